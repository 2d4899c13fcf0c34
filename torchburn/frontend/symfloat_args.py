"""A SymFloat operand of tensor arithmetic, passed as a 0-d tensor instead.

Under a symbolic batch an ATen graph computes some factors in Python from sizes: batch norm's
running variance is corrected by `n / (n - 1)` and its backward divides by `n`, both SymFloats
(`operator.truediv` of SymInts), which `mul.Tensor` then takes as its scalar. A compiled
subgraph takes tensors and SymInts, not SymFloats, so each such `mul` stayed in PyTorch and cut
the graph: a ResNet's training step after a second batch size ran its batch norms' backward as
pieces between subgraphs. The factor is made a 0-d tensor of the other operand's dtype right
where it is computed (`scalar_tensor`, in PyTorch: Python arithmetic on sizes, not a fallback),
and the op takes that:

    truediv_3 = operator.truediv(1.0, truediv_2)             # SymFloat
    mul_24 = aten.mul.Tensor(sum_1, truediv_3)

becomes

    truediv_3 = operator.truediv(1.0, truediv_2)
    scalar_tensor = aten.scalar_tensor.default(truediv_3, dtype=torch.float32)   # sum_1: f32
    mul_24 = aten.mul.Tensor(sum_1, scalar_tensor)

The value is the same: eager's kernels convert a Python float operand to the computation's
dtype (float32 for a float32 tensor) once, as `scalar_tensor` does here; and the GPU engine,
which has no float64, takes the subgraph (a float64 factor sent the whole of it to the CPU
engine). Only the four arithmetic ops on float32 and float64 tensors whose result keeps that
dtype are rewritten (a 0-d operand of the same dtype cannot change it), and `add`/`sub` only
without an `alpha` (eager computes `x + alpha * other` as one fma: rounded once).

It runs on the ATen graph before partitioning and before the FX-graph cache key is taken.
"""
from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

#: Ops whose scalar operand may be a tensor: the `.Scalar` overloads become `.Tensor` ones.
TENSOR_FORM = {aten.mul.Tensor: aten.mul.Tensor, aten.mul.Scalar: aten.mul.Tensor,
               aten.div.Tensor: aten.div.Tensor, aten.div.Scalar: aten.div.Tensor,
               aten.add.Tensor: aten.add.Tensor, aten.sub.Tensor: aten.sub.Tensor}
FLOATS = (torch.float32, torch.float64)


def is_symfloat(node: object) -> bool:
    """Whether `node` is an FX node whose value is a SymFloat."""
    return isinstance(node, torch.fx.Node) and isinstance(node.meta.get("val"), torch.SymFloat)


def is_symfloat_wrap(node: torch.fx.Node) -> bool:
    """A `scalar_tensor` of a SymFloat (this module's): size arithmetic, not a fallback."""
    return node.target is aten.scalar_tensor.default and bool(node.args) and is_symfloat(node.args[0])


def wrap_symfloat_operands(gm: torch.fx.GraphModule) -> int:
    """Rewrite every op of `TENSOR_FORM` whose `other` is a SymFloat (module docstring);
    returns how many were rewritten."""
    wrapped = 0
    made: dict[tuple[torch.fx.Node, torch.dtype], torch.fx.Node] = {}
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target not in TENSOR_FORM or len(node.args) < 2:
            continue
        x, other = node.args[0], node.args[1]
        out = node.meta.get("val")
        if not is_symfloat(other) or not isinstance(x, torch.fx.Node) or not isinstance(out, torch.Tensor):
            continue
        xv = x.meta.get("val")
        if not isinstance(xv, torch.Tensor) or xv.dtype not in FLOATS or out.dtype != xv.dtype:
            continue
        if node.kwargs.get("alpha", 1) != 1 or len(node.args) > 2:
            continue  # eager computes `x + alpha * other` with one rounding (an fma)
        assert isinstance(other, torch.fx.Node)
        key = (other, xv.dtype)
        scalar = made.get(key)
        if scalar is None:  # before its first user: later users come after it
            with gm.graph.inserting_before(node):
                scalar = gm.graph.call_function(aten.scalar_tensor.default, (other,), {"dtype": xv.dtype})
            scalar.meta["val"] = out.new_empty((), dtype=xv.dtype)
            made[key] = scalar
        node.target = TENSOR_FORM[node.target]
        node.args = (x, scalar, *node.args[2:])
        wrapped += 1
    if wrapped:
        gm.recompile()
    return wrapped
