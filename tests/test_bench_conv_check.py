"""`benchmarks/bench_conv.py`'s gradient check: against a float64 step, within a bound made of
the row's measured rounding noise, so that it passes an honest float32 step and fails a
gradient off by more than rounding."""
from __future__ import annotations

import copy
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import bench_conv  # noqa: E402
from benchmarks.bench_models import _step  # noqa: E402
from tests.models import conv_zoo  # noqa: E402


def _row() -> tuple[torch.nn.Module, object, dict[str, torch.Tensor], torch.Tensor, bench_conv.GradReference]:
    """small_cnn (tiny, batch 2) in training: the model, its case, inputs, eager's output and
    the float64 reference, as `run_row` builds them."""
    case = conv_zoo.CASES["small_cnn"]
    eager = conv_zoo.build("small_cnn", "tiny").train()
    kw = conv_zoo.inputs("small_cnn", "tiny", 2)
    stepped = copy.deepcopy(eager)
    expected = _step(stepped, case, kw, "training")()
    return eager, case, kw, expected, bench_conv.grad_reference(eager, stepped, case, kw)


def test_an_honest_float32_step_passes_and_the_noise_is_measured() -> None:
    eager, case, kw, expected, ref = _row()
    assert set(ref.noise) == {"eager", "eager-no-onednn", "float64-perturbed"}
    assert all(0 <= v < 1e-5 for v in ref.noise.values()), ref.noise  # a shallow net: float32 rounding
    assert ref.bound() == bench_conv.GRAD_FACTOR * max(ref.noise.values()) + bench_conv.GRAD_FLOOR
    model = copy.deepcopy(eager)
    got = _step(model, case, kw, "training")()
    result = bench_conv.check(got, expected, model, "training", ref)
    assert result["error"] is None and result["grad_err"] == ref.noise["eager"]  # the same computation


def test_a_gradient_off_by_more_than_the_bound_fails() -> None:
    eager, case, kw, expected, ref = _row()
    model = copy.deepcopy(eager)
    got = _step(model, case, kw, "training")()
    weight = dict(model.named_parameters())["features.0.weight"]  # the first convolution's, as a stem's
    assert 2 * ref.bound() < 1e-3  # within the old check's 2e-2 of eager, which let it pass
    with torch.no_grad():
        weight.grad.view(-1)[0] += 2 * ref.bound() * ref.scale
    result = bench_conv.check(got, expected, model, "training", ref)
    assert result["error"] is not None and "off by" in result["error"], result
    assert "features.0.weight" in result["error"] and result["grad_err"] > result["grad_bound"]


def test_a_missing_gradient_fails() -> None:
    eager, case, kw, expected, ref = _row()
    model = copy.deepcopy(eager)
    got = _step(model, case, kw, "training")()
    next(iter(model.parameters())).grad = None
    assert "no gradient" in bench_conv.check(got, expected, model, "training", ref)["error"]
