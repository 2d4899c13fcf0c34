"""`lower-to-loops-gpu`: `lower-to-loops` with matrix products in the form GPUs want.

The CPU lowering writes a matrix product as a cache-blocked, packed, vectorized nest for the
host (`loopgen/matmul.py`). A GPU wants the plain definition instead, one output element per
iteration of a parallel nest with the reduction over k inside, so that `gpu-map` can see the
product and WGSL codegen can tile it for workgroups. Every other kernel is lowered exactly as
`lower-to-loops` lowers it, but for `attention`, written as the nest the WGSL flash-attention
shader reads (`loopgen/attention_gpu.py`). A fused epilogue (bias add, activation, residual add,
cast: elementwise ops computed from the product, see `fuse`) follows the reduction, per element;
through a reshape that regroups the rows (a linear layer on `[batch, seq, features]`), the
store and the ops after the reshape index the reshaped result (`gpu_regroup.py`):
`%out[i0 floordiv 16, i0 mod 16, i1] = ...`.

Before (tensor IR, after `fuse`):

    %2 = matmul(%x, %wt) {fused_into = [0]} : f32[32, 1024]
    %3 = add(%2, %bias) {kernel = 0} : f32[32, 1024]

After:

    kernel @k0(%x: f32[32, 512], %w: f32[1024, 512], %bias: f32[1024], %out0: f32[32, 1024]) {
      for i0 in 0..32 {
        for i1 in 0..1024 {
          alloc %acc2: f32[1] strides [1] local
          %acc2[0] = 0.0:f32
          for k3 in 0..512 {
            let x4 = %x[i0, k3]
            let x5 = %w[i1, k3]
            let t6 = x4 * x5
            %acc2[0] = %acc2[0] + t6
          }
          let x7 = %acc2[0]
          let x8 = %bias[i1]
          let t9 = x7 + x8
          %out0[i0, i1] = t9
        }
      }
    }
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, ScalarType, Var
from ...ir.tensor import Op, Value
from ..base import register_pass
from .attention import build_attention_gpu
from ..loopgen.kernel_builder import KernelBuilder
from ..loopgen.views import regroup_rows
from ..loopgen.matmul import CpuInfo, epilogue_views, fused_matmul
from ..loopgen.store_views import fused_through_views
from ..lower_to_loops import LowerToLoops


def build_plain_gemm(kb: KernelBuilder, root: Op, mm: Op, out: lp.Buffer) -> lp.Stmt:
    """The nest of the module docstring: output loops, an accumulator, the k loop, the
    epilogue; half-precision products accumulate in f32."""
    a, b = mm.operands
    shape = mm.result.shape
    vars_ = kb.loops(shape, "i")
    bvars, i, j = vars_[:-2], vars_[-2], vars_[-1]
    k = Var(kb.fresh("k"))
    acc_t = dt.compute_dtype(mm.result.dtype)
    for o in (root, mm):
        if o.loc and o.loc not in kb.origins:
            kb.origins.append(o.loc)
    kb.push()
    acc = lp.Buffer(kb.fresh("acc"), acc_t, (Const(1),), (Const(1),), "local")
    kb.emit(lp.Alloc(acc))
    kb.emit(lp.Store(acc.name, (Const(0),), Const(0, ScalarType(acc_t))))
    kb.push()
    av = ex.cast(kb.value_at(a, (*bvars, i, k)), acc_t)
    bv = ex.cast(kb.value_at(b, (*bvars, k, j)), acc_t)
    prod = kb.bind(ex.Binary("mul", av, bv, ScalarType(acc_t)))
    cur = ex.Load(acc.name, (Const(0),), ScalarType(acc_t))
    kb.emit(lp.Store(acc.name, (Const(0),), ex.Binary("add", cur, prod, ScalarType(acc_t))))
    kbody = kb.pop()
    kb.emit(lp.For(k, Const(0), a.shape[-1], "serial", kbody))
    total = kb.bind(ex.cast(ex.Load(acc.name, (Const(0),), ScalarType(acc_t)), mm.result.dtype), "x")
    idx = (*bvars, i, j)
    kb.define(mm.result, idx, total)
    # A reshape regrouping the rows inside the epilogue (`fuse`): the ops before it are
    # computed at the product's index, the ones after it and the store at the root's.
    views = epilogue_views(root, mm, set(kb.buffers)) if root is not mm else []
    out_idx = idx
    if views:
        out_idx = (*regroup_rows(idx[:-1], mm.result.shape[:-1], root.result.shape[:-1]), j)
        for view in views:
            kb.define(view.result, out_idx, kb.value_at(view.operands[0], idx))
    val = kb.compute(root, out_idx) if root is not mm else total
    kb.used_buffers[out.name] = out
    kb.emit(lp.Store(out.name, out_idx, val))
    body = kb.pop()
    origin = (("origin", "; ".join(kb.origins)),) if kb.origins else ()
    return kb.nest(vars_, shape, body, origin)


@register_pass
@dataclass(frozen=True)
class LowerToLoopsGpu(LowerToLoops):
    """`lower-to-loops`, with matrix products as plain nests (module docstring)."""

    name: ClassVar[str] = "lower-to-loops-gpu"
    simd_qlinear: ClassVar[bool] = False
    simd_conv: ClassVar[bool] = False
    simd_attention: ClassVar[bool] = False
    slice_views: ClassVar[bool] = False
    split_concats: ClassVar[bool] = False

    def _lower_root(self, name: str, op: Op, buffers: dict[Value, lp.Buffer], symbols: tuple[Var, ...],
                    temps: list[lp.Buffer], cpu: CpuInfo) -> lp.Kernel:
        mm = fused_matmul(op, set(buffers))
        attn = (op, []) if op.name == "attention" else fused_through_views(op, set(buffers), {"attention"})
        if mm is None and attn is None:
            return super()._lower_root(name, op, buffers, symbols, temps, cpu)
        kb = KernelBuilder(name, buffers)
        out = buffers[op.result]
        if attn is not None:
            # the flash-attention shader's nest (`loopgen/attention_gpu.py`), storing through
            # the permutes and reshapes computed in its kernel (`loopgen/store_views.py`)
            body = build_attention_gpu(kb, attn[0], out, attn[1])
        else:
            body = build_plain_gemm(kb, op, mm, out)
        params = tuple(sorted(kb.used_buffers.values(), key=lambda b: b.name == out.name))
        used: set[str] = set()
        for b in params:
            for d in (*b.shape, *b.strides):
                used |= ex.free_vars(d)
        for s in lp.walk_stmts(body):
            for e in lp.stmt_exprs(s):
                used |= ex.free_vars(e)
        attrs = (("origin", "; ".join(kb.origins)),) if kb.origins else ()
        return lp.Kernel(name, params, tuple(v for v in symbols if v.name in used), body, attrs)
