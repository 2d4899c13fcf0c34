"""The LLVM emitter computes what `ir/semantics.py` defines, op by op and dtype by dtype.

One program per operand dtype computes every op the semantics define on it, each into its own
output, over edge values (overflow, negative operands, NaN, inf, -0.0, subnormals); the
results must equal `semantics.evaluate` exactly for the exact ops and within a few ulps for
math-library functions. Inputs where the IR leaves the result to the target are left out:
integer division by zero and INT_MIN / -1 (x86 traps).
"""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
import torch

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir import semantics as sem
from torchburn.ir.dtypes import DType
from torchburn.ir.expr import Var

from tests.ir.test_semantics import ALL, ULPS_RTOL, assert_close_ulps, assert_exact, edge_values

from .util import TORCH_DTYPES, Compiled, buf, load, loop, program, store

#: Float ops computed by a math library (libm, LLVM's expansions): a few ulps from NumPy's.
LIBM = {"pow", "atan2", "hypot", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin",
        "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
        "erf", "erfc", "erfinv", "sigmoid", "lgamma", "digamma", "rsqrt"}
#: i32/i64 ops on which the x86 division instruction traps for INT_MIN / -1.
DIVISIONS = {"div", "floordiv", "mod", "remainder", "fmod"}


def _tensor(values: np.ndarray, d: DType) -> torch.Tensor:
    if d == dt.bf16:  # by the bits: torch's f32 -> bf16 conversion turns NaN into 0xFFFF
        bits = sem.bitcast_value(np.ascontiguousarray(values, dtype=np.float32), dt.bf16, dt.i16)
        return torch.from_numpy(bits).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(values, dtype=sem.storage(d)))


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.float().numpy() if t.dtype == torch.bfloat16 else t.numpy()


def _run(ins: list[np.ndarray], in_dtypes: list[DType], outs: list[tuple[str, DType, object]]) -> list[np.ndarray]:
    """`out_k[i] = fn_k(x0[i], x1[i], ...)` for every (name, dtype, fn) of `outs`, one program."""
    n = len(ins[0])
    s0 = Var("s0")
    in_bufs = [buf(f"x{k}", d, (s0,)) for k, d in enumerate(in_dtypes)]
    out_bufs = [buf(f"o{k}", d, (s0,)) for k, (_, d, _) in enumerate(outs)]
    i = Var("i")
    loads = [load(b, i) for b in in_bufs]
    body = lp.Block(tuple(store(ob, (i,), fn(*loads)) for ob, (_, _, fn) in zip(out_bufs, outs)))
    compiled = Compiled(program(loop(i, s0, body), in_bufs, out_bufs, [s0]))
    tensors = [_tensor(a, d) for a, d in zip(ins, in_dtypes)]
    results = [torch.zeros(n, dtype=TORCH_DTYPES[d]) for _, d, _ in outs]
    compiled(*tensors, *results, symbols=[n])
    return [_numpy(r) for r in results]


def _check(op: str, d: DType, ours: np.ndarray, expected: np.ndarray) -> None:
    if d.is_float and op in LIBM and expected.dtype != np.bool_:
        assert_close_ulps(ours, expected, d)
    else:
        assert_exact(ours, expected)


def _pairs(d: DType) -> tuple[np.ndarray, np.ndarray]:
    values = edge_values(d)
    pairs = list(itertools.product(values, values))
    if d.is_int:
        lo = -(1 << (d.bits - 1)) if d.kind == "i" else None
        pairs = [(a, b) for a, b in pairs if b != 0 and not (a == lo and b == -1)]
    a = sem.to_array(np.array([p[0] for p in pairs]), d)
    b = sem.to_array(np.array([p[1] for p in pairs]), d)
    return a, b


@pytest.mark.parametrize("d", ALL, ids=str)
def test_binary_ops_compute_the_semantics(d: DType) -> None:
    ops = [op for op in sorted(ex.BINARY_OPS) if sem.defined(op, d)]
    a, b = _pairs(d)
    outs = []
    for op in ops:
        rd = dt.bool_ if op in ex.COMPARISONS else d
        outs.append((op, rd, lambda x, y, op=op, rd=rd: ex.Binary(op, x, y, ex.ScalarType(rd))))
    for op, ours in zip(ops, _run([a, b], [d, d], outs)):
        expected = np.asarray(sem.evaluate(op, d, a, b))
        try:
            _check(op, d, ours, expected)
        except AssertionError as err:
            raise AssertionError(f"{op} on {d}: {err}") from None


