"""`split-reductions`: run a reduction to a few values (a full sum, a norm) on all threads.

`parallelize` runs the outermost *independent* loop of a nest on all threads. A kernel that
reduces a whole tensor to one value has none: its only loop updates one accumulator, so it ran
on one thread (a 1 GiB float32 sum read 13.8 GB/s here where two threads read 26.5, and
PyTorch's eager sum uses every thread). This pass splits such a loop into `P` contiguous
chunks, one partial accumulator each, in a parallel loop, then folds the partials in order:

Before (`split-reductions{threads=2}`):

    alloc %acc: f32[1] strides [1] local
    %acc[0] = 0.0:f32
    for r in 0..1048576 {
      %acc[0] = %acc[0] + %x[r]
    }
    %out[] = %acc[0]

After (P = 8 chunks of 131072; where P does not divide the trip count, a serial loop on
`%acc` runs the rest before the fold):

    alloc %acc: f32[1] strides [1] local
    %acc[0] = 0.0:f32
    alloc %acc_parts: f32[8] strides [1] local
    parallel for r_p in 0..8 {
      alloc %acc_p: f32[1] strides [1] local
      %acc_p[0] = -0.0:f32
      for r_1 in 0..131072 {
        %acc_p[0] = %acc_p[0] + %x[r_p * 131072 + r_1]
      }
      %acc_parts[r_p] = %acc_p[0]
    }
    for r_f in 0..8 {
      %acc[0] = %acc[0] + %acc_parts[r_f]
    }
    %out[] = %acc[0]

`vectorize` and `split-accumulators` then work on each chunk's loop as on the whole one.

**Which loops.** A serial loop at the kernel's top level (not inside another loop: those are
`parallelize`'s) with a constant trip count, at least `min_work` elements of work
(`parallelize.estimated_work`), no parallel loop inside, whose every store goes either to a
local buffer allocated inside it or to an *accumulator*: a local buffer allocated outside it,
read and written in the loop only by one update `%a[I] = %a[I] op e` (op one of add, mul,
min, max, and, or; `I` constants; `e` not reading `%a`). Everything else (a scan, an argmax's
value-and-index pair, a loop that writes memory) is left alone.

As with `split-accumulators`, a float sum or product is reassociated (chunks added in order
after being summed separately): the result may differ from the sequential one by rounding,
as ATen's and Inductor's parallel sums do.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Var
from ..base import LoopPass, PassContext, register_pass
from .loop_utils import (NameSupply, accesses, allocated, buffers_of, const_int, contains_loop, freshen, make_loop,
                         map_kernels, substitute_stmt)
from .parallelize import estimated_work
from .split_accumulators import _RenameBuffers
from .vectorize import REDUCTION_OPS, identity


@dataclass(frozen=True)
class _Update:
    """The one update `%buffer[index] = %buffer[index] op value` of a scalar accumulator
    (the pass runs before `vectorize`)."""

    buffer: lp.Buffer
    index: tuple[ex.Expr, ...]
    op: str
    type: ex.ScalarType


def _updates(loop: lp.For, buffers: dict[str, lp.Buffer]) -> Optional[list[_Update]]:
    """The accumulators of `loop`, or None where it is not a pure reduction (module docstring)."""
    inside = allocated(loop.body)
    uses = accesses(loop.body)
    found: list[_Update] = []
    for s in lp.walk_stmts(loop.body):
        if isinstance(s, lp.For) and s.kind == "parallel":
            return None
        if not isinstance(s, lp.Store) or s.buffer in inside:
            continue
        b = buffers.get(s.buffer)
        v = s.value
        if b is None or b.scope != "local" or not all(isinstance(i, Const) for i in s.index):
            return None
        if not (isinstance(v, ex.Binary) and v.op in REDUCTION_OPS) or v.type.lanes != 1:
            return None
        own = ex.Load(s.buffer, s.index, v.type)
        other = v.b if v.a == own else v.a if v.b == own else None
        if other is None or any(isinstance(x, ex.Load) and x.buffer == s.buffer for x in ex.walk(other)):
            return None
        if sum(a.buffer == s.buffer for a in uses) != 2:  # the update's own load and store
            return None
        found.append(_Update(b, s.index, v.op, v.type))
    return found or None


def _chunks(n: int, threads: int, per_thread: int, least: int) -> Optional[int]:
    """How many chunks to cut `n` iterations into: `per_thread` per thread, each of at least
    `least` iterations; None where fewer than two result."""
    p = min(threads * per_thread, n // max(least, 1))
    return p if p >= 2 else None


def split_loop(loop: lp.For, updates: list[_Update], p: int, names: NameSupply) -> lp.Stmt:
    """`loop` as a parallel loop over `p` chunks with partial accumulators, and the partials
    folded in order. The innermost loop (the one `vectorize` takes) is cut into chunks of
    `n // p` iterations rounded down to a multiple of 64 (aligned vectors), the rest run
    serially on the accumulators; an outer loop into balanced chunks, ``p * n // P`` to
    ``(p + 1) * n // P``."""
    n = const_int(loop.extent)
    assert n is not None
    part = Var(names.fresh(loop.var.name + "_p"), loop.var.type)
    inner = Var(names.fresh(loop.var.name), loop.var.type)
    mine = {u.buffer.name: names.fresh(u.buffer.name + "_p") for u in updates}
    parts = {u.buffer.name: names.fresh(u.buffer.name + "_parts") for u in updates}
    innermost = not contains_loop(loop.body)
    if innermost:
        c = n // p
        c -= c % 64 if c >= 64 else 0
        first: ex.Expr = ex.mul(part, c)
        extent: ex.Expr = Const(c)
        done = p * c
    else:
        first = ex.floordiv(ex.mul(part, n), p)
        extent = ex.sub(ex.floordiv(ex.mul(ex.add(part, 1), n), p), first)
        done = n
    at = ex.add(loop.start, ex.add(first, inner))
    body = _RenameBuffers(mine).visit_stmt(freshen(substitute_stmt(loop.body, {loop.var.name: at}), names))
    chunk: list[lp.Stmt] = []
    for u in updates:
        chunk.append(lp.Alloc(replace(u.buffer, name=mine[u.buffer.name])))
        chunk.append(lp.Store(mine[u.buffer.name], u.index, identity(u.op, u.type)))
    chunk.append(make_loop(inner, Const(0), extent, "serial", body, loop.annotations))
    for u in updates:
        chunk.append(lp.Store(parts[u.buffer.name], (part,), ex.Load(mine[u.buffer.name], u.index, u.type)))
    out: list[lp.Stmt] = []
    for u in updates:
        out.append(lp.Alloc(lp.Buffer(parts[u.buffer.name], u.buffer.dtype, (Const(p),), (Const(1),), "local")))
    out.append(lp.For(part, Const(0), Const(p), "parallel", lp.block(*chunk), loop.annotations))
    if n > done:
        out.append(make_loop(loop.var, ex.add(loop.start, done), Const(n - done), "serial", loop.body,
                             loop.annotations))
    fold = Var(names.fresh(loop.var.name + "_f"), loop.var.type)
    folds = [lp.Store(u.buffer.name, u.index,
                      ex.Binary(u.op, ex.Load(u.buffer.name, u.index, u.type),
                                ex.Load(parts[u.buffer.name], (fold,), u.type), u.type))
             for u in updates]
    out.append(lp.For(fold, Const(0), Const(p), "serial", lp.block(*folds)))
    return lp.block(*out)


