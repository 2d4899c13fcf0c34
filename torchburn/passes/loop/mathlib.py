"""f32 transcendentals built from IR arithmetic, for scalars and vectors alike.

Each builder takes an f32 expression `x` (any number of lanes) and a `LetSink`, and returns an
expression computing the function with only arithmetic, `fma`, comparisons, `select`,
bitcasts and integer shifts, so the vectorizer's vectors stay vectors (no per-lane libm
calls). Values used more than once are bound with `let` through the sink; the caller puts
the sink's lets before the statement that uses the result.

Method (written from the mathematics; coefficients fitted for this file, see below):

- `exp`: Cody-Waite reduction `x = n*ln2 + r`, `|r| <= ln2/2`, with `n` rounded by the
  1.5*2^23 trick (`fma(x, 1/ln2, 1.5*2^23)` holds `n` in its low mantissa bits) and `ln2`
  split in two so `n*ln2_hi` is exact; `expm1(r) = r + r^2 * P(r)` (P of degree 5); the
  result `(1 + expm1(r)) * 2^n` is scaled in two steps `2^(n>>1) * 2^(n - (n>>1))`, so results
  near FLT_MAX and subnormal results come out right without special cases. Inputs are clamped
  to [-104, 89]; beyond them the scaling overflows to inf or rounds to 0 by itself; NaN flows
  through the arithmetic.
- `expm1`: the same reduction; `expm1(x) = 2^n * expm1(r) + (2^n - 1)`, evaluated as
  `2 * fma(2^(n-1), u, 2^(n-1) - 0.5)` (one rounding, no overflow of the scale), and `u`
  itself where `n = 0`; the sign of x is copied onto the result (so expm1(-0) = -0).
- `log`: `x = 2^k * m` with `m` in [sqrt(1/2), sqrt(2)) from the bits (subnormals are scaled by
  2^23 first), `f = m - 1`, `log(m) = f - f^2/2 + f^3 * R(f)` (R of degree 7), then `+ k*ln2`
  in two parts; `log(0) = -inf`, `log(x < 0) = nan`, `log(inf) = inf`.
- `log1p`: the same on `u = 1 + x`, plus the rounding error of `u` as a correction:
  `log1p(x) = log(u) + (1 + x - u) / u`, where `1 + x - u` is exact (`1 - (u - x)` when
  `u >= 2`, else `x - (u - 1)`).
- `tanh(x) = sign(x) * e / (e + 2)` with `e = expm1(2|x|)`, `|x|` clamped to 10 (where tanh
  rounds to 1).
- `sigmoid(x) = s / (1 + e)` with `e = exp(-|x|)` and `s = 1` for `x >= 0`, `s = e` below,
  so no intermediate overflows and tiny results keep their precision.
- `erf`: `x` clamped to [-4, 4] (beyond 3.92, erf rounds to +-1), then one rational
  `x * P(x^2) / Q(x^2)` (P of degree 6, Q of degree 5 in x^2), clamped to [-1, 1]. No branch
  is evaluated and thrown away and no `exp` is needed: about 20 vector operations and one
  division, against about 45 for the two-branch form (`x * P(x^2)` below 1,
  `1 - exp(-x^2) * erfcx(x)` above) it replaced. The price is accuracy: the rational's terms
  are of the size of the result over most of the range, so Horner's roundings add up (about 1.4
  ulp from the f32 coefficients, 6 in all, where the two-branch form had 2.15). It is odd by
  construction (-0 stays -0, NaN flows through the selects).

The polynomials are minimax fits (Remez exchange in float64 with the relative-error weight
of the final function), rounded to f32; erf's rational is a minimax fit of `erf(x) / x` in
`x^2` by differential correction (linear programs over 4000 Chebyshev points, relative
error). Fitted errors: P_expm1 2.5e-10, R_log 5.9e-9, erf's P/Q 2.2e-8 (5.5e-8 with the
coefficients rounded to f32).

Measured accuracy: the maximum error over all 2^32 f32 inputs, vectorized (16 lanes, AVX-512)
through the LLVM codegen, against float64 numpy/scipy rounded to f32 (specials exact, NaN in
NaN out; tests/passes/test_mathlib.py asserts these bounds on a 1.2M-point sample):

    exp 0.99 ulp    expm1 1.44 ulp    log 0.85 ulp    log1p 2.13 ulp
    tanh 2.42 ulp   sigmoid 2.40 ulp  erf 5.95 ulp

(erf: every positive f32 up to 4.5, worst at x = 3.2953837; the negative half mirrors it bit
for bit, and above 4.5 the result is exactly 1.)

Example: `exp_f32(%x[i], sink)` puts `let m_x = %x[i]`, `let m_xh = select(m_x > 89.0:f32,
89.0:f32, m_x)`, ... into `sink.lets` and returns
`(1.0:f32 + m_u) * bitcast<f32>(m_n1 + 127:i32 << 23:i32) * bitcast<f32>(...)`; the
`expand-math` pass docstring shows the whole expansion.
"""
from __future__ import annotations

