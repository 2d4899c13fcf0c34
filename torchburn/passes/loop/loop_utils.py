"""Helpers shared by the loop passes: a polynomial normal form for integer index expressions,
affine coefficients, flattened addresses, memory accesses, fresh names and statement
substitution.

The polynomial form is the workhorse. An integer expression built from `+`, `-` and `*` is
a sum of monomials, each an integer coefficient times a product of *atoms*; an atom is a
variable or any other subexpression (`i1 // 4`, `min(i0, 7)`, a load) treated as opaque.
Two expressions with equal polynomials are equal, so

    Poly.of(i0 * 4 + (i1 + 1) * 4 - 4)  ==  Poly.of((i0 + i1) * 4)

and the coefficient of a loop variable in an address is read straight off the polynomial:
in `i0 * s1 * 4 + i1 * 4 + i2` it is `s1 * 4` for `i0` and `1` for `i2`.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Iterator, Mapping, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Binary, Const, Expr, ScalarType, Var
from ...ir.printer import print_expr
from ...ir.transform import StmtMutator

# ---- polynomial normal form ----------------------------------------------------------------------

#: A product of atoms, sorted by `atom_key`, with repetition (`i0 * i0`); `()` is the unit.
Monomial = tuple[Expr, ...]

#: Products expand `(a + b) * (c + d)` only while the result stays this small; a larger product
#: is kept whole, as one atom.
MAX_PRODUCT_TERMS = 32


@functools.lru_cache(maxsize=4096)
def atom_key(e: Expr) -> tuple[int, str]:
    """A total order on atoms: variables first, by name, then other expressions by their text."""
    if isinstance(e, Var):
        return (0, e.name)
    return (1, print_expr(e))


def _monomial_key(m: Monomial) -> tuple[tuple[int, str], ...]:
    return tuple(atom_key(a) for a in m)


def _mul_monomials(a: Monomial, b: Monomial) -> Monomial:
    return tuple(sorted(a + b, key=atom_key))


@dataclass(frozen=True)
class Poly:
    """An integer polynomial over atoms: `{monomial: coefficient}` without zero coefficients.

    `type` is the scalar type of the expression it came from (normally `i64`); arithmetic is
    exact over the integers, which equals the IR's wrapping arithmetic for `+`, `-` and `*`.
    """

    terms: tuple[tuple[Monomial, int], ...]
    type: ScalarType = ex.INDEX

    # -- construction ------------------------------------------------------------------------
    @staticmethod
    def const(value: int, type: ScalarType = ex.INDEX) -> "Poly":
        return Poly(((((), value),) if value else ()), type)

    @staticmethod
    def atom(e: Expr) -> "Poly":
        return Poly((((e,), 1),), e.type)

    @staticmethod
    def _from_dict(d: Mapping[Monomial, int], type: ScalarType) -> "Poly":
        items = sorted(((m, c) for m, c in d.items() if c != 0), key=lambda mc: _monomial_key(mc[0]))
        return Poly(tuple(items), type)

    @staticmethod
    def of(e: Expr) -> "Poly":
        """The polynomial of a scalar integer expression; other nodes become atoms."""
        return _poly_of(e)

    # -- queries ----------------------------------------------------------------------------------
    def as_dict(self) -> dict[Monomial, int]:
        return dict(self.terms)

    @property
    def is_const(self) -> bool:
        return all(m == () for m, _ in self.terms)

    @property
    def const_value(self) -> int:
        """The constant term (the whole value when `is_const`)."""
        return self.as_dict().get((), 0)

    def atoms(self) -> set[Expr]:
        return {a for m, _ in self.terms for a in m}

    # -- arithmetic ---------------------------------------------------------------------------------
    def __add__(self, other: "Poly") -> "Poly":
        d = self.as_dict()
        for m, c in other.terms:
            d[m] = d.get(m, 0) + c
        return Poly._from_dict(d, self.type)

    def __neg__(self) -> "Poly":
        return Poly(tuple((m, -c) for m, c in self.terms), self.type)

    def __sub__(self, other: "Poly") -> "Poly":
        return self + (-other)

    def scale(self, k: int) -> "Poly":
        if k == 0:
            return Poly((), self.type)
        return Poly(tuple((m, c * k) for m, c in self.terms), self.type)

    def __mul__(self, other: "Poly") -> "Poly":
        d: dict[Monomial, int] = {}
        for ma, ca in self.terms:
            for mb, cb in other.terms:
                m = _mul_monomials(ma, mb)
                d[m] = d.get(m, 0) + ca * cb
        return Poly._from_dict(d, self.type)

    # -- back to an expression -------------------------------------------------------------------
    def to_expr(self) -> Expr:
        """Rebuild an expression: positive terms first, subtractions after, the constant last.

        `Poly.of(s0 - 1 - i0).to_expr()` prints as `s0 - i0 - 1`.
        """
        t = self.type
        monos = [(m, c) for m, c in self.terms if m != ()]
        k = self.const_value
        pos = [(m, c) for m, c in monos if c > 0]
        neg = [(m, -c) for m, c in monos if c < 0]
        acc: Optional[Expr] = None
        for m, c in pos:
            term = _monomial_expr(m, c, t)
            acc = term if acc is None else ex.add(acc, term)
        if acc is None and k > 0:
            acc, k = Const(k, t), 0
        for m, c in neg:
            term = _monomial_expr(m, c, t)
            acc = ex.mul(term, Const(-1, t)) if acc is None else ex.sub(acc, term)
        if acc is None:
            return Const(k, t)
        if k > 0:
            acc = ex.add(acc, Const(k, t))
        elif k < 0:
            acc = ex.sub(acc, Const(-k, t))
        return acc


def _monomial_expr(m: Monomial, c: int, t: ScalarType) -> Expr:
    e: Expr = m[0]
    for a in m[1:]:
        e = ex.mul(e, a)
    return ex.mul(e, Const(c, t))


def _is_scalar_int(e: Expr) -> bool:
    return e.type.lanes == 1 and e.type.dtype.is_int


@functools.lru_cache(maxsize=8192)
def _poly_of(e: Expr) -> Poly:
    if not _is_scalar_int(e):
        raise TypeError(f"Poly.of needs a scalar integer expression, got {e.type}: {print_expr(e)}")
    if isinstance(e, Const):
        return Poly.const(int(e.value), e.type)
    if isinstance(e, Binary) and e.op in ("add", "sub", "mul"):
        a, b = _poly_of(e.a), _poly_of(e.b)
        if e.op == "add":
            return a + b
        if e.op == "sub":
            return a - b
        if len(a.terms) * len(b.terms) <= MAX_PRODUCT_TERMS:
            return a * b
    return Poly.atom(e)


# ---- affine forms ---------------------------------------------------------------------------------

def affine_coefficient(e: Expr, var: str) -> Optional[Expr]:
    """The coefficient `c` when `e == c * var + rest` with neither `c` nor `rest` using `var`.

    `0` when `e` does not use `var`; None when `e` is not affine in it (`var * var`,
    `var // 4`, a load indexed by `var`). The coefficient may be symbolic (`s1 * 4`).
    """
    if var not in ex.free_vars(e):
        return Const(0, e.type) if _is_scalar_int(e) else Const(0)
    if not _is_scalar_int(e):
        return None
    coeff: dict[Monomial, int] = {}
    for m, c in Poly.of(e).terms:
        hits = [a for a in m if isinstance(a, Var) and a.name == var]
        if any(not (isinstance(a, Var) and a.name == var) and var in ex.free_vars(a) for a in m):
            return None
        if len(hits) > 1:
            return None
        if hits:
            rest = list(m)
            rest.remove(hits[0])
            coeff[tuple(rest)] = coeff.get(tuple(rest), 0) + c
    return Poly._from_dict(coeff, e.type).to_expr()


def const_int(e: Optional[Expr]) -> Optional[int]:
    """The value of a scalar integer constant, else None."""
    if isinstance(e, Const) and e.type.lanes == 1 and e.type.dtype.is_int:
        return int(e.value)
    return None


def flat_address(index: Iterable[Expr], strides: Iterable[Expr]) -> Expr:
    """The element offset `sum(index[d] * strides[d])` of an n-d index (scalar indices only)."""
    acc: Expr = Const(0)
    for i, s in zip(index, strides):
        acc = ex.add(acc, ex.mul(i, s))
    return Poly.of(acc).to_expr() if _is_scalar_int(acc) else acc


# ---- statements -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Access:
    """One load or store of a buffer inside a statement tree. `index` has the lets bound in
    the tree replaced by their values, so it speaks of loop variables; `loops` are the loops
    of the tree around the access, outermost first."""

    buffer: str
    index: tuple[Expr, ...]
    is_store: bool
    loops: tuple[lp.For, ...]


def accesses(s: lp.Stmt) -> list[Access]:
    """Every load and store in a statement tree, in program order (the loads of a store's
    index and value come before the store)."""
    out: list[Access] = []
    defs: dict[str, Expr] = {}

    def expand(e: Expr) -> Expr:
        return ex.substitute(e, defs) if defs else e

    def record(e: Expr, loops_: tuple[lp.For, ...]) -> None:
        for x in ex.walk(e):
            if isinstance(x, ex.Load):
                out.append(Access(x.buffer, tuple(expand(i) for i in x.index), False, loops_))

    def visit(node: lp.Stmt, loops_: tuple[lp.For, ...]) -> None:
        for e in lp.stmt_exprs(node):
            record(e, loops_)
        if isinstance(node, lp.Store):
            out.append(Access(node.buffer, tuple(expand(i) for i in node.index), True, loops_))
        elif isinstance(node, lp.Let):
            defs[node.var.name] = expand(node.value)
        elif isinstance(node, lp.For):
            visit(node.body, (*loops_, node))
        else:
            for child in node.children():
                visit(child, loops_)

    visit(s, ())
    return out


def allocated(s: lp.Stmt) -> set[str]:
    """Names of the local buffers allocated in a statement tree."""
    return {x.buffer.name for x in lp.walk_stmts(s) if isinstance(x, lp.Alloc)}


def buffers_accessed(k: lp.Kernel) -> set[str]:
    """Names of the buffers the kernel's statements load from or store to."""
    names: set[str] = set()
    for s in lp.walk_stmts(k.body):
        target = getattr(s, "buffer", None)
        if isinstance(target, str):
            names.add(target)
        for e in lp.stmt_exprs(s):
            names.update(n.buffer for n in ex.walk(e) if isinstance(n, ex.Load))
    return names


