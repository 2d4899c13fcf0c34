"""`vectorize`: turn loops into explicit SIMD code, Halide style.

A loop `for v in start..+n` is vectorized with `W` lanes by splitting it into a main loop over
whole vectors and a scalar tail:

    for v_v in 0..n // W { body with v := ramp(v_v * W + start, 1, W) }
    for v in start + n // W * W..+n % W { body }                      (the original body)

and rewriting the main loop's body lane-wise: expressions that depend on `v` become vectors
(`ramp` for `v` itself, vector loads, vector arithmetic, calls and casts applied lane-wise)
while everything else stays scalar and is broadcast where it meets a vector. A load whose
address does not depend on `v` stays one scalar load. Local buffers allocated inside the loop
get one copy per lane (an extra innermost dimension of W), so per-iteration temporaries, such
as a reduction accumulator of an inner loop, become per-lane temporaries.

**Reductions.** A store `%acc[I] = %acc[I] op e` whose index does not depend on `v` (op one of
`add`, `mul`, `min`, `max`, `and`, `or`) is a reduction over `v`: it gets a vector accumulator
`%acc_v: T[W]` that starts at op's identity, accumulates lane-wise in the main loop and is
folded into `%acc[I]` with `vreduce_op` before the tail, which accumulates the rest as before:

    alloc %acc0_v: f32[16] strides [1] local
    %acc0_v[ramp(0, 1, 16)] = broadcast(-0.0:f32, 16)
    for r0_v in 0..R // 16 {
      %acc0_v[ramp(0, 1, 16)] = %acc0_v[ramp(0, 1, 16)] + <e, vectorized>
    }
    %acc0[0] = %acc0[0] + vreduce_add(%acc0_v[ramp(0, 1, 16)])
    for r0 in R // 16 * 16..+R % 16 { %acc0[0] = %acc0[0] + <e> }

A vectorized float sum adds in a different order than the sequential loop (W partial sums,
then a tree), so it can differ from it by rounding; that is accepted, as in every vectorizing
compiler. min/max and integer reductions are exact. Select-based reductions (argmax) are
not vectorized.

**Which loops.** Loops marked `vectorized` are always lowered (with W lanes, or with as many
lanes as their constant extent when it is smaller); a marked loop that cannot be vectorized
is an error that says why. Elsewhere the pass chooses by itself, at most one loop on each path
from the root: a serial or parallel loop is eligible when

- every store either writes a unit-stride address in `v` (the flattened address
  `sum(index[d] * strides[d])` has coefficient 1 in `v`), is a reduction as above, or writes
  a buffer allocated inside the loop;
- each other buffer it stores to is read in the loop only at the very index it is written at
  (so iterations are independent);
- inner loops and `if` conditions do not depend on `v`, and nothing inside is already vector;
- a constant extent is at least 4;
- it is not annotated `{loop = "keep-rolled"}` (`lp.KEEP_ROLLED`).

Among the eligible loops of a nest, the one with the fewest gathers (loads whose address
moves by a stride other than 0 or 1 per iteration) wins, the innermost on ties. So a row sum
vectorizes its reduction loop, a column sum vectorizes the output loop around it (no gathers,
and no reassociation), and `out[i, j] += a[i, k] * b[k, j]` vectorizes `j`.

`width=0` takes the target's number of f32 lanes (`ctx.target.lanes(f32)`, from the pass
context: 16 with AVX-512, 8 with AVX2, 4 with SSE or NEON) for every dtype: f32 is what
kernels compute in, and wider elements simply take several registers per vector.

Before (`vectorize{width=8}`):

    for i0 in 0..s0 {
      for i1 in 0..100 {
        %out[i0, i1] = exp(%x[i0, i1]) * %scale[0]
      }
    }

After:

    for i0 in 0..s0 {
      for i1_v in 0..12 {
        %out[i0, ramp(i1_v * 8, 1, 8)] = exp(%x[i0, ramp(i1_v * 8, 1, 8)]) * broadcast(%scale[0], 8)
      }
      for i1 in 96..+4 {
        %out[i0, i1] = exp(%x[i0, i1]) * %scale[0]
      }
    }
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.printer import print_expr
from ..base import LoopPass, PassContext, PassError, register_pass
from .simplify import simplify_expr
from .loop_utils import (
    NameSupply,
    Poly,
    accesses,
    affine_coefficient,
    broadcast_to,
    buffers_of,
    const_int,
    make_loop,
    map_kernels,
    uniform_value,
    vector_binary,
)

#: Combining ops a reduction store may use, and the vector reduction that finishes each.
REDUCTION_OPS = ("add", "mul", "min", "max", "and", "or")
#: The smallest constant trip count the pass vectorizes on its own.
MIN_AUTO_EXTENT = 4


def identity(op: str, t: ScalarType) -> Const:
    """The identity element of a combining op in a dtype (`-0.0` is the exact one of float add)."""
    d = t.dtype
    if op == "add":
        return Const(-0.0 if d.is_float else 0, t)
    if op == "mul":
        return Const(1, t)
    if op in ("and", "or"):
        if d.is_bool:
            return Const(op == "and", t)
        return Const(-1 if op == "and" else 0, t)
    if d.is_float:
        return Const(float("inf") if op == "min" else float("-inf"), t)
    if d.is_bool:
        return Const(op == "min", t)
    lo = -(1 << (d.bits - 1)) if d.is_signed else 0
    hi = (1 << (d.bits - 1)) - 1 if d.is_signed else (1 << d.bits) - 1
    return Const(hi if op == "min" else lo, t)


class NotVectorizable(Exception):
    """Why a loop cannot be vectorized (the message is shown for loops marked `vectorized`)."""


@dataclass(frozen=True)
class Reduction:
    """A store `%buffer[index] = %buffer[index] op value` inside the loop being vectorized;
    `index` is expanded to variables bound outside the loop (it is used after it)."""

    buffer: str
    index: tuple[Expr, ...]
    op: str
    type: ScalarType


@dataclass
class Plan:
    """What vectorizing one loop takes: its lanes, its reductions, the local buffers that get a
    copy per lane, and its cost (gathers and scatters)."""

    loop: lp.For
    lanes: int
    reductions: dict[str, Reduction] = field(default_factory=dict)
    private: dict[str, lp.Buffer] = field(default_factory=dict)
    cost: int = 0


# ---- analysis ---------------------------------------------------------------------------------------

class _Analyzer:
    """Checks one loop for vectorization and builds its `Plan`; raises `NotVectorizable`."""

    def __init__(self, loop: lp.For, lanes: int, buffers: dict[str, lp.Buffer], explicit: bool) -> None:
        self.plan = Plan(loop, lanes)
        self.var = loop.var.name
        self.buffers = buffers
        self.explicit = explicit
        #: Definitions of the lets seen so far, expanded down to loop variables.
        self.defs: dict[str, Expr] = {}
        #: Lets whose value differs between lanes.
        self.varying: set[str] = {self.var}
        #: Variables of the loops inside the loop.
        self.inner: set[str] = set()

    def run(self) -> Plan:
        self.stmt(self.plan.loop.body)
        self.check_dependences()
        return self.plan

    def fail(self, why: str) -> NotVectorizable:
        return NotVectorizable(f"loop {self.var}: {why}")

    # -- expressions --
    def expand(self, e: Expr) -> Expr:
        return ex.substitute(e, self.defs) if self.defs else e

    def is_varying(self, e: Expr) -> bool:
        if not ex.free_vars(e).isdisjoint(self.varying):
            return True
        return any(isinstance(x, ex.Load) and x.buffer in self.plan.private for x in ex.walk(e))

    def expr(self, e: Expr) -> None:
        for x in ex.walk(e):
            if x.type.lanes != 1:
                raise self.fail(f"already holds vector code ({print_expr(x)})")
            if isinstance(x, ex.Load):
                self.access(x.buffer, x.index, None)

    def access(self, buffer: str, index: tuple[Expr, ...], store: Optional[lp.Store]) -> None:
        """Count a gather or scatter; refuse a store that is not unit-stride (unless marked)."""
        if buffer in self.plan.private or not any(self.is_varying(i) for i in index):
            return
        stride = self.lane_stride(buffer, tuple(self.expand(i) for i in index))
        if stride != 1:
            if store is not None and not self.explicit:
                what = "a non-unit stride" if stride is not None else "an address not affine"
                raise self.fail(f"store to %{buffer} has {what} in {self.var}")
            self.plan.cost += 1

    def lane_stride(self, buffer: str, index: tuple[Expr, ...]) -> Optional[int]:
        """How far the flattened address moves per iteration (None: not affine or not constant)."""
        b = self.buffers.get(buffer)
        if b is None:
            raise self.fail(f"unknown buffer %{buffer}")
        total = Poly.const(0)
        for i, s in zip(index, b.strides):
            if i.type != ex.INDEX:
                return None
            c = affine_coefficient(i, self.var)
            if c is None:
                return self.merged_lane_stride(index, b)
            total = total + Poly.of(ex.mul(c, s))
        return total.const_value if total.is_const else None

    def merged_lane_stride(self, index: tuple[Expr, ...], b: lp.Buffer) -> Optional[int]:
        """The stride of the flattened address where the index is a position delinearized
        over contiguous dims (`(p + c) // 14, (p + c) % 14` with strides 14 and 1: address
        `p + c`), which `simplify`'s normal form merges back; None where it is not affine."""
        flat: Expr = Const(0)
        for i, s in zip(index, b.strides):
            flat = ex.add(flat, ex.mul(i, s))
        c = affine_coefficient(simplify_expr(flat), self.var)
        return const_int(c) if c is not None else None

    # -- statements --
    def stmt(self, s: lp.Stmt) -> None:
        if isinstance(s, lp.Block):
            for x in s.stmts:
                self.stmt(x)
        elif isinstance(s, lp.Let):
            self.expr(s.value)
            if self.is_varying(s.value):
                self.varying.add(s.var.name)
            self.defs[s.var.name] = self.expand(s.value)
        elif isinstance(s, lp.Store):
            self.store(s)
        elif isinstance(s, lp.Alloc):
            self.plan.private[s.buffer.name] = s.buffer
            if not all(isinstance(d, Const) for d in (*s.buffer.shape, *s.buffer.strides)):
                raise self.fail(f"local buffer %{s.buffer.name} has a non-constant shape")
        elif isinstance(s, lp.For):
            if s.kind in ("vectorized", "parallel"):
                raise self.fail(f"contains a {s.kind} loop ({s.var.name})")
            self.expr(s.start)
            self.expr(s.extent)
            if self.is_varying(s.start) or self.is_varying(s.extent):
                raise self.fail(f"the bounds of inner loop {s.var.name} depend on it")
            self.inner.add(s.var.name)
            self.stmt(s.body)
        elif isinstance(s, lp.If):
            self.expr(s.cond)
            if self.is_varying(s.cond):
                raise self.fail(f"the condition `{print_expr(s.cond)}` depends on it")
            self.stmt(s.then)
            if s.orelse is not None:
                self.stmt(s.orelse)
        else:
            raise self.fail(f"unsupported statement {type(s).__name__}")

    def store(self, s: lp.Store) -> None:
        for i in s.index:
            self.expr(i)
        self.expr(s.value)
        if s.buffer in self.plan.private:
            if any(self.is_varying(i) for i in s.index) and not self.explicit:
                raise self.fail(f"local %{s.buffer} is indexed by {self.var}")
            self.access(s.buffer, s.index, s)
            return
        if any(self.is_varying(i) for i in s.index):
            self.access(s.buffer, s.index, s)
            return
        red = self.reduction(s)
        if red is None:
            raise self.fail(f"every iteration stores to the same element of %{s.buffer} "
                            f"and `{print_expr(s.value)}` is not a reduction")
        if s.buffer in self.plan.reductions:
            raise self.fail(f"%{s.buffer} is updated by more than one reduction")
        fixed = all(ex.free_vars(i).isdisjoint(self.inner) and not any(isinstance(x, ex.Load) for x in ex.walk(i))
                    for i in red.index)
        if not fixed:
            raise self.fail(f"the reduction into %{s.buffer} moves to other elements inside the loop")
        self.plan.reductions[s.buffer] = red

    def reduction(self, s: lp.Store) -> Optional[Reduction]:
        """The reduction `s` performs, with its index expanded to variables bound outside."""
        v = s.value
        if not (isinstance(v, ex.Binary) and v.op in REDUCTION_OPS):
            return None
        own = ex.Load(s.buffer, s.index, v.type)
        for acc, other in ((v.a, v.b), (v.b, v.a)):
            if acc == own and not any(isinstance(x, ex.Load) and x.buffer == s.buffer for x in ex.walk(other)):
                return Reduction(s.buffer, tuple(self.expand(i) for i in s.index), v.op, v.type)
        return None

    # -- dependences --
    def check_dependences(self) -> None:
        """Reduction accumulators are used only by their own update; other stored buffers are
        accessed at one index only (so iterations do not depend on each other)."""
        uses = accesses(self.plan.loop.body)
        for buffer in self.plan.reductions:
            if sum(a.buffer == buffer for a in uses) != 2:  # the update's load and its store
                raise self.fail(f"reduction accumulator %{buffer} is also used elsewhere in the loop")
        if self.explicit:
            return
        written: dict[str, tuple[Expr, ...]] = {}
        for a in uses:
            if a.is_store and a.buffer not in self.plan.private and a.buffer not in self.plan.reductions:
                if written.setdefault(a.buffer, a.index) != a.index:
                    raise self.fail(f"%{a.buffer} is stored at two different indices")
        for a in uses:
            if a.buffer in written and a.index != written[a.buffer]:
                raise self.fail(f"%{a.buffer} is written and read at different indices")


