"""`qlinear-to-gemm`: a quantized linear over many rows becomes dequantize + float GEMM.

`qlinear`'s kernels decode each weight where they use it, once per tile of rows of x: right
for a few rows (decode, where the weight's bytes are the cost), wrong for many (prefill),
where decoding is repeated M / MR times and the tile is too small for the FMA units. With M
rows or more (`min_rows`) the weight is decoded once into an f32 buffer (`dequantize`, a
data op that fusion stores) and multiplied by the float GEMM (`loopgen/matmul.py`, blocked
for the cache and the registers), with the `qlinear`'s epilogue fused into it as into any
matmul. Decoding costs N x K stores, the product 2 M N K flops: from a few dozen rows on the
decode is a small share. The buffer is N x K x 4 bytes of workspace, reused by every layer;
weights larger than `max_weight_bytes` keep the `qlinear` (a vocabulary projection's 2 GB).

Before (M = 64):

    graph @main(%x: f32[64, 128], %q: u8[256, 64], %s: f16[256, 4]) {
      %0 = qlinear(%x, %q, %s) {kind = "int4", group_size = 32, symmetric = true} : f32[64, 256]
      return %0
    }

After:

    graph @main(%x: f32[64, 128], %q: u8[256, 64], %s: f16[256, 4]) {
      %0 = dequantize(%q, %s) {kind = "int4", group_size = 32, symmetric = true} : f32[256, 128]
      %1 = permute(%0) {dims = [1, 0]} : f32[128, 256]
      %2 = matmul(%x, %1) : f32[64, 256]
      return %2
    }

x of rank > 2 is reshaped to [M, K] and the product back; x in f16/bf16 is cast to f32 first
(the `qlinear` computes in f32 too).

On a target with byte dot products, an int4 or int8 `qlinear` that the int8 panel kernel
(`passes/quant/qgemm_i8.py`) computes stays a `qlinear` (`int8_gemm`): its integer dot
products beat the float GEMM 2.3x at 512 rows (`benchmarks/bench_qlinear_gemm.py`); ggml
block types and targets without byte dot products take the rewrite (so does every `qlinear`
with `int8_gemm=false`, as in the example above on a target with byte dot products).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from ...ir import dtypes as dt
from ...ir.expr import Const
from ...ir.tensor import Graph, Op, Value
from ..base import PassContext, TensorPass, register_pass
from ..loopgen.matmul import CpuInfo
from ..quant.qgemm_i8 import plan_qgemm_i8
from ..quant.qlinear import QLinear

#: The attributes `dequantize` takes from the `qlinear` (not `activations`: no x to quantize).
WEIGHT_ATTRS = ("kind", "group_size", "symmetric", "block_type")


def _static(values: tuple) -> Optional[list[int]]:
    if all(isinstance(v, Const) for v in values):
        return [int(v.value) for v in values]
    return None


@register_pass
@dataclass(frozen=True)
class QLinearToGemm(TensorPass):
    """Rewrite each `qlinear` of at least `min_rows` rows (static sizes) whose f32 weight fits
    in `max_weight_bytes` as `matmul(x, permute(dequantize(...)))` (module docstring); a
    `qlinear` whose `form` is "gemm" whatever its rows, one whose form is "panel", "rows" or
    "tiles" never."""

    name: ClassVar[str] = "qlinear-to-gemm"
    #: Rows of x (all leading dims together) from which the GEMM form is taken.
    min_rows: int = 32
    #: The largest f32 weight decoded into workspace (bytes).
    max_weight_bytes: int = 512 << 20
    #: Leave the `qlinear`s that the int8 panel kernel computes on the target.
    int8_gemm: bool = True

    def run(self, graph: Graph) -> Graph:
        return self.run_in(graph, PassContext())

    def run_in(self, graph: Graph, ctx: PassContext) -> Graph:
        cpu = CpuInfo.of(ctx.target)
        changed = False
        for op in [op for op in graph.ops if op.name == "qlinear"]:
            changed |= self._rewrite(graph, op, cpu)
        if changed:
            graph.remove_dead_ops()
        return graph

    def _rewrite(self, graph: Graph, op: Op, cpu: CpuInfo) -> bool:
        x = op.operands[0]
        lead = _static(tuple(x.shape[:-1]))
        kn = _static((x.shape[-1], op.result.shape[-1]))
        if lead is None or kn is None:
            return False
        m = 1
        for d in lead:
            m *= d
        k, n = kn
        ql = QLinear.of(op)
        if ql.form in ("panel", "rows", "tiles") or 4 * n * k > self.max_weight_bytes:
            return False
        if ql.form != "gemm":  # "auto": by the rows and the target
            if m < self.min_rows:
                return False
            if self.int8_gemm and plan_qgemm_i8(ql, m, cpu, ql.activations) is not None:
                return False
        at = graph.ops.index(op)

        def add(name: str, *operands: Value, **attrs: object) -> Value:
            nonlocal at
            new = graph.add_op(name, operands, dict(attrs) if attrs else None, loc=op.loc, index=at)
            at += 1
            return new.result

        attrs = {a: op.attrs[a] for a in WEIGHT_ATTRS if a in op.attrs}
        w = add("dequantize", *op.operands[1:], **attrs)
        wt = add("permute", w, dims=(1, 0))
        x2 = x if x.dtype == dt.f32 else add("cast", x, dtype=dt.f32)
        if len(lead) != 1:
            x2 = add("reshape", x2, shape=(Const(m), Const(k)))
        y = add("matmul", x2, wt)
        if len(lead) != 1:
            y = add("reshape", y, shape=op.result.shape)
        graph.replace_all_uses(op.result, y)
        return True
