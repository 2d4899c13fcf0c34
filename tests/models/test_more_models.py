"""A compact set of the architectures outside the main suite (`zoo_more.py`; the whole set is
swept by `tools/sweep_models.py`), each in the mode where it once failed or that exercises what
sets it apart, against eager with nothing in PyTorch outside `NOT_COMPILED`:

- Gemma 2 (logit soft-capping, sliding-window layers), Bloom (ALiBi), Whisper (convolutional
  encoder, encoder-decoder), Swin (shifted windows: roll, window partition) in eval under
  no_grad;
- DeBERTa-v2 (disentangled relative attention) in eval with grad;
- a GRU/LSTM stack under no_grad (its zero initial state times the weights is a GEMM with a
  constant operand, once an internal error), wav2vec2 (weight-normalized convolution, whose
  backward was left to PyTorch) and embedding bags (likewise) through a training step;
- Phi with dynamic shapes (Python floats become 0-d tensors: `aten.true_divide`), ConvNeXt with
  dynamic image sizes.

Tolerances as in `test_model_suite.py`. About 100 CPU-seconds in all.
"""
from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from tests.models import zoo_more
from tests.models.test_model_suite import (OUT_TOL, assert_compiled_whole, assert_grads_close, compiled,
                                           projection, recording)


def _inputs(name: str, shape: Any = None) -> tuple[torch.nn.Module, dict[str, Any]]:
    case = zoo_more.CASES[name]
    model = zoo_more.build(name)
    batch, seq = shape or case.shape
    return model, case.inputs(model, batch, seq, case.sequence)


@pytest.mark.parametrize("name", ["gemma2", "bloom", "whisper", "swin"])
def test_eval_no_grad(name: str) -> None:
    model, kw = _inputs(name)
    pick = zoo_more.CASES[name].pick
    f = compiled(model)
    with torch.no_grad():
        out, records = recording(lambda: pick(f(**kw)))
        torch.testing.assert_close(out, pick(model(**kw)), **OUT_TOL)
    assert_compiled_whole(records)


def test_recurrent_no_grad() -> None:
    """Dynamo traces RNN modules only with `allow_rnn` (else it hands the backend nothing)."""
    model, kw = _inputs("recurrent", (2, 5))
    f = compiled(model)
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
        out, records = recording(lambda: f(**kw))
        torch.testing.assert_close(out, model(**kw), **OUT_TOL)
    assert_compiled_whole(records)


@pytest.mark.parametrize("name,train", [("deberta_v2", False), ("wav2vec2", True), ("embedding_bag", True)])
def test_gradients(name: str, train: bool) -> None:
    eager, kw = _inputs(name)
    eager.train(train)
    pick = zoo_more.CASES[name].pick
    model = copy.deepcopy(eager)
    f = compiled(model)

    def step() -> torch.Tensor:
        out = pick(f(**kw))
        (out * projection(out)).sum().backward()
        return out

    out, records = recording(step)
    expected = pick(eager(**kw))
    (expected * projection(expected)).sum().backward()
    torch.testing.assert_close(out, expected, **OUT_TOL)
    assert_grads_close(model, eager)
    assert {r.kind for r in records} >= {"forward", "backward"}
    assert_compiled_whole(records)


def test_dynamic_shapes_phi() -> None:
    model, _ = _inputs("phi")
    case = zoo_more.CASES["phi"]
    f = compiled(model, dynamic=True)
    with torch.no_grad():
        def run_all() -> list[tuple[torch.Tensor, torch.Tensor]]:
            return [(case.pick(f(**kw)), case.pick(model(**kw)))
                    for kw in (case.inputs(model, b, s, True) for b, s in ((2, 16), (3, 9)))]

        pairs, records = recording(run_all)
    for got, expected in pairs:
        torch.testing.assert_close(got, expected, **OUT_TOL)
    assert len([r for r in records if r.kind == "forward"]) == 1
    assert_compiled_whole(records)


def test_dynamic_image_size_convnext() -> None:
    """ConvNeXt with dynamic image sizes: sizes `s // 4` read from convolution outputs (once
    five subgraphs), a view of a permuted convolution output (once wrong results), sizes
    torch leaves unsimplified (`((s // 4) ** 2) // (s // 4)`, once an internal error)."""
    model, _ = _inputs("convnext")
    pick = zoo_more.CASES["convnext"].pick
    f = compiled(model, dynamic=True)
    with torch.no_grad():
        def run_all() -> list[tuple[torch.Tensor, torch.Tensor]]:
            images = [torch.randn(2, 3, s, s, generator=torch.Generator().manual_seed(s)) for s in (32, 48)]
            return [(pick(f(pixel_values=x)), pick(model(pixel_values=x))) for x in images]

        pairs, records = recording(run_all)
    for got, expected in pairs:
        torch.testing.assert_close(got, expected, **OUT_TOL)
    assert [len(r.subgraphs) for r in records] == [1]
    assert_compiled_whole(records)
