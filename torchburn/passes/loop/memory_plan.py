"""`plan-memory`: place every temporary in the workspace, reusing the space of temporaries
that are dead.

Liveness is by kernel call: a temporary lives from the first call that names it to the last.
A dead slot is reused by a later temporary whose size is known to fit (equal size
expression, or both constant and smaller). Offsets are aligned to 64 bytes (a cache line, and
enough for any vector load). An offset is kept as a constant plus each distinct symbolic
size times how often it occurs (`36864 + 3 * ((64 * s0 + 63) // 64 * 64)`), so offsets stay
short however many temporaries of symbolic size precede them (summing the sizes one by one
gave expressions growing with the count: 28,000 characters in a 30-layer prefill, printed,
parsed, hashed and emitted per temporary). Temporaries kept across calls (`Program.kept`,
`keep-constant-prep`) come first, at constant offsets, and their bytes are never reused: the
caller's workspace holds them from one call to the next.

Before:

    program @main(%x: f32[64] strides [1]) -> (%out0: f32[64] strides [1]) {
      temp %tmp0: f32[64] strides [1]
      temp %tmp1: f32[64] strides [1]
      call @k0(%x, %tmp0)
      call @k1(%tmp0, %tmp1)
      call @k2(%tmp1, %out0)
    }

After (`%tmp1` cannot reuse `%tmp0`, both live during `@k1`):

    program @main(%x: f32[64] strides [1]) -> (%out0: f32[64] strides [1]) {
      temp %tmp0: f32[64] strides [1] offset 0
      temp %tmp1: f32[64] strides [1] offset 256
      workspace 512
      ...
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr
from ..base import LoopPass, register_pass

ALIGN = 64


def buffer_bytes(b: lp.Buffer) -> Expr:
    """Bytes spanned by a buffer: 1 + sum((size-1)*stride) elements (0 when empty)."""
    n: Expr = Const(1)
    for d in b.shape:
        n = ex.mul(n, d)
    return ex.mul(n, Const(b.dtype.itemsize))


def align(e: Expr) -> Expr:
    if isinstance(e, Const):
        return Const((int(e.value) + ALIGN - 1) // ALIGN * ALIGN)
    return ex.mul(ex.floordiv(ex.add(e, Const(ALIGN - 1)), Const(ALIGN)), Const(ALIGN))


def _fits(need: Expr, have: Expr) -> bool:
    if need == have:
        return True
    return isinstance(need, Const) and isinstance(have, Const) and int(need.value) <= int(have.value)


@register_pass
@dataclass(frozen=True)
class PlanMemory(LoopPass):
    """Assign workspace offsets to temporaries with reuse by liveness (module docstring)."""

    name: ClassVar[str] = "plan-memory"
    reuse: bool = True

    def run(self, program: lp.Program) -> lp.Program:
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        temp_names = {t.name for t in program.temps}
        for i, call in enumerate(program.calls):
            for a in call.args:
                if a in temp_names:
                    first.setdefault(a, i)
                    last[a] = i
        slots: list[tuple[Expr, Expr, int]] = []  # (offset, size, free after call index)
        end = _Sum()
        offsets: list[tuple[str, Expr]] = []
        kept = set(program.kept)
        for t in program.temps:  # kept across calls: first, at constant offsets, never shared
            if t.name in kept:
                offsets.append((t.name, end.expr()))
                end.add(align(buffer_bytes(t)))
        for t in sorted(program.temps, key=lambda t: first.get(t.name, 0)):
            if t.name in kept:
                continue
            size = align(buffer_bytes(t))
            start = first.get(t.name, 0)
            chosen = None
            if self.reuse:
                for k, (off, have, free_after) in enumerate(slots):
                    if free_after < start and _fits(size, have):
                        chosen = k
                        break
            if chosen is None:
                here = end.expr()
                offsets.append((t.name, here))
                slots.append((here, size, last.get(t.name, start)))
                end.add(size)
            else:
                off, have, _ = slots[chosen]
                slots[chosen] = (off, have, last.get(t.name, start))
                offsets.append((t.name, off))
        order = {t.name: i for i, t in enumerate(program.temps)}
        offsets.sort(key=lambda p: order[p[0]])
        return replace(program, temp_offsets=tuple(offsets), workspace_bytes=end.expr())


class _Sum:
    """A sum of sizes as a constant and a count per distinct symbolic size."""

    def __init__(self) -> None:
        self.const = 0
        self.terms: dict[Expr, int] = {}

    def add(self, size: Expr) -> None:
        if isinstance(size, Const):
            self.const += int(size.value)
        else:
            self.terms[size] = self.terms.get(size, 0) + 1

    def expr(self) -> Expr:
        out: Expr = Const(self.const)
        for term, count in self.terms.items():
            out = ex.add(out, term if count == 1 else ex.mul(Const(count), term))
        return out
