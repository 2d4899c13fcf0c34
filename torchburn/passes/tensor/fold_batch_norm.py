"""`fold-batch-norm`: fold per-channel affine ops after a convolution into its weight and bias.

Batch norm in inference (frozen statistics) reaches the tensor IR as `(conv - mean) *
rsqrt(var + eps) * gamma + beta`, each per-channel vector reshaped to `[1, C, 1, ...]` and
expanded. When the convolution's result feeds only such a chain (sub, add, mul by per-channel
values that do not depend on the convolution), the chain is `a * conv + c` per channel, and
it becomes `conv(x, w * a, bias * a + c)`: the per-channel work is done once on the weight
(`Cout x Cin x k` elements) instead of on every output element, and what follows (an
activation, a residual add) is the convolution's epilogue. Training-mode batch norm uses
statistics of the convolution's own output, so it is left alone.

Before:

    graph @main(%x: f32[2, 8, 6, 6], %w: f32[16, 8, 3, 3], %m: f32[16], %s: f32[16]) {
      %0 = conv(%x, %w) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[2, 16, 6, 6]
      %1 = reshape(%m) {shape = [1, 16, 1, 1]} : f32[1, 16, 1, 1]
      %2 = expand(%1) {shape = [2, 16, 6, 6]} : f32[2, 16, 6, 6]
      %3 = sub(%0, %2) : f32[2, 16, 6, 6]
      %4 = reshape(%s) {shape = [1, 16, 1, 1]} : f32[1, 16, 1, 1]
      %5 = expand(%4) {shape = [2, 16, 6, 6]} : f32[2, 16, 6, 6]
      %6 = mul(%3, %5) : f32[2, 16, 6, 6]
      return %6
    }

After (dead ops removed):

    graph @main(%x: f32[2, 8, 6, 6], %w: f32[16, 8, 3, 3], %m: f32[16], %s: f32[16]) {
      %0 = neg(%m) : f32[16]
      %1 = mul(%0, %s) : f32[16]
      %2 = reshape(%s) {shape = [16, 1, 1, 1]} : f32[16, 1, 1, 1]
      %3 = expand(%2) {shape = [16, 8, 3, 3]} : f32[16, 8, 3, 3]
      %4 = mul(%w, %3) : f32[16, 8, 3, 3]
      %5 = conv(%x, %4, %1) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[2, 16, 6, 6]
      return %5
    }
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional

from ...ir.expr import Const
from ...ir.tensor import Graph, Op, Value
from ..base import TensorPass, register_pass

#: Chain ops folded, and whether the per-channel value may be either operand.
AFFINE = {"sub": False, "add": True, "mul": True}


def _per_channel(v: Value, channels: object, rank: int) -> Optional[Value]:
    """`p` when `v` is `expand(reshape(p))` of a `[C]` vector `p` shaped `[1, C, 1, ...]`."""
    ex_op = v.producer
    if ex_op is None or ex_op.name != "expand":
        return None
    rs = ex_op.operands[0].producer
    if rs is None or rs.name != "reshape":
        return None
    p = rs.operands[0]
    want = (Const(1), channels, *(Const(1),) * (rank - 2))
    if p.type.rank != 1 or p.shape[0] != channels or tuple(rs.result.shape) != want or p.dtype != v.dtype:
        return None
    return p


def _depends_on(v: Value, target: Value) -> bool:
    stack, seen = [v], set()
    while stack:
        u = stack.pop()
        if u is target:
            return True
        if u.producer is None or id(u) in seen:
            continue
        seen.add(id(u))
        stack.extend(u.producer.operands)
    return False


@register_pass
@dataclass(frozen=True)
class FoldBatchNorm(TensorPass):
    """Fold per-channel affine chains after a convolution into it (module docstring)."""

    name: ClassVar[str] = "fold-batch-norm"

    def run(self, graph: Graph) -> Graph:
        changed = False
        for conv in [op for op in graph.ops if op.name == "conv"]:
            changed |= self._fold(graph, conv)
        if changed:
            graph.remove_dead_ops()
        return graph

    def _fold(self, graph: Graph, conv: Op) -> bool:
        users = graph.users()
        outputs = set(graph.outputs)
        out = conv.result
        channels, rank = out.shape[1], out.type.rank
        chain: list[tuple[str, Value]] = []
        cur = out
        last: Optional[Op] = None
        while cur not in outputs and len(users.get(cur, [])) == 1:
            op = users[cur][0]
            if op.name not in AFFINE or op.result.shape != out.shape or op.result.dtype != out.dtype:
                break
            a, b = op.operands
            other = b if a is cur else a if AFFINE[op.name] else None
            if other is None or other is cur:
                break
            p = _per_channel(other, channels, rank)
            if p is None or _depends_on(p, out):
                break
            chain.append((op.name, p))
            cur, last = op.result, op
        if last is None:
            return False
        at = graph.ops.index(last) + 1

        def add(name: str, *operands: Value, **attrs: object) -> Value:
            nonlocal at
            new = graph.add_op(name, operands, dict(attrs) if attrs else None, loc=conv.loc, index=at)
            at += 1
            return new.result

        scale: Optional[Value] = None
        shift: Optional[Value] = None
        for name, p in chain:
            if name == "sub":
                shift = add("neg", p) if shift is None else add("sub", shift, p)
            elif name == "add":
                shift = p if shift is None else add("add", shift, p)
            else:
                scale = p if scale is None else add("mul", scale, p)
                shift = None if shift is None else add("mul", shift, p)
        x, w = conv.operands[0], conv.operands[1]
        bias = conv.operands[2] if len(conv.operands) == 3 else None
        if scale is not None:
            per = add("reshape", scale, shape=(channels, *(Const(1),) * (w.type.rank - 1)))
            w = add("mul", w, add("expand", per, shape=w.shape))
            if bias is not None:
                bias = add("mul", bias, scale)
        if shift is not None:
            bias = shift if bias is None else add("add", bias, shift)
        operands = (x, w) if bias is None else (x, w, bias)
        folded = add("conv", *operands, **{k: v for k, v in conv.attrs.items() if k not in ("kernel", "fused_into")})
        graph.replace_all_uses(cur, folded)
        return True
