"""Expression emission (`codegen/llvm/expr.py`): binary operations numbered by value across
the statements of one basic block, and never reused where they would not dominate."""
from __future__ import annotations

import re

import torch

from torchburn.ir import loop as lp

from .util import Compiled, Var, buf, dt, ex, load, loop, program, store


def _count(pattern: str, text: str) -> int:
    return len(re.findall(pattern, text))


def test_index_arithmetic_repeated_across_statements_is_emitted_once() -> None:
    # out[i * 7 + 3] and out2[i * 7 + 3]: two statements, two separately built index trees
    s0, i = Var("s0"), Var("i")
    x, out, out2 = (buf(n, dt.f32, (ex.add(ex.mul(s0, 7), 3),)) for n in ("x", "out", "out2"))

    def idx() -> ex.Expr:
        return ex.add(ex.mul(i, 7), 3)

    body = lp.Block((store(out, (idx(),), ex.add(load(x, idx()), ex.const(1.0, dt.f32))),
                     store(out2, (idx(),), ex.add(load(x, idx()), ex.const(1.0, dt.f32)))))
    k = Compiled(program(loop(i, s0, body), [x], [out, out2], [s0]))
    assert _count(r"= mul i64 %\"i\", 7", k.llvm_ir) == 1, k.llvm_ir
    # the float adds read loads of different statements' values: also merged only when equal
    n = 5
    xs = torch.randn(7 * n + 3)
    o1, o2 = torch.zeros_like(xs), torch.zeros_like(xs)
    k(xs, o1, o2, symbols=[n])
    at = torch.arange(n) * 7 + 3
    torch.testing.assert_close(o1[at], xs[at] + 1)
    torch.testing.assert_close(o2[at], xs[at] + 1)


def test_a_name_bound_again_gets_its_own_value() -> None:
    # let t = x[i]; a[i] = t * 2; let t = y[i]; b[i] = t * 2: the same IR expression `t * 2`
    # on two different LLVM values
    s0, i = Var("s0"), Var("i")
    x, y, a, b = (buf(n, dt.f32, (s0,)) for n in ("x", "y", "a", "b"))
    t = Var("t", ex.ScalarType(dt.f32))
    two = ex.const(2.0, dt.f32)
    body = lp.Block((lp.Let(t, load(x, i)), store(a, (i,), ex.mul(t, two)),
                     lp.Let(t, load(y, i)), store(b, (i,), ex.mul(t, two))))
    k = Compiled(program(loop(i, s0, body), [x, y], [a, b], [s0]))
    n = 9
    xs, ys, out_a, out_b = torch.randn(n), torch.randn(n), torch.zeros(n), torch.zeros(n)
    k(xs, ys, out_a, out_b, symbols=[n])
    torch.testing.assert_close(out_a, xs * 2)
    torch.testing.assert_close(out_b, ys * 2)


def test_no_reuse_of_a_loop_body_value_after_the_loop() -> None:
    # s0 * 5 inside the loop body and again after the loop: the body does not dominate the
    # exit, so the second must be emitted again (LLVM's verifier rejects the module otherwise)
    s0, i = Var("s0"), Var("i")
    out = buf("out", dt.i64, (ex.add(s0, 1),))
    five = ex.mul(s0, 5)
    body = lp.Block((loop(i, s0, store(out, (i,), ex.add(ex.mul(s0, 5), i))),
                     store(out, (s0,), five)))
    k = Compiled(program(body, [], [out], [s0]))
    assert _count(r"= mul i64 %\"s0\", 5", k.llvm_ir) == 2, k.llvm_ir
    n = 4
    o = torch.zeros(n + 1, dtype=torch.int64)
    k(o, symbols=[n])
    assert o.tolist() == [5 * n + j for j in range(n)] + [5 * n]


