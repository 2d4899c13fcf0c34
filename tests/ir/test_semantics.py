"""`ir/semantics.py` against PyTorch eager on edge values, op by op and dtype by dtype.

Every op of `SCALAR_OPS` is checked on every dtype it is defined on: integers on overflow,
negative operands, INT_MIN and -1, division by zero; floats on NaN, inf, -0.0, subnormals and
the largest finite values. Exact ops (arithmetic, rounding, comparisons, predicates) must agree
bit for bit (NaN with NaN, the sign of zero included); transcendental functions within a few
ulps, because NumPy/libm and torch's vectorized math are different implementations.
"""
from __future__ import annotations

import doctest
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import semantics as sem
from torchburn.ir.dtypes import DType

TORCH: dict[DType, torch.dtype] = {
    dt.bool_: torch.bool, dt.i8: torch.int8, dt.i16: torch.int16, dt.i32: torch.int32,
    dt.i64: torch.int64, dt.u8: torch.uint8, dt.f16: torch.float16, dt.bf16: torch.bfloat16,
    dt.f32: torch.float32, dt.f64: torch.float64,
}
INTS = (dt.i8, dt.i16, dt.i32, dt.i64, dt.u8)
FLOATS = (dt.f16, dt.bf16, dt.f32, dt.f64)
ALL = (dt.bool_, *INTS, *FLOATS)


def edge_values(d: DType) -> list:
    if d.is_bool:
        return [False, True]
    if d.kind == "u":
        return [0, 1, 2, 3, 7, 100, 127, 128, 200, 254, 255]
    if d.is_int:
        lo, hi = -(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1
        return [0, 1, -1, 2, -2, 3, 7, -7, 100, -100, lo, lo + 1, hi, hi - 1]
    info = torch.finfo(TORCH[d])
    return [0.0, -0.0, 1.0, -1.0, 0.5, -2.5, 1.5, 3.0, -7.0, 1e-3, 100.0, math.pi,
            math.inf, -math.inf, math.nan, info.tiny / 4, -info.tiny / 4, info.max, -info.max]


def as_tensor(values, d: DType) -> torch.Tensor:
    if d.is_float:
        return torch.tensor(values, dtype=torch.float64).to(TORCH[d])
    return torch.tensor(values, dtype=torch.int64 if d.is_int else torch.bool).to(TORCH[d])


def to_numpy(t: torch.Tensor) -> np.ndarray:
    if t.dtype == torch.bfloat16:
        return t.float().numpy()
    return t.numpy()


def assert_exact(ours: np.ndarray, theirs: np.ndarray, zero_sign: bool = True) -> None:
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape
    if ours.dtype.kind != "f":
        np.testing.assert_array_equal(ours, theirs)
        return
    with np.errstate(invalid="ignore"):
        o, t = ours.astype(np.float64), theirs.astype(np.float64)
    np.testing.assert_array_equal(np.isnan(o), np.isnan(t))
    keep = ~np.isnan(o)
    np.testing.assert_array_equal(o[keep], t[keep])
    if zero_sign:
        zeros = keep & (o == 0)
        np.testing.assert_array_equal(np.signbit(o[zeros]), np.signbit(t[zeros]))


#: rtol per dtype for functions computed by different libraries (a few ulps).
ULPS_RTOL = {dt.f16: 2e-3, dt.bf16: 1.6e-2, dt.f32: 4e-6, dt.f64: 1e-13}


def assert_close_ulps(ours: np.ndarray, theirs: np.ndarray, d: DType) -> None:
    o = torch.from_numpy(np.asarray(ours, dtype=np.float64))
    t = torch.from_numpy(np.asarray(theirs, dtype=np.float64))
    torch.testing.assert_close(o, t, rtol=ULPS_RTOL[d], atol=ULPS_RTOL[d] * 1e-3, equal_nan=True)


# ---- what torch calls each op -------------------------------------------------------------

def _div(a, b):
    return torch.div(a, b, rounding_mode=None if a.is_floating_point() else "trunc")


TORCH_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": _div,
    "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "mod": torch.remainder, "remainder": torch.remainder, "fmod": torch.fmod,
    "min": torch.minimum, "max": torch.maximum, "pow": torch.pow, "atan2": torch.atan2,
    "copysign": torch.copysign, "hypot": torch.hypot, "nextafter": torch.nextafter,
    "eq": torch.eq, "ne": torch.ne, "lt": torch.lt, "le": torch.le, "gt": torch.gt, "ge": torch.ge,
    "and": torch.bitwise_and, "or": torch.bitwise_or, "xor": torch.bitwise_xor,
    "shl": torch.bitwise_left_shift, "shr": torch.bitwise_right_shift,
}
TORCH_UNARY = {
    "neg": torch.neg, "not": torch.bitwise_not, "abs": torch.abs, "exp": torch.exp,
    "exp2": torch.exp2, "expm1": torch.expm1, "log": torch.log, "log2": torch.log2,
    "log10": torch.log10, "log1p": torch.log1p, "sqrt": torch.sqrt, "rsqrt": torch.rsqrt,
    "sin": torch.sin, "cos": torch.cos, "tan": torch.tan, "asin": torch.asin, "acos": torch.acos,
    "atan": torch.atan, "sinh": torch.sinh, "cosh": torch.cosh, "tanh": torch.tanh,
    "asinh": torch.asinh, "acosh": torch.acosh, "atanh": torch.atanh, "erf": torch.erf,
    "erfc": torch.erfc, "erfinv": torch.erfinv, "sigmoid": torch.sigmoid, "floor": torch.floor,
    "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc, "sign": torch.sign,
    "reciprocal": torch.reciprocal, "isnan": torch.isnan, "isinf": torch.isinf,
    "isfinite": torch.isfinite, "lgamma": torch.lgamma, "digamma": torch.digamma,
    "signbit": torch.signbit,
}
#: Float ops whose result is exactly determined (IEEE-exact or a fixed formula) and that
#: torch computes exactly. (`sqrt` is IEEE-exact, but torch's vectorized f32 sqrt is not
#: always correctly rounded: `test_sqrt_is_correctly_rounded` checks ours.)
EXACT = {"add", "sub", "mul", "div", "floordiv", "mod", "remainder", "fmod", "min", "max",
         "copysign", "nextafter", "neg", "abs", "floor", "ceil", "round", "trunc", "sign",
         "reciprocal", "isnan", "isinf", "isfinite", "signbit"} | set(ex.COMPARISONS)