def plan_loop(loop: lp.For, width: int, buffers: dict[str, lp.Buffer], explicit: bool) -> Plan:
    """Analyse a loop for vectorization with at most `width` lanes; raise `NotVectorizable`."""
    n = const_int(loop.extent)
    lanes = width
    if n is not None:
        if explicit:
            lanes = min(n, width)
        else:
            if n < MIN_AUTO_EXTENT:
                raise NotVectorizable(f"loop {loop.var.name}: extent {n} is too small")
            lanes = width if n >= width else 1 << (n.bit_length() - 1)
    if lanes < 2:
        raise NotVectorizable(f"loop {loop.var.name}: {lanes} lane(s) is not a vector")
    return _Analyzer(loop, lanes, buffers, explicit).run()


# ---- rewriting -----------------------------------------------------------------------------------------

class _Widen:
    """Rewrites a loop body lane-wise for one `Plan` (see the module docstring)."""

    def __init__(self, plan: Plan, base: Expr, names: NameSupply, rename_all: bool) -> None:
        self.plan = plan
        #: Give scalar lets fresh names too: the body lands in the enclosing block, next to
        #: the tail that binds the original names.
        self.rename_all = rename_all
        self.lanes = plan.lanes
        self.var = plan.loop.var.name
        self.names = names
        self.lane_index = ex.Ramp(Const(0), Const(1), ScalarType(dt.index, plan.lanes))
        self.env: dict[str, Expr] = {self.var: ex.Ramp(base, Const(1), ScalarType(dt.index, plan.lanes))}
        self.private = {name: self.widen_buffer(b) for name, b in plan.private.items()}
        self.accumulators = {name: self.accumulator(r) for name, r in plan.reductions.items()}

    def widen_buffer(self, b: lp.Buffer) -> lp.Buffer:
        strides = tuple(ex.mul(s, self.lanes) for s in b.strides) + (Const(1),)
        return replace(b, name=self.names.fresh(b.name + "_v"), shape=(*b.shape, Const(self.lanes)),
                       strides=strides)

    def accumulator(self, r: Reduction) -> lp.Buffer:
        return lp.Buffer(self.names.fresh(r.buffer + "_v"), r.type.dtype, (Const(self.lanes),), (Const(1),),
                         "local")

    def acc_load(self, r: Reduction) -> Expr:
        acc = self.accumulators[r.buffer]
        return ex.Load(acc.name, (self.lane_index,), r.type.with_lanes(self.lanes))

    # -- expressions --
    def expr(self, e: Expr) -> Expr:
        if isinstance(e, Var):
            return self.env.get(e.name, e)
        if isinstance(e, Const):
            return e
        if isinstance(e, ex.Binary):
            a, b = self.expr(e.a), self.expr(e.b)
            if a is e.a and b is e.b:
                return e
            if a.type.lanes == 1 and b.type.lanes == 1:
                return ex.Binary(e.op, a, b, e.type)
            return vector_binary(e.op, a, b)
        if isinstance(e, ex.Load):
            return self.load(e)
        if isinstance(e, ex.Call):
            args = tuple(self.expr(a) for a in e.args)
            return self._lanewise(e, args, lambda xs, t: ex.Call(e.name, xs, t))
        if isinstance(e, ex.Select):
            args = (self.expr(e.cond), self.expr(e.a), self.expr(e.b))
            return self._lanewise(e, args, lambda xs, t: ex.Select(xs[0], xs[1], xs[2], t))
        if isinstance(e, (ex.Cast, ex.Bitcast)):
            value = self.expr(e.value)
            if value is e.value:
                return e
            return type(e)(value, e.type.with_lanes(value.type.lanes))
        raise PassError(f"vectorize: cannot widen {print_expr(e)}")

    def _lanewise(self, e: Expr, args: tuple[Expr, ...],
                  build: Callable[[tuple[Expr, ...], ScalarType], Expr]) -> Expr:
        """Rebuild a call or select lane-wise: scalar when every argument is, a broadcast of
        the scalar result when every argument is uniform, else a vector of the widest lanes."""
        if all(a is b for a, b in zip(args, e.children())):
            return e
        lanes = max(a.type.lanes for a in args)
        if lanes == 1:
            return build(args, e.type)
        uniform = tuple(u for u in (uniform_value(a) for a in args) if u is not None)
        if len(uniform) == len(args):
            return ex.Broadcast(build(uniform, e.type), e.type.with_lanes(lanes))
        return build(tuple(broadcast_to(a, lanes) for a in args), e.type.with_lanes(lanes))

    def load(self, e: ex.Load) -> Expr:
        index = tuple(self.expr(i) for i in e.index)
        if e.buffer in self.private:
            b = self.private[e.buffer]
            return ex.Load(b.name, (*index, self.lane_index), e.type.with_lanes(self.lanes))
        lanes = max((i.type.lanes for i in index), default=1)
        if lanes == 1:
            return e if all(a is b for a, b in zip(index, e.index)) else ex.Load(e.buffer, index, e.type)
        return ex.Load(e.buffer, index, e.type.with_lanes(lanes))

    # -- statements --
    def stmt(self, s: lp.Stmt) -> lp.Stmt:
        if isinstance(s, lp.Block):
            return lp.block(*(self.stmt(x) for x in s.stmts))
        if isinstance(s, lp.Let):
            value = self.expr(s.value)
            if value.type.lanes == 1 and not self.rename_all:
                return s if value is s.value else lp.Let(s.var, value)
            suffix = "_v" if value.type.lanes > 1 else ""
            var = Var(self.names.fresh(s.var.name + suffix), value.type)
            self.env[s.var.name] = var
            return lp.Let(var, value)
        if isinstance(s, lp.Store):
            return self.store(s)
        if isinstance(s, lp.Alloc):
            return lp.Alloc(self.private[s.buffer.name])
        if isinstance(s, lp.For):
            return replace(s, start=self.expr(s.start), extent=self.expr(s.extent), body=self.stmt(s.body))
        if isinstance(s, lp.If):
            orelse = None if s.orelse is None else self.stmt(s.orelse)
            return lp.If(self.expr(s.cond), self.stmt(s.then), orelse)
        raise PassError(f"vectorize: cannot widen statement {type(s).__name__}")

    def store(self, s: lp.Store) -> lp.Stmt:
        red = self.plan.reductions.get(s.buffer)
        if red is not None:
            own = ex.Load(s.buffer, s.index, red.type)
            v = s.value
            assert isinstance(v, ex.Binary)
            other = v.b if v.a == own else v.a
            acc = self.acc_load(red)
            value = vector_binary(red.op, acc, broadcast_to(self.expr(other), self.lanes))
            return lp.Store(self.accumulators[s.buffer].name, (self.lane_index,), value)
        index = tuple(self.expr(i) for i in s.index)
        value = self.expr(s.value)
        if s.buffer in self.private:
            return lp.Store(self.private[s.buffer].name, (*index, self.lane_index), broadcast_to(value, self.lanes))
        lanes = max((i.type.lanes for i in index), default=1)
        if lanes == 1:
            raise PassError(f"vectorize: store to %{s.buffer} does not depend on the loop variable")
        return lp.Store(s.buffer, index, broadcast_to(value, lanes))

    # -- around the main loop --
    def prologue(self) -> list[lp.Stmt]:
        out: list[lp.Stmt] = []
        for name, r in self.plan.reductions.items():
            acc = self.accumulators[name]
            init = identity(r.op, r.type)
            out.append(lp.Alloc(acc))
            out.append(lp.Store(acc.name, (self.lane_index,), ex.Broadcast(init, r.type.with_lanes(self.lanes))))
        return out

    def epilogue(self) -> list[lp.Stmt]:
        out: list[lp.Stmt] = []
        for r in self.plan.reductions.values():
            total = ex.VectorReduce(r.op, self.acc_load(r), r.type)
            current = ex.Load(r.buffer, r.index, r.type)
            out.append(lp.Store(r.buffer, r.index, ex.Binary(r.op, current, total, r.type)))
        return out


