"""`dedup-kernels`: one kernel per structure, so a model's repeated layers compile once.

A transformer's 30 decoder layers lower to 30 copies of each layer kernel, equal up to names
and provenance. Every loop pass, codegen and LLVM would do the same work 30 times; after this
pass they see each distinct kernel once, and the calls of the copies call the one kept.

Two kernels merge when their structural hashes (`ir/hashing.py`: blind to names and `origin`)
are equal and they take the same program symbols by name (symbols are bound by name to the
program's, so `s0` and `s1` in the same place are different kernels). The first of a group is
kept, with its name and origin; parameters correspond by position, so the calls' buffers
stay as they are.

Before:

    program @main(%x: f32[4] strides [1], %y: f32[4] strides [1]) -> (%z: f32[4] strides [1]) {
      temp %t: f32[4] strides [1]
      call @k0(%x, %t)
      call @k1(%t, %z)
    }
    kernel @k0(%a: f32[4] strides [1], %b: f32[4] strides [1]) { ... %b[i0] = exp(%a[i0]) ... }
    kernel @k1(%c: f32[4] strides [1], %d: f32[4] strides [1]) { ... %d[i0] = exp(%c[i0]) ... }

After:

    program @main(...) -> (...) {
      temp %t: f32[4] strides [1]
      call @k0(%x, %t)
      call @k0(%t, %z)
    }
    kernel @k0(%a: f32[4] strides [1], %b: f32[4] strides [1]) { ... }
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...ir import loop as lp
from ...ir.hashing import structural_hash
from ..base import LoopPass, register_pass


def kernel_identity(kernel: lp.Kernel) -> tuple[str, tuple[str, ...]]:
    """What two kernels must share to be one: structure and the program symbols they take."""
    return structural_hash(kernel), tuple(s.name for s in kernel.symbols)


def dedup_program(program: lp.Program) -> lp.Program:
    """`program` with each group of identical kernels replaced by its first (see the module
    docstring); the same object when every kernel is distinct."""
    kept: dict[tuple[str, tuple[str, ...]], lp.Kernel] = {}
    rename: dict[str, str] = {}
    for k in program.kernels:
        first = kept.setdefault(kernel_identity(k), k)
        if first is not k:
            rename[k.name] = first.name
    if not rename:
        return program
    calls = tuple(replace(c, kernel=rename.get(c.kernel, c.kernel)) for c in program.calls)
    return replace(program, kernels=tuple(kept.values()), calls=calls)


@register_pass
@dataclass(frozen=True)
class DedupKernels(LoopPass):
    """Merge kernels equal up to names and provenance; calls of a copy call the one kept.

    Before:

        call @k0(%x, %t)
        call @k1(%t, %z)        // @k1 is @k0 but for names
        kernel @k0(...) { ... }
        kernel @k1(...) { ... }

    After:

        call @k0(%x, %t)
        call @k0(%t, %z)
        kernel @k0(...) { ... }
    """

    name = "dedup-kernels"

    def run(self, program: lp.Program) -> lp.Program:
        return dedup_program(program)