def _collapse(loop: lp.For, want: int, names: NameSupply) -> lp.For:
    """`loop` fused with the loop it holds alone (constant bounds from 0; never the innermost)
    while it has fewer than `want` iterations: a sum over [3, 1000, 333] gets 3000 outer
    iterations to split.

        for r0 in 0..3 { for r1 in 0..1000 { B } }  ->  for r0_r1 in 0..3000 { B[r0 := r0_r1 // 1000, r1 := r0_r1 % 1000] }
    """
    while True:
        n, inner = const_int(loop.extent), loop.body
        if (n is None or n >= want or not isinstance(inner, lp.For) or inner.kind != "serial"
                or const_int(inner.start) != 0 or const_int(loop.start) != 0
                or not contains_loop(inner.body)):
            return loop  # (the innermost loop stays whole: `vectorize` wants it contiguous)
        m = const_int(inner.extent)
        if m is None or m < 1:
            return loop
        var = Var(names.fresh(f"{loop.var.name}_{inner.var.name}"), loop.var.type)
        body = substitute_stmt(inner.body, {loop.var.name: ex.floordiv(var, m), inner.var.name: ex.mod(var, m)})
        loop = lp.For(var, Const(0), Const(n * m), "serial", body, loop.annotations)


def split_kernel(kernel: lp.Kernel, threads: int, min_work: int, per_thread: int,
                 least: int) -> lp.Kernel:
    """Split the top-level reduction loops of one kernel (module docstring)."""
    stmts = list(kernel.body.stmts) if isinstance(kernel.body, lp.Block) else [kernel.body]
    buffers = buffers_of(kernel)
    names: Optional[NameSupply] = None
    changed = False
    for k, s in enumerate(stmts):
        if not isinstance(s, lp.For) or s.kind != "serial" or estimated_work(s) < min_work:
            continue
        updates = _updates(s, buffers)  # (fusing loops below changes none of its updates)
        if updates is None:
            continue
        names = names or NameSupply.for_kernel(kernel)
        loop = _collapse(s, threads * per_thread, names)
        n = const_int(loop.extent)
        per_iteration = max(estimated_work(loop.body), 1.0)
        p = _chunks(n, threads, per_thread, -int(-least // per_iteration)) if n is not None else None
        if p is None:
            continue
        stmts[k] = split_loop(loop, updates, p, names)
        changed = True
    return replace(kernel, body=lp.block(*stmts)) if changed else kernel


@register_pass
@dataclass(frozen=True)
class SplitReductions(LoopPass):
    """Split a top-level reduction loop into chunks with partial accumulators, run in
    parallel, folded in order. See the module docstring for the before/after IR and which
    loops qualify."""

    name = "split-reductions"
    per_kernel = True
    #: Work (elements, `parallelize.estimated_work`) below which a reduction stays serial.
    min_work: int = 1 << 18
    #: Chunks per thread (more balance the threads; each costs one partial and one fold).
    chunks_per_thread: int = 4
    #: Fewest elements of work in a chunk.
    min_chunk: int = 4096
    #: Threads to split for; 0 means the target's (`PassContext.target.threads`); 1 splits nothing.
    threads: int = 0

    def run(self, program: lp.Program) -> lp.Program:
        return self.run_in(program, PassContext())

    def run_in(self, program: lp.Program, ctx: PassContext) -> lp.Program:
        threads = self.threads or max(ctx.target.threads, 1)
        if threads < 2:
            return program
        return map_kernels(program, lambda k: split_kernel(k, threads, self.min_work,
                                                          self.chunks_per_thread, self.min_chunk))
