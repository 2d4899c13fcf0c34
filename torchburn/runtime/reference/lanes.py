"""Which loops the reference engine may run as NumPy lanes (all iterations at once).

A loop runs in lanes when its iterations are independent: for every buffer the body writes
(other than locals it allocates itself, which get one private copy per lane), there is one
dimension in which every access of that buffer in the body uses the same index expression,
and that expression is injective in the loop variable: `a * i + c` with a constant `a != 0`
and `c` not bound inside the loop (a `ramp(a * i + c, s, n)` is injective when `|a| >= n * |s|`).
Distinct iterations then touch disjoint elements (the engine also checks at run time that
the written buffers do not overlap themselves and that no kernel argument is passed twice
while written), so the lock-step execution equals the sequential one.

    for i0 in 0..s0 {                      runs in lanes: %out is accessed at [i0, i1] only
      for i1 in 0..4 {                     runs in lanes too (a second lane axis)
        %out[i0, i1] = exp(%x[i0, i1])
      }
    }
    for k in 0..512 {                      stays serial: %acc[0] is the same element for all k
      %acc[0] = %acc[0] + %x[k]
    }
"""
from __future__ import annotations

from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Expr


def laneable(loop: lp.For) -> bool:
    """Whether the iterations of `loop` are independent (module docstring)."""
    accesses: dict[str, list[tuple[Expr, ...]]] = {}
    written: set[str] = set()
    allocated: set[str] = set()
    inside: set[str] = {loop.var.name}
    _collect(loop.body, {}, inside, accesses, written, allocated)
    for name in written - allocated:
        if not _has_injective_dim(accesses[name], loop.var.name, inside):
            return False
    return True


def _resolve(e: Expr, lets: dict[str, Optional[Expr]]) -> Expr:
    """`e` with the load-free integer `let`s in scope substituted (opaque ones stay names)."""
    names = ex.free_vars(e)
    mapping = {n: v for n in names if (v := lets.get(n)) is not None}
    return ex.substitute(e, mapping) if mapping else e


def _collect(s: lp.Stmt, lets: dict[str, Optional[Expr]], inside: set[str],
             accesses: dict[str, list[tuple[Expr, ...]]], written: set[str], allocated: set[str]) -> None:
    def note_loads(e: Expr) -> None:
        for node in ex.walk(e):
            if isinstance(node, ex.Load):
                accesses.setdefault(node.buffer, []).append(tuple(_resolve(i, lets) for i in node.index))

    if isinstance(s, lp.Block):
        scope = dict(lets)
        for x in s.stmts:
            _collect(x, scope, inside, accesses, written, allocated)
        return
    for e in lp.stmt_exprs(s):
        note_loads(e)
    if isinstance(s, lp.Let):
        inside.add(s.var.name)
        loads = any(isinstance(n, ex.Load) for n in ex.walk(s.value))
        lets[s.var.name] = None if loads or not s.var.dtype.is_int or s.var.lanes != 1 else _resolve(s.value, lets)
    elif isinstance(s, lp.Store):
        written.add(s.buffer)
        accesses.setdefault(s.buffer, []).append(tuple(_resolve(i, lets) for i in s.index))
    elif isinstance(s, lp.Alloc):
        allocated.add(s.buffer.name)
    elif isinstance(s, lp.For):
        inside.add(s.var.name)
        lets[s.var.name] = None
        _collect(s.body, dict(lets), inside, accesses, written, allocated)
    elif isinstance(s, lp.If):
        _collect(s.then, dict(lets), inside, accesses, written, allocated)
        if s.orelse is not None:
            _collect(s.orelse, dict(lets), inside, accesses, written, allocated)


def _has_injective_dim(indices: list[tuple[Expr, ...]], var: str, inside: set[str]) -> bool:
    first = indices[0]
    for d, e in enumerate(first):
        if all(len(ix) == len(first) and ix[d] == e for ix in indices) and _injective(e, var, inside):
            return True
    return False