#: torch rounds the intermediate quotient of a half `floordiv` to the half; the IR computes
#: it in f32 and rounds once (one ulp apart at most, at quotients with many digits).
EXACT_BUT_HALVES = {"floordiv"}
#: torch's vectorized fmod computes `a - trunc(a / b) * b`, NaN when `a / b` overflows; ours
#: is C's fmod (exact), as the code generators' `frem`. Compared where a / b is finite.
FMOD_LIKE = {"fmod", "mod", "remainder"}
#: Ops where torch.minimum/maximum pick either zero for (0.0, -0.0); ours is IEEE's.
ZERO_SIGN_FREE = {"min", "max"}


def test_scalar_ops_cover_the_ir() -> None:
    assert ex.BINARY_OPS <= sem.SCALAR_OPS and ex.UNARY_FUNCS <= sem.SCALAR_OPS
    assert {"fma", ex.DOT4_U8I8, "cast", "bitcast", "select"} <= sem.SCALAR_OPS
    assert set(TORCH_BINARY) == set(ex.BINARY_OPS)
    assert set(TORCH_UNARY) == set(ex.UNARY_FUNCS)
    for kind, table in sem.TABLES.items():
        assert set(table) <= sem.SCALAR_OPS, kind


def test_doctests() -> None:
    result = doctest.testmod(sem, extraglobs={"dt": dt})
    assert result.attempted > 5 and result.failed == 0


def _torch_in(op: str, fn, args: list[torch.Tensor], d: DType) -> torch.Tensor | None:
    """torch's result, computed in f32 and rounded where torch lacks the op for a half
    (that rounding is the IR's definition for f16/bf16); None where torch has no such op."""
    try:
        return fn(*args)
    except (RuntimeError, NotImplementedError, TypeError):
        if d in (dt.f16, dt.bf16):
            return fn(*(a.float() for a in args)).to(TORCH[d])
        return None