import math
import struct
from typing import Callable, Optional, Sequence

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Binary, Const, Expr, ScalarType, Var
from .loop_utils import NameSupply

# ---- coefficients -----------------------------------------------------------------------------------

#: expm1(r) = r + r^2 * P(r) on [-ln2/2, ln2/2]; P[k] multiplies r^k.
EXPM1_P = (0.5, 0.1666666567325592, 0.04166635498404503, 0.008333390578627586,
           0.0013941213255748153, 0.00019845923816319555)
#: log1p(f) = f - f^2/2 + f^3 * R(f) on [sqrt(1/2) - 1, sqrt(2) - 1].
LOG_R = (0.3333333134651184, -0.250008225440979, 0.20001234114170074, -0.16623298823833466,
         0.14201553165912628, -0.1316058188676834, 0.12763328850269318, -0.07635657489299774)
#: erf(x) = x * P(x^2) / Q(x^2) on [-4, 4]; P[k], Q[k] multiply x^(2k).
ERF_P = (1.128379225730896, 0.18638762831687927, 0.05363363027572632, 0.0037813596427440643,
         0.0003434288955759257, 3.7338656966312556e-06, -8.536421347571377e-09)
ERF_Q = (1.0, 0.498515248298645, 0.11370272934436798, 0.01521074678748846, 0.0012436264660209417,
         5.392381353885867e-05)
#: erf rounds to +-1 in f32 beyond |x| = 3.92; the rational is fitted up to here.
ERF_CLAMP = 4.0

#: ln2 = LN2_HI + LN2_LO; LN2_HI has few mantissa bits, so n * LN2_HI is exact for |n| < 2^15.
LN2_HI = 0.693359375
LN2_LO = -2.12194440e-4
INV_LN2 = 1.4426950408889634
#: fma(x, 1/ln2, ROUND_MAGIC) - ROUND_MAGIC is x/ln2 rounded to an integer (|x/ln2| < 2^22).
ROUND_MAGIC = 12582912.0  # 1.5 * 2^23
#: Bits of sqrt(1/2) as an f32: the log reduction puts the mantissa in [sqrt(1/2), sqrt(2)).
SQRT_HALF_BITS = 0x3F3504F3
FLT_MIN = 2.0 ** -126


# ---- building blocks ----------------------------------------------------------------------------------

class LetSink:
    """Collects the `let`s an expansion needs, with fresh names from `names`."""

    def __init__(self, names: Optional[NameSupply] = None, prefix: str = "m") -> None:
        self.names = names if names is not None else NameSupply()
        self.prefix = prefix
        self.lets: list[lp.Let] = []

    def bind(self, e: Expr, hint: str) -> Expr:
        """A variable holding `e` (constants and variables are returned as they are)."""
        if isinstance(e, (Var, Const)) or (isinstance(e, ex.Broadcast) and isinstance(e.value, Const)):
            return e
        v = Var(self.names.fresh(f"{self.prefix}_{hint}"), e.type)
        self.lets.append(lp.Let(v, e))
        return v