def _injective(e: Expr, var: str, inside: set[str]) -> bool:
    if isinstance(e, ex.Broadcast):
        return _injective(e.value, var, inside)
    if isinstance(e, ex.Ramp):
        if not isinstance(e.stride, ex.Const):
            return False
        coef = _coefficient(e.base, var, inside)
        return coef is not None and coef != 0 and abs(coef) >= e.lanes * abs(int(e.stride.value))
    coef = _coefficient(e, var, inside)
    return coef is not None and coef != 0


def _coefficient(e: Expr, var: str, inside: set[str]) -> Optional[int]:
    """The constant `a` when `e == a * var + c` with `c` free of names bound inside the loop;
    None when `e` is not of that form."""
    if isinstance(e, ex.Var):
        if e.name == var:
            return 1
        return None if e.name in inside else 0
    if isinstance(e, ex.Const):
        return 0
    if isinstance(e, ex.Binary) and e.op in ("add", "sub"):
        a, b = _coefficient(e.a, var, inside), _coefficient(e.b, var, inside)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b
    if isinstance(e, ex.Binary) and e.op == "mul":
        for x, y in ((e.a, e.b), (e.b, e.a)):
            if isinstance(y, ex.Const):
                c = _coefficient(x, var, inside)
                return None if c is None else c * int(y.value)
    if isinstance(e, ex.Load):
        return None
    # any other node: fine when it mentions neither the variable nor a name bound inside
    names = ex.free_vars(e)
    if var in names or names & inside or any(isinstance(n, ex.Load) for n in ex.walk(e)):
        return None
    return 0


#: Binary ops an accumulator may be updated with (`%acc[c] = %acc[c] op e`).
FOLD_OPS = ("add", "mul", "min", "max", "and", "or", "xor")


def accumulator_updates(loop: lp.For) -> Optional[tuple[lp.Store, ...]]:
    """The stores of a reduction loop whose body is straight-line `let`s and accumulator
    updates `%acc[c] = %acc[c] op e` (`c` fixed during the loop, `%acc` read nowhere else in
    the body, one update per accumulator); None for any other loop. Such a loop evaluates
    every `e` for all iterations at once and folds them into each accumulator in iteration
    order (the same operations, in the same order, as running it serially).

        for k in 0..512 {
          let p = %a[i0, k] * %b[k, i1]
          %acc[0] = %acc[0] + p
        }
    """
    stmts = loop.body.stmts if isinstance(loop.body, lp.Block) else (loop.body,)
    if not all(isinstance(s, (lp.Let, lp.Store)) for s in stmts):
        return None
    stores = tuple(s for s in stmts if isinstance(s, lp.Store))
    written = {s.buffer for s in stores}
    if not stores or len(written) != len(stores):
        return None
    inside = {loop.var.name} | {s.var.name for s in stmts if isinstance(s, lp.Let)}
    for s in stmts:
        if isinstance(s, lp.Let) and _loads(s.value, written):
            return None
    for s in stores:
        if any(ex.free_vars(i) & inside or _loads(i, set()) for i in s.index):
            return None
        if fold_operand(s) is None:
            return None
    return stores


def fold_operand(s: lp.Store) -> Optional[tuple[str, Expr, bool]]:
    """For `%acc[c] = %acc[c] op e` (or `e op %acc[c]`): (op, e, whether the accumulator is the
    left operand); None when the store is not such an update or `e` reads `%acc`."""
    v = s.value
    if not isinstance(v, ex.Binary) or v.op not in FOLD_OPS:
        return None
    acc = ex.Load(s.buffer, s.index, v.type)
    for mine, other, left in ((v.a, v.b, True), (v.b, v.a, False)):
        if mine == acc and not _loads(other, {s.buffer}):
            return v.op, other, left
    return None


def _loads(e: Expr, names: set[str]) -> bool:
    """Whether `e` loads any of `names` (any buffer at all when `names` is empty)."""
    return any(isinstance(n, ex.Load) and (not names or n.buffer in names) for n in ex.walk(e))