@pytest.mark.parametrize("d", ALL, ids=str)
@pytest.mark.parametrize("op", sorted(ex.BINARY_OPS))
def test_binary_matches_torch(op: str, d: DType) -> None:
    if not sem.defined(op, d):
        with pytest.raises(sem.UndefinedOp):
            sem.evaluate(op, d, np.zeros(1, sem.storage(d)), np.zeros(1, sem.storage(d)))
        return
    values = edge_values(d)
    pairs = list(itertools.product(values, values))
    if d.is_int and op in ("div", "floordiv", "mod", "remainder", "fmod"):
        pairs = [(a, b) for a, b in pairs if b != 0]
        if d.bits >= 32:  # torch traps (SIGFPE) on INT_MIN / -1 in i32/i64: checked below
            pairs = [(a, b) for a, b in pairs if not (a == -(1 << (d.bits - 1)) and b == -1)]
    if d.is_int and op == "pow":
        pairs = [(a, b) for a, b in pairs if b >= 0 or a in (1, -1)]  # torch: integer ** negative
    if d.is_float and op in FMOD_LIKE:
        pairs = [(a, b) for a, b in pairs if not _ratio_overflows(a, b, d)]
    a = as_tensor([p[0] for p in pairs], d)
    b = as_tensor([p[1] for p in pairs], d)
    expected = _torch_in(op, TORCH_BINARY[op], [a, b], d)
    if expected is None:
        pytest.skip(f"torch has no {op} on {d}")
    ours = sem.evaluate(op, d, to_numpy(a), to_numpy(b))
    theirs = to_numpy(expected)
    if not d.is_float or (op in EXACT and not (op in EXACT_BUT_HALVES and d.bits == 16)):
        assert_exact(ours, theirs, zero_sign=op not in ZERO_SIGN_FREE)
    else:
        assert_close_ulps(ours, theirs, d)


def _ratio_overflows(a: float, b: float, d: DType) -> bool:
    if not (math.isfinite(a) and math.isfinite(b)) or b == 0:
        return False
    wide = torch.tensor(a, dtype=TORCH[d]).float() / torch.tensor(b, dtype=TORCH[d]).float()
    return not math.isfinite(torch.tensor(wide.item(), dtype=torch.float64).to(TORCH[d]).item()) \
        or abs(a / b) > float(torch.finfo(TORCH[d]).max) / 2


@pytest.mark.parametrize("d", [dt.f16, dt.bf16, dt.f32], ids=str)
def test_sqrt_is_correctly_rounded(d: DType) -> None:
    """sqrt of the f64 value, rounded once more to the dtype, is the correctly rounded sqrt
    (53 >= 2 * 24 + 2 bits; f64 itself is IEEE)."""
    x = np.abs(to_numpy(as_tensor(edge_values(d) + [0.999, 1e5, 2.0, 3.0, 0.1], d)))
    expected = sem.cast_value(np.sqrt(x.astype(np.float64)), dt.f64, d)
    assert_exact(sem.evaluate("sqrt", d, x), expected)


@pytest.mark.parametrize("d", ALL, ids=str)
@pytest.mark.parametrize("op", sorted(ex.UNARY_FUNCS))
def test_unary_matches_torch(op: str, d: DType) -> None:
    if not sem.defined(op, d):
        with pytest.raises(sem.UndefinedOp):
            sem.evaluate(op, d, np.zeros(1, sem.storage(d)))
        return
    values = edge_values(d)
    if d.is_float:
        values += [-0.3, 0.7, 0.999, -1.0001, 10.0, -10.5, 1e5]
    x = as_tensor(values, d)
    expected = _torch_in(op, TORCH_UNARY[op], [x], d)
    if expected is None:
        pytest.skip(f"torch has no {op} on {d}")
    ours = sem.evaluate(op, d, to_numpy(x))
    theirs = to_numpy(expected)
    if not d.is_float or op in EXACT:
        assert_exact(ours, theirs)
    else:
        assert_close_ulps(ours, theirs, d)