class _F:
    """Typed constructors for one lane count: f32 and i32 constants and operations."""

    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.f32 = ScalarType(dt.f32, lanes)
        self.i32 = ScalarType(dt.i32, lanes)
        self.bool = ScalarType(dt.bool_, lanes)

    def c(self, v: float) -> Expr:
        """An f32 constant (rounded to f32 here, so the IR text shows the value used)."""
        return ex.const(_round_f32(v), dt.f32, self.lanes)

    def ci(self, v: int) -> Expr:
        return ex.const(int(v), dt.i32, self.lanes)

    def op(self, op: str, a: Expr, b: Expr) -> Expr:
        t = self.bool if op in ex.COMPARISONS else a.type
        return Binary(op, a, b, t)

    def add(self, a: Expr, b: Expr) -> Expr:
        return self.op("add", a, b)

    def sub(self, a: Expr, b: Expr) -> Expr:
        return self.op("sub", a, b)

    def mul(self, a: Expr, b: Expr) -> Expr:
        return self.op("mul", a, b)

    def div(self, a: Expr, b: Expr) -> Expr:
        return self.op("div", a, b)

    def fma(self, a: Expr, b: Expr, c: Expr) -> Expr:
        return ex.Call("fma", (a, b, c), a.type)

    def select(self, cond: Expr, a: Expr, b: Expr) -> Expr:
        return ex.Select(cond, a, b, a.type)

    def abs(self, x: Expr) -> Expr:
        return ex.Call("abs", (x,), x.type)

    def copysign(self, mag: Expr, sign: Expr) -> Expr:
        return Binary("copysign", mag, sign, mag.type)

    def to_bits(self, x: Expr) -> Expr:
        return ex.Bitcast(x, self.i32)

    def from_bits(self, i: Expr) -> Expr:
        return ex.Bitcast(i, self.f32)

    def to_float(self, i: Expr) -> Expr:
        return ex.Cast(i, self.f32)

    def pow2(self, n: Expr) -> Expr:
        """2^n for an i32 `n` in [-126, 127], built from the exponent bits."""
        return self.from_bits(self.op("shl", self.add(n, self.ci(127)), self.ci(23)))

    def clamp_above(self, x: Expr, hi: float) -> Expr:
        """`min(x, hi)` that keeps NaN (a comparison with NaN is false)."""
        return self.select(self.op("gt", x, self.c(hi)), self.c(hi), x)

    def clamp_below(self, x: Expr, lo: float) -> Expr:
        return self.select(self.op("lt", x, self.c(lo)), self.c(lo), x)

    def horner(self, coeffs: Sequence[float], x: Expr) -> Expr:
        """`coeffs[0] + x * (coeffs[1] + x * (...))` with fma at every step."""
        acc = self.c(coeffs[-1])
        for k in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.c(k))
        return acc


def _check_f32(x: Expr) -> _F:
    if x.type.dtype != dt.f32:
        raise TypeError(f"mathlib builds f32 functions, got {x.type}")
    return _F(x.type.lanes)


def _reduce_ln2(f: _F, x: Expr, sink: LetSink) -> tuple[Expr, Expr]:
    """`x = n*ln2 + r` with integer `n` (returned as i32) and `|r| <= ln2/2` (plus rounding)."""
    t = sink.bind(f.fma(x, f.c(INV_LN2), f.c(ROUND_MAGIC)), "t")
    n_f = sink.bind(f.sub(t, f.c(ROUND_MAGIC)), "nf")
    n = sink.bind(f.sub(f.to_bits(t), f.ci(_f32_bits(ROUND_MAGIC))), "n")
    r = f.fma(n_f, f.c(-LN2_HI), x)
    r = sink.bind(f.fma(n_f, f.c(-LN2_LO), r), "r")
    return n, r