@pytest.mark.parametrize("d", ALL, ids=str)
def test_unary_ops_compute_the_semantics(d: DType) -> None:
    ops = [op for op in sorted(ex.UNARY_FUNCS) if sem.defined(op, d)]
    values = edge_values(d) + ([-0.3, 0.7, 0.999, -1.0001, 10.0, -10.5, 1e5] if d.is_float else [])
    x = sem.to_array(np.array(values), d)
    outs = [(op, dt.bool_ if op in ex.PREDICATES else d, lambda v, op=op: ex.call(op, v)) for op in ops]
    for op, ours in zip(ops, _run([x], [d], outs)):
        try:
            _check(op, d, ours, np.asarray(sem.evaluate(op, d, x)))
        except AssertionError as err:
            raise AssertionError(f"{op} on {d}: {err}") from None


@pytest.mark.parametrize("d", [d for d in ALL if sem.defined("fma", d)], ids=str)
def test_fma_and_select_compute_the_semantics(d: DType) -> None:
    values = edge_values(d)
    triples = list(itertools.product(values[:9], values[:7], values[:5]))
    a, b, c = (sem.to_array(np.array([t[k] for t in triples]), d) for k in range(3))
    cond = (np.arange(len(triples)) % 3 == 0)
    outs = [("fma", d, lambda x, y, z, w: ex.Call("fma", (x, y, z), x.type)),
            ("select", d, lambda x, y, z, w: ex.Select(w, x, y, x.type))]
    fma, select = _run([a, b, c, cond], [d, d, d, dt.bool_], outs)
    _check("fma", d, fma, np.asarray(sem.evaluate("fma", d, a, b, c)))
    assert_exact(select, np.asarray(sem.evaluate("select", d, cond, a, b)))


@pytest.mark.parametrize("src", ALL, ids=str)
def test_casts_compute_the_semantics(src: DType) -> None:
    values = edge_values(src)
    if src.is_float:  # out-of-range float -> int is the target's (x86: INT_MIN): in range only
        values += [300.7, -300.7, 1e9, -1e9, 65519.0, 65520.0, 127.5, -128.9, 255.9]
    x = sem.to_array(np.array(values), src)
    dsts = [d for d in ALL if d != src]
    outs = [(str(d), d, lambda v, d=d: ex.Cast(v, ex.ScalarType(d))) for d in dsts]
    for d, ours in zip(dsts, _run([x], [src], outs)):
        expected = np.asarray(sem.cast_value(x, src, d))
        keep = np.array([not (src.is_float and d.is_int) or sem.float_fits_int(float(v), d) for v in x])
        try:
            assert_exact(ours[keep], expected[keep])
        except AssertionError as err:
            raise AssertionError(f"cast {src} -> {d}: {err}") from None


def test_bitcasts_compute_the_semantics() -> None:
    pairs = [(a, b) for a in ALL for b in ALL if a != b and a.bits == b.bits
             and not ((a.is_bool or b.is_bool) and (a.is_float or b.is_float))]
    for src in sorted({p[0] for p in pairs}, key=str):
        x = sem.to_array(np.array(edge_values(src)), src)
        dsts = [b for a, b in pairs if a == src]
        outs = [(str(d), d, lambda v, d=d: ex.Bitcast(v, ex.ScalarType(d))) for d in dsts]
        for d, ours in zip(dsts, _run([x], [src], outs)):
            assert_exact(ours, np.asarray(sem.bitcast_value(x, src, d)))


def test_dot4_computes_the_semantics() -> None:
    rng = np.random.default_rng(0)
    acc = rng.integers(-2**31, 2**31, (16, 8)).astype(np.int32)
    a = rng.integers(0, 256, (16, 32)).astype(np.uint8)
    b = rng.integers(-128, 128, (16, 32)).astype(np.int8)
    acc[0, 0], a[0, :4], b[0, :4] = 2**31 - 1, 255, 127
    s0 = Var("s0")
    ba, bx, bw = buf("acc", dt.i32, (s0, 8)), buf("a", dt.u8, (s0, 32)), buf("b", dt.i8, (s0, 32))
    out = buf("out", dt.i32, (s0, 8))
    i = Var("i")

    def ramp(n: int) -> ex.Expr:
        return ex.Ramp(ex.Const(0), ex.Const(1), ex.ScalarType(dt.index, n))

    value = ex.Call(ex.DOT4_U8I8, (load(ba, i, ramp(8), lanes=8), load(bx, i, ramp(32), lanes=32),
                                   load(bw, i, ramp(32), lanes=32)), ex.ScalarType(dt.i32, 8))
    compiled = Compiled(program(loop(i, s0, store(out, (i, ramp(8)), value)), [ba, bx, bw], [out], [s0]))
    result = torch.zeros(16, 8, dtype=torch.int32)
    compiled(torch.from_numpy(acc), torch.from_numpy(a), torch.from_numpy(b), result, symbols=[16])
    np.testing.assert_array_equal(result.numpy(), sem.evaluate(ex.DOT4_U8I8, dt.i32, acc, a, b))




