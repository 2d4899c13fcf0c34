"""Serial GPU kernels: `gpu-split-phases` cuts a kernel of several top-level loops into one
kernel per phase; `gpu-chunk-serial` keeps what one invocation loops within the device's limit.

`gpu-map` maps a kernel whose body is one loop nest (after leading `let`s); a body of several
top-level statements gets no mapping and runs as one invocation. That is a scatter's form (copy
the input into the output, then apply the updates in order), `index_put`'s, a sort's (the
index vector, then the merge passes): its first phase, an elementwise copy of every element,
ran on one GPU thread.

**`gpu-split-phases`** (before `gpu-map`) cuts such a body between statements where nothing a
statement defined (a `let`, a local buffer) is used after the cut; a leading `let` that reads
no buffer the kernel writes is copied into each phase that uses it. The phases are kernels
called one after the other (a dispatch sees all that the previous one wrote), so the cut is
exact; `gpu-map` then maps each phase on its own: the copy gets a grid.

Before:

    kernel @k0(%x: f32[65536] strides [1], %i: i64[1000] strides [1], %s: f32[1000] strides [1], %out0: f32[65536] strides [1]) {
      for i0 in 0..65536 {
        %out0[i0] = %x[i0]
      }
      for j1 in 0..1000 {
        let t2 = checked_index(%i[j1], 65536)
        %out0[t2] = %out0[t2] + %s[j1]
      }
    }
    call @k0(%x, %i, %s, %out0)

After `gpu-split-phases`:

    kernel @k0_p0(%x: f32[65536] strides [1], %out0: f32[65536] strides [1]) {
      for i0 in 0..65536 {
        %out0[i0] = %x[i0]
      }
    }
    kernel @k0_p1(%i: i64[1000] strides [1], %s: f32[1000] strides [1], %out0: f32[65536] strides [1]) {
      for j1 in 0..1000 { ... }
    }
    call @k0_p0(%x, %out0)
    call @k0_p1(%i, %s, %out0)

**`gpu-chunk-serial`** (after `gpu-map`) counts the loop iterations one invocation runs, all
its loops together, as llvmpipe's limiter counts them: a `grid` or `block` loop costs nothing
(it is the invocation grid), a cooperative `threads` nest `ceil(n / workgroup)` trips, a plain
loop its extent's upper bound times (its body's count + 1), plus 1 for entering it (an outer
iteration around an inner loop of k iterations costs k + 2, as measured on llvmpipe;
`Bounds`: an extent may depend on the loops around it); row, GEMM and attention kernels are
tiled by their emitters and not counted (their row loops take about `row / lanes` trips each).
A serial loop after leading `let`s (which `gpu-split-phases` copies into a phase) is chunked
with the lets recomputed inside it. Where the target has a limit
(`Target.gpu_loop_iterations`: Mesa's llvmpipe ends all loops of an invocation after 65,535
iterations, and the kernel's result is silently wrong) and a single-invocation kernel's one
loop exceeds it, the loop's range is cut into consecutive kernels within the limit (exact, as
`gpu-split-wide`'s chunks are):

    kernel @k0_p1(...) { for j1 in 0..100000 { ... } }      ->    kernel @k0_p1_0(...) { for j1 in 0..65470 { ... } }
                                                                    kernel @k0_p1_1(...) { for j1 in 0..34530 { ... } }   (j1 + 65470 inside)

A kernel still past the limit (a row loop longer than the limit in a grid kernel, a sort's
nested merge passes), or whose count depends on the sizes, gets the count as the attribute
`gpu_iterations = "<expression over the symbols>"`: code generation refuses the first kind
(the CPU engine runs the graph) and the launcher runs a call of the second kind in PyTorch when
the sizes it gets put it past the limit (`codegen/wgsl/program.py`, `backend/gpu_launcher.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr
from ...ir.loop import ITERATIONS_ATTR
from ...ir.printer import print_expr
from ..base import LoopPass, PassContext, PassError, register_pass
from ..loop.bounds import Bounds
from .split import _chunk, replace_kernels, restrict

#: Iterations kept free below the limit in each chunk (a loop the shader compiler adds).
MARGIN = 64


def _stmts(s: lp.Stmt) -> tuple[lp.Stmt, ...]:
    return s.stmts if isinstance(s, lp.Block) else (s,)


def _defined(s: lp.Stmt) -> set[str]:
    """Names a top-level statement makes visible to the ones after it: a `let`'s variable, a
    local buffer."""
    if isinstance(s, lp.Let):
        return {s.var.name}
    if isinstance(s, lp.Alloc):
        return {s.buffer.name}
    return set()


def _used(s: lp.Stmt) -> set[str]:
    """Variables and buffers a statement reads or writes (its own definitions included)."""
    names: set[str] = set()
    for x in lp.walk_stmts(s):
        for e in lp.stmt_exprs(x):
            names |= ex.free_vars(e)
            names |= {n.buffer for n in ex.walk(e) if isinstance(n, ex.Load)}
        if isinstance(x, lp.Store):
            names.add(x.buffer)
        if isinstance(x, lp.For):
            names |= ex.free_vars(x.start) | ex.free_vars(x.extent)
    return names


def phases(k: lp.Kernel) -> Optional[list[lp.Stmt]]:
    """The bodies of `k`'s phases (module docstring), or None when it is one."""
    stmts = _stmts(k.body)
    if len(stmts) < 2 or any(isinstance(s, lp.For) and s.annotation("gpu") for s in lp.walk_stmts(k.body)):
        return None
    written = {s.buffer for s in lp.walk_stmts(k.body) if isinstance(s, lp.Store)}
    # leading lets that read nothing the kernel writes: copied where used
    pure: list[lp.Let] = []
    for s in stmts:
        if not isinstance(s, lp.Let) or any(isinstance(n, ex.Load) and n.buffer in written for n in ex.walk(s.value)):
            break
        pure.append(s)
    rest = stmts[len(pure):]
    if sum(isinstance(s, lp.For) for s in rest) < 2:
        return None  # one loop nest (and perhaps straight-line code): gpu-map's to map
    uses = [_used(s) for s in rest]
    groups: list[list[lp.Stmt]] = [[rest[0]]]
    for c in range(1, len(rest)):
        before = set().union(*(_defined(s) for s in rest[:c]))
        if before & set().union(*uses[c:]):
            groups[-1].append(rest[c])  # a let or local of an earlier statement is used here or later
        else:
            groups.append([rest[c]])
    if len(groups) < 2:
        return None
    out: list[lp.Stmt] = []
    for g in groups:
        needed: list[lp.Stmt] = []
        names = set().union(*(_used(s) for s in g))
        for let in reversed(pure):  # a let a copied let reads comes along too
            if let.var.name in names:
                needed.insert(0, let)
                names |= ex.free_vars(let.value)
        out.append(lp.block(*needed, *g))
    return out


