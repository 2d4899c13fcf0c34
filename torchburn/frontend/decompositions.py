"""TorchBurn's decomposition table: what AOTAutograd breaks down before our lowerings run.

We start from PyTorch's core-ATen decompositions and remove the ops we lower better as a
whole (so, for instance, `addmm` stays one op and fuses its bias, and `gelu` keeps its
exact form).
"""
from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import torch
from torch._decomp import core_aten_decompositions, get_decompositions

from .embedding_bag_decompositions import embedding_bag_decompositions
from .grad_decompositions import grad_decompositions
from .nn_decompositions import nn_decompositions
from .sampling_decompositions import sampling_decompositions
from .scatter_decompositions import scatter_decompositions

aten = torch.ops.aten

#: Ops we lower directly even though core ATen decomposes them.
KEEP: tuple[Any, ...] = (
    aten.addmm, aten.mv, aten.dot, aten.silu, aten.gelu,
    aten.take,  # its decomposition reads a 0-d index into Python; `index` handles it
    # decomposed, they become `index_put`, which wraps negative indices eager refuses here (and
    # a call that faults reruns the graph in PyTorch: it must raise index_copy's own error)
    aten.index_copy, aten.index_add,
    # random ops stay whole (NOT_COMPILED): decomposed, `bernoulli` draws `rand_like` numbers,
    # which are not the ones eager's float64 kernel draws from the same seed
    aten.bernoulli,
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
    # grid sampling becomes gathers and index arithmetic; `_upsample_bilinear2d_aa.vec` maps
    # to the `.default` overload `sampling_decompositions` handles; tril/triu indices are
    # aranges and arithmetic
    aten.grid_sampler_2d, aten._upsample_bilinear2d_aa, aten.tril_indices, aten.triu_indices,
)


def _overloads(ops: tuple[Any, ...]) -> set[Any]:
    out: set[Any] = set()
    for op in ops:
        if isinstance(op, torch._ops.OpOverloadPacket):
            out.update(getattr(op, o) for o in op.overloads())
        else:
            out.add(op)
    return out


#: Seconds spent in torch's `core_aten_decompositions()` in this process (it scans the
#: dispatcher for composite ops, ~80 ms the first time); benchmarks report it apart from ours.
torch_table_seconds = 0.0
_table: dict[Any, Callable[..., Any]] | None = None


def decomposition_table(core: Mapping[Any, Callable[..., Any]] | None = None) -> dict[Any, Callable[..., Any]]:
    """The table passed to AOTAutograd (a copy: built once per process, since building it costs
    tens of milliseconds and every `torch.compile` asks for it). `core` stands for torch's
    core-ATen table when the caller has it already (`decomp_cache.py` rebuilds it from disk)."""
    global _table
    if _table is None:
        _table = _build(core_table() if core is None else core)
    return dict(_table)


def is_built() -> bool:
    """Whether this process has built the table already."""
    return _table is not None


def core_table() -> dict[Any, Callable[..., Any]]:
    """torch's core-ATen decomposition table, timed (see `torch_table_seconds`)."""
    global torch_table_seconds
    t0 = time.perf_counter()
    table = dict(core_aten_decompositions())
    torch_table_seconds += time.perf_counter() - t0
    return table


def _build(core: Mapping[Any, Callable[..., Any]]) -> dict[Any, Callable[..., Any]]:
    table = dict(core)
    table.update(get_decompositions(list(EXTRA)))
    table.update(nn_decompositions())
    table.update(embedding_bag_decompositions())
    table.update(grad_decompositions())
    table.update(sampling_decompositions())
    table.update(scatter_decompositions())
    for op in _overloads(KEEP):
        table.pop(op, None)
    return table