def buffers_of(kernel: lp.Kernel) -> dict[str, lp.Buffer]:
    """The kernel's parameter buffers and local allocations, by name."""
    table = {b.name: b for b in kernel.params}
    for s in lp.walk_stmts(kernel.body):
        if isinstance(s, lp.Alloc):
            table[s.buffer.name] = s.buffer
    return table


def loops(s: lp.Stmt) -> Iterator[lp.For]:
    """Every loop in a statement tree, outer loops first."""
    for node in lp.walk_stmts(s):
        if isinstance(node, lp.For):
            yield node


def map_loops(s: lp.Stmt, on_loop: Callable[[lp.For], lp.Stmt]) -> lp.Stmt:
    """Rebuild `s` with every outermost loop replaced by `on_loop(loop)`, keeping the blocks
    and branches around them (and all of `s` when nothing changed) identical. `on_loop`
    decides whether and when to recurse into its loop's body (with `map_loops` again), so
    loop passes need not walk blocks and branches themselves; expressions are not visited."""
    if isinstance(s, lp.Block):
        new = tuple(map_loops(x, on_loop) for x in s.stmts)
        return s if all(a is b for a, b in zip(new, s.stmts)) else lp.block(*new)
    if isinstance(s, lp.If):
        then = map_loops(s.then, on_loop)
        orelse = None if s.orelse is None else map_loops(s.orelse, on_loop)
        return s if then is s.then and orelse is s.orelse else lp.If(s.cond, then, orelse)
    if isinstance(s, lp.For):
        return on_loop(s)
    return s


