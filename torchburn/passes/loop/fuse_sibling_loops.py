"""`fuse-sibling-loops`: run independent loops over the same range as one loop.

`lower-to-loops` gives each reduction of a row kernel its own loop, so sibling reductions of
one input (`sum(x - c)` and `sum((x - c)^2)` of a variance, see `var_and_mean`) read the row
once per reduction. Two innermost serial loops of one block with equal start and extent,
separated only by lets, allocations and stores, become one loop when neither touches a buffer
the other writes. The statements between them that the second loop needs (its accumulator's
allocation and initial value, a shift it reads) move above the first loop, provided they
depend on nothing the first loop or the statements left behind compute; the others (what
reads the first loop's result) move below the fused loop. Iterations of the two loops then
interleave, which changes nothing, since they share no written buffer.

Before:

    alloc %a: f32[1] strides [1] local
    %a[0] = 0.0:f32
    for r0 in 0..n { %a[0] = %a[0] + %x[r0] }
    let m = %a[0] / 4.0:f32
    alloc %b: f32[1] strides [1] local
    %b[0] = 0.0:f32
    for r1 in 0..n { %b[0] = %b[0] + %x[r1] * %x[r1] }

After:

    alloc %a: f32[1] strides [1] local
    %a[0] = 0.0:f32
    alloc %b: f32[1] strides [1] local
    %b[0] = 0.0:f32
    for r0 in 0..n {
      %a[0] = %a[0] + %x[r0]
      %b[0] = %b[0] + %x[r0] * %x[r0]
    }
    let m = %a[0] / 4.0:f32
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ..base import LoopPass, register_pass
from .loop_utils import contains_loop, map_kernels, substitute_stmt


def _reads_writes(s: lp.Stmt) -> tuple[set[str], set[str]]:
    """Buffers a statement tree loads from and stores to (an allocation counts as a write)."""
    reads: set[str] = set()
    writes: set[str] = set()
    for node in lp.walk_stmts(s):
        for e in lp.stmt_exprs(node):
            reads |= {x.buffer for x in ex.walk(e) if isinstance(x, ex.Load)}
        if isinstance(node, lp.Store):
            writes.add(node.buffer)
        elif isinstance(node, lp.Alloc):
            writes.add(node.buffer.name)
    return reads, writes


def _free_vars(s: lp.Stmt) -> set[str]:
    out: set[str] = set()
    for node in lp.walk_stmts(s):
        for e in lp.stmt_exprs(node):
            out |= ex.free_vars(e)
    return out


def _is_fusable_loop(s: lp.Stmt) -> bool:
    return isinstance(s, lp.For) and s.kind == "serial" and not contains_loop(s.body)


def fuse_pair(first: lp.For, between: list[lp.Stmt], second: lp.For) -> Optional[list[lp.Stmt]]:
    """`first; between; second` as `hoisted; fused loop; rest`, or None when not legal."""
    if (first.start, first.extent) != (second.start, second.extent):
        return None
    if not all(isinstance(s, (lp.Let, lp.Alloc, lp.Store)) for s in between):
        return None
    r1, w1 = _reads_writes(first.body)
    r2, w2 = _reads_writes(second.body)
    if w1 & (r2 | w2) or w2 & r1:
        return None
    # what `second` needs from `between`, found backwards, transitively
    need_vars = _free_vars(second)
    need_bufs = r2 | w2
    needed: list[bool] = [False] * len(between)
    for k in range(len(between) - 1, -1, -1):
        s = between[k]
        _, w = _reads_writes(s)
        if (isinstance(s, lp.Let) and s.var.name in need_vars) or w & need_bufs:
            needed[k] = True
            reads, _ = _reads_writes(s)
            need_vars |= _free_vars(s)
            need_bufs |= reads | w
    hoisted = [s for s, n in zip(between, needed) if n]
    rest = [s for s, n in zip(between, needed) if not n]
    hr, hw = _reads_writes(lp.block(*hoisted)) if hoisted else (set(), set())
    rr, rw = _reads_writes(lp.block(*rest)) if rest else (set(), set())
    rest_lets = {s.var.name for s in rest if isinstance(s, lp.Let)}
    if hw & (r1 | w1 | rr) or hr & (w1 | rw) or need_vars & rest_lets:
        return None
    body2 = substitute_stmt(second.body, {second.var.name: first.var})
    fused = replace(first, body=lp.block(first.body, body2))
    return [*hoisted, fused, *rest]


def fuse_block(stmts: tuple[lp.Stmt, ...]) -> list[lp.Stmt]:
    """The statements of one block with sibling loops fused, left to right."""
    out: list[lp.Stmt] = []
    for s in stmts:
        if _is_fusable_loop(s):
            assert isinstance(s, lp.For)
            at = max((k for k, x in enumerate(out) if isinstance(x, lp.For)), default=None)
            if at is not None and _is_fusable_loop(out[at]):
                first = out[at]
                assert isinstance(first, lp.For)
                merged = fuse_pair(first, out[at + 1:], s)
                if merged is not None:
                    out = out[:at] + merged
                    continue
        out.append(s)
    return out


def _fuse(s: lp.Stmt) -> lp.Stmt:
    if isinstance(s, lp.Block):
        inner = tuple(_fuse(x) for x in s.stmts)
        new = fuse_block(inner)
        same = len(new) == len(s.stmts) and all(a is b for a, b in zip(new, s.stmts))
        return s if same else lp.block(*new)
    if isinstance(s, lp.For):
        body = _fuse(s.body)
        return s if body is s.body else replace(s, body=body)
    if isinstance(s, lp.If):
        then = _fuse(s.then)
        orelse = None if s.orelse is None else _fuse(s.orelse)
        return s if then is s.then and orelse is s.orelse else lp.If(s.cond, then, orelse)
    return s


@register_pass
@dataclass(frozen=True)
class FuseSiblingLoops(LoopPass):
    """Fuse innermost serial loops of one range that share no written buffer (horizontal
    fusion), moving the statements between them above or below.

    Before:

        let c = %x[i0, 0]
        for r0 in 0..n { %a[0] = %a[0] + (%x[i0, r0] - c) }
        let m = %a[0]
        for r1 in 0..n { %b[0] = %b[0] + (%x[i0, r1] - c) * (%x[i0, r1] - c) }

    After:

        let c = %x[i0, 0]
        for r0 in 0..n {
          %a[0] = %a[0] + (%x[i0, r0] - c)
          %b[0] = %b[0] + (%x[i0, r0] - c) * (%x[i0, r0] - c)
        }
        let m = %a[0]

    The module docstring says when loops are fused.
    """

    name = "fuse-sibling-loops"
    per_kernel = True

    def run(self, program: lp.Program) -> lp.Program:
        def one(k: lp.Kernel) -> lp.Kernel:
            body = _fuse(k.body)
            return k if body is k.body else replace(k, body=body)

        return map_kernels(program, one)