@pytest.mark.parametrize("lanes", [4, 8])
@pytest.mark.parametrize("narrow", ["and15", "shr4", "and127", "and255"])
def test_dot4_of_small_operands_computes_the_semantics(lanes: int, narrow: str) -> None:
    """`dot4_u8i8_acc` whose u8 operand is known below 128 (an int4 weight's nibbles) is
    `pmaddubsw` + `pmaddwd` on x86 (codegen/llvm/dot.py): exact, the i16 pair sums cannot
    saturate at the extremes (127 * -128 twice); a full-range operand (`& 255`, where 255 * 127
    twice would saturate) keeps the widening sequence."""
    rng = np.random.default_rng(lanes)
    acc = rng.integers(-2**31, 2**31, (16, lanes)).astype(np.int32)
    raw = rng.integers(0, 256, (16, 4 * lanes)).astype(np.uint8)
    b = rng.integers(-128, 128, (16, 4 * lanes)).astype(np.int8)
    raw[0, :], b[0, :] = 255, -128
    raw[1, :], b[1, :] = 255, 127
    s0 = Var("s0")
    ba, bx, bw = buf("acc", dt.i32, (s0, lanes)), buf("a", dt.u8, (s0, 4 * lanes)), buf("b", dt.i8, (s0, 4 * lanes))
    out = buf("out", dt.i32, (s0, lanes))
    i = Var("i")

    def ramp(n: int) -> ex.Expr:
        return ex.Ramp(ex.Const(0), ex.Const(1), ex.ScalarType(dt.index, n))

    u8 = ex.ScalarType(dt.u8, 4 * lanes)
    a = load(bx, i, ramp(4 * lanes), lanes=4 * lanes)
    op, k = {"and15": ("and", 15), "shr4": ("shr", 4), "and127": ("and", 127), "and255": ("and", 255)}[narrow]
    small = ex.Binary(op, a, ex.const(k, dt.u8, 4 * lanes), u8)
    value = ex.Call(ex.DOT4_U8I8, (load(ba, i, ramp(lanes), lanes=lanes), small, load(bw, i, ramp(4 * lanes), lanes=4 * lanes)),
                    ex.ScalarType(dt.i32, lanes))
    compiled = Compiled(program(loop(i, s0, store(out, (i, ramp(lanes)), value)), [ba, bx, bw], [out], [s0]))
    result = torch.zeros(16, lanes, dtype=torch.int32)
    compiled(torch.from_numpy(acc), torch.from_numpy(raw), torch.from_numpy(b), result, symbols=[16])
    codes = sem.evaluate(op, dt.u8, raw, np.full_like(raw, k))
    np.testing.assert_array_equal(result.numpy(), sem.evaluate(ex.DOT4_U8I8, dt.i32, acc, codes, b))
    from .util import TARGET
    uses_maddubs = "pmadd.ub.sw" in compiled.llvm_ir
    if TARGET.native_dot4(lanes):
        assert not uses_maddubs
    else:
        assert uses_maddubs == (narrow != "and255" and TARGET.small_dot4(lanes))


@pytest.mark.parametrize("lanes", [4, 8, 16])
@pytest.mark.parametrize("clamp", ["none", "b", "a"])
def test_signed_dot4_computes_the_semantics(lanes: int, clamp: str) -> None:
    """`dot4_i8i8_acc` (signed by signed bytes) is exact at the extremes (-128 * -128 four
    times, which `pmaddubsw` would saturate); with one operand clamped above -128
    (`max(x, -127)`) it is `|a| * sign(b, a)` through `pmaddubsw` on x86 without VNNI, else the
    widening sequence."""
    rng = np.random.default_rng(11 * lanes)
    n = 4 * lanes
    acc = rng.integers(-2**31, 2**31, (16, lanes)).astype(np.int32)
    a = rng.integers(-128, 128, (16, n)).astype(np.int8)
    b = rng.integers(-128, 128, (16, n)).astype(np.int8)
    a[0, :], b[0, :] = -128, -128
    a[1, :], b[1, :] = -128, 127
    a[2, :], b[2, :] = 127, -128
    a[3, ::2], b[3, ::2] = 0, -128
    s0 = Var("s0")
    ba, bx, bw = buf("acc", dt.i32, (s0, lanes)), buf("a", dt.i8, (s0, n)), buf("b", dt.i8, (s0, n))
    out = buf("out", dt.i32, (s0, lanes))
    i = Var("i")

    def ramp(k: int) -> ex.Expr:
        return ex.Ramp(ex.Const(0), ex.Const(1), ex.ScalarType(dt.index, k))

    i8 = ex.ScalarType(dt.i8, n)
    xa, xb = load(bx, i, ramp(n), lanes=n), load(bw, i, ramp(n), lanes=n)
    if clamp == "a":
        xa = ex.Binary("max", xa, ex.const(-127, dt.i8, n), i8)
    elif clamp == "b":
        xb = ex.Binary("max", xb, ex.const(-127, dt.i8, n), i8)
    value = ex.Call(ex.DOT4_I8I8, (load(ba, i, ramp(lanes), lanes=lanes), xa, xb), ex.ScalarType(dt.i32, lanes))
    compiled = Compiled(program(loop(i, s0, store(out, (i, ramp(lanes)), value)), [ba, bx, bw], [out], [s0]))
    result = torch.zeros(16, lanes, dtype=torch.int32)
    compiled(torch.from_numpy(acc), torch.from_numpy(a), torch.from_numpy(b), result, symbols=[16])
    ca = np.maximum(a, -127).astype(np.int8) if clamp == "a" else a
    cb = np.maximum(b, -127).astype(np.int8) if clamp == "b" else b
    np.testing.assert_array_equal(result.numpy(), sem.evaluate(ex.DOT4_I8I8, dt.i32, acc, ca, cb))
    from .util import TARGET
    if TARGET.small_dot4(lanes) and not TARGET.native_dot4(lanes):
        assert ("pmadd.ub.sw" in compiled.llvm_ir) == (clamp != "none")


