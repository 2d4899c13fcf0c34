"""Statements: let, if/else, local accumulators, loop kinds (unrolled, vectorized, parallel)."""
from __future__ import annotations

import pytest
import torch

from torchburn.codegen import CodegenError
from torchburn.ir.loop import Alloc, If, Let, block

from .util import Compiled, Const, Var, buf, dt, ex, load, loop, program, st, store


def test_let_and_if_else() -> None:
    """out[i] = x[i] > 0 ? 2 * x[i] : -1 (via let + if/else)."""
    s0 = Var("s0")
    x, out = buf("x", dt.f32, (s0,)), buf("out", dt.f32, (s0,))
    i, t = Var("i"), Var("t", st(dt.f32))
    body = block(
        Let(t, load(x, i)),
        If(ex.binary("gt", t, ex.const(0.0, dt.f32)),
           store(out, (i,), ex.mul(t, ex.const(2.0, dt.f32))),
           store(out, (i,), ex.const(-1.0, dt.f32))),
    )
    k = Compiled(program(loop(i, s0, body), [x], [out], [s0]))
    xv = torch.randn(50)
    res = torch.empty(50)
    k(xv, res, symbols=[50])
    assert torch.equal(res, torch.where(xv > 0, 2 * xv, torch.tensor(-1.0)))


def test_if_without_else() -> None:
    s0 = Var("s0")
    out = buf("out", dt.i32, (s0,))
    i = Var("i")
    body = If(ex.binary("eq", ex.mod(i, 3), Const(0)), store(out, (i,), ex.const(1, dt.i32)))
    k = Compiled(program(loop(i, s0, body), [], [out], [s0]))
    res = torch.zeros(10, dtype=torch.int32)
    k(res, symbols=[10])
    assert res.tolist() == [1 if n % 3 == 0 else 0 for n in range(10)]


def row_sum_program(kind: str = "serial") -> Compiled:
    """out[i] = sum_j x[i, j], accumulating in a local one-element buffer."""
    s0, s1 = Var("s0"), Var("s1")
    x, out = buf("x", dt.f32, (s0, s1)), buf("out", dt.f32, (s0,))
    acc = buf("acc", dt.f32, (1,), scope="local")
    i, j = Var("i"), Var("j")
    zero = Const(0)
    body = block(
        Alloc(acc),
        store(acc, (zero,), ex.const(0.0, dt.f32)),
        loop(j, s1, store(acc, (zero,), ex.add(load(acc, zero), load(x, i, j)))),
        store(out, (i,), load(acc, zero)),
    )
    return Compiled(program(loop(i, s0, body, kind=kind), [x], [out], [s0, s1]))


@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_reduction_with_local_accumulator(kind) -> None:
    k = row_sum_program(kind)
    xv = torch.randn(37, 19)
    res = torch.empty(37)
    k(xv, res, symbols=[37, 19])
    torch.testing.assert_close(res, xv.sum(dim=1))
    assert k.llvm_ir.count("alloca [") + k.llvm_ir.count("alloca float") >= 1


def test_unrolled_loop_gets_metadata() -> None:
    out = buf("out", dt.i64, (4,))
    i = Var("i")
    k = Compiled(program(loop(i, 4, store(out, (i,), ex.mul(i, i)), kind="unrolled"), [], [out]))
    assert "llvm.loop.unroll.full" in k.llvm_ir
    res = torch.zeros(4, dtype=torch.int64)
    k(res)
    assert res.tolist() == [0, 1, 4, 9]


def test_unrolled_symbolic_loop_runs_serially() -> None:
    s0 = Var("s0")
    out = buf("out", dt.i64, (s0,))
    i = Var("i")
    k = Compiled(program(loop(i, s0, store(out, (i,), i), kind="unrolled"), [], [out], [s0]))
    assert "llvm.loop.unroll.full" not in k.llvm_ir
    res = torch.zeros(5, dtype=torch.int64)
    k(res, symbols=[5])
    assert res.tolist() == list(range(5))


def test_vectorized_loop_is_rejected() -> None:
    out = buf("out", dt.i64, (4,))
    i = Var("i")
    with pytest.raises(CodegenError, match="vectorize pass"):
        Compiled(program(loop(i, 4, store(out, (i,), i), kind="vectorized"), [], [out]))


def test_unbound_variable_is_reported() -> None:
    out = buf("out", dt.i64, (4,))
    i = Var("i")
    with pytest.raises(CodegenError, match="variable 'q' is not bound"):
        Compiled(program(loop(i, 4, store(out, (i,), Var("q"))), [], [out]))


def test_symbolic_local_buffer_is_rejected() -> None:
    s0 = Var("s0")
    acc = buf("acc", dt.f32, (s0,), scope="local")
    with pytest.raises(CodegenError, match="constant shape"):
        Compiled(program(Alloc(acc), [], [], [s0]))


def parallel_program(n_outer_extra: bool = False) -> Compiled:
    """out[i, j] = x[i, j] * scale + i, with a parallel outer loop, a let outside the loop and a
    nested parallel loop (which runs serially inside the outlined body)."""
    s0, s1 = Var("s0"), Var("s1")
    x, out = buf("x", dt.f32, (s0, s1)), buf("out", dt.f32, (s0, s1))
    i, j = Var("i"), Var("j")
    scale = Var("scale", st(dt.f32))
    inner = store(out, (i, j), ex.add(ex.mul(load(x, i, j), scale), ex.cast(i, dt.f32)))
    body = block(Let(scale, ex.const(3.0, dt.f32)),
                 loop(i, s0, loop(j, s1, inner, kind="parallel"), kind="parallel"))
    return Compiled(program(body, [x], [out], [s0, s1]))


@pytest.mark.parametrize("rows", [0, 1, 2, 7, 64])
def test_parallel_loop(rows) -> None:
    k = parallel_program()
    assert "GOMP_parallel" in k.llvm_ir
    xv = torch.randn(rows, 5)
    res = torch.full((rows, 5), -99.0)
    k(xv, res, symbols=[rows, 5])
    expected = xv * 3 + torch.arange(rows, dtype=torch.float32)[:, None]
    torch.testing.assert_close(res, expected)


def test_parallel_loop_runs_each_iteration_once() -> None:
    """out[i] += 1 over a zeroed output: the thread slices cover the range exactly."""
    s0 = Var("s0")
    out = buf("out", dt.i32, (s0,))
    i = Var("i")
    k = Compiled(program(loop(i, s0, store(out, (i,), ex.add(load(out, i), ex.const(1, dt.i32))),
                              kind="parallel"), [], [out], [s0]))
    for n in (1, 2, 3, 1001):
        res = torch.zeros(n, dtype=torch.int32)
        k(res, symbols=[n])
        assert torch.equal(res, torch.ones(n, dtype=torch.int32))