def _upper(e: Expr, bounds: Bounds) -> Optional[Expr]:
    """An upper bound of `e` over the scope's loop ranges, as an expression over the symbols,
    or None where none is known."""
    hi = bounds.interval(e).hi
    if hi is None or any(not (isinstance(a, ex.Var) and a.name in bounds.symbols) for a in hi.atoms()):
        return None
    return ex.maximum(hi.to_expr(), Const(0))


def iterations(s: lp.Stmt, bounds: Bounds) -> Optional[Expr]:
    """The loop iterations one invocation runs in `s`, at most (module docstring), or None
    where it is not known (an extent without a bound, a kernel its emitter tiles)."""
    if isinstance(s, lp.Block):
        total: Expr = Const(0)
        for x in s.stmts:
            n = iterations(x, bounds)
            if n is None:
                return None
            total = ex.add(total, n)
        return total
    if isinstance(s, lp.If):
        a = iterations(s.then, bounds)
        b = Const(0) if s.orelse is None else iterations(s.orelse, bounds)
        return None if a is None or b is None else ex.add(a, b)
    if not isinstance(s, lp.For):
        return Const(0)
    mapping = s.annotation("gpu")
    inner = bounds.bind_loop(s.var, s.start, s.extent)
    if mapping in ("grid", "block"):
        return iterations(s.body, inner)
    if mapping == "threads":  # the nest is one loop shared by the workgroup (`_cooperative`)
        total_extent: Expr = Const(1)
        body: lp.Stmt = s
        while isinstance(body, lp.For) and body.annotation("gpu") == "threads":
            n = _upper(body.extent, bounds)
            if n is None:
                return None
            total_extent = ex.mul(total_extent, n)
            inner = inner.bind_loop(body.var, body.start, body.extent) if body is not s else inner
            body = body.body
        wg = int(s.annotation("gpu_wg") or 256)
        per = iterations(body, inner)
        if per is None:
            return None
        trips = ex.floordiv(ex.add(total_extent, Const(wg - 1)), Const(wg))
        return ex.add(ex.mul(trips, ex.add(per, Const(1))), Const(1))
    if mapping is not None:
        return None  # rows, lanes, gemm, attention: tiled by their emitters
    n = _upper(s.extent, bounds)
    per = iterations(s.body, inner)
    if n is None or per is None:
        return None
    # each iteration counts once, and so does each entry of the loop (llvmpipe's limiter, as
    # measured: an outer iteration around an inner loop of k iterations costs k + 2)
    return ex.add(ex.mul(n, ex.add(per, Const(1))), Const(1))