def _expm1_reduced(f: _F, r: Expr, sink: LetSink) -> Expr:
    """expm1(r) for |r| <= ln2/2: `r + r^2 * P(r)`."""
    r2 = f.mul(r, r)
    return sink.bind(f.fma(r2, f.horner(EXPM1_P, r), r), "u")


def _f32_bits(v: float) -> int:
    bits: int = struct.unpack("<i", struct.pack("<f", v))[0]
    return bits


def _round_f32(v: float) -> float:
    if math.isnan(v) or math.isinf(v):
        return v
    rounded: float = struct.unpack("<f", struct.pack("<f", v))[0]
    return rounded


# ---- the functions -------------------------------------------------------------------------------------

def exp_f32(x: Expr, sink: LetSink) -> Expr:
    """e^x (measured max error: see the tests; about 1 ulp)."""
    f = _check_f32(x)
    x = sink.bind(x, "x")
    xc = sink.bind(f.clamp_below(sink.bind(f.clamp_above(x, 89.0), "xh"), -104.0), "xc")
    n, r = _reduce_ln2(f, xc, sink)
    p = f.add(f.c(1.0), _expm1_reduced(f, r, sink))
    half = sink.bind(f.op("shr", n, f.ci(1)), "n1")
    s1 = f.pow2(half)
    s2 = f.pow2(f.sub(n, half))
    return f.mul(f.mul(p, s1), s2)


def expm1_f32(x: Expr, sink: LetSink) -> Expr:
    """e^x - 1, accurate near 0."""
    f = _check_f32(x)
    x = sink.bind(x, "x")
    xc = sink.bind(f.clamp_below(sink.bind(f.clamp_above(x, 89.0), "xh"), -18.0), "xc")
    n, r = _reduce_ln2(f, xc, sink)
    u = _expm1_reduced(f, r, sink)
    h = sink.bind(f.pow2(f.sub(n, f.ci(1))), "h")
    scaled = f.mul(f.fma(h, u, f.sub(h, f.c(0.5))), f.c(2.0))
    # expm1 has the sign of x; copysign keeps it for x = -0.0 too (u = fma(r*r, P, r) is +0.0)
    return f.copysign(f.select(f.op("eq", n, f.ci(0)), u, scaled), x)


def _split_exponent(f: _F, v: Expr, sink: LetSink) -> tuple[Expr, Expr]:
    """`v = 2^k * m` with `m` in [sqrt(1/2), sqrt(2)), for a positive normal f32 `v`."""
    bits = sink.bind(f.to_bits(v), "bits")
    k = sink.bind(f.op("shr", f.sub(bits, f.ci(SQRT_HALF_BITS)), f.ci(23)), "k")
    return k, f.from_bits(f.sub(bits, f.op("shl", k, f.ci(23))))


def _log_finish(f: _F, e: Expr, m: Expr, extra: Optional[Expr], sink: LetSink) -> Expr:
    """`e*ln2 + log(m) + extra` for `m` in [sqrt(1/2), sqrt(2)) and a small correction `extra`."""
    fm = sink.bind(f.sub(m, f.c(1.0)), "f")
    z = sink.bind(f.mul(fm, fm), "z")
    y = f.mul(f.mul(fm, z), f.horner(LOG_R, fm))
    y = f.fma(e, f.c(LN2_LO), y)
    y = f.fma(z, f.c(-0.5), y)
    if extra is not None:
        y = f.add(y, extra)
    return f.fma(e, f.c(LN2_HI), f.add(fm, y))


