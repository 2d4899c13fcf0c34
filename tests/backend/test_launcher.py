"""The generated launchers (`torchburn/backend/launcher_gen.py`, `torchburn/backend/launcher.py`): tight guards
that still send every mismatching input to PyTorch, and the direct call path of the backend."""
from __future__ import annotations

from typing import Any

import torch

import torchburn.backend.entry as be


def compiled_with_launchers(fn: Any, *args: torch.Tensor) -> tuple[Any, list[Any]]:
    launchers: list[Any] = []
    original = be._install

    def spy(module: Any, name: str, sub: Any, launcher: Any) -> None:
        launchers.append(launcher)
        original(module, name, sub, launcher)

    torch._dynamo.reset()
    be._install = spy
    try:
        compiled = torch.compile(fn, backend=be.torchburn_backend, dynamic=False)
        torch.testing.assert_close(compiled(*args), fn(*args))
    finally:
        be._install = original
    assert launchers, "nothing was compiled"
    return compiled, launchers


def test_stride_of_a_size_one_dimension_is_not_guarded() -> None:
    x = torch.randn(4, 1, 8)
    _, (launcher,) = compiled_with_launchers(lambda a: a * 2 + 1, x)
    odd = torch.randn(4, 8).unsqueeze(1).as_strided((4, 1, 8), (8, 77, 1))  # stride of dim 1 unused
    (out,) = launcher(odd)
    torch.testing.assert_close(out, odd * 2 + 1)
    assert launcher.stats.eager_fallbacks == 0


def test_every_other_layout_change_runs_in_pytorch() -> None:
    x = torch.randn(6, 8)
    _, (launcher,) = compiled_with_launchers(lambda a: a.exp() - a, x)
    for bad in (torch.randn(8, 6).t(), torch.randn(6, 16)[:, ::2], torch.randn(6, 9),
                torch.randn(6, 8, dtype=torch.float64), torch.randn(48)):
        before = launcher.stats.eager_fallbacks
        (out,) = launcher(bad)
        torch.testing.assert_close(out, bad.exp() - bad)
        assert launcher.stats.eager_fallbacks == before + 1


def test_direct_call_path_with_several_outputs() -> None:
    x = torch.randn(5, 7)

    def two(a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a + 1, (a * a).sum(1)

    compiled, launchers = compiled_with_launchers(two, x)
    for _ in range(3):
        y = torch.randn(5, 7)
        got = compiled(y)
        assert isinstance(got, tuple) and len(got) == 2
        torch.testing.assert_close(got, two(y))


def test_source_is_straight_line() -> None:
    _, (launcher,) = compiled_with_launchers(lambda a: a + 1, torch.randn(4))
    src = launcher.source
    assert "a0.shape != (4,)" in src and "a0.stride() != (1,)" in src
    assert "for " not in src and "while " not in src


def test_symbol_only_inside_a_size_expression_is_solved() -> None:
    """An input of size `s1 + 3` (s1 appearing nowhere else) binds `s1 = size - 3`; a size
    the expression cannot produce goes to PyTorch."""
    from torchburn.compiler.driver import compile_graph
    from torchburn.ir.parser import parse_graph
    from torchburn.backend.launcher import Launcher
    from torchburn.backend.launcher_gen import launcher_spec

    graph = parse_graph("""graph @main(%x: f32[2 * s1 + 3, 4]) {
  %0 = exp(%x) : f32[2 * s1 + 3, 4]
  return %0
}""")
    compiled, _ = compile_graph(graph)
    spec = launcher_spec(graph, compiled.signature())
    assert "s1 = (" in spec.source
    launcher = Launcher(spec, compiled.entry, lambda a: (a.exp(),), keepalive=compiled)
    for rows in (3, 5, 11):
        x = torch.randn(rows, 4)
        (out,) = launcher(x)
        torch.testing.assert_close(out, x.exp())
    assert launcher.stats.eager_fallbacks == 0
    for rows in (4, 1):  # even, or below 3: no s1 >= 0 gives it
        (out,) = launcher(torch.zeros(rows, 4))
        torch.testing.assert_close(out, torch.ones(rows, 4))
    assert launcher.stats.eager_fallbacks == 2


def _index_exprs():
    """Random index expressions over s0, s1 (the shape arithmetic a launcher computes), with
    casts to narrower integer types whose wrapping the Python source must reproduce."""
    from hypothesis import strategies as st

    from torchburn.ir import dtypes as dt
    from torchburn.ir import expr as ex

    leaves = st.one_of(st.sampled_from([ex.Var("s0"), ex.Var("s1")]),
                       st.integers(-300, 300).map(lambda v: ex.Const(v)))

    def grow(children):
        binary = st.tuples(st.sampled_from(["add", "sub", "mul", "floordiv", "mod", "min", "max"]),
                           children, children).map(lambda t: ex.Binary(t[0], t[1], t[2], ex.INDEX))
        narrow = st.tuples(st.sampled_from([dt.i8, dt.i16, dt.i32, dt.u8]), children).map(
            lambda t: ex.Cast(ex.Cast(t[1], ex.ScalarType(t[0])), ex.INDEX))
        return st.one_of(binary, narrow)

    return st.recursive(leaves, grow, max_leaves=8)


def test_python_expr_computes_the_semantics() -> None:
    """The launcher's size expressions (Python source) give `evaluate_index`'s values, which
    are `ir/semantics.py`'s: floor division and modulo toward -inf, wrapping narrow casts,
    division by zero raising."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from torchburn.backend.launcher_gen import python_expr
    from torchburn.ir import expr as ex

    @settings(max_examples=300, deadline=None)
    @given(_index_exprs(), st.integers(-1000, 1000), st.integers(-1000, 1000))
    def check(e, s0, s1):
        env = {"s0": s0, "s1": s1}
        src = python_expr(e)
        try:
            expected = ex.evaluate_index(e, env)
        except ZeroDivisionError:
            try:
                eval(src, {"__builtins__": {"min": min, "max": max}}, dict(env))
            except ZeroDivisionError:
                return
            raise AssertionError(f"{src} did not divide by zero")
        assert eval(src, {"__builtins__": {"min": min, "max": max}}, dict(env)) == expected, src

    check()
