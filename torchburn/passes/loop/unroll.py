"""`unroll`: replace small loops of constant trip count by copies of their body.

Loops marked `unrolled` are always unrolled fully (their extent must be a constant of at most
`MAX_UNROLL`); innermost serial loops (no loop inside, after their own inner loops were
unrolled) with a constant extent of at most `max_extent` are unrolled too, when the copies
add up to at most `AUTO_UNROLL_BUDGET` lets and stores (`max_extent=0` unrolls only marked
loops), unless the loop is annotated `lp.KEEP_ROLLED` (`{loop = "keep-rolled"}`: its author
knows the copies buy nothing, and every later stage would pay for them). Each copy gets the loop variable replaced by its value, and its
lets, local buffers and inner loop variables fresh names, so the copies can share one block.
Run `simplify` afterwards to fold the index arithmetic.

Before (`unroll{max_extent=4}`):

    for i0 in 0..s0 {
      for i1 in 0..2 {
        let t = %x[i0, i1] * 2.0:f32
        %out[i0, i1] = t + 1.0:f32
      }
    }

After:

    for i0 in 0..s0 {
      let t = %x[i0, 0] * 2.0:f32
      %out[i0, 0] = t + 1.0:f32
      let t_1 = %x[i0, 1] * 2.0:f32
      %out[i0, 1] = t_1 + 1.0:f32
    }
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...ir import expr as ex
from ...ir import loop as lp
from ..base import LoopPass, PassError, register_pass
from .loop_utils import (
    NameSupply,
    const_int,
    contains_loop,
    freshen,
    map_kernels,
    map_loop_body,
    map_loops,
    substitute_stmt,
)

#: The largest loop marked `unrolled` the pass expands; larger ones are an error.
MAX_UNROLL = 1024
#: Loops unrolled on the pass's own initiative grow to at most this many statements.
AUTO_UNROLL_BUDGET = 64


def statement_count(s: lp.Stmt) -> int:
    """Lets and stores in a statement tree (the size unrolling multiplies)."""
    return sum(isinstance(x, (lp.Let, lp.Store)) for x in lp.walk_stmts(s))


def unroll_loop(s: lp.For, names: NameSupply) -> lp.Stmt:
    """The body of `s` once per iteration (its extent must be a constant)."""
    n = const_int(s.extent)
    if n is None:
        raise PassError(f"unroll: loop {s.var.name} is marked unrolled but its extent is not a constant")
    copies: list[lp.Stmt] = []
    for k in range(max(n, 0)):
        body = substitute_stmt(s.body, {s.var.name: ex.add(s.start, k)})
        copies.append(body if k == 0 else freshen(body, names))
    return lp.block(*copies) if copies else lp.Block(())


class _Unroller:
    def __init__(self, kernel: lp.Kernel, max_extent: int) -> None:
        self.max_extent = max_extent
        self.names = NameSupply.for_kernel(kernel)

    def stmt(self, s: lp.Stmt) -> lp.Stmt:
        return map_loops(s, self.loop)

    def loop(self, s: lp.For) -> lp.Stmt:
        s = map_loop_body(s, self.loop)
        if s.kind == "unrolled":
            n = const_int(s.extent)
            if n is not None and n > MAX_UNROLL:
                raise PassError(f"unroll: loop {s.var.name} is marked unrolled with {n} iterations "
                                f"(at most {MAX_UNROLL}); split it first")
            return unroll_loop(s, self.names)
        n = const_int(s.extent)
        if (s.kind == "serial" and n is not None and n <= self.max_extent and not contains_loop(s.body)
                and n * statement_count(s.body) <= AUTO_UNROLL_BUDGET and lp.KEEP_ROLLED not in s.annotations):
            return unroll_loop(s, self.names)
        return s


def unroll_kernel(kernel: lp.Kernel, max_extent: int = 8) -> lp.Kernel:
    """Unroll the loops of one kernel (see the module docstring)."""
    body = _Unroller(kernel, max_extent).stmt(kernel.body)
    return kernel if body is kernel.body else replace(kernel, body=body)


@register_pass
@dataclass(frozen=True)
class Unroll(LoopPass):
    """Fully unroll loops marked `unrolled`, and innermost serial loops of at most
    `max_extent` iterations (unless annotated `{loop = "keep-rolled"}`).

    Before (`unroll{max_extent=4}`):

        for i1 in 0..2 {
          let t = %x[i0, i1] * 2.0:f32
          %out[i0, i1] = t + 1.0:f32
        }

    After:

        let t = %x[i0, 0] * 2.0:f32
        %out[i0, 0] = t + 1.0:f32
        let t_1 = %x[i0, 1] * 2.0:f32
        %out[i0, 1] = t_1 + 1.0:f32
    """

    name = "unroll"
    per_kernel = True
    #: Innermost serial loops with a constant extent up to this are unrolled; 0: only marked ones.
    max_extent: int = 8

    def run(self, program: lp.Program) -> lp.Program:
        return map_kernels(program, lambda k: unroll_kernel(k, self.max_extent))