def map_loop_body(s: lp.For, on_loop: Callable[[lp.For], lp.Stmt]) -> lp.For:
    """`s` with `map_loops(on_loop)` applied to its body (the same object when unchanged)."""
    body = map_loops(s.body, on_loop)
    return s if body is s.body else replace(s, body=body)


def contains_loop(s: lp.Stmt) -> bool:
    return next(loops(s), None) is not None


def empty() -> lp.Stmt:
    """The statement that does nothing."""
    return lp.Block(())


def is_empty(s: lp.Stmt) -> bool:
    return isinstance(s, lp.Block) and all(is_empty(x) for x in s.stmts)


class _Substitute(StmtMutator):
    def __init__(self, mapping: Mapping[str, Expr]) -> None:
        self.mapping = mapping

    def visit_Var(self, node: Var) -> Expr:
        return self.mapping.get(node.name, node)


def substitute_stmt(s: lp.Stmt, mapping: Mapping[str, Expr]) -> lp.Stmt:
    """Replace variables by expressions everywhere in a statement tree."""
    return _Substitute(mapping).visit_stmt(s) if mapping else s


def make_loop(var: Var, start: Expr, extent: Expr, kind: str, body: lp.Stmt,
              annotations: tuple[tuple[str, str], ...] = ()) -> lp.Stmt:
    """A loop, or what it amounts to: nothing for a constant extent <= 0, the body with the
    variable replaced by `start` for extent 1."""
    n = const_int(extent)
    if (n is not None and n <= 0) or is_empty(body):
        return empty()
    if n == 1:
        return substitute_stmt(body, {var.name: start})
    return lp.For(var, start, extent, kind, body, annotations)


