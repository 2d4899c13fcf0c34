"""`keep-constant-prep`: work a kernel does on constant inputs alone is done once, not per call.

A convolution kernel packs its weight into the blocked layout its micro-kernel reads
(`loopgen/conv.py`: `%wp[group block, ci, *taps, lane]`) at the top of every call; a
pointwise convolution packs its weight panels alike (`conv_pointwise.py`). When the weight is
a constant input of the program (`Program.constant_inputs`: a module's parameter in
inference, marked `const` on the graph's input), the packed copy is the same on every call
until the weight changes. This pass finds such preparation and keeps its result across calls:

- a top-level statement of a kernel is *preparation* when, in every call of the kernel, it
  reads nothing but constant inputs, kept temporaries and its own local buffers, writes
  nothing but kept temporaries and its own locals, and uses no variable it does not bind
  itself (no symbol, no `let` from outside);
- a temporary of constant size, never passed as a view, is *kept* when something writes it
  and every statement writing it, in every call, is preparation (found as a fixed point:
  start from every such temporary, drop those a non-preparation statement writes).

So a weight packed at the top of the convolution kernel is kept, and a whole kernel computing a
weight from constants alone (batch norm folded into a convolution's weight, `fold-batch-norm`:
`w * gamma / sqrt(var + eps)`) runs under the same guard as the packing that reads it. Only
temporaries that something outside the preparation reads are listed as kept (the packed
weight); one that only preparation reads (the folded weight) stays an ordinary temporary,
written and read in the same refreshing call, its bytes reused by the rest. A program that
writes a constant input itself keeps nothing.

Each preparation statement is wrapped in `if refresh != 0` (the program symbol `lp.REFRESH`,
added to the kernel's and the program's symbols), its temporaries are listed in
`Program.kept` and the constant inputs it reads in `Program.kept_from`. Memory planning puts
kept temporaries first in the workspace and never reuses their bytes; the caller (the
launcher, `backend/launcher_gen.py`) passes `refresh = 1` on a call whose `kept_from` tensors
or workspace are not those of its last call (another tensor, other memory, or a moved version
counter: an in-place update of the weight), else 0. A kernel called several times (equal
layers merged by `dedup-kernels`) has a statement guarded only where it is preparation in
every call.

Before:

    program @f(%x: f32[1, 64, 100] ..., %w: f32[64, 64, 3] ...) -> (%out0: ...) {
      temp %k0_ws0: f32[8, 64, 3, 8] strides [1536, 24, 8, 1]
      constant %w
      call @k0(%k0_ws0, %w, %x, %out0)
    }
    kernel @k0(%k0_ws0: ..., %w: ..., %x: ..., %out0: ...) {
      for p0 in 0..8 { for p1 in 0..64 { ... %k0_ws0[p0, p1, 0, ramp(0, 1, 8)] = %w[ramp(p0 * 8, 1, 8), p1, 0] ... } }
      for ti in 0..40 { ... %k0_ws0[...] ... %x[...] ... %out0[...] = ... }
    }

After:

    program @f(...) -> (...) symbols(refresh) {
      temp %k0_ws0: f32[8, 64, 3, 8] strides [1536, 24, 8, 1]
      constant %w
      kept %k0_ws0 from %w
      call @k0(%k0_ws0, %w, %x, %out0)
    }
    kernel @k0(...) symbols(refresh) {
      if refresh != 0 {
        for p0 in 0..8 { for p1 in 0..64 { ... } }
      }
      for ti in 0..40 { ... }
    }
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, replace
from typing import ClassVar

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Var
from ..base import LoopPass, register_pass
from .loop_utils import allocated

REFRESH = Var(lp.REFRESH)


def _unbound_vars(s: lp.Stmt) -> set[str]:
    """Variables a statement tree reads that it does not bind itself (by a loop or a `let`)."""
    free: set[str] = set()

    def visit(node: lp.Stmt, bound: frozenset[str]) -> frozenset[str]:
        for e in lp.stmt_exprs(node):
            free.update(ex.free_vars(e) - bound)
        if isinstance(node, lp.Let):
            return bound | {node.var.name}
        if isinstance(node, lp.For):
            visit(node.body, bound | {node.var.name})
        elif isinstance(node, lp.Block):
            inner = bound
            for child in node.stmts:
                inner = visit(child, inner)
        else:
            for child in node.children():
                visit(child, bound)
        return bound

    visit(s, frozenset())
    return free


def _reads_writes(s: lp.Stmt) -> tuple[set[str], set[str]]:
    """The buffers a statement tree loads from and stores to."""
    reads: set[str] = set()
    writes: set[str] = set()
    for node in lp.walk_stmts(s):
        if isinstance(node, lp.Store):
            writes.add(node.buffer)
        for e in lp.stmt_exprs(node):
            reads.update(x.buffer for x in ex.walk(e) if isinstance(x, ex.Load))
    return reads, writes


def _static(b: lp.Buffer) -> bool:
    return all(isinstance(d, Const) for d in (*b.shape, *b.strides))


@register_pass
@dataclass(frozen=True)
class KeepConstantPrep(LoopPass):
    """Run a kernel's preparation of constant inputs (a weight packed into the layout its
    micro-kernel reads) only when those inputs changed, and keep its result between calls
    (module docstring).

    Before:

        constant %w
        call @k0(%k0_ws0, %w, %x, %out0)
        kernel @k0(...) { for p0 { ... %k0_ws0[..] = %w[..] } ; for ti { ... %k0_ws0[..] ... } }

    After:

        kept %k0_ws0 from %w
        kernel @k0(...) symbols(refresh) { if refresh != 0 { for p0 { ... } } ; for ti { ... } }
    """

    name: ClassVar[str] = "keep-constant-prep"

    def run(self, program: lp.Program) -> lp.Program:
        constants = set(program.constant_inputs) - lp.written_inputs(program)
        if not constants or program.kept or any(s.name == lp.REFRESH for s in program.symbols):
            return program
        viewed = {a for c in program.calls for i, a in enumerate(c.args) if c.offset(i) is not None}
        kept = {t.name for t in program.temps if _static(t) and t.name not in viewed}
        calls_of: dict[str, list[lp.KernelCall]] = defaultdict(list)
        for call in program.calls:
            calls_of[call.kernel].append(call)
        # per kernel: its top-level statements and, per statement, (reads, writes, closed)
        facts: dict[str, list[tuple[set[str], set[str], bool]]] = {}
        for k in program.kernels:
            facts[k.name] = []
            params = {p.name for p in k.params}
            for s in _statements(k):
                reads, writes = _reads_writes(s)
                local = allocated(s)
                reads, writes = reads - local, writes - local
                closed = not _unbound_vars(s) and reads | writes <= params
                facts[k.name].append((reads, writes, closed))
        while True:  # drop what a statement that is not preparation writes, until nothing changes
            guarded = self._guarded(program, calls_of, facts, constants, kept)
            spoiled: set[str] = set()
            written: set[str] = set()
            for k in program.kernels:
                for n, (_, writes, _) in enumerate(facts[k.name]):
                    for call in calls_of.get(k.name, []):
                        args = _args(k, call, writes)
                        (written if n in guarded[k.name] else spoiled).update(args)
            now = (kept - spoiled) & written
            if now == kept:
                break
            kept = now
        # a temporary only preparation reads (batch norm folded into a weight that is then
        # packed) need not outlive the call: it stays an ordinary temporary, written and read
        # under the same `refresh`; what the rest of the call reads is kept
        needed: set[str] = set()
        for k in program.kernels:
            for n, (reads, _, _) in enumerate(facts[k.name]):
                if n not in guarded[k.name]:
                    for call in calls_of.get(k.name, []):
                        needed |= _args(k, call, reads) & kept
        kept &= needed
        if not kept:
            return program
        kernels = []
        kept_from: set[str] = set()
        cond = ex.binary("ne", REFRESH, Const(0))
        for k in program.kernels:
            chosen = guarded[k.name]
            if not chosen:
                kernels.append(k)
                continue
            stmts = _statements(k)
            body = lp.block(*(lp.If(cond, s) if n in chosen else s for n, s in enumerate(stmts)))
            symbols = k.symbols if any(s.name == lp.REFRESH for s in k.symbols) else (*k.symbols, REFRESH)
            kernels.append(replace(k, body=body, symbols=symbols))
            for n in chosen:
                for call in calls_of[k.name]:
                    kept_from.update(a for a in _args(k, call, facts[k.name][n][0]) if a in constants)
        return replace(program, kernels=tuple(kernels), symbols=(*program.symbols, REFRESH),
                       kept=tuple(t.name for t in program.temps if t.name in kept),
                       kept_from=tuple(b.name for b in program.inputs if b.name in kept_from))

    @staticmethod
    def _guarded(program: lp.Program, calls_of: dict[str, list[lp.KernelCall]],
                 facts: dict[str, list[tuple[set[str], set[str], bool]]], constants: set[str],
                 kept: set[str]) -> dict[str, set[int]]:
        """Per kernel, the top-level statements that are preparation in every call of it,
        given the temporaries still deemed `kept`."""
        out: dict[str, set[int]] = {}
        for k in program.kernels:
            calls = calls_of.get(k.name, [])
            out[k.name] = {n for n, (reads, writes, closed) in enumerate(facts[k.name])
                           if calls and closed and writes
                           and all(_args(k, c, reads) <= constants | kept and _args(k, c, writes) <= kept
                                   for c in calls)}
        return out


def _statements(k: lp.Kernel) -> tuple[lp.Stmt, ...]:
    return k.body.stmts if isinstance(k.body, lp.Block) else (k.body,)


def _args(k: lp.Kernel, call: lp.KernelCall, params: set[str]) -> set[str]:
    """The program buffers `call` binds to the kernel's `params` (local buffers: none)."""
    return {a for p, a in zip(k.params, call.args) if p.name in params}
