"""`expand-attention`: write the fused `attention` op as the products and the softmax a GPU
engine already runs well.

The CPU kernel of `attention` (`loopgen/attention.py`) walks the keys of one query row in a
serial loop; on a GPU that is one thread per row doing all the work, hundreds of times slower
than the same math as two batched matrix products around a row softmax, each of which the GPU
engine maps to workgroups (`gpu_map.py`, `gpu_rows.py`, the tiled GEMM of `codegen/wgsl/gemm.py`).
This pass rewrites each `attention` op into that form, per key segment `s`:

    scores_s = (q_g @ k_s^T) * scale  [+ mask_s | where(mask_s, ., -inf) | causal where]
    p        = softmax over concat(scores_0, scores_1, ...) along the keys
    out      = sum_s slice_s(p) @ v_s

Grouped-query heads are folded into the rows, not repeated: `q: [*B, Hq, Tq, D]` is read as
`q_g: [*B, Hk, G*Tq, D]` (`G = Hq / Hk`), so each key/value head is multiplied once for its
`G` query heads; masks are reshaped the same way.

The GPU pipeline runs it with `keep_flash`: attention ops that the one-kernel flash attention
of the GPU engine handles (`flash_supported`; `loopgen/attention_gpu.py` and
`codegen/wgsl/attention.py`) stay fused, and only the rest is expanded: head dims that are
symbolic or above 256, and ops needing more storage buffers than `max_buffers` (three
segments with masks). Half-precision inputs are computed in f32
(as the fused op does) and the result is cast back. An op whose head counts are symbolic and
differ is left as it is.

Before:

    graph @main(%q: f32[1, 4, 2, 8], %k: f32[1, 2, 5, 8], %v: f32[1, 2, 5, 8]) {
      %0 = attention(%q, %k, %v) {scale = 0.35, causal = false, masked = false, segments = 1} : f32[1, 4, 2, 8]
      return %0
    }

After:

    graph @main(%q: f32[1, 4, 2, 8], %k: f32[1, 2, 5, 8], %v: f32[1, 2, 5, 8]) {
      %0 = reshape(%q) {shape = [1, 2, 4, 8]} : f32[1, 2, 4, 8]
      %1 = permute(%k) {dims = [0, 1, 3, 2]} : f32[1, 2, 8, 5]
      %2 = matmul(%0, %1) : f32[1, 2, 4, 5]
      %3 = full() {shape = [1, 2, 4, 5], value = 0.35, dtype = f32} : f32[1, 2, 4, 5]
      %4 = mul(%2, %3) : f32[1, 2, 4, 5]
      %5 = reduce_max(%4) {dims = [3], keepdim = true} : f32[1, 2, 4, 1]
      %6 = expand(%5) {shape = [1, 2, 4, 5]} : f32[1, 2, 4, 5]
      %7 = sub(%4, %6) : f32[1, 2, 4, 5]
      %8 = exp(%7) : f32[1, 2, 4, 5]
      %9 = reduce_sum(%8) {dims = [3], keepdim = true} : f32[1, 2, 4, 1]
      %10 = expand(%9) {shape = [1, 2, 4, 5]} : f32[1, 2, 4, 5]
      %11 = div(%8, %10) : f32[1, 2, 4, 5]
      %12 = matmul(%11, %v) : f32[1, 2, 4, 8]
      %13 = reshape(%12) {shape = [1, 4, 2, 8]} : f32[1, 4, 2, 8]
      return %13
    }
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from ...ir import dtypes as dt
from ...ir.expr import Const, Expr
from ...ir.tensor import Graph, Op, Value
from ..base import TensorPass, register_pass


def _group(hq: Expr, hk: Expr) -> Optional[int]:
    """`Hq / Hk` when it is known at compile time."""
    if hq == hk:
        return 1
    if isinstance(hq, Const) and isinstance(hk, Const):
        return int(hq.value) // int(hk.value)
    return None


class _Emitter:
    """Inserts ops before a position of the graph, with the location of the op they replace."""

    def __init__(self, graph: Graph, at: int, loc: Optional[str]) -> None:
        self.graph, self.at, self.loc = graph, at, loc

    def __call__(self, name: str, *operands: Value, **attrs: Any) -> Value:
        op = self.graph.add_op(name, operands, attrs or None, loc=self.loc, index=self.at)
        self.at += 1
        return op.result


#: Head dims the flash kernel keeps in registers (`codegen/wgsl/attention.py`, MAX_HEAD_DIM).
FLASH_MAX_HEAD_DIM = 256


def flash_supported(op: Op, max_buffers: int = 8) -> bool:
    """Whether the GPU's flash-attention kernel computes `op`: constant head dims up to
    `FLASH_MAX_HEAD_DIM` (its q row and accumulator are registers) and few enough buffers
    (q, k and v per segment, masks, output). Everything else (symbolic or wide head dims, many
    segments) is expanded: products and a row softmax have no such limits."""
    q, v = op.operands[0], op.operands[2]
    segments, masked = op.attrs.get("segments", 1), op.attrs.get("masked", False)
    dims = (q.shape[-1], v.shape[-1])
    if not all(isinstance(x, Const) and 0 < int(x.value) <= FLASH_MAX_HEAD_DIM for x in dims):
        return False
    return 2 + segments * (3 if masked else 2) <= max_buffers


@register_pass
@dataclass(frozen=True)
class ExpandAttention(TensorPass):
    """Rewrite `attention` as matrix products around a row softmax (module docstring).
    `fold_groups`: read grouped-query heads as extra rows of q (no k/v repeat); when false,
    k and v are expanded to the query heads instead. `keep_flash`: leave the ops the one-kernel
    flash attention of the GPU engine computes (`flash_supported`), expand only the others."""

    name: ClassVar[str] = "expand-attention"
    fold_groups: bool = True
    #: Keep the ops `flash_supported` accepts (the GPU pipeline sets it).
    keep_flash: bool = False
    #: Storage buffers a shader may bind (the flash kernel binds q, k and v of each segment,
    #: the masks and the output).
    max_buffers: int = 8

    def run(self, graph: Graph) -> Graph:
        changed = False
        for op in [o for o in graph.ops if o.name == "attention"]:
            if self.keep_flash and flash_supported(op, self.max_buffers):
                continue
            changed |= self._expand(graph, op)
        if changed:
            graph.remove_dead_ops()
        return graph

    def _expand(self, graph: Graph, op: Op) -> bool:
        q = op.operands[0]
        segments, masked, causal = op.attrs.get("segments", 1), op.attrs.get("masked", False), op.attrs.get("causal", False)
        scale = float(op.attrs["scale"])
        batch, hq, tq, d = q.shape[:-3], q.shape[-3], q.shape[-2], q.shape[-1]
        hk = op.operands[1].shape[-3]
        g = _group(hq, hk)
        if g is None:
            return False
        emit = _Emitter(graph, graph.ops.index(op), op.loc)
        acc = dt.compute_dtype(q.dtype)

        def f32(v: Value) -> Value:
            return v if v.dtype == acc else emit("cast", v, dtype=acc)

        fold = self.fold_groups or g == 1
        heads = hk if fold else hq
        rows = tq * g if fold and g > 1 else tq
        nb = len(batch)

        def by_rows(v: Value, cols: Expr) -> Value:
            """A `[*B, Hq, Tq, cols]` tensor in the row layout `[*B, heads, rows, cols]`."""
            return v if not fold or g == 1 else emit("reshape", v, shape=(*batch, heads, rows, cols))

        def kv_heads(v: Value) -> Value:
            """k or v with one head per row block: as is when folding, else expanded to Hq."""
            if fold or g == 1:
                return v
            t, c = v.shape[-2], v.shape[-1]
            five = emit("reshape", v, shape=(*batch, hk, Const(1), t, c))
            wide = emit("expand", five, shape=(*batch, hk, Const(g), t, c))
            return emit("reshape", wide, shape=(*batch, hq, t, c))

        qg = by_rows(f32(q), d)
        perm = (*range(nb), nb, nb + 2, nb + 1)
        scores: list[Value] = []
        for s in range(segments):
            k = kv_heads(f32(op.operands[1 + 2 * s]))
            tk = k.shape[-2]
            shape = (*batch, heads, rows, tk)
            sc = emit("matmul", qg, emit("permute", k, dims=perm))
            sc = emit("mul", sc, emit("full", shape=shape, value=scale, dtype=acc))
            if masked:
                m = op.operands[1 + 2 * segments + s]
                if m.dtype == dt.bool_:
                    ninf = emit("full", shape=shape, value=float("-inf"), dtype=acc)
                    sc = emit("where", by_rows(m, tk), sc, ninf)
                else:
                    sc = emit("add", sc, by_rows(f32(m), tk))
            if causal:
                full5 = (*batch, heads, Const(g) if fold and g > 1 else Const(1), tq, tk)
                i = emit("iota", shape=full5, dim=nb + 2, start=0, step=1, dtype=dt.i32)
                j = emit("iota", shape=full5, dim=nb + 3, start=0, step=1, dtype=dt.i32)
                keep = emit("reshape", emit("le", j, i), shape=shape)
                sc = emit("where", keep, sc, emit("full", shape=shape, value=float("-inf"), dtype=acc))
            scores.append(sc)
        last = nb + 2
        allk = scores[0] if segments == 1 else emit("concat", *scores, dim=last)
        wide = allk.shape
        red = (*wide[:-1], Const(1))
        mx = emit("reduce_max", allk, dims=[last], keepdim=True)
        e = emit("exp", emit("sub", allk, emit("expand", mx, shape=wide)))
        tot = emit("reduce_sum", e, dims=[last], keepdim=True)
        assert tuple(tot.shape) == red
        p = emit("div", e, emit("expand", tot, shape=wide))
        out: Optional[Value] = None
        start: Expr = Const(0)
        for s, sc in enumerate(scores):
            tk = sc.shape[-1]
            ps = p if segments == 1 else emit("slice", p, dim=last, start=start, end=start + tk, step=1)
            start = start + tk
            part = emit("matmul", ps, kv_heads(f32(op.operands[2 + 2 * s])))
            out = part if out is None else emit("add", out, part)
        assert out is not None
        dv = out.shape[-1]
        if fold and g > 1:
            out = emit("reshape", out, shape=(*batch, hq, tq, dv))
        if out.dtype != op.result.dtype:
            out = emit("cast", out, dtype=op.result.dtype)
        graph.replace_all_uses(op.result, out)
        return True
