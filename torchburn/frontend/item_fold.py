"""Fold `scalar_tensor(_local_scalar_dense(t))` back into a tensor op on `t`.

`t.item()` returned from a compiled function reaches the backend as a read of the value into
Python (`_local_scalar_dense`, which stays in PyTorch by design) and a tensor made from that
Python number again (`scalar_tensor`). For a float that number is a SymFloat, which a compiled
subgraph cannot take as an input; and the round trip through Python is a copy anyway. So the
pair becomes a view of `t` as a 0-d tensor and a conversion to `scalar_tensor`'s dtype:

    _local_scalar_dense = aten._local_scalar_dense.default(t)        # t: f16[1]
    scalar_tensor = aten.scalar_tensor.default(_local_scalar_dense, dtype=torch.float64)

becomes

    view = aten.view.default(t, [])
    scalar_tensor = aten._to_copy.default(view, dtype=torch.float64)

The value is the same: a float goes to Python as a double, which holds every float16, bfloat16,
float32 and float64 exactly, so converting the tensor directly rounds once, as eager does. An
integer or bool goes to Python exactly too; the fold is made only when both dtypes are floats
or both are the same, so no int-to-float rounding question arises.

It runs on the ATen graph before partitioning and before the FX-graph cache key is taken, so
the cached plan names the nodes of the folded graph.
"""
from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten


def fold_item_round_trips(gm: torch.fx.GraphModule) -> int:
    """Rewrite every foldable pair in `gm` in place; returns how many were folded."""
    folded = 0
    for node in list(gm.graph.nodes):
        src = _foldable_source(node)
        if src is None:
            continue
        dense = node.args[0]
        dtype = node.kwargs.get("dtype") or torch.get_default_dtype()
        src_val = src.meta["val"]
        with gm.graph.inserting_before(node):
            view = gm.graph.call_function(aten.view.default, (src, []))
            view.meta["val"] = src_val.view([])
            conv = gm.graph.call_function(aten._to_copy.default, (view,), {"dtype": dtype})
            conv.meta["val"] = view.meta["val"].to(dtype)
        conv.meta.update({k: v for k, v in node.meta.items() if k != "val"})
        node.replace_all_uses_with(conv)
        gm.graph.erase_node(node)
        if not dense.users:  # type: ignore[union-attr]
            gm.graph.erase_node(dense)  # type: ignore[arg-type]
        folded += 1
    if folded:
        gm.recompile()
    return folded


def _foldable_source(node: torch.fx.Node) -> "torch.fx.Node | None":
    """The tensor `t` of `scalar_tensor(_local_scalar_dense(t))`, when folding keeps the value."""
    if node.op != "call_function" or node.target is not aten.scalar_tensor.default or len(node.args) != 1:
        return None
    dense = node.args[0]
    if not (isinstance(dense, torch.fx.Node) and dense.target is aten._local_scalar_dense.default):
        return None
    src = dense.args[0]
    if not isinstance(src, torch.fx.Node):
        return None
    src_val, out_val = src.meta.get("val"), node.meta.get("val")
    if not (isinstance(src_val, torch.Tensor) and isinstance(out_val, torch.Tensor)):
        return None
    if not (isinstance(src_val.numel(), int) and src_val.numel() == 1) or out_val.device != src_val.device:
        return None
    dtype = node.kwargs.get("dtype") or torch.get_default_dtype()
    if not (dtype == src_val.dtype or (dtype.is_floating_point and src_val.dtype.is_floating_point)):
        return None
    return src
