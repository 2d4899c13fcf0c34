"""`split-accumulators`: give a vector reduction several independent accumulators.

After `vectorize`, a reduction loop updates one vector accumulator per iteration:

    for r_v in 0..n { %acc_v[ramp(0, 1, 16)] = %acc_v[ramp(0, 1, 16)] + e }

Each add waits for the previous one, so the loop runs at the latency of one vector add
(3-4 cycles) although the core could start two per cycle. This pass unrolls such a loop by
`count` and gives every copy of the body its own accumulator, so `count` chains run side by
side; a remainder loop runs the last `n % count` iterations on the first accumulator, and the
accumulators are folded into the original one, as a tree, after the loop:

    alloc %acc_v_1: f32[16] strides [1] local
    %acc_v_1[ramp(0, 1, 16)] = broadcast(-0.0:f32, 16)
    ...                                                      (and %acc_v_2, %acc_v_3)
    for r_v_u in 0..n // 4 {
      <body with r_v := r_v_u * 4, on %acc_v>
      <body with r_v := r_v_u * 4 + 1, on %acc_v_1>
      ...                                                    (copies 2 and 3)
    }
    for r_v in n // 4 * 4..+n % 4 { <body on %acc_v> }
    %acc_v[ramp(0, 1, 16)] = (%acc_v[...] + %acc_v_1[...]) + (%acc_v_2[...] + %acc_v_3[...])

The unrolled loop runs the iterations in their original order, so only the reduction is
reassociated. That is exact for min, max, and, or and integer add/mul; a float sum or product
adds in another order and may differ from the sequential result by rounding, like any
vectorized or multi-threaded sum (ATen and Inductor reassociate their sums the same way).

**Which loops.** A serial loop whose body, outside inner loops and `if`s, updates a local
buffer with lanes > 1 as `%a[I] = %a[I] op e` (op one of `add`, `mul`, `min`, `max`, `and`,
`or`), where `%a` is allocated outside the loop, `I` depends on nothing bound inside it, and
the loop touches `%a` only in that update. Loops with a constant extent below `count`, and
scalar accumulators (tails, loops `vectorize` left alone) are not changed.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, Var
from ...ir.transform import StmtMutator
from ..base import LoopPass, register_pass
from .loop_utils import (
    NameSupply,
    accesses,
    allocated,
    const_int,
    freshen,
    make_loop,
    map_kernels,
    map_loop_body,
    map_loops,
    substitute_stmt,
)
from .vectorize import REDUCTION_OPS, identity


@dataclass(frozen=True)
class Accumulator:
    """One reduction update `%buffer[index] = %buffer[index] op e` found in a loop body."""

    buffer: lp.Buffer
    index: tuple[Expr, ...]
    op: str
    type: ex.ScalarType


class _RenameBuffers(StmtMutator):
    """Point the loads and stores of some buffers at other buffers."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping

    def visit_Load(self, node: ex.Load) -> Expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        return replace(node, buffer=self.mapping.get(node.buffer, node.buffer))

    def visit_Store(self, s: lp.Store) -> lp.Stmt:
        index = tuple(self.visit(i) for i in s.index)
        return lp.Store(self.mapping.get(s.buffer, s.buffer), index, self.visit(s.value))


def _top_level_stores(s: lp.Stmt) -> list[lp.Store]:
    """Stores that run once per iteration of the loop whose body is `s` (not in inner loops
    or branches)."""
    if isinstance(s, lp.Store):
        return [s]
    if isinstance(s, lp.Block):
        return [x for child in s.stmts for x in _top_level_stores(child)]
    return []


def _bound_inside(s: lp.Stmt) -> set[str]:
    """Variables bound in a statement tree (lets and loop variables)."""
    out: set[str] = set()
    for x in lp.walk_stmts(s):
        if isinstance(x, lp.Let):
            out.add(x.var.name)
        elif isinstance(x, lp.For):
            out.add(x.var.name)
    return out


def find_accumulators(loop: lp.For, buffers: dict[str, lp.Buffer]) -> list[Accumulator]:
    """The vector reduction updates of `loop` that may get split accumulators (module docstring)."""
    inside = allocated(loop.body)
    bound = _bound_inside(loop.body) | {loop.var.name}
    uses = accesses(loop.body)
    found: list[Accumulator] = []
    for s in _top_level_stores(loop.body):
        v = s.value
        b = buffers.get(s.buffer)
        if b is None or b.scope != "local" or s.buffer in inside or v.type.lanes < 2:
            continue
        if not (isinstance(v, ex.Binary) and v.op in REDUCTION_OPS):
            continue
        own = ex.Load(s.buffer, s.index, v.type)
        other = v.b if v.a == own else v.a if v.b == own else None
        if other is None or any(isinstance(x, ex.Load) and x.buffer == s.buffer for x in ex.walk(other)):
            continue
        if any(not ex.free_vars(i).isdisjoint(bound) or any(isinstance(x, ex.Load) for x in ex.walk(i))
               for i in s.index):
            continue
        if sum(a.buffer == s.buffer for a in uses) != 2:  # the update's own load and store
            continue
        found.append(Accumulator(b, s.index, v.op, v.type))
    return found


