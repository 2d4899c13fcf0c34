"""Quantized linears' kernel forms chosen by the tuner (`torchburn/backend/qlinear_tuning.py`)
and the `qlinear` op's `form` attribute that carries the choice to the kernels.

Which candidate wins is forced by slowing the others down inside their runners (a real
measurement on a known margin), so the tests do not depend on the machine's load."""
from __future__ import annotations

import time
from typing import Any, Iterator

import pytest
import torch

from tests.passes.test_qlinear import Compiled, qlinear_graph
from torchburn.backend import qlinear_tuning
from torchburn.runtime.config import reload_config
from torchburn.runtime.tuner import records


@pytest.fixture
def tuning(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TORCHBURN_TUNE", "search")
    records().clear()
    reload_config()
    torch._dynamo.reset()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    records().clear()
    monkeypatch.undo()
    reload_config()
    torch._dynamo.reset()


def burn(seconds: float) -> None:
    """Spend `seconds` of this process's CPU time: the tuner times one-thread rounds in CPU
    time (`measuring_clock`), where a sleep would cost nothing."""
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


def only_winner(monkeypatch: pytest.MonkeyPatch, winner: str, seconds: float = 0.02) -> list[str]:
    """Every candidate but `winner` spends `seconds` more CPU time per run (which both of the
    tuner's clocks see); returns the names prepared."""
    prepared: list[str] = []
    real = qlinear_tuning.candidates

    def patched(*args: Any, **kwargs: Any) -> list[Any]:
        out = []
        for c in real(*args, **kwargs):
            def prepare(c: Any = c) -> Any:
                prepared.append(c.name)
                run = c.prepare()
                if c.name == winner:
                    return run

                def slow() -> Any:
                    burn(seconds)
                    return run()
                return slow
            out.append(type(c)(c.name, c.kind, prepare, c.default))
        return out

    monkeypatch.setattr(qlinear_tuning, "candidates", patched)
    return prepared


def _layer() -> Any:
    from torchburn.quant import QuantizedLinear

    torch.manual_seed(0)
    return QuantizedLinear.from_float(torch.nn.Linear(256, 96), "int4", group_size=32)


@pytest.mark.parametrize("winner", ["rows", "gemm"])
def test_the_measured_form_is_compiled(tuning: None, monkeypatch: pytest.MonkeyPatch, winner: str) -> None:
    """Every form is measured; the winner's kernel is the one that runs (f32 activations, so
    exact to f32 rounding, for `gemm`; int8 ones, within their bound, for `rows`)."""
    from tests.helpers import assert_fully_compiled, run_compiled

    prepared = only_winner(monkeypatch, winner)
    layer = _layer()
    x = torch.randn(2, 40, 256)
    with torch.no_grad():
        expected = layer(x)
        out, reports = run_compiled(layer, x)
    assert_fully_compiled(reports)
    assert {"auto", "rows", "panel", "gemm"} <= set(prepared), prepared
    lines = [line for r in reports for line in r.tuning if line.startswith("qlinear ")]
    assert len(lines) == 1 and f": {winner} (measured" in lines[0], lines
    assert "f32[80,256] x int4 g32 [96, 256]" in lines[0]
    if winner == "gemm":
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    else:
        assert float((out - expected).abs().max()) < 0.05


def test_auto_and_the_form_it_picks_are_measured_once(tuning: None) -> None:
    """`auto` at 80 rows compiles to the panel kernel: the same code as the explicit `panel`,
    so the tuner measures it once (the line says so) and noise cannot choose between twins."""
    from tests.helpers import assert_fully_compiled, run_compiled
    from torchburn.codegen import host_target

    if not (host_target().native_dot4(16) or host_target().small_dot4(8)):
        pytest.skip("the panel kernel is `auto`'s form where the CPU has byte dot products")
    layer = _layer()
    with torch.no_grad():
        _, reports = run_compiled(layer, torch.randn(2, 40, 256))
    assert_fully_compiled(reports)
    lines = [line for r in reports for line in r.tuning if line.startswith("qlinear ")]
    assert len(lines) == 1 and "panel is auto's code" in lines[0], lines
    assert " panel " not in lines[0].split("(", 1)[1].split(";")[0], lines  # not among the timings


def test_records_are_reused(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A second compile of the same shapes applies the record without measuring again."""
    from tests.helpers import run_compiled

    only_winner(monkeypatch, "gemm")
    layer = _layer()
    x = torch.randn(2, 40, 256)
    with torch.no_grad():
        run_compiled(layer, x)
        prepared = only_winner(monkeypatch, "rows")
        out, reports = run_compiled(layer, x)
    assert prepared == []
    lines = [line for r in reports for line in r.tuning if line.startswith("qlinear ")]
    assert len(lines) == 1 and ": gemm (record" in lines[0], lines


def test_off_mode_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.helpers import run_compiled

    monkeypatch.setenv("TORCHBURN_TUNE", "off")
    reload_config()
    try:
        prepared = only_winner(monkeypatch, "gemm")
        with torch.no_grad():
            _, reports = run_compiled(_layer(), torch.randn(2, 40, 256))
        assert prepared == [] and not any(r.tuning for r in reports)
    finally:
        monkeypatch.undo()
        reload_config()


@pytest.mark.parametrize("form, rows, expect", [("rows", 64, "mr="), ("panel", 8, "qgemm"), ("gemm", 8, None),
                                                ("auto", 64, "qgemm"), ("auto", 8, "mr=")])
def test_form_attribute_picks_the_kernel(form: str, rows: int, expect: Any) -> None:
    """`form` overrides the choice by rows: the streaming kernel at 64 rows, the panel at 8,
    dequantize + GEMM (two kernels, no `qlinear` plan) at 8."""
    from torchburn.codegen import host_target

    if not host_target().small_dot4(8):
        pytest.skip("no byte dot product on this host")
    text = qlinear_graph(rows, 40, 256, "int4", 32, False, activations="auto")
    if form != "auto":
        text = text.replace('activations = "auto"', f'activations = "auto", form = "{form}"')
    c = Compiled(text)
    plans = [dict(k.attrs).get("qlinear") for k in c.program.kernels]
    if expect is None:
        assert len(plans) == 2 and not any(plans), plans
    else:
        assert len(plans) == 1 and plans[0].startswith(expect), plans


def test_form_attribute_is_checked() -> None:
    from torchburn.ir.ops import OpError
    from torchburn.ir.parser import parse_graph
    from torchburn.ir.verifier import verify

    text = qlinear_graph(8, 16, 64, "int4", 32, True).replace('activations = "f32"', 'form = "fast"')
    with pytest.raises((OpError, ValueError), match="unknown form"):
        verify(parse_graph(text))


def test_invariant_mode_measures_nothing_and_writes_rows(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """TORCHBURN_QLINEAR_INVARIANT=1: the tuner measures no form (nothing to choose) and the
    lowering writes `form = "rows"`, so 80 rows take the rows form (the panel's size otherwise)
    and each row equals the same row computed alone, bit for bit."""
    from tests.helpers import assert_fully_compiled, run_compiled

    monkeypatch.setenv("TORCHBURN_QLINEAR_INVARIANT", "1")
    reload_config()
    prepared = only_winner(monkeypatch, "gemm")
    layer = _layer()
    x = torch.randn(2, 40, 256)
    with torch.no_grad():
        out, reports = run_compiled(layer, x)
        alone, _ = run_compiled(layer, x[1:2, 7:8])
    assert_fully_compiled(reports)
    assert prepared == [] and not any(line.startswith("qlinear ") for r in reports for line in r.tuning)
    assert torch.equal(out[1, 7], alone[0, 0])