def apply_plan(plan: Plan, names: NameSupply) -> lp.Stmt:
    """The vectorized form of `plan.loop`: reduction set-up, main loop, reduction finish, tail."""
    loop, lanes = plan.loop, plan.lanes
    count = ex.floordiv(loop.extent, lanes)
    if const_int(count) == 1:
        outer = None
        base = loop.start
    else:
        outer = Var(names.fresh(loop.var.name + "_v"))
        base = ex.add(ex.mul(outer, lanes), loop.start)
    widen = _Widen(plan, base, names, rename_all=outer is None)
    body = widen.stmt(loop.body)
    if outer is not None:
        kind = "parallel" if loop.kind == "parallel" else "serial"
        body = make_loop(outer, Const(0), count, kind, body, loop.annotations)
    done = ex.mul(count, lanes)
    tail = make_loop(loop.var, ex.add(loop.start, done), ex.mod(loop.extent, lanes), "serial", loop.body,
                     loop.annotations)
    return lp.block(*widen.prologue(), body, *widen.epilogue(), tail)


# ---- choosing loops ------------------------------------------------------------------------------------

class _Vectorizer:
    """Chooses the loops to vectorize in a kernel (first) and rewrites them (then)."""

    def __init__(self, kernel: lp.Kernel, width: int) -> None:
        self.width = width
        self.buffers = buffers_of(kernel)
        self.names = NameSupply.for_kernel(kernel)

    def choose(self, s: lp.Stmt) -> tuple[Optional[int], list[Plan]]:
        """The plans for the loops to vectorize in `s` and their total cost (None: no loop)."""
        if isinstance(s, lp.For):
            return self.choose_loop(s)
        cost: Optional[int] = None
        plans: list[Plan] = []
        for child in s.children():
            c, p = self.choose(child)
            if c is not None:
                cost = (cost or 0) + c
                plans += p
        return cost, plans

    def choose_loop(self, s: lp.For) -> tuple[Optional[int], list[Plan]]:
        if s.kind == "vectorized":
            try:
                plan = plan_loop(s, self.width, self.buffers, explicit=True)
            except NotVectorizable as err:
                raise PassError(f"vectorize: cannot vectorize a loop marked vectorized: {err}") from None
            return plan.cost, [plan]
        inner_cost, inner = self.choose(s.body)
        marked_inside = any(p.loop.kind == "vectorized" for p in inner)
        if s.kind in ("serial", "parallel") and not marked_inside and lp.KEEP_ROLLED not in s.annotations:
            try:
                plan = plan_loop(s, self.width, self.buffers, explicit=False)
            except NotVectorizable:
                pass
            else:
                if inner_cost is None or plan.cost < inner_cost:
                    return plan.cost, [plan]
        return inner_cost, inner

    def apply(self, s: lp.Stmt, plans: dict[int, Plan]) -> lp.Stmt:
        if isinstance(s, lp.For):
            plan = plans.get(id(s))
            if plan is not None:
                return apply_plan(plan, self.names)
            body = self.apply(s.body, plans)
            return s if body is s.body else replace(s, body=body)
        if isinstance(s, lp.Block):
            stmts = tuple(self.apply(x, plans) for x in s.stmts)
            return s if all(a is b for a, b in zip(stmts, s.stmts)) else lp.block(*stmts)
        if isinstance(s, lp.If):
            then = self.apply(s.then, plans)
            orelse = None if s.orelse is None else self.apply(s.orelse, plans)
            return s if then is s.then and orelse is s.orelse else lp.If(s.cond, then, orelse)
        return s

    def run(self, body: lp.Stmt) -> lp.Stmt:
        _, plans = self.choose(body)
        return self.apply(body, {id(p.loop): p for p in plans})