def test_a_scalar_broadcast_twice_in_a_block_is_broadcast_once() -> None:
    # a[ramp] = x[ramp] * c; b[ramp] = x[ramp] + c, with c = w[0] loaded once (a let)
    i = Var("i")
    n, lanes = 16, 8
    x, w, a, b = buf("x", dt.f32, (n,)), buf("w", dt.f32, (1,)), buf("a", dt.f32, (n,)), buf("b", dt.f32, (n,))
    c = Var("c", ex.ScalarType(dt.f32))
    idx = ex.Ramp(ex.mul(i, lanes), ex.Const(1), ex.ScalarType(dt.index, lanes))
    vec = ex.ScalarType(dt.f32, lanes)
    cv = ex.Broadcast(c, vec)
    body = lp.Block((lp.Let(c, load(w, ex.Const(0))),
                     store(a, (idx,), ex.mul(load(x, idx, lanes=lanes), cv)),
                     store(b, (idx,), ex.add(load(x, idx, lanes=lanes), ex.Broadcast(c, vec)))))
    k = Compiled(program(loop(i, n // lanes, body), [x, w], [a, b]))
    assert _count(r"shufflevector", k.llvm_ir) == 1, k.llvm_ir
    xs, ws, out_a, out_b = torch.randn(n), torch.tensor([1.5]), torch.zeros(n), torch.zeros(n)
    k(xs, ws, out_a, out_b)
    torch.testing.assert_close(out_a, xs * 1.5)
    torch.testing.assert_close(out_b, xs + 1.5)


def test_a_vector_loads_index_and_constant_splats_are_not_emitted_as_values() -> None:
    # let v = x[ramp(i * 8, 1, 8)]; out[ramp(i * 8, 1, 8)] = v * 2: the load's address is its
    # first lane's (memory.py); the ramp itself is no value, and splat(2.0) is a constant vector
    i = Var("i")
    n, lanes = 32, 8
    x, out = buf("x", dt.f32, (n,)), buf("out", dt.f32, (n,))
    v = Var("v", ex.ScalarType(dt.f32, lanes))
    idx = ex.Ramp(ex.mul(i, lanes), ex.Const(1), ex.ScalarType(dt.index, lanes))
    body = lp.Block((lp.Let(v, load(x, idx, lanes=lanes)),
                     store(out, (idx,), ex.mul(v, ex.Broadcast(ex.const(2.0, dt.f32), v.type)))))
    k = Compiled(program(loop(i, n // lanes, body), [x], [out]))
    assert "<8 x i64>" not in k.llvm_ir, k.llvm_ir
    assert _count(r"shufflevector|insertelement", k.llvm_ir) == 0, k.llvm_ir
    xs, o = torch.randn(n), torch.zeros(n)
    k(xs, o)
    torch.testing.assert_close(o, xs * 2)


def test_a_16_bit_float_select_chooses_bits() -> None:
    # out[i] = i < 3 ? x[i] : 0.0 in bf16 and f16, vectors and scalars: a select of `bfloat`
    # on a CPU without bf16 arithmetic would widen both sides and call a rounding function
    for dtype, tdtype in ((dt.bf16, torch.bfloat16), (dt.f16, torch.float16)):
        for lanes in (1, 8):
            i = Var("i")
            n = 16
            x, out = buf("x", dtype, (n,)), buf("out", dtype, (n,))
            if lanes == 1:
                idx, pos = i, i
            else:
                idx = ex.Ramp(ex.mul(i, lanes), ex.Const(1), ex.ScalarType(dt.index, lanes))
                pos = idx
            cond = ex.binary("lt", pos, ex.Const(3) if lanes == 1 else ex.Broadcast(ex.Const(3), pos.type))
            zero = ex.const(0.0, dtype) if lanes == 1 else ex.Broadcast(ex.const(0.0, dtype), ex.ScalarType(dtype, lanes))
            k = Compiled(program(loop(i, n // lanes, store(out, (idx,), ex.select(cond, load(x, idx, lanes=lanes), zero))),
                                 [x], [out]))
            assert re.search(r"select\s+(<8 x i1>|i1) [^,]+, (<8 x i16>|i16)", k.llvm_ir), k.llvm_ir
            xs, o = torch.randn(n, dtype=tdtype), torch.full((n,), 7.0, dtype=tdtype)
            k(xs, o)
            expected = torch.where(torch.arange(n) < 3, xs, torch.zeros_like(xs))
            assert torch.equal(o, expected)


def test_a_nan_constant_with_a_payload_compiles_in_every_float_type() -> None:
    # found by tests/runtime/test_reference_vs_llvm.py: `bfloat 0x7FF8000000000001` is a payload
    # bfloat cannot hold, and LLVM rejected the module; the IR leaves NaN bits unspecified
    import struct

    payload_nan = struct.unpack("<d", struct.pack("<Q", 0x7FF8000000000001))[0]
    for dtype, tdtype in ((dt.bf16, torch.bfloat16), (dt.f16, torch.float16), (dt.f32, torch.float32)):
        out = buf("out", dtype, (1,))
        k = Compiled(program(store(out, (ex.Const(0),), ex.Const(payload_nan, ex.ScalarType(dtype, 1))), [], [out]))
        o = torch.zeros(1, dtype=tdtype)
        k(o)
        assert torch.isnan(o).all(), dtype
