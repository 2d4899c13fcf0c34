"""TorchBurn's decomposition table: what AOTAutograd breaks down before our lowerings run.

We start from PyTorch's core-ATen decompositions and remove the ops we lower better as a
whole (so, for instance, `addmm` stays one op and fuses its bias, and `gelu` keeps its
exact form).
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from .nn_decompositions import nn_decompositions

aten = torch.ops.aten

#: Ops we lower directly even though core ATen decomposes them.
KEEP: tuple[Any, ...] = (
    aten.addmm, aten.mv, aten.dot, aten.silu, aten.gelu,
    aten.take,  # its decomposition reads a 0-d index into Python; `index` handles it
)

#: Extra decompositions (ops that are not core ATen and have a good decomposition in torch).
EXTRA: tuple[Any, ...] = (
    aten.native_layer_norm, aten.native_layer_norm_backward, aten._softmax_backward_data,
    aten._log_softmax_backward_data, aten.gelu_backward, aten.silu_backward, aten.threshold_backward,
    aten.sigmoid_backward, aten.tanh_backward, aten.mse_loss, aten.mse_loss_backward,
    # norms: batch norm (all variants) and group norm become reductions, var_mean and
    # elementwise ops; their backwards are core decompositions already.
    aten.native_batch_norm, aten._native_batch_norm_legit, aten._native_batch_norm_legit_no_training,
    aten._native_batch_norm_legit_functional, aten.native_group_norm, aten._batch_norm_with_update,
    aten._batch_norm_with_update_functional, aten._batch_norm_no_update,
)


def _overloads(ops: tuple[Any, ...]) -> set[Any]:
    out: set[Any] = set()
    for op in ops:
        if isinstance(op, torch._ops.OpOverloadPacket):
            out.update(getattr(op, o) for o in op.overloads())
        else:
            out.add(op)
    return out


def decomposition_table() -> dict[Any, Callable[..., Any]]:
    """The table passed to AOTAutograd."""
    table = dict(core_aten_decompositions())
    table.update(get_decompositions(list(EXTRA)))
    table.update(nn_decompositions())
    for op in _overloads(KEEP):
        table.pop(op, None)
    return table
