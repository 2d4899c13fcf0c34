"""Special functions: modified Bessel functions (i0, i0e, i1, i1e, k0, k1 and scaled k0, k1),
Bessel functions (j0, j1, y0, y1, spherical j0), the Airy function Ai, ndtri and erfcx.

They follow PyTorch's algorithms (Cephes, `ATen/native/Math.h`), written over `Num`, a small
wrapper that builds elementwise IR with Python's operators, so each function reads like its
C original: a branch is a `where` over both sides, a loop over a coefficient table unrolls at
build time. Everything is computed in f64 and rounded to the result dtype (bool and integer
inputs promote to the default float dtype, as in PyTorch).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Sequence, Union

import torch

from ...ir import dtypes as dt
from ...ir.tensor import Value
from ..builder import Builder
from ..registry import lowering
from . import special_tables as tb

aten = torch.ops.aten

Scalar = Union[int, float]


class Num:
    """An f64 tensor value with arithmetic operators; Python numbers mix in as constants."""

    def __init__(self, b: Builder, v: Value) -> None:
        self.b = b
        self.v = v

    def _lift(self, other: Union["Num", Scalar]) -> Value:
        return other.v if isinstance(other, Num) else self.b.scalar_like(float(other), self.v)

    def _bin(self, name: str, other: Union["Num", Scalar], swap: bool = False) -> "Num":
        a, c = self.v, self._lift(other)
        return Num(self.b, self.b.op(name, c, a) if swap else self.b.op(name, a, c))

    def __add__(self, o: Union["Num", Scalar]) -> "Num":
        return self._bin("add", o)

    def __radd__(self, o: Scalar) -> "Num":
        return self._bin("add", o, swap=True)

    def __sub__(self, o: Union["Num", Scalar]) -> "Num":
        return self._bin("sub", o)

    def __rsub__(self, o: Scalar) -> "Num":
        return self._bin("sub", o, swap=True)

    def __mul__(self, o: Union["Num", Scalar]) -> "Num":
        return self._bin("mul", o)

    def __rmul__(self, o: Scalar) -> "Num":
        return self._bin("mul", o, swap=True)

    def __truediv__(self, o: Union["Num", Scalar]) -> "Num":
        return self._bin("div", o)

    def __rtruediv__(self, o: Scalar) -> "Num":
        return self._bin("div", o, swap=True)

    def __neg__(self) -> "Num":
        return Num(self.b, self.b.op("neg", self.v))

    # Comparisons give bool values, used only as `where` conditions.
    def __lt__(self, o: Union["Num", Scalar]) -> "Num":  # type: ignore[override]
        return self._bin("lt", o)

    def __le__(self, o: Union["Num", Scalar]) -> "Num":  # type: ignore[override]
        return self._bin("le", o)

    def __gt__(self, o: Union["Num", Scalar]) -> "Num":  # type: ignore[override]
        return self._bin("gt", o)

    def __or__(self, o: "Num") -> "Num":
        return self._bin("or", o)

    def eq(self, o: Union["Num", Scalar]) -> "Num":
        return self._bin("eq", o)

    def fn(self, name: str) -> "Num":
        """A unary IR function: `x.fn("exp")`."""
        return Num(self.b, self.b.op(name, self.v))


def where(cond: Num, a: Union[Num, Scalar], c: Union[Num, Scalar]) -> Num:
    """`cond ? a : c`, elementwise (both sides are computed)."""
    b = cond.b
    like = a.v if isinstance(a, Num) else c.v if isinstance(c, Num) else None

    def value(x: Union[Num, Scalar]) -> Value:
        if isinstance(x, Num):
            return x.v
        if like is not None:
            return b.scalar_like(float(x), like)
        return b.expand(b.full(float(x), (), dt.f64), cond.v.shape)

    return Num(b, b.op("where", cond.v, value(a), value(c)))


def horner(x: Num, coeffs: Sequence[float]) -> Num:
    """c[0] x^n + c[1] x^(n-1) + ... + c[n] (Cephes' polevl)."""
    acc: Union[Num, float] = coeffs[0]
    for c in coeffs[1:]:
        acc = acc * x + c
    assert isinstance(acc, Num)
    return acc


def chbevl(x: Num, coeffs: Sequence[float]) -> Num:
    """The Chebyshev series sum c[i] T_i(x / 2) by Clenshaw's recurrence (Cephes' chbevl)."""
    b0: Union[Num, float] = coeffs[0]
    b1: Union[Num, float] = 0.0
    b2: Union[Num, float] = 0.0
    for c in coeffs[1:]:
        b2, b1 = b1, b0
        b0 = x * b1 - b2 + c
    assert isinstance(b0, Num)
    return 0.5 * (b0 - b2)


# ---- modified Bessel functions ----------------------------------------------------------------

def i0e(x: Num) -> Num:
    ax = x.fn("abs")
    return where(ax <= 8.0, chbevl(ax / 2.0 - 2.0, tb.I0E_A), chbevl(32.0 / ax - 2.0, tb.I0E_B) / ax.fn("sqrt"))


def i0(x: Num) -> Num:
    return x.fn("abs").fn("exp") * i0e(x)


def i1e(x: Num) -> Num:
    ax = x.fn("abs")
    out = where(ax <= 8.0, chbevl(ax / 2.0 - 2.0, tb.I1E_A) * ax, chbevl(32.0 / ax - 2.0, tb.I1E_B) / ax.fn("sqrt"))
    return where(x < 0.0, -out, out)


def i1(x: Num) -> Num:
    return x.fn("abs").fn("exp") * i1e(x)


def _k_domain(x: Num, out: Num) -> Num:
    """k0/k1 are +inf at 0 and NaN for negative arguments."""
    return where(x.eq(0.0), math.inf, where(x < 0.0, math.nan, out))


def k0e(x: Num) -> Num:
    small = (chbevl(x * x - 2.0, tb.K0_A) - (0.5 * x).fn("log") * i0(x)) * x.fn("exp")
    return _k_domain(x, where(x <= 2.0, small, chbevl(8.0 / x - 2.0, tb.K0_B) / x.fn("sqrt")))


def k0(x: Num) -> Num:
    small = chbevl(x * x - 2.0, tb.K0_A) - (0.5 * x).fn("log") * i0(x)
    large = (-x).fn("exp") * chbevl(8.0 / x - 2.0, tb.K0_B) / x.fn("sqrt")
    return _k_domain(x, where(x <= 2.0, small, large))


def k1e(x: Num) -> Num:
    small = ((0.5 * x).fn("log") * i1(x) + chbevl(x * x - 2.0, tb.K1_A) / x) * x.fn("exp")
    return _k_domain(x, where(x <= 2.0, small, chbevl(8.0 / x - 2.0, tb.K1_B) / x.fn("sqrt")))


def k1(x: Num) -> Num:
    small = (0.5 * x).fn("log") * i1(x) + chbevl(x * x - 2.0, tb.K1_A) / x
    large = (-x).fn("exp") * chbevl(8.0 / x - 2.0, tb.K1_B) / x.fn("sqrt")
    return _k_domain(x, where(x <= 2.0, small, large))


# ---- Bessel functions of the first and second kind ----------------------------------------------

_SQRT_2_OVER_PI = 0.797884560802865355879892119868763737
_TWO_OVER_PI = 0.636619772367581343075535053490057448


def _asymptotic(x: Num, z: Num, tables: tuple[Sequence[float], ...], phase: float, second_kind: bool) -> Num:
    """The large-x form shared by j0, j1, y0 and y1 (x > 5), with z = 25 / x^2."""
    pp, pq, qp, qq = (horner(z, t) for t in tables)
    shifted = x - phase
    p, q = pp / pq, 5.0 / x * (qp / qq)
    if second_kind:
        core = p * shifted.fn("sin") + q * shifted.fn("cos")
    else:
        core = p * shifted.fn("cos") - q * shifted.fn("sin")
    return core * _SQRT_2_OVER_PI / x.fn("sqrt")


_J0_LARGE = (tb.J0_PP, tb.J0_PQ, tb.J0_QP, tb.J0_QQ)
_J1_LARGE = (tb.J1_PP, tb.J1_PQ, tb.J1_QP, tb.J1_QQ)


def j0(x: Num) -> Num:
    ax = x.fn("abs")
    z = ax * ax
    small = (z - 5.78318596294678452118) * (z - 30.4712623436620863991) * horner(z, tb.J0_RP) / horner(z, tb.J0_RQ)
    small = where(ax < 0.00001, 1.0 - z / 4.0, small)
    return where(ax <= 5.0, small, _asymptotic(ax, 25.0 / z, _J0_LARGE, math.pi / 4, False))


def j1(x: Num) -> Num:
    ax = x.fn("abs")
    z = ax * ax
    small = horner(z, tb.J1_RP) / horner(z, tb.J1_RQ) * ax * (z - 14.6819706421238932572) * (z - 49.2184563216946036703)
    out = where(ax <= 5.0, small, _asymptotic(ax, 25.0 / z, _J1_LARGE, 3 * math.pi / 4, False))
    return where(x < 0.0, -out, out)


def _y_domain(x: Num, out: Num) -> Num:
    """y0/y1 are -inf at 0 and NaN for negative arguments."""
    return where(x.eq(0.0), -math.inf, where(x < 0.0, math.nan, out))


def y0(x: Num) -> Num:
    z = x * x
    small = horner(z, tb.Y0_YP) / horner(z, tb.Y0_YQ) + _TWO_OVER_PI * x.fn("log") * j0(x)
    return _y_domain(x, where(x <= 5.0, small, _asymptotic(x, 25.0 / z, _J0_LARGE, math.pi / 4, True)))


def y1(x: Num) -> Num:
    z = x * x
    small = x * (horner(z, tb.Y1_YP) / horner(z, tb.Y1_YQ)) + _TWO_OVER_PI * (j1(x) * x.fn("log") - 1.0 / x)
    return _y_domain(x, where(x <= 5.0, small, _asymptotic(x, 25.0 / z, _J1_LARGE, 3 * math.pi / 4, True)))


def spherical_j0(x: Num) -> Num:
    z = x * x
    series = horner(z, (1.0 / 6227020800.0, -1.0 / 39916800.0, 1.0 / 362880.0, -1.0 / 5040.0,
                        1.0 / 120.0, -1.0 / 6.0, 1.0))
    out = where(x.fn("abs") < 0.5, series, x.fn("sin") / x)
    return where(x.fn("isinf"), 0.0, out)


# ---- Airy function ------------------------------------------------------------------------------------

_AIRY_C1, _AIRY_C2 = 0.355028053887817239260, 0.258819403792806798405
_INV_SQRT_PI = 5.64189583547756286948e-01


def airy_ai(x: Num) -> Num:
    """Ai(x): an asymptotic form below -2.09 and above 2.09, the Maclaurin series between.
    The series' loop stops at convergence in C; here it runs a fixed 14 terms, which reach
    f64 precision for |x| < 2.09 (further terms change nothing)."""
    root = (-x).fn("sqrt")
    zn = -2.0 / 3.0 * x * root
    z = 1.0 / zn
    z2 = z * z
    t = zn + 0.25 * math.pi
    oscillating = (_INV_SQRT_PI / root.fn("sqrt")
                   * (t.fn("sin") * (1.0 + z2 * horner(z2, tb.AIRY_AFN) / horner(z2, tb.AIRY_AFD))
                      - t.fn("cos") * (z * horner(z2, tb.AIRY_AGN) / horner(z2, tb.AIRY_AGD))))
    zeta = 2.0 / 3.0 * x * x.fn("sqrt")
    r = 1.0 / zeta
    decaying = (_INV_SQRT_PI * (horner(r, tb.AIRY_AN) / horner(r, tb.AIRY_AD))
                / (2.0 * x.fn("sqrt").fn("sqrt") * zeta.fn("exp")))
    cube = x * x * x
    f: Union[Num, float] = 1.0
    g: Num = x
    m: Union[Num, float] = 1.0
    n: Num = x
    k = 1.0
    for _ in range(14):
        m = m * cube / (k + 1.0) / (k + 2.0)
        n = n * cube / (k + 2.0) / (k + 3.0)
        k += 3.0
        f = f + m
        g = g + n
    assert isinstance(f, Num)
    series = _AIRY_C1 * f - _AIRY_C2 * g
    out = where(x < -2.09, oscillating, where(x < 2.09, series, decaying))
    return where(x.fn("isinf"), math.nan, where(x > 103.892, 0.0, out))


# ---- normal distribution ----------------------------------------------------------------------------

_EXP_M2 = 0.13533528323661269189  # exp(-2)


def ndtri(y0: Num) -> Num:
    """The inverse of the standard normal CDF."""
    flip = y0 > 1.0 - _EXP_M2
    y = where(flip, 1.0 - y0, y0)
    # Central range: |y - 0.5| <= 3/8.
    c = y - 0.5
    c2 = c * c
    central = (c + c * (c2 * horner(c2, tb.NDTRI_P0) / horner(c2, tb.NDTRI_Q0))) * 2.50662827463100050242
    # Tails: z = sqrt(-2 log y), two rational fits.
    t = (-2.0 * y.fn("log")).fn("sqrt")
    r = 1.0 / t
    fit = where(t < 8.0, r * horner(r, tb.NDTRI_P1) / horner(r, tb.NDTRI_Q1),
                r * horner(r, tb.NDTRI_P2) / horner(r, tb.NDTRI_Q2))
    tail = t - t.fn("log") / t - fit
    tail = where(flip, tail, -tail)
    out = where(y > _EXP_M2, central, tail)
    out = where((y0 < 0.0) | (y0 > 1.0), math.nan, out)
    return where(y0.eq(0.0), -math.inf, where(y0.eq(1.0), math.inf, out))


def erfcx(x: Num) -> Num:
    """exp(x^2) erfc(x): directly below x = 26 (f64 holds both factors there), else the
    asymptotic series 1/(x sqrt(pi)) (1 - 1/(2x^2) + 3/(2x^2)^2 - 15/(2x^2)^3 + 105/(2x^2)^4)."""
    direct = (x * x).fn("exp") * x.fn("erfc")
    u = 1.0 / (2.0 * x * x)
    series = horner(u, (105.0, -15.0, 3.0, -1.0, 1.0)) / (x * math.sqrt(math.pi))
    return where(x < 26.0, direct, series)


# ---- registration -----------------------------------------------------------------------------------

def _register(op: Any, fn: Callable[[Num], Num]) -> None:
    def lower(b: Builder, x: Value) -> Value:
        out = b.out_dtype
        return b.cast(fn(Num(b, b.cast(x, dt.f64))).v, out)
    lowering(op)(lower)


for _op, _fn in (
    (aten.i0, i0), (aten.special_i0e, i0e), (aten.special_i1, i1), (aten.special_i1e, i1e),
    (aten.special_modified_bessel_i0, i0), (aten.special_modified_bessel_i1, i1),
    (aten.special_modified_bessel_k0, k0), (aten.special_modified_bessel_k1, k1),
    (aten.special_scaled_modified_bessel_k0, k0e), (aten.special_scaled_modified_bessel_k1, k1e),
    (aten.special_bessel_j0, j0), (aten.special_bessel_j1, j1),
    (aten.special_bessel_y0, y0), (aten.special_bessel_y1, y1),
    (aten.special_spherical_bessel_j0, spherical_j0),
    (aten.special_ndtri, ndtri), (aten.special_erfcx, erfcx), (aten.special_airy_ai, airy_ai),
):
    _register(_op, _fn)
