"""Value ranges of integer index expressions, from loop ranges and non-negative symbols.

An `Interval` has polynomial end points over the kernel's symbols (or None for unbounded),
so ranges can stay symbolic:

    for i0 in 0..s0 {            i0      in [0, s0 - 1]
      for i1 in 0..4 {           i1      in [0, 3]
        ... i0 * 4 + i1 ...      i0*4+i1 in [0, s0 * 4 - 1]

Expressions are brought to `Poly` normal form before interval arithmetic, so `i1 - i1` is
exactly 0 rather than `[-3, 3]`. Symbols (sizes and strides) are non-negative; a symbol used as
a divisor is assumed positive, since dividing by zero would be undefined anyway. Each end point
is checked for sign by its coefficients: a polynomial in non-negative atoms with non-negative
coefficients is non-negative.

Integers wrap (`ir/semantics.py`): an expression of a type narrower than i64 whose range
leaves the type's range may wrap, so its range is then the type's. Constant end points are
computed with the semantics' `floordiv` and `shr`.

`Bounds.prove_lt(a, b)` and friends answer the questions the simplifier asks ("is
`0 <= i1 < 4` known here?"); they say False when they do not know.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import semantics as sem
from ...ir.dtypes import DType
from ...ir.expr import Binary, Const, Expr, Var
from .loop_utils import Poly, const_int

End = Optional[Poly]


@dataclass(frozen=True)
class Interval:
    """`lo <= x <= hi`; an end point of None is unbounded."""

    lo: End
    hi: End

    @staticmethod
    def const(lo: Optional[int], hi: Optional[int]) -> "Interval":
        return Interval(None if lo is None else Poly.const(lo), None if hi is None else Poly.const(hi))

    @staticmethod
    def point(p: Poly) -> "Interval":
        return Interval(p, p)

    @property
    def const_lo(self) -> Optional[int]:
        return self.lo.const_value if self.lo is not None and self.lo.is_const else None

    @property
    def const_hi(self) -> Optional[int]:
        return self.hi.const_value if self.hi is not None and self.hi.is_const else None

    def __add__(self, other: "Interval") -> "Interval":
        return Interval(_padd(self.lo, other.lo), _padd(self.hi, other.hi))

    def scale(self, k: int) -> "Interval":
        lo = None if self.lo is None else self.lo.scale(k)
        hi = None if self.hi is None else self.hi.scale(k)
        return Interval(lo, hi) if k >= 0 else Interval(hi, lo)


UNBOUNDED = Interval(None, None)


def _padd(a: End, b: End) -> End:
    return None if a is None or b is None else a + b


def _pmul(a: End, b: End) -> End:
    return None if a is None or b is None else a * b


def type_range(dtype: DType) -> Interval:
    """The values a dtype can hold; i64 (the index type) counts as unbounded."""
    if dtype.is_bool:
        return Interval.const(0, 1)
    if dtype.is_int and dtype.bits < 64:
        if dtype.is_signed:
            return Interval.const(-(1 << (dtype.bits - 1)), (1 << (dtype.bits - 1)) - 1)
        return Interval.const(0, (1 << dtype.bits) - 1)
    if dtype.kind == "u":
        return Interval.const(0, None)
    return UNBOUNDED


class Bounds:
    """Range analysis in one scope: the kernel's symbols plus the ranges of enclosing loop
    variables and integer lets. `bind` and `bind_loop` return the analyzer of an inner scope."""

    def __init__(self, symbols: Iterable[str] = (), ranges: Optional[Mapping[str, Interval]] = None) -> None:
        self.symbols = frozenset(symbols)
        self.ranges: dict[str, Interval] = dict(ranges or {})
        self._cache: dict[Expr, Interval] = {}
        #: `simplify_expr`'s results in this scope (a scope never changes once made, so an
        #: expression simplifies the same way every time it is asked here).
        self.simplified: dict[Expr, Expr] = {}

    # ---- scopes --------------------------------------------------------------------------------
    def bind(self, name: str, interval: Interval) -> "Bounds":
        ranges = dict(self.ranges)
        ranges[name] = interval
        inner = Bounds.__new__(Bounds)
        inner.symbols, inner.ranges, inner._cache, inner.simplified = self.symbols, ranges, {}, {}
        return inner

    def bind_loop(self, var: Var, start: Expr, extent: Expr) -> "Bounds":
        """The scope inside `for var in start..+extent` (the body runs only if extent >= 1)."""
        lo = self.interval(start).lo
        hi = self.interval(ex.sub(ex.add(start, extent), 1)).hi
        return self.bind(var.name, Interval(lo, hi))

    # ---- questions -------------------------------------------------------------------------------
    def prove_nonneg(self, e: Expr) -> bool:
        """Whether `e >= 0` is known."""
        return self.nonneg(self.interval(e).lo)

    def prove_le(self, a: Expr, b: Expr) -> bool:
        return self.prove_nonneg(ex.sub(b, a))

    def prove_lt(self, a: Expr, b: Expr) -> bool:
        return self.prove_nonneg(ex.sub(ex.sub(b, a), 1))

    def prove_in(self, e: Expr, lo: Expr, hi_exclusive: Expr) -> bool:
        """Whether `lo <= e < hi_exclusive` is known."""
        return self.prove_le(lo, e) and self.prove_lt(e, hi_exclusive)

    def nonneg(self, p: End) -> bool:
        """Whether an end point is known non-negative."""
        if p is None:
            return False
        for m, c in p.terms:
            if m == ():
                if c < 0:
                    return False
            elif c < 0 or not all(self._atom_nonneg(a) for a in m):
                return False
        return True

    def _le(self, a: End, b: End) -> bool:
        return a is not None and b is not None and self.nonneg(b - a)

    def _atom_nonneg(self, a: Expr) -> bool:
        if isinstance(a, Var):
            if a.name in self.symbols:
                return True
            r = self.ranges.get(a.name)
            return r is not None and r.lo is not None and self.nonneg(r.lo)
        return self.nonneg(self.interval(a).lo)

    # ---- intervals -------------------------------------------------------------------------------
    def interval(self, e: Expr) -> Interval:
        """The range of a scalar integer expression (UNBOUNDED for anything else)."""
        if e.type.lanes != 1 or not (e.type.dtype.is_int or e.type.dtype.is_bool):
            return UNBOUNDED
        hit = self._cache.get(e)
        if hit is None:
            hit = _within_type(self._interval(e), e.type.dtype)
            self._cache[e] = hit
        return hit

    def _interval(self, e: Expr) -> Interval:
        if e.type.dtype.is_bool:
            return Interval.const(0, 1)
        total = Interval.const(0, 0)
        for m, c in Poly.of(e).terms:
            term = Interval.const(1, 1)
            for a in m:
                term = self._mul(term, self._atom(a))
            total = total + term.scale(c)
            if total.lo is None and total.hi is None:
                break
        return total

    def _sign(self, r: Interval) -> str:
        if self.nonneg(r.lo):
            return "nonneg"
        if r.hi is not None and self.nonneg(-r.hi):
            return "nonpos"
        return "mixed"

    def _mul(self, a: Interval, b: Interval) -> Interval:
        if None not in (a.const_lo, a.const_hi, b.const_lo, b.const_hi):
            corners = [x * y for x in (a.const_lo, a.const_hi) for y in (b.const_lo, b.const_hi)]  # type: ignore[operator]
            return Interval.const(min(corners), max(corners))
        sa, sb = self._sign(a), self._sign(b)
        if sa == "mixed" and sb != "mixed":
            a, b, sa, sb = b, a, sb, sa
        if sa == "nonneg":
            if sb == "nonneg":
                return Interval(_pmul(a.lo, b.lo), _pmul(a.hi, b.hi))
            if sb == "nonpos":
                return Interval(_pmul(a.hi, b.lo), _pmul(a.lo, b.hi))
            return Interval(_pmul(a.hi, b.lo), _pmul(a.hi, b.hi))
        if sa == "nonpos":
            if sb == "nonneg":
                return Interval(_pmul(a.lo, b.hi), _pmul(a.hi, b.lo))
            if sb == "nonpos":
                return Interval(_pmul(a.hi, b.hi), _pmul(a.lo, b.lo))
            return Interval(_pmul(a.lo, b.hi), _pmul(a.lo, b.lo))
        return UNBOUNDED

    def _atom(self, a: Expr) -> Interval:
        """The range of an atom of a polynomial: a variable or an opaque operation."""
        if isinstance(a, Var):
            if a.name in self.ranges:
                return self.ranges[a.name]
            if a.name in self.symbols:
                return Interval.point(Poly.atom(a))
            return type_range(a.type.dtype)
        if isinstance(a, Binary):
            rule = _ATOM_RULES.get(a.op)
            if rule is not None:
                return rule(self, a)
        if isinstance(a, ex.Cast):
            if _preserves_value(a.value.type.dtype, a.type.dtype):
                return self.interval(a.value)
            return type_range(a.type.dtype)
        if isinstance(a, ex.Select):
            return self._union(self.interval(a.a), self.interval(a.b))
        if isinstance(a, ex.Call) and a.name == ex.CHECKED_INDEX:  # in [0, n - 1]
            return Interval(Poly.const(0), self.interval(ex.sub(a.args[1], Const(1))).hi)
        return type_range(a.type.dtype)

    def _union(self, a: Interval, b: Interval) -> Interval:
        lo = a.lo if self._le(a.lo, b.lo) else b.lo if self._le(b.lo, a.lo) else None
        hi = b.hi if self._le(a.hi, b.hi) else a.hi if self._le(b.hi, a.hi) else None
        return Interval(lo, hi)

    # -- rules for opaque binary atoms --
    def _floordiv(self, e: Binary) -> Interval:
        a = self.interval(e.a)
        c = const_int(e.b)
        if c is not None and c > 0:
            lo = _floor_end(a.lo, c, self, lower=True)
            hi = _floor_end(a.hi, c, self, lower=False)
            return Interval(lo, hi)
        if c is None and self._atom_nonneg_expr(e.b) and self.nonneg(a.lo):
            return Interval(Poly.const(0), a.hi)  # a // b <= a for a >= 0, b >= 1
        return type_range(e.type.dtype)

    def _mod(self, e: Binary) -> Interval:
        a = self.interval(e.a)
        c = const_int(e.b)
        if c is not None and c > 0:
            if self.nonneg(a.lo) and self._le(a.hi, Poly.const(c - 1)):
                return a
            return Interval.const(0, c - 1)
        if c is None and self._atom_nonneg_expr(e.b):
            b = self.interval(e.b)
            if self.nonneg(a.lo) and self._le(a.hi, None if b.lo is None else b.lo - Poly.const(1)):
                return a
            return Interval(Poly.const(0), None if b.hi is None else b.hi - Poly.const(1))
        return type_range(e.type.dtype)

    def _min(self, e: Binary) -> Interval:
        a, b = self.interval(e.a), self.interval(e.b)
        lo = a.lo if self._le(a.lo, b.lo) else b.lo if self._le(b.lo, a.lo) else None
        hi = a.hi if self._le(a.hi, b.hi) or b.hi is None else b.hi if self._le(b.hi, a.hi) or a.hi is None \
            else b.hi if b.hi.is_const else a.hi  # both bound it: keep a constant (`min(32, s0 - k)`)
        return Interval(lo, hi)

    def _max(self, e: Binary) -> Interval:
        a, b = self.interval(e.a), self.interval(e.b)
        lo = b.lo if self._le(a.lo, b.lo) or a.lo is None else a.lo if self._le(b.lo, a.lo) or b.lo is None \
            else a.lo if a.lo.is_const else b.lo
        hi = b.hi if self._le(a.hi, b.hi) else a.hi if self._le(b.hi, a.hi) else None
        return Interval(lo, hi)

    def _and(self, e: Binary) -> Interval:
        for operand in (e.b, e.a):
            c = const_int(operand)
            if c is not None and c >= 0:
                return Interval.const(0, c)
        return type_range(e.type.dtype)

    def _shr(self, e: Binary) -> Interval:
        a, k = self.interval(e.a), const_int(e.b)
        if k is not None and k >= 0 and self.nonneg(a.lo):
            if a.const_hi is not None:
                d = e.type.dtype
                lo = sem.evaluate("shr", d, a.const_lo, k) if a.const_lo is not None else 0
                return Interval.const(lo, sem.evaluate("shr", d, a.const_hi, k))
            return Interval(Poly.const(0), a.hi)
        return type_range(e.type.dtype)

    def _shl(self, e: Binary) -> Interval:
        k = const_int(e.b)
        if k is not None and 0 <= k < 62:
            return self.interval(e.a).scale(1 << k)
        return type_range(e.type.dtype)

    def _atom_nonneg_expr(self, e: Expr) -> bool:
        return self.nonneg(self.interval(e).lo)


def _floor_end(p: End, c: int, b: Bounds, lower: bool) -> End:
    """An end point of `x // c` from the same end point of `x` (c > 0)."""
    if p is None:
        return None
    if p.is_const:
        return Poly.const(sem.evaluate("floordiv", dt.index, p.const_value, c))
    if b.nonneg(p):
        # 0 <= p // c <= p
        return Poly.const(0) if lower else p
    if b.nonneg(-p):
        # p <= p // c <= 0
        return p if lower else Poly.const(0)
    return None


_ATOM_RULES = {
    "floordiv": Bounds._floordiv,
    "mod": Bounds._mod,
    "min": Bounds._min,
    "max": Bounds._max,
    "and": Bounds._and,
    "shr": Bounds._shr,
    "shl": Bounds._shl,
}


def _within_type(r: Interval, dtype: DType) -> Interval:
    """`r`, or the whole range of `dtype` where a constant end point leaves it (the value may
    have wrapped). i64 is the index type: index arithmetic is taken not to overflow."""
    if dtype.is_bool or dtype == dt.index:
        return r
    full = type_range(dtype)
    lo, hi = r.const_lo, r.const_hi
    if (lo is not None and lo < full.const_lo) or (hi is not None and full.const_hi is not None
                                                    and hi > full.const_hi):  # type: ignore[operator]
        return full
    return r


def kernel_bounds(symbols: Iterable[Var]) -> Bounds:
    """The analyzer at the top of a kernel: only the (non-negative) symbols are known."""
    return Bounds(v.name for v in symbols)


def _preserves_value(src: DType, dst: DType) -> bool:
    """Whether every value of integer type `src` is representable in `dst` (a widening cast)."""
    if src.is_bool:
        return dst.is_int or dst.is_bool
    if not (src.is_int and dst.is_int):
        return False
    if src.is_signed:
        return dst.is_signed and dst.bits >= src.bits
    return dst.bits > src.bits or (not dst.is_signed and dst.bits == src.bits)
