"""`parallelize`: run the outermost independent loop of each loop nest on all threads.

A serial loop becomes `parallel` when

- the work inside it (the product of trip counts times the elements stored per iteration;
  a symbolic trip count without a constant upper bound, such as `s0` but not `s0 % 8`,
  counts as large) is more than `min_work`, and
- its iterations are independent: every buffer it writes, except local buffers allocated
  inside it (per-iteration temporaries such as reduction accumulators), is accessed in one
  dimension `d` at `c * v + f` in every load and store, with the same `f`-expression, `c` a
  non-zero constant (or a positive symbol) and the range of `f` narrower than `|c|`, so
  different iterations touch disjoint slices.

Loops inside a parallel loop are left alone (no nested parallelism); when the outermost loop
of a nest is not independent (a reduction over it, a scan), the pass looks further in.

With `collapse=true`, a parallel loop with a small constant trip count (fewer than twice the
threads) whose body is exactly one independent loop, with bounds that do not depend on it and
loops inside it, is fused with that loop, so all threads get work. (The innermost loop is
never fused away: it is the one the vectorizer wants.)

Before (`parallelize{threads=16}`):

    for b in 0..4 {
      for i in 0..s0 {
        for j in 0..64 {
          %out[b, i, j] = %x[b, i, j] * 2.0:f32
        }
      }
    }

After:

    parallel for b_i in 0..s0 * 4 {
      for j in 0..64 {
        %out[b_i // s0, b_i % s0, j] = %x[b_i // s0, b_i % s0, j] * 2.0:f32
      }
    }

Without collapsing (`parallelize{collapse=false}`) the same nest gets `parallel for b in 0..4`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, Var
from ..base import LoopPass, PassContext, register_pass
from .bounds import Bounds, kernel_bounds
from .loop_utils import (
    Access,
    NameSupply,
    Poly,
    accesses,
    affine_coefficient,
    allocated,
    const_int,
    map_kernels,
    substitute_stmt,
)


def estimated_work(s: lp.Stmt, bounds: Optional[Bounds] = None) -> float:
    """Elements stored when `s` runs once: trip counts multiplied out (a trip count without a
    constant upper bound counts as infinite), vector stores counting their lanes."""
    b = bounds if bounds is not None else Bounds()
    if isinstance(s, lp.Block):
        return sum(estimated_work(x, b) for x in s.stmts)
    if isinstance(s, lp.Store):
        return float(max(i.type.lanes for i in s.index) if s.index else 1)
    if isinstance(s, lp.For):
        body = estimated_work(s.body, b.bind_loop(s.var, s.start, s.extent))
        if body == 0:
            return 0.0
        n = b.interval(s.extent).const_hi
        return math.inf if n is None else max(n, 0) * body
    if isinstance(s, lp.If):
        return max(estimated_work(s.then, b), 0.0 if s.orelse is None else estimated_work(s.orelse, b))
    return 0.0


def independent(loop: lp.For, bounds: Bounds) -> bool:
    """Whether the iterations of `loop` touch disjoint memory, so they can run at the same time
    (see the module docstring)."""
    private = allocated(loop.body)
    inside = bounds.bind_loop(loop.var, loop.start, loop.extent)
    scopes: dict[tuple[lp.For, ...], Bounds] = {}

    def scope(loops: tuple[lp.For, ...]) -> Bounds:
        if loops not in scopes:
            b = inside if not loops else scope(loops[:-1])
            scopes[loops] = b if not loops else b.bind_loop(loops[-1].var, loops[-1].start, loops[-1].extent)
        return scopes[loops]

    groups: dict[str, list[Access]] = {}
    for a in accesses(loop.body):
        groups.setdefault(a.buffer, []).append(a)
    for buffer, uses in groups.items():
        if buffer in private or not any(a.is_store for a in uses):
            continue
        ndim = len(uses[0].index)
        if not any(_disjoint_in(loop, [(a.index[d], scope(a.loops)) for a in uses]) for d in range(ndim)):
            return False
    return True


def _disjoint_in(loop: lp.For, uses: list[tuple[Expr, Bounds]]) -> bool:
    """All uses index one dimension by the same `c*v + f`, with the range of `f` narrower than
    `|c|` (a vector index `ramp(c*v + f, s, n)` widens the range of `f` by `(n-1)*|s|`)."""
    first = uses[0][0]
    if any(index != first for index, _ in uses):
        return False
    scalar, spread = _lane_spread(first)
    if scalar is None:
        return False
    c = affine_coefficient(scalar, loop.var.name)
    if c is None:
        return False
    k = const_int(c)
    if k == 0:
        return False
    size: Expr = Const(abs(k)) if k is not None else c
    rest = Poly.of(ex.sub(scalar, ex.mul(c, loop.var))).to_expr()
    for _, b in uses:
        if k is None and not b.prove_lt(Const(0), c):
            return False
        r = b.interval(rest)
        if r.lo is None or r.hi is None:
            return False
        if not b.prove_lt(ex.add(ex.sub(r.hi.to_expr(), r.lo.to_expr()), spread), size):
            return False
    return True


def _lane_spread(e: Expr) -> tuple[Optional[Expr], int]:
    """`(first lane, last lane - first lane)` of a scalar, broadcast or constant-stride ramp."""
    if e.type.lanes == 1:
        return e, 0
    if isinstance(e, ex.Broadcast):
        return e.value, 0
    stride = const_int(e.stride) if isinstance(e, ex.Ramp) else None
    if isinstance(e, ex.Ramp) and stride is not None:
        return e.base, abs(stride) * (e.type.lanes - 1)
    return None, 0


class _Parallelizer:
    def __init__(self, kernel: lp.Kernel, min_work: int, collapse: bool, threads: int) -> None:
        self.min_work = min_work
        self.collapse = collapse
        self.threads = threads
        self.names = NameSupply.for_kernel(kernel)

    def stmt(self, s: lp.Stmt, b: Bounds) -> lp.Stmt:
        if isinstance(s, lp.Block):
            new = tuple(self.stmt(x, b) for x in s.stmts)
            return s if all(x is y for x, y in zip(new, s.stmts)) else lp.Block(new)
        if isinstance(s, lp.If):
            then = self.stmt(s.then, b)
            orelse = None if s.orelse is None else self.stmt(s.orelse, b)
            return s if then is s.then and orelse is s.orelse else lp.If(s.cond, then, orelse)
        if isinstance(s, lp.For):
            return self.loop(s, b)
        return s

    def loop(self, s: lp.For, b: Bounds) -> lp.Stmt:
        if s.kind in ("parallel", "vectorized"):
            return s
        if s.kind == "serial" and estimated_work(s, b) > self.min_work and independent(s, b):
            fused = self.fuse(s, b) if self.collapse else None
            return fused if fused is not None else replace(s, kind="parallel")
        body = self.stmt(s.body, b.bind_loop(s.var, s.start, s.extent))
        return s if body is s.body else replace(s, body=body)

    def fuse(self, s: lp.For, b: Bounds) -> Optional[lp.Stmt]:
        """`for a { for c { body } }` -> `parallel for a_c in 0..A*C { body[a, c := ...] }`."""
        n = const_int(s.extent)
        inner = s.body
        if n is None or n >= 2 * self.threads or not isinstance(inner, lp.For) or inner.kind != "serial":
            return None
        if not any(isinstance(x, lp.For) for x in lp.walk_stmts(inner.body)):
            return None  # keep an innermost loop whole: it is the one to vectorize
        if s.var.name in ex.free_vars(inner.start) | ex.free_vars(inner.extent):
            return None
        if not independent(inner, b.bind_loop(s.var, s.start, s.extent)):
            return None
        var = Var(self.names.fresh(f"{s.var.name}_{inner.var.name}"))
        outer_value = ex.add(ex.floordiv(var, inner.extent), s.start)
        inner_value = ex.add(ex.mod(var, inner.extent), inner.start)
        body = substitute_stmt(inner.body, {s.var.name: outer_value, inner.var.name: inner_value})
        return lp.For(var, Const(0), ex.mul(inner.extent, s.extent), "parallel", body,
                      s.annotations or inner.annotations)


def parallelize_kernel(kernel: lp.Kernel, min_work: int = 32768, collapse: bool = True,
                       threads: int = 1) -> lp.Kernel:
    """Mark the outermost independent loops of one kernel parallel (see the module docstring);
    `threads` is what collapsing plans for."""
    body = _Parallelizer(kernel, min_work, collapse, threads).stmt(kernel.body, kernel_bounds(kernel.symbols))
    return kernel if body is kernel.body else replace(kernel, body=body)


@register_pass
@dataclass(frozen=True)
class Parallelize(LoopPass):
    """Mark the outermost independent loop of each nest `parallel` when it has enough work.

    Before:

        for i0 in 0..s0 {
          alloc %acc0: f32[1] strides [1] local
          %acc0[0] = 0.0:f32
          for r0 in 0..s1 {
            %acc0[0] = %acc0[0] + %x[i0, r0]
          }
          %out[i0] = %acc0[0]
        }

    After:

        parallel for i0 in 0..s0 {
          ... (unchanged)
        }

    `%out` is written at `i0` only and `%acc0` is private to an iteration, so `i0` is
    independent; its work (`s0 * s1` elements) is symbolic, hence large. See the module
    docstring for the rules and for collapsing.
    """

    name = "parallelize"
    per_kernel = True
    #: Loops doing at most this many element stores stay serial.
    min_work: int = 32768
    #: Fuse a small parallel loop with the loop it holds, so all threads get work.
    collapse: bool = True
    #: Threads assumed when collapsing; 0 means the target's (`PassContext.target.threads`).
    threads: int = 0

    def run(self, program: lp.Program) -> lp.Program:
        return self.run_in(program, PassContext())

    def run_in(self, program: lp.Program, ctx: PassContext) -> lp.Program:
        threads = self.threads or max(ctx.target.threads, 1)
        return map_kernels(program, lambda k: parallelize_kernel(k, self.min_work, self.collapse, threads))