@pytest.mark.parametrize("d", [d for d in ALL if d.is_int or d.is_float], ids=str)
def test_fma_is_rounded_once(d: DType) -> None:
    vals = [v for v in edge_values(d) if not (isinstance(v, float) and not math.isfinite(v))]
    triples = list(itertools.product(vals[:8], vals[:8], vals[:6]))
    if d.is_float:  # a case where a*b + c rounds twice: 1 + 2^-p products
        eps = float(torch.finfo(TORCH[d] if d not in (dt.f16, dt.bf16) else torch.float32).eps)
        triples.append((1 + eps, 1 - eps, -1.0))
    a, b, c = (as_tensor([t[i] for t in triples], d) for i in range(3))
    ours = sem.evaluate("fma", d, to_numpy(a), to_numpy(b), to_numpy(c))
    if d.is_int:
        assert_exact(ours, to_numpy(a * b + c))
        return
    if d in (dt.f16, dt.bf16):  # computed as an f32 fma, then rounded
        wide = sem.evaluate("fma", dt.f32, *(to_numpy(t.float()) for t in (a, b, c)))
        assert_exact(ours, to_numpy(torch.from_numpy(np.asarray(wide)).to(TORCH[d])))
        return
    exact = [_round_exact(Fraction(x) * Fraction(y) + Fraction(z), d)
             for x, y, z in zip(to_numpy(a).tolist(), to_numpy(b).tolist(), to_numpy(c).tolist())]
    assert_exact(np.where(ours == 0, 0.0, ours), np.array(exact, dtype=ours.dtype), zero_sign=False)
    assert ours[-1] == np.asarray(-(eps * eps), dtype=ours.dtype)


def test_fma_overflowing_f64_gives_a_signed_infinity() -> None:
    # found by tests/runtime/test_reference_vs_llvm.py: the exact f64 result too large for a
    # float raised OverflowError inside the golden model instead of rounding to infinity
    a = np.array([7.154037092184149e16, -7.154037092184149e16])
    b = np.full(2, 2.512837313670504e291)
    out = sem.evaluate("fma", dt.f64, a, b, np.zeros(2))
    assert out.tolist() == [math.inf, -math.inf]


def _round_exact(x: Fraction, d: DType) -> float:
    """`x` rounded to nearest even in f32 or f64, by comparing exact distances."""
    f = float(x)
    if d == dt.f64:
        return f
    c = np.float32(f)
    best = None
    for cand in (np.nextafter(c, np.float32(-np.inf)), c, np.nextafter(c, np.float32(np.inf))):
        if not np.isfinite(cand):
            continue
        dist = abs(Fraction(float(cand)) - x)
        even = int(np.asarray(cand).view(np.uint32)) % 2 == 0
        key = (dist, not even)
        if best is None or key < best[0]:
            best = (key, float(cand))
    assert best is not None
    return best[1]


@pytest.mark.parametrize("src", ALL, ids=str)
@pytest.mark.parametrize("dst", ALL, ids=str)
def test_cast_matches_torch(src: DType, dst: DType) -> None:
    values = edge_values(src)
    if src.is_float:
        values += [300.7, -300.7, 1e10, -1e10, 3e9, 65519.0, 65520.0, 2.0 ** 31, -2.0 ** 31,
                   2.0 ** 63, 127.5, -128.9, 255.9]
    elif src.is_int and src.bits == 64:
        values += [(1 << 53) + 1, (1 << 24) + 1, 2049]
    x = as_tensor(values, src)
    ours = sem.cast_value(to_numpy(x), src, dst)
    assert_exact(ours, to_numpy(x.to(TORCH[dst])))


@pytest.mark.parametrize("src,dst", [(a, b) for a in ALL for b in ALL
                                     if a.bits == b.bits and not (a.is_bool and b.is_float)
                                     and not (b.is_bool and a.is_float)], ids=str)
def test_bitcast_matches_torch(src: DType, dst: DType) -> None:
    x = as_tensor(edge_values(src), src)
    ours = sem.bitcast_value(to_numpy(x), src, dst)
    if src.is_bool or dst.is_bool:
        theirs = x.to(TORCH[dst])  # a bool is the byte 0/1: the value converts
    else:
        theirs = x.view(TORCH[dst])
    assert_exact(ours, to_numpy(theirs))