def kernel_iterations(k: lp.Kernel) -> Optional[Expr]:
    """`iterations` of a kernel's body, in its symbols' scope."""
    return iterations(k.body, Bounds({v.name for v in k.symbols}))


@register_pass
@dataclass(frozen=True)
class GpuSplitPhases(LoopPass):
    """Cut single-invocation kernels of several top-level loops into phase kernels (module
    docstring)."""

    name: ClassVar[str] = "gpu-split-phases"

    def run(self, program: lp.Program) -> lp.Program:
        pieces: dict[str, list[lp.Kernel]] = {}
        for k in program.kernels:
            bodies = phases(k)
            if bodies is not None:
                pieces[k.name] = [restrict(k, b, f"{k.name}_p{i}") for i, b in enumerate(bodies)]
        return replace_kernels(program, pieces)


@register_pass
@dataclass(frozen=True)
class GpuChunkSerial(LoopPass):
    """Keep each invocation's loop iterations within the target's limit (module docstring)."""

    name: ClassVar[str] = "gpu-chunk-serial"
    #: Loop iterations one invocation may run; 0: the target's `gpu_loop_iterations` (0 there:
    #: no limit, and the pass changes nothing).
    max_iterations: int = 0

    def run(self, program: lp.Program) -> lp.Program:
        return self.run_in(program, PassContext())

    def run_in(self, program: lp.Program, ctx: PassContext) -> lp.Program:
        limit = self.max_iterations or ctx.target.gpu_loop_iterations
        if limit < 0:
            raise PassError(f"gpu-chunk-serial: max_iterations must be at least 0, not {limit}")
        if not limit:
            return program
        pieces: dict[str, list[lp.Kernel]] = {}
        for k in program.kernels:
            n = kernel_iterations(k)
            if n is None or (isinstance(n, Const) and int(n.value) <= limit):
                continue
            chunks = self.chunks(k, limit) if isinstance(n, Const) else None
            pieces[k.name] = chunks or [replace(k, attrs=tuple(a for a in k.attrs if a[0] != ITERATIONS_ATTR)
                                                + ((ITERATIONS_ATTR, print_expr(n)),))]
        return replace_kernels(program, pieces)

    @staticmethod
    def chunks(k: lp.Kernel, limit: int) -> Optional[list[lp.Kernel]]:
        """`k`'s one serial loop cut into consecutive kernels within `limit`, or None when `k`
        is not a single-invocation loop or one iteration alone is past the limit."""
        loop = k.body
        stmts = _stmts(loop)
        if len(stmts) > 1 and all(isinstance(x, lp.Let) for x in stmts[:-1]) and isinstance(stmts[-1], lp.For):
            # leading lets (`gpu-split-phases` copies those a phase reads): recomputed inside
            # the loop, whose chunks then each carry them
            loop = replace(stmts[-1], body=lp.block(*stmts[:-1], stmts[-1].body))
            k = replace(k, body=loop)
        if not isinstance(loop, lp.For) or loop.annotation("gpu") or not isinstance(loop.extent, Const) \
                or loop.start != Const(0):
            return None
        per = iterations(loop.body, Bounds({v.name for v in k.symbols}).bind_loop(loop.var, loop.start, loop.extent))
        budget = limit - MARGIN - 1  # the chunk loop's own entry counts once
        if not isinstance(per, Const) or int(per.value) + 1 > budget:
            return None
        step = budget // (int(per.value) + 1)
        n = int(loop.extent.value)
        return [_chunk(k, loop, a, min(a + step, n), f"{k.name}_{c}") for c, a in enumerate(range(0, n, step))]
