"""`gpu-split-wide`: split a kernel that binds more buffers than a GPU shader stage may see.

WebGPU guarantees 8 storage buffers per shader stage (Mesa's llvmpipe offers 16, NVIDIA's
Vulkan driver far more; the device is requested with the adapter's limit, and the target says
it: `Target.gpu_storage_buffers`). A kernel can
read many more: an LLM's KV-cache write stores every layer's new keys and values, a `cat` of
2 x layers tensors, into the one cache buffer, so SmolLM2 (30 layers) needs 62. Such a kernel
is nearly always a loop over the pieces whose body selects its source by the loop variable.
This pass cuts the outermost loop's range into consecutive chunks, one kernel each, called one
after the other (so the iterations run in the loop's order: splitting is exact whatever the
loop does); in a chunk, `simplify` decides the selects from the chunk's range, the loads of
other pieces disappear, and so do their parameters. Chunks grow while they stay within
the limit: the `max_buffers` option, or when it is 0 (the default) the target's
`gpu_storage_buffers` (8 outside a pipeline: `run` plans for WebGPU's guarantee). A device
with a high limit keeps such a kernel whole: one dispatch instead of one per chunk. A kernel
whose body is not one loop, or whose single iterations still need too
many buffers, is left as it is (codegen then says why it cannot run it).

Before (`max_buffers = 3`):

    kernel @k0(%a: f32[4] strides [1], %b: f32[4] strides [1], %out0: f32[2, 4] strides [4, 1]) {
      for j0 in 0..2 {
        for j1 in 0..4 {
          let x2 = %a[j1]
          let x3 = %b[j1]
          %out0[j0, j1] = select(j0 < 1, x2, x3)
        }
      }
    }
    call @k0(%a, %b, %out0)

After:

    kernel @k0_0(%a: f32[4] strides [1], %out0: f32[2, 4] strides [4, 1]) {
      for j1 in 0..4 {
        let x2 = %a[j1]
        %out0[0, j1] = x2
      }
    }
    kernel @k0_1(%b: f32[4] strides [1], %out0: f32[2, 4] strides [4, 1]) {
      for j1 in 0..4 {
        let x3 = %b[j1]
        %out0[1, j1] = x3
      }
    }
    call @k0_0(%a, %out0)
    call @k0_1(%b, %out0)
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const
from ..base import LoopPass, PassContext, PassError, register_pass
from ..loop.loop_utils import buffers_accessed, substitute_stmt
from ..loop.simplify import simplify_kernel


def restrict(k: lp.Kernel, body: lp.Stmt, name: str) -> lp.Kernel:
    """`k` with `body`, named `name`, with only the parameters and symbols `body` uses."""
    sub = replace(k, name=name, body=body)
    used = buffers_accessed(sub)
    params = tuple(p for p in k.params if p.name in used)
    free: set[str] = set()
    for p in params:
        for d in (*p.shape, *p.strides):
            free |= ex.free_vars(d)
    for s in lp.walk_stmts(body):
        for e in lp.stmt_exprs(s):
            free |= ex.free_vars(e)
        if isinstance(s, lp.For):
            free |= ex.free_vars(s.start) | ex.free_vars(s.extent)
    return replace(sub, params=params, symbols=tuple(x for x in k.symbols if x.name in free))


def _chunk(k: lp.Kernel, loop: lp.For, start: int, stop: int, name: str) -> lp.Kernel:
    """`k` for the iterations `start..stop` of its outer loop, simplified, with only the
    parameters and symbols it still uses."""
    v = loop.var
    body = substitute_stmt(loop.body, {v.name: ex.add(v, Const(start))})
    sub = simplify_kernel(replace(k, body=replace(loop, extent=Const(stop - start), body=body)))
    return restrict(sub, sub.body, name)


def replace_kernels(program: lp.Program, pieces: dict[str, list[lp.Kernel]]) -> lp.Program:
    """`program` with each kernel named in `pieces` replaced by its pieces, called in order with
    the arguments (and byte offsets) of the parameters each keeps."""
    if not pieces:
        return program
    kernels: list[lp.Kernel] = []
    for k in program.kernels:
        kernels.extend(pieces.get(k.name, [k]))
    calls: list[lp.KernelCall] = []
    for c in program.calls:
        if c.kernel not in pieces:
            calls.append(c)
            continue
        arg = {p.name: (a, c.offset(i)) for i, (p, a) in enumerate(zip(program.kernel(c.kernel).params, c.args))}
        for s in pieces[c.kernel]:
            offsets = tuple(arg[p.name][1] for p in s.params)
            calls.append(lp.KernelCall(s.name, tuple(arg[p.name][0] for p in s.params),
                                       offsets if any(o is not None for o in offsets) else ()))
    return replace(program, kernels=tuple(kernels), calls=tuple(calls))


def bound_buffers(k: lp.Kernel) -> int:
    """Storage buffers `k`'s shader binds: its parameters, and the fault flag when it checks
    an index (`checked_index`: `codegen/wgsl/ops.py` sets the flag of an index out of range)."""
    return len(k.params) + int(lp.checks_indices(k.body))


@register_pass
@dataclass(frozen=True)
class GpuSplitWide(LoopPass):
    """Split kernels that bind more than `max_buffers` buffers (module docstring)."""

    name: ClassVar[str] = "gpu-split-wide"
    #: Buffers a kernel may bind; 0: the target's `gpu_storage_buffers` (the device's
    #: `maxStorageBuffersPerShaderStage`; 8, WebGPU's guarantee, for the generic target).
    max_buffers: int = 0

    def run(self, program: lp.Program) -> lp.Program:
        return self.run_in(program, PassContext())

    def limit(self, ctx: PassContext) -> int:
        """The buffers a kernel may bind: the option, else the target's."""
        return self.max_buffers or ctx.target.gpu_storage_buffers

    def run_in(self, program: lp.Program, ctx: PassContext) -> lp.Program:
        limit = self.limit(ctx)
        if limit < 1:
            raise PassError(f"gpu-split-wide: a kernel must be allowed at least one buffer, not {limit}")
        pieces: dict[str, list[lp.Kernel]] = {}
        for k in program.kernels:
            split = self.split(k, limit) if bound_buffers(k) > limit else None
            if split is not None:
                pieces[k.name] = split
        return replace_kernels(program, pieces)

    def split(self, k: lp.Kernel, limit: int = 0) -> Optional[list[lp.Kernel]]:
        """The chunks of `k` binding at most `limit` buffers each (0: `max_buffers`, else 8),
        or None when it cannot be split within the limit."""
        limit = limit or self.max_buffers or 8
        loop = k.body
        if not isinstance(loop, lp.For) or not isinstance(loop.extent, Const) or not isinstance(loop.start, Const) \
                or loop.start.value != 0:
            return None
        n = int(loop.extent.value)
        out: list[lp.Kernel] = []
        a = 0
        while a < n:
            best = _chunk(k, loop, a, a + 1, f"{k.name}_{len(out)}")
            if bound_buffers(best) > limit:
                return None
            b = a + 1
            while b < n:
                cand = _chunk(k, loop, a, b + 1, best.name)
                if bound_buffers(cand) > limit:
                    break
                best, b = cand, b + 1
            out.append(best)
            a = b
        return out if len(out) > 1 else None