def test_bitcast_rejects_other_widths_and_float_bools() -> None:
    with pytest.raises(sem.UndefinedOp):
        sem.bitcast_value(1.0, dt.f32, dt.i16)
    with pytest.raises(sem.UndefinedOp):
        sem.bitcast_value(True, dt.bool_, dt.f16)  # bool is 8 bits; f16 16: width first


@pytest.mark.parametrize("d", ALL, ids=str)
def test_select_matches_torch(d: DType) -> None:
    values = edge_values(d)
    a = as_tensor(values, d)
    b = as_tensor(values[::-1], d)
    c = torch.tensor([i % 3 == 0 for i in range(len(values))])
    ours = sem.evaluate("select", d, c.numpy(), to_numpy(a), to_numpy(b))
    assert_exact(ours, to_numpy(torch.where(c, a, b)))


def test_dot4_matches_torch() -> None:
    g = torch.Generator().manual_seed(0)
    acc = torch.randint(-2**31, 2**31 - 1, (3, 8), generator=g, dtype=torch.int64).to(torch.int32)
    acc[0, 0] = 2**31 - 1  # the sum wraps
    a = torch.randint(0, 256, (3, 32), generator=g).to(torch.uint8)
    a[0, :4] = 255
    b = torch.randint(-128, 128, (3, 32), generator=g).to(torch.int8)
    b[0, :4] = 127
    expected = (acc.long() + (a.long() * b.long()).reshape(3, 8, 4).sum(-1)).to(torch.int32)
    ours = sem.evaluate(ex.DOT4_U8I8, dt.i32, acc.numpy(), a.numpy(), b.numpy())
    np.testing.assert_array_equal(ours, expected.numpy())
    with pytest.raises(ValueError):
        sem.evaluate(ex.DOT4_U8I8, dt.i32, acc.numpy(), a.numpy()[:, :16], b.numpy()[:, :16])


def test_signed_dot4_matches_torch() -> None:
    g = torch.Generator().manual_seed(1)
    acc = torch.randint(-2**31, 2**31 - 1, (3, 8), generator=g, dtype=torch.int64).to(torch.int32)
    a = torch.randint(-128, 128, (3, 32), generator=g).to(torch.int8)
    b = torch.randint(-128, 128, (3, 32), generator=g).to(torch.int8)
    a[0, :4], b[0, :4] = -128, -128
    expected = (acc.long() + (a.long() * b.long()).reshape(3, 8, 4).sum(-1)).to(torch.int32)
    ours = sem.evaluate(ex.DOT4_I8I8, dt.i32, acc.numpy(), a.numpy(), b.numpy())
    np.testing.assert_array_equal(ours, expected.numpy())


# ---- rules torch cannot show ----------------------------------------------------------------

@pytest.mark.parametrize("d", [d for d in INTS if d.kind == "i"], ids=str)
def test_int_min_by_minus_one_wraps(d: DType) -> None:
    lo = -(1 << (d.bits - 1))
    assert sem.evaluate("floordiv", d, lo, -1) == lo
    assert sem.evaluate("div", d, lo, -1) == lo
    assert sem.evaluate("mod", d, lo, -1) == 0 and sem.evaluate("fmod", d, lo, -1) == 0
    arr = np.array([lo], dtype=sem.storage(d))
    assert sem.evaluate("floordiv", d, arr, np.array([-1], dtype=arr.dtype)).tolist() == [lo]


@pytest.mark.parametrize("d", INTS, ids=str)
@pytest.mark.parametrize("op", ["div", "floordiv", "mod", "remainder", "fmod"])
def test_integer_division_by_zero_raises(op: str, d: DType) -> None:
    with pytest.raises(sem.DivisionByZero):
        sem.evaluate(op, d, 7, 0)
    with pytest.raises(ZeroDivisionError):
        sem.evaluate(op, d, np.array([1, 2], sem.storage(d)), np.array([1, 0], sem.storage(d)))
    with pytest.raises(RuntimeError, match="ZeroDivisionError"):  # torch raises too
        TORCH_BINARY[op](as_tensor([7], d), as_tensor([0], d))