class NameSupply:
    """Fresh names that clash with no variable, buffer or symbol already in a kernel."""

    def __init__(self, used: Iterable[str] = ()) -> None:
        self.used = set(used)

    @staticmethod
    def for_kernel(kernel: lp.Kernel) -> "NameSupply":
        used = {b.name for b in kernel.params} | {v.name for v in kernel.symbols}
        for s in lp.walk_stmts(kernel.body):
            if isinstance(s, lp.For):
                used.add(s.var.name)
            elif isinstance(s, lp.Let):
                used.add(s.var.name)
            elif isinstance(s, lp.Alloc):
                used.add(s.buffer.name)
            elif isinstance(s, lp.Store):
                used.add(s.buffer)
            for e in lp.stmt_exprs(s):
                used |= ex.free_vars(e)
        return NameSupply(used)

    def fresh(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.used:
            name = f"{hint}_{k}"
            k += 1
        self.used.add(name)
        return name


class _Freshen(StmtMutator):
    """Give every let, loop variable and local buffer defined in a tree a fresh name."""

    def __init__(self, names: NameSupply, suffix: str) -> None:
        self.names, self.suffix = names, suffix
        self.vars: dict[str, Var] = {}
        self.bufs: dict[str, str] = {}

    def _rename(self, v: Var) -> Var:
        nv = Var(self.names.fresh(v.name + self.suffix), v.type)
        self.vars[v.name] = nv
        return nv

    def visit_Var(self, node: Var) -> Expr:
        return self.vars.get(node.name, node)

    def visit_Load(self, node: ex.Load) -> Expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        return replace(node, buffer=self.bufs.get(node.buffer, node.buffer))

    def visit_Let(self, s: lp.Let) -> lp.Stmt:
        value = self.visit(s.value)
        return lp.Let(self._rename(s.var), value)

    def visit_For(self, s: lp.For) -> lp.Stmt:
        start, extent = self.visit(s.start), self.visit(s.extent)
        var = self._rename(s.var)
        return replace(s, var=var, start=start, extent=extent, body=self.visit_stmt(s.body))

    def visit_Alloc(self, s: lp.Alloc) -> lp.Stmt:
        name = self.names.fresh(s.buffer.name + self.suffix)
        self.bufs[s.buffer.name] = name
        return lp.Alloc(replace(s.buffer, name=name))

    def visit_Store(self, s: lp.Store) -> lp.Stmt:
        index = tuple(self.visit(i) for i in s.index)
        value = self.visit(s.value)
        return lp.Store(self.bufs.get(s.buffer, s.buffer), index, value)


def freshen(s: lp.Stmt, names: NameSupply, suffix: str = "") -> lp.Stmt:
    """A copy of `s` whose lets, loop variables and local buffers have fresh names, so that
    copies of one body (unrolling) can sit side by side in one block."""
    return _Freshen(names, suffix).visit_stmt(s)


def vars_through_lets(e: Expr, lets: Mapping[str, Expr]) -> set[str]:
    """The variables `e` reads, looking through the `let`s (name -> value) it names."""
    out: set[str] = set()
    todo = list(ex.free_vars(e))
    while todo:
        name = todo.pop()
        if name in out:
            continue
        out.add(name)
        if name in lets:
            todo.extend(ex.free_vars(lets[name]))
    return out


def map_kernels(program: lp.Program, fn: Callable[[lp.Kernel], lp.Kernel]) -> lp.Program:
    """Apply `fn` to every kernel of a program, keeping the program object when nothing changed."""
    new = tuple(fn(k) for k in program.kernels)
    if all(a is b for a, b in zip(new, program.kernels)):
        return program
    return program.with_kernels(new)


# ---- vector algebra -------------------------------------------------------------------------------------

def uniform_value(e: Expr) -> Optional[Expr]:
    """The scalar every lane of `e` holds: `e` itself for a scalar, `x` for `broadcast(x, n)`."""
    if e.type.lanes == 1:
        return e
    if isinstance(e, ex.Broadcast):
        return e.value
    return None


def broadcast_to(e: Expr, lanes: int) -> Expr:
    """`e` with `lanes` lanes: scalars are broadcast, vectors must already have that width."""
    if e.type.lanes == lanes:
        return e
    if e.type.lanes != 1:
        raise ValueError(f"cannot widen a {e.type} value to {lanes} lanes")
    return ex.Broadcast(e, e.type.with_lanes(lanes))


def vector_binary(op: str, a: Expr, b: Expr) -> Expr:
    """`a op b` where either side may be a vector (a scalar side is broadcast), keeping
    ramps and broadcasts in closed form, as Halide does:

        broadcast(x, n) + broadcast(y, n)  ->  broadcast(x + y, n)
        ramp(b, s, n) + broadcast(x, n)     ->  ramp(b + x, s, n)
        ramp(b, s, n) * broadcast(k, n)     ->  ramp(b * k, s * k, n)     (integers)
        ramp(b, s, n) - ramp(c, t, n)       ->  ramp(b - c, s - t, n)
    """
    lanes = max(a.type.lanes, b.type.lanes)
    if lanes == 1:
        return ex.binary(op, a, b)
    ua, ub = uniform_value(a), uniform_value(b)
    if ua is not None and ub is not None:
        s = ex.binary(op, ua, ub)
        return ex.Broadcast(s, s.type.with_lanes(lanes))
    if a.type.dtype.is_int:
        ramp = _ramp_binary(op, a, b, ua, ub, lanes)
        if ramp is not None:
            return ramp
    a, b = broadcast_to(a, lanes), broadcast_to(b, lanes)
    rtype = ScalarType(dt.bool_, lanes) if op in ex.COMPARISONS else a.type
    return Binary(op, a, b, rtype)


def _ramp_binary(op: str, a: Expr, b: Expr, ua: Optional[Expr], ub: Optional[Expr],
                 lanes: int) -> Optional[Expr]:
    t = a.type.with_lanes(lanes)
    if op in ("add", "sub"):
        if isinstance(a, ex.Ramp) and ub is not None:
            return ex.Ramp(ex.binary(op, a.base, ub), a.stride, t)
        if ua is not None and isinstance(b, ex.Ramp):
            stride = b.stride if op == "add" else ex.sub(Const(0, b.stride.type), b.stride)
            return ex.Ramp(ex.binary(op, ua, b.base), stride, t)
        if isinstance(a, ex.Ramp) and isinstance(b, ex.Ramp):
            return ex.Ramp(ex.binary(op, a.base, b.base), ex.binary(op, a.stride, b.stride), t)
    if op == "mul":
        if isinstance(a, ex.Ramp) and ub is not None:
            return ex.Ramp(ex.mul(a.base, ub), ex.mul(a.stride, ub), t)
        if ua is not None and isinstance(b, ex.Ramp):
            return ex.Ramp(ex.mul(ua, b.base), ex.mul(ua, b.stride), t)
    return None