@pytest.mark.parametrize("lanes", [4, 8])
@pytest.mark.parametrize("masks", [(15, 15), (64, 127)])
def test_nested_dot4_of_nibbles_computes_the_semantics(lanes: int, masks: tuple[int, int]) -> None:
    """`dot4(dot4(acc, a & 15, b1), a >> 4, b2)` adds the two `pmaddubsw` results in i16 before
    one `pmaddwd` (bounds 15 + 15 < 128); bounds adding up to 127 or more (63 + 64) keep two
    separate sequences (`>> 1` then `& 127` bounds the second by 127). Both exact at the extremes."""
    rng = np.random.default_rng(7 * lanes)
    n = 4 * lanes
    acc = rng.integers(-2**31, 2**31, (16, lanes)).astype(np.int32)
    raw = rng.integers(0, 256, (16, n)).astype(np.uint8)
    b = rng.integers(-128, 128, (16, 2 * n)).astype(np.int8)
    raw[0, :], b[0, :] = 255, -128
    raw[1, :], b[1, :] = 255, 127
    s0 = Var("s0")
    ba, bx, bw = buf("acc", dt.i32, (s0, lanes)), buf("a", dt.u8, (s0, n)), buf("b", dt.i8, (s0, 2 * n))
    out = buf("out", dt.i32, (s0, lanes))
    i = Var("i")

    def ramp(start: int, k: int) -> ex.Expr:
        return ex.Ramp(ex.Const(start), ex.Const(1), ex.ScalarType(dt.index, k))

    u8 = ex.ScalarType(dt.u8, n)
    a = load(bx, i, ramp(0, n), lanes=n)
    lo = ex.Binary("and", a, ex.const(masks[0], dt.u8, n), u8)
    hi = ex.Binary("and", ex.Binary("shr", a, ex.const(1, dt.u8, n), u8), ex.const(masks[1], dt.u8, n), u8)
    i32 = ex.ScalarType(dt.i32, lanes)
    inner = ex.Call(ex.DOT4_U8I8, (load(ba, i, ramp(0, lanes), lanes=lanes), lo, load(bw, i, ramp(0, n), lanes=n)), i32)
    value = ex.Call(ex.DOT4_U8I8, (inner, hi, load(bw, i, ramp(n, n), lanes=n)), i32)
    compiled = Compiled(program(loop(i, s0, store(out, (i, ramp(0, lanes)), value)), [ba, bx, bw], [out], [s0]))
    result = torch.zeros(16, lanes, dtype=torch.int32)
    compiled(torch.from_numpy(acc), torch.from_numpy(raw), torch.from_numpy(b), result, symbols=[16])
    lo_v = raw & masks[0]
    hi_v = (raw >> 1) & masks[1]
    want = sem.evaluate(ex.DOT4_U8I8, dt.i32, sem.evaluate(ex.DOT4_U8I8, dt.i32, acc, lo_v, b[:, :n]), hi_v, b[:, n:])
    np.testing.assert_array_equal(result.numpy(), want)
    from .util import TARGET
    if TARGET.small_dot4(lanes) and not TARGET.native_dot4(lanes):
        ubsw = len(re.findall(r"call .*pmadd\.ub\.sw", compiled.llvm_ir))
        wd = len(re.findall(r"call .*pmadd\.wd", compiled.llvm_ir))
        assert ubsw > 0 and wd == (ubsw // 2 if masks == (15, 15) else ubsw)