def test_scalar_results_are_python_numbers() -> None:
    assert sem.evaluate("add", dt.i8, 100, 100) == -56
    assert type(sem.evaluate("add", dt.i8, 100, 100)) is int
    assert type(sem.evaluate("lt", dt.f32, 1.0, 2.0)) is bool
    assert type(sem.evaluate("exp", dt.f16, 1.0)) is float
    assert sem.evaluate("exp", dt.f16, 1.0) == float(np.float16(math.e))
    assert sem.evaluate("add", dt.bf16, 1.0, 2.0 ** -9) == 1.0  # ties to even on the f32 bits
    assert sem.evaluate("add", dt.bf16, 1.0 + 2.0 ** -7, 2.0 ** -8) == 1.0 + 2.0 ** -6
    assert sem.evaluate("add", dt.bf16, 1.0 + 2.0 ** -7, 2.0 ** -9) == 1.0 + 2.0 ** -7
    assert isinstance(sem.evaluate("add", dt.i32, np.array([1]), np.array([2])), np.ndarray)


def test_min_max_follow_ieee_on_zeros_and_nan() -> None:
    assert math.copysign(1, sem.evaluate("min", dt.f32, 0.0, -0.0)) == -1
    assert math.copysign(1, sem.evaluate("min", dt.f32, -0.0, 0.0)) == -1
    assert math.copysign(1, sem.evaluate("max", dt.f64, -0.0, 0.0)) == 1
    assert math.isnan(sem.evaluate("max", dt.bf16, 1.0, math.nan))


def test_unknown_op_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="unknown scalar op"):
        sem.evaluate("frobnicate", dt.f32, 1.0)
    with pytest.raises(sem.UndefinedOp, match="exp is not defined on i32"):
        sem.evaluate("exp", dt.i32, 1)


def test_missing_ops() -> None:
    assert sem.missing_ops(sem.SCALAR_OPS) == set()
    assert sem.missing_ops(sem.SCALAR_OPS - {"fma"}) == {"fma"}


# ---- the folders compute what the semantics say --------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from torchburn.passes.loop import simplify# noqa: E402
from torchburn.passes.loop.bounds import Bounds  # noqa: E402


