"""`simplify`: algebraic simplification of expressions and clean-up of statements.

Expressions are simplified bottom-up by a small table of rewrite rules, each a function of
the node and a `Bounds` analyzer that knows the ranges of the enclosing loop variables:

- constant folding of every operator, in the operand dtype (integers wrap, f32 rounds as f32);
- identities: `x * 1`, `x + 0`, `x - 0.0`... (float rules only where IEEE-exact: `x + 0.0` is
  not `x` for `x = -0.0`, so only `x + -0.0` folds);
- integer index expressions are kept in a polynomial normal form, so `i0 * 4 + i1 * 4 - 4 * i0`
  becomes `i1 * 4`;
- division and remainder (floor semantics) by `d`, a constant or a monomial such as `s1` or
  `4 * s1`: with `x = q*d + r`, `x // d -> q + r // d` and `x % d -> r % d` (exact for any
  non-zero `d`); then `r // d -> 0` and `r % d -> r` when `0 <= r < d` is provable from the loop
  bounds (`bounds.py`); `(x // c1) // c2 -> x // (c1*c2)`, `(x // c) * c + x % c -> x`;
- `min`, `max` and comparisons decided by the bounds; `select` with a known condition;
- vector forms in closed form (`ramp(b, s, n) + broadcast(x, n) -> ramp(b + x, s, n)`;
  `ramp(b, 1, 16) // 128 -> broadcast(b // 128, 16)` when `b` is a multiple of 16).

Statements: lets bound to a constant or a variable are substituted, unused lets and unused
local allocations are removed, loops with extent <= 0 disappear, loops with extent 1 are
replaced by their body with the variable substituted, and ifs with a known condition by the
taken branch.

Before:

    kernel @k(%x: f32[64] strides [1], %out: f32[16, 4] strides [4, 1]) {
      for i0 in 0..16 {
        for i1 in 0..4 {
          for i2 in 0..1 {
            let t = 0
            %out[(i0 * 4 + i1 + i2) // 4, (i0 * 4 + i1) % 4] = %x[i0 * 4 + i1 + t] * 1.0:f32
          }
        }
      }
    }

After:

    kernel @k(%x: f32[64] strides [1], %out: f32[16, 4] strides [4, 1]) {
      for i0 in 0..16 {
        for i1 in 0..4 {
          %out[i0, i1] = %x[i0 * 4 + i1]
        }
      }
    }
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir import semantics as sem
from ...ir.expr import Binary, Const, Expr, Var
from ..base import LoopPass, register_pass
from .bounds import Bounds, kernel_bounds
from .loop_utils import (
    NameSupply,
    Poly,
    const_int,
    empty,
    freshen,
    is_empty,
    map_kernels,
    substitute_stmt,
    uniform_value,
    vector_binary,
)

Rule = Callable[[Expr, Bounds], Optional[Expr]]

#: Iterations of the rule table on one node before giving up on a fixed point.
MAX_REWRITES = 16

# ---- constant folding -------------------------------------------------------------------------

#: Float ops folded at compile time: those whose result IEEE (or the IR's formula) fixes
#: exactly, so folding gives what the generated code computes. Transcendental functions are
#: left to the target's math library.
EXACT_FLOAT_OPS: frozenset[str] = frozenset(
    {"add", "sub", "mul", "div", "floordiv", "mod", "remainder", "fmod", "min", "max", "copysign"}
) | ex.COMPARISONS


def fold_constants(e: Expr, b: Bounds) -> Optional[Expr]:
    """`3 + 4 -> 7`, `100:i8 + 100:i8 -> -56:i8`, `1.5:f32 * 2.0:f32 -> 3.0:f32`, `2 < 3 -> true`
    (scalar constants only; values are `semantics.evaluate`'s; integer division by zero stays)."""
    if not (isinstance(e, Binary) and isinstance(e.a, Const) and isinstance(e.b, Const)):
        return None
    d = e.a.type.dtype
    if (d.is_float and e.op not in EXACT_FLOAT_OPS) or not sem.defined(e.op, d):
        return None
    try:
        r = sem.evaluate(e.op, d, e.a.value, e.b.value)
    except sem.DivisionByZero:
        return None
    return Const(r, e.type)


def fold_cast(e: Expr, b: Bounds) -> Optional[Expr]:
    """`cast<f32>(3) -> 3.0:f32`, `cast<i32>(2.7:f32) -> 2:i32`, `cast<f32>(0.1:f64)` rounds
    (`semantics.cast_value`); a float out of the integer's range (or NaN) is left to the target."""
    if not (isinstance(e, ex.Cast) and isinstance(e.value, Const) and e.value.type.lanes == 1):
        return None
    src, d = e.value.type.dtype, e.type.dtype
    if src.is_float and d.is_int and not sem.float_fits_int(e.value.value, d):
        return None
    return Const(sem.cast_value(e.value.value, src, d), e.type)


# ---- identities -------------------------------------------------------------------------------------

def _is_const(e: Expr, value: float) -> bool:
    u = uniform_value(e)
    return isinstance(u, Const) and not u.type.dtype.is_bool and u.value == value


def _is_neg_zero(e: Expr) -> bool:
    u = uniform_value(e)
    return isinstance(u, Const) and u.type.dtype.is_float and u.value == 0.0 \
        and math.copysign(1.0, float(u.value)) < 0


def identities(e: Expr, b: Bounds) -> Optional[Expr]:
    """`x * 1 -> x`, `x + 0 -> x`, `x * 0 -> 0` (integers), `x - x -> 0` (integers),
    `x + -0.0 -> x`, `x - 0.0 -> x`, `x / 1 -> x`, `x // 1 -> x`, `x % 1 -> 0`, `0 // y -> 0`,
    `min(x, x) -> x`."""
    if not isinstance(e, Binary):
        return None
    x, y, op = e.a, e.b, e.op
    is_int = e.a.type.dtype.is_int
    if op == "mul":
        if _is_const(y, 1):
            return x
        if _is_const(x, 1):
            return y
        if is_int and (_is_const(x, 0) or _is_const(y, 0)):
            return _zero_like(e)
    elif op == "add":
        if (is_int and _is_const(y, 0)) or _is_neg_zero(y):
            return x
        if (is_int and _is_const(x, 0)) or _is_neg_zero(x):
            return y
    elif op == "sub":
        if _is_const(y, 0) and (is_int or not _is_neg_zero(y)):
            return x
        if is_int and x == y:
            return _zero_like(e)
    elif op in ("div", "floordiv") and _is_const(y, 1):
        return x
    elif op == "mod" and is_int and _is_const(y, 1):
        return _zero_like(e)
    if op in ("div", "floordiv", "mod") and is_int and _is_const(x, 0) and not _is_const(y, 0):
        return _zero_like(e)  # 0 / y, for the y != 0 the program relies on
    elif op in ("min", "max") and x == y:
        return x
    elif op in ("and", "or") and e.type.dtype.is_bool:
        for p, q in ((x, y), (y, x)):
            if isinstance(p, Const):
                keep = (op == "and") == bool(p.value)
                return q if keep else p
    return None


def _zero_like(e: Expr) -> Expr:
    z = Const(0, e.type.with_lanes(1))
    return z if e.type.lanes == 1 else ex.Broadcast(z, e.type)


# ---- integer index arithmetic ----------------------------------------------------------------------------

def _is_index(e: Expr) -> bool:
    return e.type == ex.INDEX


def canonical_index(e: Expr, b: Bounds) -> Optional[Expr]:
    """`+ - *` on i64 in polynomial normal form: `(i0 + 1) * 4 - 4 -> i0 * 4`,
    plus `(x // c) * c + x % c -> x`."""
    if not (_is_index(e) and isinstance(e, Binary) and e.op in ("add", "sub", "mul")):
        return None
    p = _merge_div_mod(Poly.of(e))
    out = p.to_expr()
    return None if out == e else out


def _merge_div_mod(p: Poly) -> Poly:
    """`k*c * (x // c) + k * (x % c)` -> `k * x` for a positive constant c."""
    d = p.as_dict()
    changed = False
    for m, k in list(d.items()):
        if len(m) != 1 or not (isinstance(m[0], Binary) and m[0].op == "mod"):
            continue
        x, c = m[0].a, const_int(m[0].b)
        if c is None or c <= 0:
            continue
        q = ((ex.floordiv(x, c),))
        if d.get(q) == k * c and d.get(m) == k:
            del d[q], d[m]
            for mx, cx in Poly.of(x).scale(k).terms:
                d[mx] = d.get(mx, 0) + cx
            changed = True
    return Poly._from_dict(d, p.type) if changed else p


def _split_by(p: Poly, divisor: Expr) -> Optional[tuple[Poly, Poly]]:
    """Write `p = q * divisor + r` by moving every monomial divisible by `divisor` (a constant
    or a monomial times a constant) into `q`."""
    dp = Poly.of(divisor)
    if len(dp.terms) != 1:
        return None
    (dm, dc), = dp.terms
    q: dict[tuple[Expr, ...], int] = {}
    r: dict[tuple[Expr, ...], int] = {}
    for m, c in p.terms:
        rest = list(m)
        divisible = c % dc == 0
        for a in dm:
            if a in rest:
                rest.remove(a)
            else:
                divisible = False
        if divisible:
            q[tuple(rest)] = q.get(tuple(rest), 0) + c // dc
        else:
            r[m] = r.get(m, 0) + c
    return Poly._from_dict(q, p.type), Poly._from_dict(r, p.type)


def _nonzero_divisor(d: Expr, b: Bounds) -> bool:
    """Constant divisors must be non-zero; a symbolic one is, wherever the program is defined."""
    c = const_int(d)
    return c != 0


def div_mod(e: Expr, b: Bounds) -> Optional[Expr]:
    """With `x = q*d + r`: `x // d -> q + r // d`, `x % d -> r % d` (exact for floor division
    by any non-zero `d`); `r // d -> k` when `k*d <= r < (k+1)*d` is provable, `r % d -> r` when
    `0 <= r < d` is."""
    if not (_is_index(e) and isinstance(e, Binary) and e.op in ("floordiv", "mod")):
        return None
    d = e.b
    if not _nonzero_divisor(d, b):
        return None
    split = _split_by(Poly.of(e.a), d)
    if split is None:
        return None
    q, r = split
    r_expr = r.to_expr()
    if e.op == "mod":
        if b.prove_in(r_expr, Const(0), d):
            return r_expr
        out: Expr = Binary("mod", r_expr, d, e.type)
    else:
        k = _known_quotient(r_expr, d, b)
        r_div = Const(k) if k is not None else Binary("floordiv", r_expr, d, e.type)
        out = ex.add(q.to_expr(), r_div)
    return None if out == e else out


def _known_quotient(r: Expr, d: Expr, b: Bounds) -> Optional[int]:
    """`k` when `k*d <= r < (k+1)*d` is provable."""
    if b.prove_in(r, Const(0), d):
        return 0
    c = const_int(d)
    lo = b.interval(r).const_lo
    if c is not None and lo is not None:
        k = lo // c
        if b.prove_lt(r, Const((k + 1) * c)):
            return k
    return None


def nested_div_mod(e: Expr, b: Bounds) -> Optional[Expr]:
    """`(x // c1) // c2 -> x // (c1 * c2)` and `(x % c1) % c2 -> x % c2` when c2 divides c1
    (positive constants)."""
    if not (isinstance(e, Binary) and e.type.dtype.is_int and isinstance(e.a, Binary)):
        return None
    c1, c2 = const_int(e.a.b), const_int(e.b)
    if c1 is None or c2 is None or c1 <= 0 or c2 <= 0:
        return None
    if e.op == "floordiv" and e.a.op == "floordiv":
        return Binary("floordiv", e.a.a, Const(c1 * c2, e.type), e.type)
    if e.op == "mod" and e.a.op == "mod" and c1 % c2 == 0:
        return Binary("mod", e.a.a, e.b, e.type)
    return None


def min_max(e: Expr, b: Bounds) -> Optional[Expr]:
    """`min(a, b) -> a` when `a <= b` is provable (and the like for max)."""
    if not (isinstance(e, Binary) and e.op in ("min", "max") and _is_index(e)):
        return None
    if b.prove_le(e.a, e.b):
        return e.a if e.op == "min" else e.b
    if b.prove_le(e.b, e.a):
        return e.b if e.op == "min" else e.a
    return None


def compare(e: Expr, b: Bounds) -> Optional[Expr]:
    """Integer comparisons decided by the bounds: `i1 < 4 -> true` inside `for i1 in 0..4`."""
    if not (isinstance(e, Binary) and e.op in ex.COMPARISONS and _is_index(e.a)):
        return None
    x, y = e.a, e.b
    if e.op in ("gt", "ge"):
        x, y = y, x
    if e.op in ("lt", "gt"):
        known = True if b.prove_lt(x, y) else False if b.prove_le(y, x) else None
    elif e.op in ("le", "ge"):
        known = True if b.prove_le(x, y) else False if b.prove_lt(y, x) else None
    else:
        same = Poly.of(x) == Poly.of(y)
        differ = b.prove_lt(x, y) or b.prove_lt(y, x)
        known = same if (same or differ) else None
        if known is not None and e.op == "ne":
            known = not known
    return None if known is None else Const(known, e.type)


def vector_forms(e: Expr, b: Bounds) -> Optional[Expr]:
    """Binary operations on broadcasts and ramps in closed form (see `vector_binary`)."""
    if not (isinstance(e, Binary) and e.type.lanes > 1):
        return None
    if not any(isinstance(x, (ex.Broadcast, ex.Ramp)) for x in (e.a, e.b)):
        return None
    out = vector_binary(e.op, e.a, e.b)
    return None if out == e else out


def ramp_div_mod(e: Expr, b: Bounds) -> Optional[Expr]:
    """`ramp(x, s, n) // c -> broadcast(x // c, n)` and `ramp(x, s, n) % c -> ramp(x % c, s, n)`
    (a positive constant `c`, `s >= 0`) when no two lanes straddle a multiple of `c`: `x` is a
    multiple of `g` (the gcd of its polynomial's coefficients), so `x % c` is a multiple of
    `gcd(g, c)`, and `(n - 1) * s < gcd(g, c)` keeps the last lane in the same block. A row of
    16 lanes read through a flattened `[.., 128, 128]` view (`ramp(r * 64 + 16, 1, 16) // 128`)
    was otherwise a gather: GroupNorm's statistics over 8x32x128x128, 2.35 ms a reduction."""
    if not (isinstance(e, Binary) and e.op in ("floordiv", "mod") and isinstance(e.a, ex.Ramp)
            and e.type.dtype == ex.INDEX.dtype):  # exact integers: a narrower type wraps
        return None
    c = const_int(uniform_value(e.b))
    s = const_int(e.a.stride)
    if c is None or s is None or c <= 0 or s < 0:
        return None
    g = 0
    for _, coef in Poly.of(e.a.base).terms:
        g = math.gcd(g, coef)
    block = math.gcd(g, c)
    if (e.type.lanes - 1) * s >= block:
        return None
    if e.op == "floordiv":
        q = ex.binary("floordiv", e.a.base, Const(c, e.a.base.type))
        return ex.Broadcast(q, q.type.with_lanes(e.type.lanes))
    return ex.Ramp(ex.binary("mod", e.a.base, Const(c, e.a.base.type)), e.a.stride, e.type)


def ramp_zero_stride(e: Expr, b: Bounds) -> Optional[Expr]:
    """`ramp(x, 0, n) -> broadcast(x, n)`."""
    if isinstance(e, ex.Ramp) and _is_const(e.stride, 0):
        return ex.Broadcast(e.base, e.type)
    return None


def select_known(e: Expr, b: Bounds) -> Optional[Expr]:
    """`select(true, x, y) -> x`, `select(c, x, x) -> x`."""
    if not isinstance(e, ex.Select):
        return None
    c = uniform_value(e.cond)
    if isinstance(c, Const):
        return e.a if c.value else e.b
    if e.a == e.b:
        return e.a
    return None


def reduce_broadcast(e: Expr, b: Bounds) -> Optional[Expr]:
    """`vreduce_max(broadcast(x, n)) -> x` (also min, and, or)."""
    if isinstance(e, ex.VectorReduce) and e.op in ("min", "max", "and", "or") \
            and isinstance(e.value, ex.Broadcast):
        return e.value.value
    return None


def double_negation(e: Expr, b: Bounds) -> Optional[Expr]:
    """`neg(neg(x)) -> x`, `not(not(x)) -> x`, `neg(c) -> -c`."""
    if not (isinstance(e, ex.Call) and e.name in ("neg", "not") and len(e.args) == 1):
        return None
    x = e.args[0]
    if isinstance(x, ex.Call) and x.name == e.name:
        return x.args[0]
    if isinstance(x, Const) and e.name == "neg" and not x.type.dtype.is_bool:
        v = -x.value
        return Const(sem.wrap_int(int(v), x.type.dtype) if x.type.dtype.is_int else v, x.type)
    return None


#: The rewrite table: rules tried, in order, on each kind of node.
RULES: dict[type, tuple[Rule, ...]] = {
    Binary: (fold_constants, identities, canonical_index, div_mod, nested_div_mod, min_max,
             compare, vector_forms, ramp_div_mod),
    ex.Cast: (fold_cast,),
    ex.Select: (select_known,),
    ex.Ramp: (ramp_zero_stride,),
    ex.VectorReduce: (reduce_broadcast,),
    ex.Call: (double_negation,),
}


def simplify_expr(e: Expr, bounds: Optional[Bounds] = None) -> Expr:
    """Simplify an expression bottom-up with `RULES` (without loop ranges unless given). The
    results, subexpressions included, are kept in the scope (`Bounds.simplified`), so the
    statements of one loop body share the work on their common index expressions."""
    return _ExprSimplifier(bounds or Bounds()).visit(e)


class _ExprSimplifier:
    def __init__(self, bounds: Bounds) -> None:
        self.bounds = bounds
        self.cache: dict[Expr, Expr] = bounds.simplified

    def visit(self, e: Expr) -> Expr:
        hit = self.cache.get(e)
        if hit is not None:
            return hit
        self._warm(e)
        out = self._rewrite(self._children(e))
        self.cache[e] = out
        return out

    def _warm(self, e: Expr) -> None:
        """Simplify the operands below `e` deepest first, with an explicit stack, so the
        recursion of `visit` finds them cached (expressions can be thousands deep)."""
        stack: list[tuple[Expr, bool]] = [(k, False) for k in reversed(e.children())]
        while stack:
            node, children_done = stack.pop()
            if node in self.cache:
                continue
            if children_done or not node.children():
                self.cache[node] = self._rewrite(self._children(node))
                continue
            stack.append((node, True))
            stack.extend((k, False) for k in reversed(node.children()))

    def _children(self, e: Expr) -> Expr:
        changes: dict[str, Any] = {}
        for name, value in vars(e).items():
            if isinstance(value, Expr):
                new = self.visit(value)
                if new is not value:
                    changes[name] = new
            elif isinstance(value, tuple) and value and isinstance(value[0], Expr):
                items = tuple(self.visit(x) for x in value)
                if any(a is not b for a, b in zip(items, value)):
                    changes[name] = items
        return replace(e, **changes) if changes else e  # type: ignore[type-var]

    def _rewrite(self, e: Expr) -> Expr:
        for _ in range(MAX_REWRITES):
            for rule in RULES.get(type(e), ()):
                out = rule(e, self.bounds)
                if out is not None and out != e:
                    e = self._children(out)  # a rewrite can expose new work in the children
                    break
            else:
                return e
        return e


# ---- statements ------------------------------------------------------------------------------------------

def stmt_free_vars(s: lp.Stmt) -> set[str]:
    """Names of the variables read anywhere in a statement tree."""
    names: set[str] = set()
    for node in lp.walk_stmts(s):
        for e in lp.stmt_exprs(node):
            names |= ex.free_vars(e)
    return names


def _buffers_used(s: lp.Stmt) -> set[str]:
    names: set[str] = set()
    for node in lp.walk_stmts(s):
        if isinstance(node, lp.Store):
            names.add(node.buffer)
        for e in lp.stmt_exprs(node):
            names |= {x.buffer for x in ex.walk(e) if isinstance(x, ex.Load)}
    return names


def _free_names(stmts: tuple[lp.Stmt, ...]) -> set[str]:
    """Variables and buffers a statement sequence uses without binding them first."""
    free: set[str] = set()

    def visit(s: lp.Stmt, bound: set[str]) -> None:
        for e in lp.stmt_exprs(s):
            names = ex.free_vars(e) | {x.buffer for x in ex.walk(e) if isinstance(x, ex.Load)}
            free.update(names - bound)
        if isinstance(s, lp.Block):
            for x in s.stmts:
                visit(x, bound)
        elif isinstance(s, lp.Store):
            free.update({s.buffer} - bound)
        elif isinstance(s, lp.Let):
            bound.add(s.var.name)
        elif isinstance(s, lp.Alloc):
            bound.add(s.buffer.name)
        elif isinstance(s, lp.For):
            visit(s.body, bound | {s.var.name})
        elif isinstance(s, lp.If):
            visit(s.then, set(bound))
            if s.orelse is not None:
                visit(s.orelse, set(bound))

    visit(lp.Block(stmts), set())
    return free


def _defined_names(s: lp.Stmt) -> set[str]:
    out: set[str] = set()
    for node in lp.walk_stmts(s):
        if isinstance(node, lp.Let):
            out.add(node.var.name)
        elif isinstance(node, lp.Alloc):
            out.add(node.buffer.name)
    return out


def _loaded_buffers(e: Expr) -> set[str]:
    return {x.buffer for x in ex.walk(e) if isinstance(x, ex.Load)}


@dataclass
class _StmtSimplifier:
    names: NameSupply
    #: `uses` per statement: id -> (the statement, its variables, its buffers)
    memo: dict[int, tuple[lp.Stmt, frozenset[str], frozenset[str]]] = field(default_factory=dict)

    def block(self, stmts: tuple[lp.Stmt, ...], b: Bounds) -> lp.Stmt:
        out: list[lp.Stmt] = []
        subst: dict[str, Expr] = {}
        for i, s in enumerate(stmts):
            if subst:
                s = substitute_stmt(s, subst)
            if isinstance(s, lp.Let):
                value = simplify_expr(s.value, b)
                if isinstance(value, (Const, Var)):
                    subst[s.var.name] = value
                    continue
                if value.type.lanes == 1 and value.type.dtype.is_int:
                    b = b.bind(s.var.name, b.interval(value))
                out.append(lp.Let(s.var, value))
                continue
            new = self.stmt(s, b)
            if not isinstance(s, lp.Block) and isinstance(new, lp.Block):
                # A loop or branch dissolved into this block: its names must not meet the
                # names defined before it here, capture uses after it, or be bound again by
                # a statement after it (a vectorized loop of one iteration dissolved beside its
                # scalar tail, which binds the same names: a verifier error on AVX2 for a
                # biased 5x5 convolution 36 wide)
                clash = (_defined_names(lp.Block(tuple(out))) | _free_names(stmts[i + 1:])
                         | _defined_names(lp.Block(tuple(stmts[i + 1:]))))
                if _defined_names(new) & clash:
                    new = freshen(new, self.names)
            out.append(new)
        return lp.block(*_drop_dead(out, self.uses)) if out else empty()

    def uses(self, s: lp.Stmt) -> tuple[frozenset[str], frozenset[str]]:
        """The variables and buffers a statement tree reads or writes (`stmt_free_vars`,
        `_buffers_used`), remembered per statement: the blocks of a nest are cleaned from the
        inside out, so an outer block finds its inner statements' answers here instead of
        walking them again at every level."""
        hit = self.memo.get(id(s))
        if hit is not None and hit[0] is s:
            return hit[1], hit[2]
        names: set[str] = set()
        bufs: set[str] = set()
        if isinstance(s, lp.Store):
            bufs.add(s.buffer)
        for e in lp.stmt_exprs(s):
            names |= ex.free_vars(e)
            bufs |= _loaded_buffers(e)
        for child in s.children():
            child_names, child_bufs = self.uses(child)
            names |= child_names
            bufs |= child_bufs
        out = (frozenset(names), frozenset(bufs))
        self.memo[id(s)] = (s, *out)
        return out

    def stmt(self, s: lp.Stmt, b: Bounds) -> lp.Stmt:
        if isinstance(s, lp.Block):
            return self.block(s.stmts, b)
        if isinstance(s, lp.Store):
            return lp.Store(s.buffer, tuple(simplify_expr(i, b) for i in s.index), simplify_expr(s.value, b))
        if isinstance(s, lp.For):
            return self.loop(s, b)
        if isinstance(s, lp.If):
            cond = simplify_expr(s.cond, b)
            if isinstance(cond, Const):
                taken = s.then if cond.value else s.orelse
                return empty() if taken is None else self.block((taken,), b)
            then = self.stmt(s.then, b)
            orelse = None if s.orelse is None else self.stmt(s.orelse, b)
            if orelse is not None and is_empty(orelse):
                orelse = None
            if is_empty(then) and orelse is None:
                return empty()
            return lp.If(cond, then, orelse)
        if isinstance(s, lp.Let):
            return self.block((s,), b)
        return s

    def loop(self, s: lp.For, b: Bounds) -> lp.Stmt:
        start, extent = simplify_expr(s.start, b), simplify_expr(s.extent, b)
        if b.prove_le(extent, Const(0)):
            return empty()
        if const_int(extent) == 1:
            return self.block((substitute_stmt(s.body, {s.var.name: start}),), b)
        body = self.stmt(s.body, b.bind_loop(s.var, start, extent))
        if is_empty(body):
            return empty()
        return replace(s, start=start, extent=extent, body=body)


def _drop_dead(stmts: list[lp.Stmt], uses: "Callable[[lp.Stmt], tuple[frozenset[str], frozenset[str]]] | None" = None
               ) -> list[lp.Stmt]:
    """Remove lets whose variable and allocations whose buffer the rest of the block never uses
    (`uses(s)`: the variables and buffers of a statement tree, by default walked afresh)."""
    used_vars: set[str] = set()
    used_bufs: set[str] = set()
    kept: list[lp.Stmt] = []
    for s in reversed(stmts):
        if isinstance(s, lp.Let) and s.var.name not in used_vars:
            continue
        if isinstance(s, lp.Alloc) and s.buffer.name not in used_bufs:
            continue
        if is_empty(s):
            continue
        if uses is None:
            used_vars |= stmt_free_vars(s)
            used_bufs |= _buffers_used(s)
        else:
            names, bufs = uses(s)
            used_vars |= names
            used_bufs |= bufs
        kept.append(s)
    return kept[::-1]


def simplify_kernel(kernel: lp.Kernel) -> lp.Kernel:
    """Simplify one kernel's body (see the module docstring)."""
    body = _StmtSimplifier(NameSupply.for_kernel(kernel)).stmt(kernel.body, kernel_bounds(kernel.symbols))
    return kernel if body == kernel.body else replace(kernel, body=body)


@register_pass
@dataclass(frozen=True)
class Simplify(LoopPass):
    """Algebraic simplification of expressions, constant folding and statement clean-up.

    Before:

        for i0 in 0..16 {
          for i1 in 0..4 {
            for i2 in 0..1 {
              let t = 0
              %out[(i0 * 4 + i1 + i2) // 4, (i0 * 4 + i1) % 4] = %x[i0 * 4 + i1 + t] * 1.0:f32
            }
          }
        }

    After:

        for i0 in 0..16 {
          for i1 in 0..4 {
            %out[i0, i1] = %x[i0 * 4 + i1]
          }
        }

    The rules are listed in `RULES`; see the module docstring for what each does.
    """

    name = "simplify"
    per_kernel = True

    def run(self, program: lp.Program) -> lp.Program:
        return map_kernels(program, simplify_kernel)