def log_f32(x: Expr, sink: LetSink) -> Expr:
    """Natural logarithm."""
    f = _check_f32(x)
    x = sink.bind(x, "x")
    tiny = sink.bind(f.op("lt", x, f.c(FLT_MIN)), "tiny")
    k, m = _split_exponent(f, f.select(tiny, f.mul(x, f.c(2.0 ** 23)), x), sink)
    e = sink.bind(f.sub(f.to_float(k), f.select(tiny, f.c(23.0), f.c(0.0))), "e")
    r = _log_finish(f, e, m, None, sink)
    r = f.select(f.op("eq", x, f.c(math.inf)), f.c(math.inf), r)
    r = f.select(f.op("eq", x, f.c(0.0)), f.c(-math.inf), r)
    return f.select(f.op("ge", x, f.c(0.0)), r, f.c(math.nan))  # x < 0 and NaN give NaN


def log1p_f32(x: Expr, sink: LetSink) -> Expr:
    """log(1 + x), accurate near 0: the logarithm of `u = 1 + x` (rounded) plus the first-order
    correction `(1 + x - u) / u`, whose numerator is computed exactly."""
    f = _check_f32(x)
    x = sink.bind(x, "x")
    u = sink.bind(f.add(f.c(1.0), x), "u")
    k, m = _split_exponent(f, u, sink)
    lost = f.select(f.op("gt", k, f.ci(0)), f.sub(f.c(1.0), f.sub(u, x)), f.sub(x, f.sub(u, f.c(1.0))))
    r = _log_finish(f, sink.bind(f.to_float(k), "e"), m, f.div(lost, u), sink)
    r = f.select(f.op("eq", x, f.c(math.inf)), f.c(math.inf), r)
    r = f.select(f.op("eq", x, f.c(-1.0)), f.c(-math.inf), r)
    r = f.select(f.op("eq", x, f.c(0.0)), x, r)  # keeps the sign of -0.0
    return f.select(f.op("ge", x, f.c(-1.0)), r, f.c(math.nan))  # x < -1 and NaN give NaN


def tanh_f32(x: Expr, sink: LetSink) -> Expr:
    """Hyperbolic tangent."""
    f = _check_f32(x)
    x = sink.bind(x, "x")
    a = f.clamp_above(f.abs(x), 10.0)
    e = sink.bind(expm1_f32(f.mul(a, f.c(2.0)), sink), "e")
    return f.copysign(f.div(e, f.add(e, f.c(2.0))), x)


def sigmoid_f32(x: Expr, sink: LetSink) -> Expr:
    """1 / (1 + e^-x)."""
    f = _check_f32(x)
    x = sink.bind(x, "x")
    e = sink.bind(exp_f32(ex.Call("neg", (f.abs(x),), x.type), sink), "e")
    num = f.select(f.op("lt", x, f.c(0.0)), e, f.c(1.0))
    return f.div(num, f.add(f.c(1.0), e))


def erf_f32(x: Expr, sink: LetSink) -> Expr:
    """The error function: one rational in x^2 over the clamped range (no branches, no exp),
    so a vector costs about twenty operations and one division."""
    f = _check_f32(x)
    x = sink.bind(x, "x")
    xc = sink.bind(f.clamp_below(sink.bind(f.clamp_above(x, ERF_CLAMP), "xh"), -ERF_CLAMP), "xc")
    t = sink.bind(f.mul(xc, xc), "t")
    r = sink.bind(f.div(f.mul(xc, f.horner(ERF_P, t)), f.horner(ERF_Q, t)), "r")
    # the rational may round a hair beyond 1 near the clamp; erf never does
    return f.clamp_below(sink.bind(f.clamp_above(r, 1.0), "rh"), -1.0)


Builder = Callable[[Expr, LetSink], Expr]

#: The functions this module implements, by IR call name.
F32_FUNCTIONS: dict[str, Builder] = {
    "exp": exp_f32,
    "expm1": expm1_f32,
    "log": log_f32,
    "log1p": log1p_f32,
    "tanh": tanh_f32,
    "sigmoid": sigmoid_f32,
    "erf": erf_f32,
}