def int_values(d: DType) -> st.SearchStrategy[int]:
    """Values of `d`, edge values favoured, plus some beyond its range (a Const may hold one)."""
    lo, hi = (0, (1 << d.bits) - 1) if d.kind == "u" else (-(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1)
    return st.one_of(st.sampled_from(edge_values(d)), st.integers(lo, hi), st.integers(2 * lo - 5, 2 * hi + 5))


@st.composite
def int_case(draw: st.DrawFn, ops: tuple[str, ...]) -> tuple[str, DType, int, int]:
    d = draw(st.sampled_from(INTS))
    return draw(st.sampled_from(ops)), d, draw(int_values(d)), draw(int_values(d))


_ALL_INT_BINARY = tuple(sorted(ex.BINARY_OPS - {"atan2", "copysign", "hypot", "nextafter"}))


def _array_value(op: str, d: DType, a: int, b: int):
    """The array definition (no Python-int shortcut), as a Python value."""
    return sem.evaluate(op, d, np.array([sem.wrap_int(a, d)], sem.storage(d)),
                        np.array([sem.wrap_int(b, d)], sem.storage(d))).tolist()[0]


@settings(max_examples=400, deadline=None)
@given(int_case(_ALL_INT_BINARY))
def test_python_int_shortcut_equals_array_definition(case) -> None:
    op, d, a, b = case
    try:
        expected = _array_value(op, d, a, b)
    except sem.DivisionByZero:
        with pytest.raises(sem.DivisionByZero):
            sem.evaluate(op, d, a, b)
        return
    assert sem.evaluate(op, d, a, b) == expected


@settings(max_examples=400, deadline=None)
@given(int_case(tuple(sorted(ex.FOLDED_INT_OPS))))
def test_expr_folding_agrees_with_semantics(case) -> None:
    op, d, a, b = case
    folded = ex.binary(op, ex.const(a, d), ex.const(b, d))
    try:
        expected = _array_value(op, d, a, b)
    except sem.DivisionByZero:
        assert isinstance(folded, ex.Binary)  # not folded
        return
    assert isinstance(folded, ex.Const) and folded.type.dtype == d
    assert folded.value == expected


def test_expr_and_simplify_agree_on_the_known_case() -> None:
    folded = ex.add(ex.const(100, dt.i8), ex.const(100, dt.i8))
    assert folded == ex.const(-56, dt.i8)
    node = ex.Binary("add", ex.const(100, dt.i8), ex.const(100, dt.i8), ex.ScalarType(dt.i8))
    assert simplify.simplify_expr(node) == ex.const(-56, dt.i8)


@settings(max_examples=400, deadline=None)
@given(int_case(_ALL_INT_BINARY))
def test_simplify_folding_agrees_with_semantics(case) -> None:
    op, d, a, b = case
    t = ex.ScalarType(dt.bool_) if op in ex.COMPARISONS else ex.ScalarType(d)
    node = ex.Binary(op, ex.const(a, d), ex.const(b, d), t)
    folded = simplify.fold_constants(node, Bounds())
    try:
        expected = _array_value(op, d, a, b)
    except sem.DivisionByZero:
        assert folded is None
        return
    assert folded == ex.Const(expected, t)


@st.composite
def float_case(draw: st.DrawFn) -> tuple[str, DType, float, float]:
    d = draw(st.sampled_from(FLOATS))
    values = st.one_of(st.sampled_from(edge_values(d)), st.floats(allow_nan=True, allow_infinity=True))
    op = draw(st.sampled_from(sorted(simplify.EXACT_FLOAT_OPS)))
    return op, d, draw(values), draw(values)


@settings(max_examples=400, deadline=None)
@given(float_case())
def test_simplify_float_folding_agrees_with_semantics(case) -> None:
    op, d, a, b = case
    t = ex.ScalarType(dt.bool_) if op in ex.COMPARISONS else ex.ScalarType(d)
    node = ex.Binary(op, ex.const(a, d), ex.const(b, d), t)
    folded = simplify.fold_constants(node, Bounds())
    expected = sem.evaluate(op, d, np.array([a]), np.array([b]))
    assert isinstance(folded, ex.Const)
    assert_exact(np.array([folded.value]), np.asarray(expected).astype(np.float64)
                 if d.is_float and op not in ex.COMPARISONS else np.asarray(expected))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(ALL), st.sampled_from(ALL), st.data())
def test_cast_folding_agrees_with_semantics(src: DType, dst: DType, data) -> None:
    if src.is_float:
        v = data.draw(st.one_of(st.sampled_from(edge_values(src)), st.floats(-1e12, 1e12)))
    elif src.is_int:
        v = data.draw(int_values(src))
    else:
        v = data.draw(st.booleans())
    c = ex.const(sem.to_array(v, src).item(), src)  # a value of src (a Const may hold more)
    by_expr = ex.cast(c, dst)
    by_simplify = simplify.fold_cast(ex.Cast(c, ex.ScalarType(dst)), Bounds())
    if src.is_float and dst.is_int:  # left to the target where targets may differ
        assert isinstance(by_expr, ex.Cast)
        assert (by_simplify is None) == (not sem.float_fits_int(c.value, dst))
    for folded in (by_expr, by_simplify):
        if folded is None or isinstance(folded, ex.Cast):
            continue
        assert isinstance(folded, ex.Const) and folded.type.dtype == dst
        expected = sem.cast_value(c.value, src, dst)
        assert_exact(np.array([folded.value]), np.array([expected]))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["add", "sub", "mul", "floordiv", "mod", "min", "max"]),
       st.integers(-10**6, 10**6), st.integers(-10**6, 10**6))
def test_evaluate_index_is_the_semantics(op: str, a: int, b: int) -> None:
    e = ex.Binary(op, ex.Var("s0"), ex.Var("s1"), ex.INDEX)
    try:
        expected = sem.evaluate(op, dt.index, a, b)
    except sem.DivisionByZero:
        with pytest.raises(ZeroDivisionError):
            ex.evaluate_index(e, {"s0": a, "s1": b})
        return
    assert ex.evaluate_index(e, {"s0": a, "s1": b}) == expected
    narrow = ex.Cast(e, ex.ScalarType(dt.i8))
    assert ex.evaluate_index(narrow, {"s0": a, "s1": b}) == sem.wrap_int(expected, dt.i8)
