"""Reductions over an empty dim raise where eager raises (torchburn/frontend/lowerings/
reductions.py `require_nonempty`, and the launcher's check for symbolic dims)."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from torchburn.backend.launcher import Launcher
from torchburn.backend.launcher_gen import launcher_spec
from torchburn.compiler.driver import compile_graph
from torchburn.ir.parser import parse_graph

from ...helpers import assert_fully_compiled, run_compiled

#: Ops whose empty reduction eager refuses. (amax/amin/aminmax over a dim, and amax/argmax
#: over everything, are refused by Dynamo's fake tensors while tracing, before any backend.)
EMPTY_RAISES: dict[str, Callable[[torch.Tensor], Any]] = {
    "max.dim values": lambda t: t.max(1).values,
    "max.dim indices": lambda t: t.max(1).indices,
    "min.dim values": lambda t: t.min(1).values,
    "min.dim keepdim": lambda t: t.min(1, keepdim=True).indices,
    "argmax": lambda t: t.argmax(1),
    "argmin": lambda t: t.argmin(1),
    "max": lambda t: t.max(),
    "min": lambda t: t.min(),
}


def _eager_error(fn: Callable[[torch.Tensor], Any], x: torch.Tensor) -> BaseException:
    with pytest.raises(Exception) as info:
        fn(x)
    return info.value


@pytest.mark.parametrize("name", sorted(EMPTY_RAISES))
def test_empty_reduction_raises_like_eager(name: str) -> None:
    fn = EMPTY_RAISES[name]
    x = torch.randn(3, 0)
    expected = _eager_error(fn, x)
    with pytest.raises(type(expected)) as info:
        run_compiled(fn, x)
    # the same condition as eager's message says (Dynamo may wrap it, keeping the type)
    assert "non-zero size" in str(info.value) or "numel() == 0" in str(info.value)


@pytest.mark.parametrize("fn", [EMPTY_RAISES["max.dim values"], EMPTY_RAISES["argmax"], EMPTY_RAISES["min"],
                                lambda t: t.amin(1)])
def test_nonempty_reductions_still_compile(fn: Callable[[torch.Tensor], Any]) -> None:
    x = torch.randn(3, 5)
    out, reports = run_compiled(fn, x)
    torch.testing.assert_close(out, fn(x))
    assert_fully_compiled(reports)


def test_reduction_over_a_dim_kept_empty_elsewhere_compiles() -> None:
    # reducing dim 1 of a [0, 4] tensor is fine in eager: an empty result
    fn = EMPTY_RAISES["max.dim values"]
    x = torch.randn(0, 4)
    out, _ = run_compiled(fn, x)
    assert out.shape == fn(x).shape == (0,)


def test_launcher_sends_a_symbolic_empty_dim_to_eager() -> None:
    graph = parse_graph("""graph @main(%x: f32[4, s0]) {
  %0 = reduce_max(%x) {dims = [1], keepdim = false} : f32[4]
  return %0
}""")
    compiled, _ = compile_graph(graph)
    spec = launcher_spec(graph, compiled.signature())
    assert "s0 == 0" in spec.source
    launcher = Launcher(spec, compiled.entry, lambda a: (a.amax(1),), keepalive=compiled)
    x = torch.randn(4, 6)
    (out,) = launcher(x)
    torch.testing.assert_close(out, x.amax(1))
    assert launcher.stats.eager_fallbacks == 0
    with pytest.raises(IndexError, match="non-zero size"):
        launcher(torch.randn(4, 0))
    assert launcher.stats.eager_fallbacks == 1
