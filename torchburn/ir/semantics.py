"""The meaning of every scalar operation of the IR, defined once, over NumPy.

Constant folding (`expr.py`, `passes/loop/simplify.py`), index evaluation, the bounds analysis, the
launcher's size expressions and the reference interpreter all compute through `evaluate` and
`cast_value`; the code generators (LLVM, WGSL) implement the same operations and are tested
against this module (`tests/codegen/test_semantics_agreement.py`). `SCALAR_OPS` lists the
operations every interpretation must cover; an interpretation registers what its tables handle
(`register_interpretation`) and `tests/codegen/test_handler_coverage.py` fails if one lacks an
(op, dtype) that `defined` says means something.

Values. An operation is applied for one operand dtype to NumPy arrays or Python scalars; the
result is an array for array inputs and a Python `int`/`float`/`bool` for scalar inputs (so
constant folding can use it). Arrays hold each dtype in its NumPy type (`storage`), except
bf16, which NumPy lacks: its values are f32 arrays holding bf16-representable numbers.
Inputs are first brought to the dtype (integers wrap, floats round), so `Const(200, i8)`
means -56.

Integers (i8, i16, i32, i64 = index, u8) wrap two's complement: `add(100, 100)` on i8 is -56.
`floordiv` and `mod` round toward -inf (Python: `-7 // 2 == -4`, `-7 % 2 == 1`); `div`
truncates (`-7 / 2 == -3`) and `fmod` is C's `%` (`-7 fmod 2 == -1`). Division or remainder by
zero raises `DivisionByZero` (torch raises too; a folder then leaves the expression alone).
`INT_MIN // -1` wraps to INT_MIN and `INT_MIN % -1` is 0, PyTorch eager's values (eager's
truncating `div` traps with SIGFPE on i32/i64 there; the generated code gives the wrapped
value, and never executes a division by 0 or -1: `codegen/llvm/faults.py`). Shifts by the bit width or more (or by a negative amount, read
unsigned) give 0, and `>>` of a negative signed value -1, as torch does.

Floats follow IEEE 754: NaN, inf and -0.0 come out as IEEE (and `numpy`) say. f16 and bf16
are computed in f32 and rounded back to nearest even (exact for + - * / sqrt; what torch and
the code generators do for everything else). `min`/`max` propagate NaN and order -0.0 below
+0.0 (IEEE 754-2019 `minimum`/`maximum`, LLVM's `llvm.minimum`; torch.minimum also propagates
NaN but returns either zero for `min(0.0, -0.0)`). Comparisons are false on NaN except `ne`. `nextafter` on the halves steps in their own
precision.

Casts (`cast_value`): integers wrap; anything -> bool is `x != 0`; float -> int truncates, and
out of range gives INT_MIN in i32/i64 (x86, and torch there) while 8/16-bit targets go through
i32 and wrap (`300.7 -> u8` is 44); every conversion into f16/bf16 goes through f32.

    >>> evaluate("add", dt.i8, 100, 100)
    -56
    >>> evaluate("floordiv", dt.i64, -7, 2), evaluate("div", dt.i64, -7, 2)
    (-4, -3)
    >>> evaluate("min", dt.f32, float("nan"), 1.0)
    nan
    >>> cast_value(300.7, dt.f32, dt.u8)
    44
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from . import dtypes as dt
from .dtypes import DType
from .opnames import (CHECKED_INDEX, COMPARISONS, DOT4_CALLS, DOT4_U8I8, OTHER_CALLS, PREDICATES, SCALAR_OPS,
                      TILE_DOT_CALLS, TILE_DOT_U8I8, TILE_ROWS)


class DivisionByZero(ZeroDivisionError):
    """Integer division or remainder by zero: undefined in the IR; callers decide."""


class IndexOutOfRange(IndexError):
    """`checked_index(i, n)` with `i` outside `[0, n)`: a fault; callers decide (the reference
    engine counts it as native code does, and the launcher raises eager's error)."""


def _checked_index(i: np.ndarray, n: np.ndarray) -> np.ndarray:
    """`checked_index(i, n)`: `i`, where every `0 <= i < n`; raises `IndexOutOfRange` otherwise."""
    if np.any((i < 0) | (i >= n)):
        raise IndexOutOfRange("an index read from a tensor is out of range")
    return i


class UndefinedOp(TypeError):
    """The operation has no meaning on this dtype (`exp` of an integer, `sub` of bools)."""


_STORAGE: dict[DType, type] = {
    dt.bool_: np.bool_, dt.i8: np.int8, dt.i16: np.int16, dt.i32: np.int32, dt.i64: np.int64,
    dt.u8: np.uint8, dt.f16: np.float16, dt.bf16: np.float32, dt.f32: np.float32, dt.f64: np.float64,
}
_UNSIGNED_OF: dict[int, type] = {8: np.uint8, 16: np.uint16, 32: np.uint32, 64: np.uint64}

Fn = Callable[..., np.ndarray]


def storage(dtype: DType) -> np.dtype:
    """The NumPy dtype arrays of `dtype` are held in (bf16: f32 holding bf16 values)."""
    return np.dtype(_STORAGE[dtype])


def _kind(dtype: DType) -> str:
    return dtype.kind  # "f", "i", "u", "b"


# ---- bringing values to a dtype -----------------------------------------------------------------

#: The range of each integer dtype, by name (a str hashes faster than a DType).
_INT_RANGE: dict[str, tuple[int, int]] = {
    d.name: ((0, (1 << d.bits) - 1) if d.kind == "u" else (-(1 << (d.bits - 1)), (1 << (d.bits - 1)) - 1))
    for d in dt.ALL_DTYPES if d.is_int
}


def wrap_int(value: int, dtype: DType) -> int:
    """A Python int reduced to `dtype`'s range, two's complement (`wrap_int(200, i8) == -56`)."""
    lo, hi = _INT_RANGE[dtype.name]
    if lo <= value <= hi:
        return value
    bits = dtype.bits
    mask = (1 << bits) - 1
    v = value & mask
    if dtype.kind == "i" and v >> (bits - 1):
        v -= 1 << bits
    return v


def round_bf16(x: np.ndarray) -> np.ndarray:
    """f32 values rounded to bf16 (nearest even on the f32 bits; NaN -> the quiet NaN 0x7FC0),
    exactly as `codegen/llvm/halfconv.py` and torch do. Returns f32."""
    f = np.asarray(x, dtype=np.float32)
    bits = f.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF
    top = np.where(np.isnan(f), 0x7FC0, rounded).astype(np.uint32)
    return (top << np.uint32(16)).view(np.float32)


def _round_float(x: np.ndarray, dtype: DType) -> np.ndarray:
    """A float array of any width rounded to `dtype` (f64 reaches the halves through f32)."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to inf is the rounding
        if dtype == dt.f64:
            return x.astype(np.float64)
        f = x.astype(np.float32)
        if dtype == dt.f16:
            return f.astype(np.float16)
        if dtype == dt.bf16:
            return round_bf16(f)
        return f


def to_array(value: Any, dtype: DType) -> np.ndarray:
    """`value` (array or scalar) as an array of `dtype`'s storage: ints wrap, floats round."""
    if isinstance(value, int) and not isinstance(value, bool) and dtype.is_int:
        value = wrap_int(value, dtype)
    a = np.asarray(value)
    if dtype.is_bool:
        return a.astype(np.bool_)
    if dtype.is_int:
        if a.dtype.kind not in "iub":
            raise TypeError(f"a {a.dtype} value is not an integer of {dtype}; cast it first")
        return a.astype(_STORAGE[dtype])
    if a.dtype.kind in "iub":  # as cast_value: integers reach f32 and the halves through f32
        a = a.astype(np.float64 if dtype == dt.f64 else np.float32)
    if dtype == dt.bf16 and a.dtype == np.float32:  # values already bf16 keep their bits (-NaN)
        exact = (np.ascontiguousarray(a).view(np.uint32) & 0xFFFF) == 0
        return np.where(exact, a, round_bf16(a))
    return _round_float(a, dtype)


def _compute(a: np.ndarray, dtype: DType) -> np.ndarray:
    """Operands of the halves are computed on in f32."""
    return a.astype(np.float32) if dtype == dt.f16 else a


def _finish(r: np.ndarray, dtype: DType) -> np.ndarray:
    r = np.asarray(r)
    if r.dtype == np.bool_ and not dtype.is_bool:
        return r  # a comparison or predicate
    if dtype.is_float:
        return _round_float(r, dtype)
    return r.astype(_STORAGE[dtype])


# ---- integer operations -------------------------------------------------------------------------

def _nonzero_divisor(b: np.ndarray) -> None:
    if np.any(b == 0):
        raise DivisionByZero("integer division or remainder by zero")


def _int_floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _nonzero_divisor(b)
    return np.floor_divide(a, b)  # NumPy wraps INT_MIN // -1 to INT_MIN


def _int_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _nonzero_divisor(b)
    return np.remainder(a, b)


def _int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Truncating division: the floor quotient moved toward zero where signs differ."""
    q = _int_floordiv(a, b)
    r = a - q * b
    return q + ((r != 0) & ((a < 0) != (b < 0))).astype(q.dtype)


def _int_fmod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    _nonzero_divisor(b)
    return np.fmod(a, b)


def _shift_amount(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(amount clamped into range, whether it was out of range read as unsigned)."""
    bits = a.dtype.itemsize * 8
    too_far = b.astype(_UNSIGNED_OF[b.dtype.itemsize * 8]) >= bits
    return np.where(too_far, 0, b).astype(a.dtype), too_far


def _shl(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    amount, too_far = _shift_amount(a, b)
    return np.where(too_far, 0, np.left_shift(a, amount)).astype(a.dtype)


def _shr(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Arithmetic for signed operands (all sign bits past the width), logical for unsigned."""
    amount, too_far = _shift_amount(a, b)
    shifted = np.right_shift(a, amount)
    past = np.where(a < 0, -1, 0) if a.dtype.kind == "i" else 0
    return np.where(too_far, past, shifted).astype(a.dtype)


def _int_pow(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Repeated squaring, wrapping; a negative exponent gives 0, except base 1 (1) and base
    -1 (+-1 by the exponent's parity), as torch and `codegen/llvm/helpers.ipow`."""
    a, b = np.broadcast_arrays(a, b)
    bits = a.dtype.itemsize * 8
    e = b.astype(_UNSIGNED_OF[bits]).copy()
    acc = np.ones_like(a)
    sq = a.copy()
    for _ in range(bits):
        acc = np.where(e & 1, acc * sq, acc)
        sq = sq * sq
        e = e >> 1
    if a.dtype.kind == "i":
        odd = (b & 1) != 0
        negative = np.where(a == 1, 1, np.where(a == -1, np.where(odd, -1, 1), 0))
        acc = np.where(b < 0, negative, acc)
    return acc.astype(a.dtype)


def _int_sign(x: np.ndarray) -> np.ndarray:
    return (x > 0).astype(x.dtype) - (x < 0).astype(x.dtype)


def _identity(x: np.ndarray) -> np.ndarray:
    return x


def _false(x: np.ndarray) -> np.ndarray:
    return np.zeros(np.shape(x), dtype=np.bool_)


def _true(x: np.ndarray) -> np.ndarray:
    return np.ones(np.shape(x), dtype=np.bool_)


_COMPARE: dict[str, Fn] = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal,
    "gt": np.greater, "ge": np.greater_equal,
}
_INT_COMMON: dict[str, Fn] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply,
    "and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor,
    "shl": _shl, "shr": _shr, "min": np.minimum, "max": np.maximum, "pow": _int_pow,
    "div": _int_div, "floordiv": _int_floordiv, "mod": _int_mod, "remainder": _int_mod,
    "fmod": _int_fmod,
    **_COMPARE,
    "not": np.invert, "neg": np.negative, "abs": np.abs, "sign": _int_sign,
    "floor": _identity, "ceil": _identity, "round": _identity, "trunc": _identity,
    "isnan": _false, "isinf": _false, "isfinite": _true, "signbit": lambda x: x < 0,
    "fma": lambda a, b, c: a * b + c,
}
#: Integer operations (u8 uses the same functions: NumPy's unsigned arithmetic is the unsigned
#: meaning, so `floordiv` is `div` and `abs` the identity). Examples on i8: `add(100, 100) = -56`,
#: `floordiv(-7, 2) = -4`, `div(-7, 2) = -3`, `mod(-7, 2) = 1`, `fmod(-7, 2) = -1`,
#: `shl(1, 8) = 0`, `shr(-8, 9) = -1`, `abs(-128) = -128`, `pow(2, -1) = 0`, `pow(-1, -3) = -1`;
#: on u8: `sub(0, 1) = 255`, `not(0) = 255`.
SIGNED: dict[str, Fn] = dict(_INT_COMMON)
UNSIGNED: dict[str, Fn] = dict(_INT_COMMON)

#: Bools are 0/1: `add` is or, `mul` and, `min` and, `max` or (torch's bool arithmetic).
BOOL: dict[str, Fn] = {
    "and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor,
    "add": np.logical_or, "mul": np.logical_and, "min": np.logical_and, "max": np.logical_or,
    **_COMPARE,
    "not": np.logical_not, "abs": _identity, "sign": _identity,
    "floor": _identity, "ceil": _identity, "round": _identity, "trunc": _identity,
    "isnan": _false, "isinf": _false, "isfinite": _true, "signbit": _false,
}


# ---- float operations ---------------------------------------------------------------------------

def _float_floordiv(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch's div_floor_floating: floor((a - fmod(a, b)) / b), corrected for rounding; a zero
    quotient keeps the sign of a / b; b == 0 gives a / b (inf or NaN). As `codegen/llvm/binary`."""
    mod = np.fmod(a, b)
    div = (a - mod) / b
    signs_differ = (b < 0) != (mod < 0)
    div = np.where(~(mod == 0) & signs_differ, div - 1, div)  # ~(==): NaN counts as nonzero
    floor = np.floor(div)
    floor = np.where(div - floor > 0.5, floor + 1, floor)
    zero = np.copysign(np.zeros_like(a), a / b)
    result = np.where(~(div == 0), floor, zero)
    return np.where(b == 0, a / b, result)


def _float_mod(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """torch.remainder: C fmod, plus the divisor where the signs of remainder and divisor differ."""
    mod = np.fmod(a, b)
    return np.where((mod != 0) & ~np.isnan(mod) & ((b < 0) != (mod < 0)), mod + b, mod)


def _minimum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE minimum: NaN propagates, -0.0 < +0.0."""
    r = np.minimum(a, b)
    zeros = (a == 0) & (b == 0)
    return np.where(zeros, np.where(np.signbit(a) | np.signbit(b), -0.0, 0.0).astype(r.dtype), r)


def _maximum(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IEEE maximum: NaN propagates, +0.0 > -0.0."""
    r = np.maximum(a, b)
    zeros = (a == 0) & (b == 0)
    return np.where(zeros, np.where(np.signbit(a) & np.signbit(b), -0.0, 0.0).astype(r.dtype), r)


def _half_nextafter(dtype: DType, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """nextafter in f16/bf16's own precision, as torch (the next f16 after 0 is 2**-24): a
    step of one on the 16-bit pattern, not an f32 step rounded back."""
    a, b = np.broadcast_arrays(a, b)
    u = _bits_of(np.ascontiguousarray(a), dtype).astype(np.int32)
    away = (a < b) == (a > 0)  # the step grows the magnitude
    stepped = _from_bits(np.where(away, u + 1, u - 1).astype(np.uint16), dtype)
    tiny = _from_bits(np.where(b < 0, 0x8001, 0x0001).astype(np.uint16), dtype)
    r = np.where(a == 0, tiny, stepped)
    r = np.where(a == b, b, r)
    return np.where(np.isnan(a) | np.isnan(b), np.float32(math.nan), r)


#: Ops that f16/bf16 compute in their own precision instead of f32: `fn(dtype, *args)`.
HALF_OWN_PRECISION: dict[str, Callable[..., np.ndarray]] = {"nextafter": _half_nextafter}


def _one(x: np.ndarray) -> np.ndarray:
    return np.ones_like(x)


def _float_sign(x: np.ndarray) -> np.ndarray:
    """1 for x > 0, -1 for x < 0, else +0 (NaN and both zeros give 0, as torch.sign)."""
    return np.where(x > 0, 1.0, np.where(x < 0, -1.0, 0.0)).astype(x.dtype)


def _via_f64(fn: Callable[[float], float]) -> Fn:
    """A Python `math` function applied element by element in f64 (C libm), rounded back."""
    vec = np.vectorize(fn, otypes=[np.float64])

    def apply(x: np.ndarray) -> np.ndarray:
        return vec(x.astype(np.float64)).astype(x.dtype) if x.size else x.copy()
    return apply


def _lgamma(x: float) -> float:
    try:
        return math.lgamma(x)
    except (ValueError, OverflowError):  # the poles 0, -1, -2, ...; huge x
        return math.inf


# erfinv: torch's `calc_erfinv` rational approximations (central and tail regions), refined
# by two Newton steps; shared with `codegen/llvm/helpers.py`.
ERFINV_A = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
ERFINV_B = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
ERFINV_C = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
ERFINV_D = (3.543889200, 1.637067800)
ERFINV_CENTRAL = 0.7
# digamma: asymptotic series coefficients and digamma(10) (torch's `calc_digamma`).
DIGAMMA_A = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
             -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
             8.33333333333333333333e-2)
PSI_10 = 2.25175258906672110764

_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _horner(x: np.ndarray, coeffs: Iterable[float]) -> np.ndarray:
    acc = np.zeros_like(x)
    for c in coeffs:
        acc = acc * x + c
    return acc


def _erfinv(x: np.ndarray) -> np.ndarray:
    """Inverse error function, computed in f64 as `helpers.erfinv_f64`: +-1 -> +-inf, |y| > 1 -> NaN."""
    y = x.astype(np.float64)
    ay = np.abs(y)
    z = y * y
    central = y * _horner(z, ERFINV_A[::-1]) / (_horner(z, ERFINV_B[::-1]) * z + 1.0)
    with np.errstate(all="ignore"):
        zt = np.sqrt(-np.log((1.0 - ay) * 0.5))
    tail = np.copysign(_horner(zt, ERFINV_C[::-1]) / (_horner(zt, ERFINV_D[::-1]) * zt + 1.0), y)
    r = np.where(ay <= ERFINV_CENTRAL, central, tail)
    for _ in range(2):
        r = r - (_erf64(r) - y) / (2.0 / math.sqrt(math.pi) * np.exp(-r * r))
    r = np.where(ay == 1.0, np.copysign(math.inf, y), r)
    r = np.where(ay > 1.0, math.nan, r)
    return r.astype(x.dtype)


def _digamma(x: np.ndarray) -> np.ndarray:
    """digamma as `helpers.digamma_f64`: 0 -> -+inf, negative integers -> NaN, reflection for
    x < 0, recurrence up to x >= 10, then the asymptotic series."""
    v = x.astype(np.float64)
    negative = v < 0
    trunc = np.trunc(v)
    with np.errstate(all="ignore"):
        reflect = -(math.pi / np.tan(math.pi * (v - trunc)))
    xv = np.where(negative, 1.0 - v, v)
    acc = np.where(negative, reflect, 0.0)
    while True:
        step = xv < 10.0
        if not step.any():
            break
        with np.errstate(all="ignore"):
            acc = np.where(step, acc - 1.0 / xv, acc)
        xv = np.where(step, xv + 1.0, xv)
    with np.errstate(all="ignore"):
        zz = 1.0 / (xv * xv)
        poly = np.where(xv < 1.0e17, zz * _horner(zz, DIGAMMA_A), 0.0)
        series = acc + np.log(xv) - 0.5 / xv - poly
    r = np.where(xv == 10.0, acc + PSI_10, series)
    r = np.where(negative & (v == trunc), math.nan, r)
    r = np.where(v == 0, np.copysign(math.inf, -v), r)
    return r.astype(x.dtype)


def _fma_exact(a: float, b: float, c: float) -> float:
    if not all(math.isfinite(v) for v in (a, b, c)):
        return a * b + c
    exact = Fraction(a) * Fraction(b) + Fraction(c)
    if exact == 0:
        return a * b + c  # the sign of an exact zero follows IEEE's rule for the sum
    try:
        return float(exact)  # correctly rounded
    except OverflowError:
        return math.inf if exact > 0 else -math.inf  # (copysign would take float(exact) again)


_fma64 = np.vectorize(_fma_exact, otypes=[np.float64])


def _float_fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """a * b + c rounded once. f32: the product is exact in f64 and the f64 sum is rounded to
    odd, after which rounding to f32 is correct; f64: exact rationals."""
    if a.dtype == np.float64:
        a, b, c = np.broadcast_arrays(a, b, c)
        return _fma64(a, b, c) if a.size else a.copy()
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    err = (p - (s - bb)) + (c64 - bb)  # TwoSum: s + err == p + c exactly (when finite)
    odd = (s.view(np.uint64) & 1).astype(bool)
    inexact = np.isfinite(s) & (err != 0) & ~odd
    s = np.where(inexact, np.nextafter(s, np.where(err > 0, math.inf, -math.inf)), s)
    return s.astype(a.dtype)


#: Float operations, IEEE in the operand's precision (f16/bf16: in f32, rounded once).
#: Examples on f32: `div(1, -0.0) = -inf`, `floordiv(-0.0, 5) = -0.0`, `mod(-1, 3) = 2`,
#: `fmod(-1, 3) = -1`, `min(nan, 1) = nan`, `min(0.0, -0.0) = -0.0`, `ne(nan, nan) = true`,
#: `sign(nan) = 0`, `round(2.5) = 2` (half to even), `pow(nan, 0) = 1`, `rsqrt(0) = inf`.
FLOAT: dict[str, Fn] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide,
    "floordiv": _float_floordiv, "mod": _float_mod, "remainder": _float_mod, "fmod": np.fmod,
    "min": _minimum, "max": _maximum, "pow": np.power, "atan2": np.arctan2,
    "copysign": np.copysign, "hypot": np.hypot, "nextafter": np.nextafter,
    **_COMPARE,
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt,
    "rsqrt": lambda x: _one(x) / np.sqrt(x), "reciprocal": lambda x: _one(x) / x,
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos,
    "atan": np.arctan, "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh,
    "acosh": np.arccosh, "atanh": np.arctanh,
    "erf": _via_f64(math.erf), "erfc": _via_f64(math.erfc), "lgamma": _via_f64(_lgamma),
    "erfinv": _erfinv, "digamma": _digamma,
    "sigmoid": lambda x: _one(x) / (_one(x) + np.exp(-x)),
    "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc, "sign": _float_sign,
    "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "signbit": np.signbit,
    "fma": _float_fma,
}

#: The definitions, by dtype kind ("f", "i", "u", "b"). `cast`, `bitcast`, `select` and
#: the byte dot products (`dot4_u8i8_acc`, `dot4_i8i8_acc`) are defined below for every kind
#: they apply to.
TABLES: dict[str, Mapping[str, Fn]] = {"f": FLOAT, "i": SIGNED, "u": UNSIGNED, "b": BOOL}


def defined(op: str, dtype: DType) -> bool:
    """Whether `op` means something on operands of `dtype`."""
    if op in ("cast", "select"):
        return True
    if op == "bitcast":
        return True
    if op in DOT4_CALLS or op in TILE_DOT_CALLS:
        return dtype == dt.i32
    if op == CHECKED_INDEX:
        return dtype == dt.i64
    return op in TABLES[_kind(dtype)]


# ---- casts --------------------------------------------------------------------------------------

_INT_LIMIT: dict[int, tuple[float, float]] = {b: (-2.0 ** (b - 1), 2.0 ** (b - 1)) for b in (32, 64)}


def _float_to_int(x: np.ndarray, dst: DType) -> np.ndarray:
    """Truncate toward zero. Into i32/i64 a value out of range (or NaN) gives INT_MIN, the x86
    `cvttss2si` "integer indefinite" that LLVM's fptosi produces there; into 8/16-bit types
    (u8 included) it converts to i32 first and wraps, as torch does (`-1.0 -> u8` is 255,
    `300.0 -> u8` is 44, `1e10 -> i16` is 0 (INT_MIN wrapped), NaN -> 0)."""
    bits = 32 if dst.bits < 32 else dst.bits
    lo, hi = _INT_LIMIT[bits]
    t = np.trunc(x.astype(np.float64))
    ok = (t >= lo) & (t < hi)
    wide = np.where(ok, t, 0).astype(np.int64)
    wide = np.where(ok, wide, np.iinfo(np.int64).min if bits == 64 else np.iinfo(np.int32).min)
    return wide.astype(_STORAGE[dst])


def float_fits_int(value: float, dst: DType) -> bool:
    """Whether converting the float `value` to integer `dst` is the same on every target: the
    truncated value fits in `dst` (8/16-bit: in i32, after which the wrap is defined). Out of
    range, x86 gives INT_MIN (what `cast_value` and torch give here) but AArch64 saturates, so
    constant folders leave such casts to the target."""
    if not math.isfinite(value):
        return False
    lo, hi = _INT_LIMIT[32 if dst.bits < 32 else dst.bits]
    return lo <= math.trunc(value) < hi


def cast_value(value: Any, src: DType, dst: DType) -> Any:
    """Convert `value` of `src` to `dst` (the IR's `cast<dst>(x)`), as `codegen/llvm/casts.py`:

    - int -> int wraps (sign- or zero-extends by the source's signedness); bool -> 0/1;
    - anything -> bool is `x != 0` (NaN is true);
    - float -> int truncates toward zero; out of range and NaN: see `_float_to_int`;
    - int -> float rounds to nearest; every conversion into f16/bf16 goes through f32 (as torch).

        >>> cast_value(-1, dt.i8, dt.u8), cast_value(255, dt.u8, dt.i8)
        (255, -1)
        >>> cast_value(float("nan"), dt.f32, dt.i32), cast_value(-2.7, dt.f64, dt.i64)
        (-2147483648, -2)
    """
    scalar = np.ndim(value) == 0 and not isinstance(value, np.ndarray)
    x = to_array(value, src)
    with np.errstate(all="ignore"):
        if src == dst:
            r = x
        elif dst.is_bool:
            r = x != 0
        elif dst.is_int:
            r = _float_to_int(_compute(x, src), dst) if src.is_float else x.astype(_STORAGE[dst])
        else:
            r = _round_float(x.astype(np.float32) if src.is_int and dst.bits == 16 else x, dst)
    return r.item() if scalar else r


def _bits_of(x: np.ndarray, dtype: DType) -> np.ndarray:
    """The raw bits as an unsigned array of the dtype's width."""
    if dtype == dt.bf16:
        return (x.astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return x.view(_UNSIGNED_OF[dtype.bits])


def _from_bits(u: np.ndarray, dtype: DType) -> np.ndarray:
    if dtype == dt.bf16:
        return (u.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return u.view(_STORAGE[dtype])


def bitcast_value(value: Any, src: DType, dst: DType) -> Any:
    """Reinterpret the bits (`bitcast<dst>(x)`, same width). A bool is the byte 0/1, so bool <->
    i8/u8 converts the value; bool <-> float is undefined.

        >>> bitcast_value(1.0, dt.f32, dt.i32), bitcast_value(-1, dt.i8, dt.u8)
        (1065353216, 255)
    """
    if src.bits != dst.bits:
        raise UndefinedOp(f"bitcast from {src} to {dst} changes the width")
    if src.is_bool or dst.is_bool:
        if src.is_float or dst.is_float:
            raise UndefinedOp(f"bitcast between {src} and {dst} is not defined")
        return cast_value(value, src, dst)
    scalar = np.ndim(value) == 0 and not isinstance(value, np.ndarray)
    x = np.ascontiguousarray(to_array(value, src))
    r = _from_bits(_bits_of(x, src), dst)
    return r.item() if scalar else r


def bitcast_lanes_value(value: Any, src: DType, lanes_in: int, dst: DType, lanes_out: int) -> Any:
    """`bitcast<dst, lanes_out>(x)` for an `x` of `lanes_in` lanes of `src` (the last axis of an
    array when `lanes_in` > 1): the same bytes, lane 0 lowest, regrouped.

        >>> bitcast_lanes_value(np.array([1, 256], np.int32), dt.i32, 2, dt.u8, 8).tolist()
        [1, 0, 0, 0, 0, 1, 0, 0]
    """
    if lanes_in * src.bits != lanes_out * dst.bits or src.is_bool or dst.is_bool:
        raise UndefinedOp(f"bitcast from {src} x {lanes_in} to {dst} x {lanes_out} changes the width")
    x = np.ascontiguousarray(to_array(value, src))
    if lanes_in == 1:
        x = (x.reshape(()) if np.ndim(value) == 0 else x)[..., None]
    raw = np.ascontiguousarray(_bits_of(x, src).astype(np.dtype(_UNSIGNED_OF[src.bits]).newbyteorder("<")))
    regrouped = raw.view(np.uint8).reshape(*x.shape[:-1], lanes_out * dst.bits // 8)
    wide = np.ascontiguousarray(regrouped).view(np.dtype(_UNSIGNED_OF[dst.bits]).newbyteorder("<"))
    out = _from_bits(wide.astype(_UNSIGNED_OF[dst.bits]), dst)
    return out[..., 0] if lanes_out == 1 else out


# ---- the entry point ----------------------------------------------------------------------------

def _tile_dot(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """`tile_dot_u8i8` / `tile_dot_i8i8` over the last axis: acc `(..., 256)` i32, a and b
    `(..., 16K)`: `acc[16 i + j] + sum(a[K i + k] * b[64 (k // 4) + 4 j + k % 4] for k < K)`,
    the products exact, the sums wrapping in i32 (leading axes broadcast)."""
    acc, a, b = np.asarray(acc), np.asarray(a), np.asarray(b)
    rows = TILE_ROWS
    k = a.shape[-1] // rows
    if acc.shape[-1:] != (rows * rows,) or a.shape[-1:] != (rows * k,) or b.shape[-1:] != a.shape[-1:]:
        raise ValueError(f"tile_dot needs (..., 256), (..., 16K), (..., 16K); got {acc.shape}, {a.shape}, {b.shape}")
    am = a.astype(np.int64).reshape(a.shape[:-1] + (rows, k))
    # b[q, j, t] -> b as k x j: k = 4 q + t
    bm = b.astype(np.int64).reshape(b.shape[:-1] + (k // 4, rows, 4))
    bm = np.swapaxes(bm, -2, -1).reshape(b.shape[:-1] + (k, rows))
    prod = (am @ bm).reshape(np.broadcast_shapes(am.shape[:-2], bm.shape[:-2]) + (rows * rows,))
    return (acc.astype(np.int64) + prod).astype(np.int32)


def _dot4(acc: np.ndarray, a: np.ndarray, b: np.ndarray, name: str = DOT4_U8I8) -> np.ndarray:
    """`dot4_u8i8_acc` over the last axis: acc `(..., L)` i32, a `(..., 4L)` u8 (i8 for
    `dot4_i8i8_acc`), b `(..., 4L)` i8: `acc[i] + sum(a[4i + j] * b[4i + j] for j in 0..3)`,
    the products exact, the sum wrapping in i32."""
    acc, a, b = np.asarray(acc), np.asarray(a), np.asarray(b)
    lanes = acc.shape[-1] if acc.ndim else 1
    if a.shape[-1:] != (4 * lanes,) or b.shape[-1:] != a.shape[-1:]:
        raise ValueError(f"{name} needs (..., L), (..., 4L), (..., 4L); got {acc.shape}, {a.shape}, {b.shape}")
    prod = a.astype(np.int64) * b.astype(np.int64)
    sums = prod.reshape(prod.shape[:-1] + (lanes, 4)).sum(axis=-1)
    if a.shape != b.shape or acc.shape[:-1] != sums.shape[:-1]:
        # leading axes (the interpreter's batch of iterations) broadcast: an operand may be
        # loop-invariant (a constant vector)
        return (acc.astype(np.int64) + sums).astype(np.int32)
    return (acc.astype(np.int64).reshape(sums.shape) + sums).astype(np.int32).reshape(acc.shape)


def _py_floordiv(a: int, b: int) -> int:
    if b == 0:
        raise DivisionByZero("integer division or remainder by zero")
    return a // b


def _py_mod(a: int, b: int) -> int:
    if b == 0:
        raise DivisionByZero("integer division or remainder by zero")
    return a % b


#: Python-int shortcuts for the ops constant folding of index arithmetic calls all the time
#: (NumPy costs microseconds per scalar call). Exact integer results, wrapped afterwards; the
#: tests check them equal to the array definitions above.
_PY_INT: dict[str, Callable[[int, int], int]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "floordiv": _py_floordiv, "mod": _py_mod, "min": min, "max": max,
}


def fold_int(op: str, dtype: DType, a: int, b: int) -> int:
    """`evaluate(op, dtype, a, b)` for Python ints and an op of `_PY_INT` (add, sub, mul,
    floordiv, mod, min, max): the shortcut constant folding of index arithmetic takes."""
    return wrap_int(_PY_INT[op](wrap_int(a, dtype), wrap_int(b, dtype)), dtype)


#: The ops `fold_int` takes.
FOLD_INT_OPS: frozenset[str] = frozenset(_PY_INT)


def evaluate(op: str, dtype: DType, *args: Any) -> Any:
    """Apply `op` element-wise for operand dtype `dtype` (see the module docstring).

    `cast` and `bitcast` take `(value, dst_dtype)`, `select` `(cond, a, b)` with `dtype` the
    type of `a` and `b`, `dot4_u8i8_acc` and `dot4_i8i8_acc` `(acc, a, b)` with `dtype` i32. Raises
    `DivisionByZero` for integer division by zero and `UndefinedOp` for an op the dtype lacks.

        >>> evaluate("mod", dt.i32, -7, 3), evaluate("fmod", dt.i32, -7, 3)
        (2, -1)
        >>> evaluate("shr", dt.i8, -8, 9), evaluate("shl", dt.u8, 1, 8)
        (-1, 0)
        >>> evaluate("floordiv", dt.f32, -0.0, 5.0), evaluate("sqrt", dt.f16, 2.0)
        (-0.0, 1.4140625)
    """
    if op == "cast":
        return cast_value(args[0], dtype, args[1])
    if op == "bitcast":
        return bitcast_value(args[0], dtype, args[1])
    if len(args) == 2 and type(args[0]) is int and type(args[1]) is int and op in _PY_INT and dtype.is_int:
        return fold_int(op, dtype, args[0], args[1])
    scalar = all(np.ndim(a) == 0 and not isinstance(a, np.ndarray) for a in args)
    with np.errstate(all="ignore"):
        if op == "select":
            cond = to_array(args[0], dt.bool_)
            r = np.where(cond, to_array(args[1], dtype), to_array(args[2], dtype))
        elif op == CHECKED_INDEX:
            if dtype != dt.i64:
                raise UndefinedOp(f"{op} takes i64 indices, not {dtype}")
            r = _checked_index(to_array(args[0], dt.i64), to_array(args[1], dt.i64))
        elif op in DOT4_CALLS:
            if dtype != dt.i32:
                raise UndefinedOp(f"{op} accumulates in i32, not {dtype}")
            a_dtype = dt.u8 if op == DOT4_U8I8 else dt.i8
            r = _dot4(to_array(args[0], dt.i32), to_array(args[1], a_dtype), to_array(args[2], dt.i8), op)
        elif op in TILE_DOT_CALLS:
            if dtype != dt.i32:
                raise UndefinedOp(f"{op} accumulates in i32, not {dtype}")
            a_dtype = dt.u8 if op == TILE_DOT_U8I8 else dt.i8
            r = _tile_dot(to_array(args[0], dt.i32), to_array(args[1], a_dtype), to_array(args[2], dt.i8))
        else:
            fn = TABLES[_kind(dtype)].get(op)
            if fn is None:
                if op not in SCALAR_OPS:
                    raise ValueError(f"unknown scalar op {op!r}")
                raise UndefinedOp(f"{op} is not defined on {dtype}")
            own = HALF_OWN_PRECISION.get(op) if dtype in (dt.f16, dt.bf16) else None
            if own is not None:
                r = _finish(own(dtype, *(to_array(a, dtype) for a in args)), dtype)
            else:
                r = _finish(fn(*(_compute(to_array(a, dtype), dtype) for a in args)), dtype)
    r = np.asarray(r)
    return r.item() if scalar else r


# ---- interpretations ------------------------------------------------------------------------------

#: `handles(op, dtype)`: whether an interpretation has an entry for `op` on operands of `dtype`
#: (an entry that raises a clear "unsupported" error, as WGSL's for f64, is an entry).
Handles = Callable[[str, DType], bool]

_INTERPRETATIONS: dict[str, Handles] = {}


def register_interpretation(name: str, handles: Handles) -> None:
    """Record an interpretation of the IR (an emitter, the reference interpreter) by what its
    tables handle; `tests/codegen/test_handler_coverage.py` checks each against this module."""
    _INTERPRETATIONS[name] = handles


def interpretations() -> dict[str, Handles]:
    """The registered interpretations (their modules register on import)."""
    return dict(_INTERPRETATIONS)


def missing(handles: Handles) -> set[tuple[str, DType]]:
    """The (op, dtype) pairs the semantics define that an interpretation has no entry for."""
    return {(op, d) for op in SCALAR_OPS for d in dt.ALL_DTYPES
            if defined(op, d) and not handles(op, d)}


def missing_ops(covered: Iterable[str]) -> set[str]:
    """The ops of `SCALAR_OPS` that a table keyed by op name (`covered`) lacks."""
    return set(SCALAR_OPS) - set(covered)


__all__ = [
    "SCALAR_OPS", "OTHER_CALLS", "PREDICATES", "COMPARISONS", "TABLES", "DivisionByZero", "IndexOutOfRange",
    "UndefinedOp", "evaluate", "cast_value", "bitcast_value", "defined", "storage", "to_array",
    "wrap_int", "fold_int", "FOLD_INT_OPS", "round_bf16", "float_fits_int", "register_interpretation", "interpretations",
    "missing", "missing_ops", "Handles",
]