def vectorize_kernel(kernel: lp.Kernel, width: int) -> lp.Kernel:
    """Vectorize one kernel with vectors of at most `width` lanes."""
    body = _Vectorizer(kernel, width).run(kernel.body)
    return kernel if body is kernel.body else replace(kernel, body=body)


@register_pass
@dataclass(frozen=True)
class Vectorize(LoopPass):
    """Turn loops into explicit SIMD code with a scalar tail; vectorize reductions.

    Before (`vectorize{width=8}`):

        for i0 in 0..s0 {
          alloc %acc0: f32[1] strides [1] local
          %acc0[0] = 0.0:f32
          for r0 in 0..100 {
            %acc0[0] = %acc0[0] + %x[i0, r0]
          }
          %out[i0] = %acc0[0]
        }

    After:

        for i0 in 0..s0 {
          alloc %acc0: f32[1] strides [1] local
          %acc0[0] = 0.0:f32
          alloc %acc0_v: f32[8] strides [1] local
          %acc0_v[ramp(0, 1, 8)] = broadcast(-0.0:f32, 8)
          for r0_v in 0..12 {
            %acc0_v[ramp(0, 1, 8)] = %acc0_v[ramp(0, 1, 8)] + %x[i0, ramp(r0_v * 8, 1, 8)]
          }
          %acc0[0] = %acc0[0] + vreduce_add(%acc0_v[ramp(0, 1, 8)])
          for r0 in 96..+4 {
            %acc0[0] = %acc0[0] + %x[i0, r0]
          }
          %out[i0] = %acc0[0]
        }

    Which loops are chosen, and how, is described in the module docstring.
    """

    name = "vectorize"
    per_kernel = True
    #: Lanes per vector; 0 takes the target's number of f32 lanes.
    width: int = 0

    def run(self, program: lp.Program) -> lp.Program:
        return self.run_in(program, PassContext())

    def run_in(self, program: lp.Program, ctx: PassContext) -> lp.Program:
        width = self.width or ctx.target.lanes(dt.f32)
        if width < 2:
            return program
        return map_kernels(program, lambda k: vectorize_kernel(k, width))