def _tree(op: str, values: list[Expr]) -> Expr:
    """`values` combined pairwise, so the combination is as shallow as it can be."""
    while len(values) > 1:
        pairs = [ex.Binary(op, values[k], values[k + 1], values[k].type) for k in range(0, len(values) - 1, 2)]
        values = pairs + values[len(values) - len(values) % 2:]
    return values[0]


def split_loop(loop: lp.For, accs: list[Accumulator], count: int, names: NameSupply) -> lp.Stmt:
    """`loop` unrolled by `count` with one accumulator per copy, remainder and final fold."""
    copies = {a.buffer.name: [a.buffer.name] + [names.fresh(a.buffer.name) for _ in range(count - 1)]
              for a in accs}
    setup: list[lp.Stmt] = []
    for a in accs:
        for name in copies[a.buffer.name][1:]:
            setup.append(lp.Alloc(replace(a.buffer, name=name)))
            setup.append(lp.Store(name, a.index, ex.Broadcast(identity(a.op, a.type.with_lanes(1)), a.type)))
    outer = Var(names.fresh(loop.var.name + "_u"), loop.var.type)
    bodies: list[lp.Stmt] = []
    for k in range(count):
        at = ex.add(ex.add(ex.mul(outer, count), k), loop.start)
        body = substitute_stmt(loop.body, {loop.var.name: at})
        if k:
            body = _RenameBuffers({old: new[k] for old, new in copies.items()}).visit_stmt(freshen(body, names))
        bodies.append(body)
    groups = ex.floordiv(loop.extent, count)
    main = make_loop(outer, Const(0), groups, "serial", lp.block(*bodies), loop.annotations)
    done = ex.mul(groups, count)
    # The remainder's lets get fresh names too: with constant extents both loops may be a
    # single trip, inlined into one scope beside the first copy (5 = 1 * 4 + 1).
    rest = make_loop(loop.var, ex.add(loop.start, done), ex.mod(loop.extent, count), "serial",
                     freshen(loop.body, names), loop.annotations)
    fold: list[lp.Stmt] = []
    for a in accs:
        parts: list[Expr] = [ex.Load(name, a.index, a.type) for name in copies[a.buffer.name]]
        fold.append(lp.Store(a.buffer.name, a.index, _tree(a.op, parts)))
    return lp.block(*setup, main, rest, *fold)


class _Splitter:
    """Walks one kernel and splits the accumulators of every eligible loop."""

    def __init__(self, kernel: lp.Kernel, count: int) -> None:
        self.count = count
        self.names = NameSupply.for_kernel(kernel)
        self.buffers = {b.name: b for b in kernel.params}
        for s in lp.walk_stmts(kernel.body):
            if isinstance(s, lp.Alloc):
                self.buffers[s.buffer.name] = s.buffer

    def stmt(self, s: lp.Stmt) -> lp.Stmt:
        return map_loops(s, self.loop)

    def loop(self, s: lp.For) -> lp.Stmt:
        s = map_loop_body(s, self.loop)
        return self.split(s) or s

    def split(self, s: lp.For) -> Optional[lp.Stmt]:
        if s.kind != "serial":
            return None
        n = const_int(s.extent)
        if n is not None and n < self.count:
            return None
        accs = find_accumulators(s, self.buffers)
        if not accs:
            return None
        return split_loop(s, accs, self.count, self.names)


def split_kernel(kernel: lp.Kernel, count: int) -> lp.Kernel:
    """Split the vector reduction accumulators of one kernel into `count` each."""
    body = _Splitter(kernel, count).stmt(kernel.body)
    return kernel if body is kernel.body else replace(kernel, body=body)


@register_pass
@dataclass(frozen=True)
class SplitAccumulators(LoopPass):
    """Unroll vector reduction loops by `count`, one independent accumulator per copy.

    Before (`split-accumulators{count=2}`):

        alloc %acc_v: f32[8] strides [1] local
        %acc_v[ramp(0, 1, 8)] = broadcast(-0.0:f32, 8)
        for r_v in 0..s0 {
          %acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v * 8, 1, 8)]
        }

    After (and `simplify`):

        alloc %acc_v: f32[8] strides [1] local
        %acc_v[ramp(0, 1, 8)] = broadcast(-0.0:f32, 8)
        alloc %acc_v_1: f32[8] strides [1] local
        %acc_v_1[ramp(0, 1, 8)] = broadcast(-0.0:f32, 8)
        for r_v_u in 0..s0 // 2 {
          %acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v_u * 16, 1, 8)]
          %acc_v_1[ramp(0, 1, 8)] = %acc_v_1[ramp(0, 1, 8)] + %x[ramp(r_v_u * 16 + 8, 1, 8)]
        }
        for r_v in s0 // 2 * 2..+s0 % 2 {
          %acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v * 8, 1, 8)]
        }
        %acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %acc_v_1[ramp(0, 1, 8)]

    Float sums and products are reassociated (see the module docstring).
    """

    name = "split-accumulators"
    per_kernel = True
    #: Independent accumulators per reduction (the unroll factor); 1 changes nothing.
    count: int = 4

    def run(self, program: lp.Program) -> lp.Program:
        if self.count < 2:
            return program
        return map_kernels(program, lambda k: split_kernel(k, self.count))
