"""Tensor parallelism for the decoder (Megatron-style), over torch.distributed.

Each rank keeps a slice of every layer:

* attention: the query heads ``[r*H/n, (r+1)*H/n)`` and their key/value heads (rows of
  ``q_proj``/``k_proj``/``v_proj``), so its KV cache holds only its own heads; ``o_proj``
  keeps the matching input columns;
* MLP: rows ``[r*I/n, (r+1)*I/n)`` of ``gate_proj``/``up_proj``, the matching input columns
  of ``down_proj``.

The row-split projections (``o_proj``, ``down_proj``) give partial sums that one
``all_reduce`` per projection adds up (a functional collective, so inside the compiled step it
stays in PyTorch at its place and the compute around it is compiled; see
docs/distributed.md). Embedding, norms and the output head are replicated: every rank ends a
step with the same logits and picks the same token.

Quantized weights (``QuantizedLinear``) shard by whole groups: rows are split freely (a group
lies in one row), input columns only at multiples of the group size, so every rank holds
exactly the groups the single-process model holds, unchanged.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional, Union

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ...quant import QuantizedLinear
from ..model.decoder import Decoder
from ..model.fuse import fuse_projections, unfuse_projections

Linear = Union[nn.Linear, QuantizedLinear]


class TensorParallelError(ValueError):
    """A model that cannot be split across the requested number of ranks."""


class RowParallel(nn.Module):
    """A linear whose input columns are split across ranks: partial product, then the sum
    over ranks (``all_reduce``), then the bias (added once, after the sum)."""

    def __init__(self, local: Linear, bias: Optional[torch.Tensor], group: Any) -> None:
        super().__init__()
        self.local = local
        self.register_buffer("bias", bias)
        self.group = group if group is not None else dist.group.WORLD

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        import torch.distributed._functional_collectives as funcol

        y = funcol.all_reduce(self.local(x), "sum", self.group)
        return y + self.bias if self.bias is not None else y


def _rows(linear: Linear, start: int, stop: int) -> Linear:
    """Output rows ``[start, stop)`` of ``linear`` (with their bias)."""
    if isinstance(linear, QuantizedLinear):
        out = _empty_quantized(linear, linear.in_features, stop - start, linear.bias is not None)
        for name in ("qweight", "packed", "blocks", "scales", "mins", "bias"):
            t = linear._buffers.get(name)
            if t is not None:
                out._buffers[name] = t[start:stop].clone()
        return out
    out_lin = nn.Linear(linear.in_features, stop - start, bias=linear.bias is not None)
    with torch.no_grad():
        out_lin.weight.copy_(linear.weight[start:stop])
        if linear.bias is not None:
            out_lin.bias.copy_(linear.bias[start:stop])
    return out_lin


def _columns(linear: Linear, start: int, stop: int) -> Linear:
    """Input columns ``[start, stop)`` of ``linear``, without its bias (`RowParallel` adds it
    after the sum). A quantized weight is cut at group boundaries only."""
    if isinstance(linear, QuantizedLinear):
        g = linear.group_size
        if g is None or start % g or stop % g:
            raise TensorParallelError(
                f"a quantized linear of {linear.in_features} inputs in groups of {g} cannot be split at "
                f"input column {start if g is None or start % g else stop}: quantized weights shard by whole groups")
        out = _empty_quantized(linear, stop - start, linear.out_features, False)
        if linear.block_type is not None:
            nbytes = linear.blocks.shape[1] // (linear.in_features // g)
            out._buffers["blocks"] = linear.blocks[:, start // g * nbytes:stop // g * nbytes].clone()
        elif linear.quant_type == "int8":
            out._buffers["qweight"] = linear.qweight[:, start:stop].clone()
        else:
            out._buffers["packed"] = linear.packed[:, start // 2:stop // 2].clone()
        for name in ("scales", "mins"):
            t = linear._buffers.get(name)
            if t is not None:
                out._buffers[name] = t[:, start // g:stop // g].clone()
        return out
    out_lin = nn.Linear(stop - start, linear.out_features, bias=False)
    with torch.no_grad():
        out_lin.weight.copy_(linear.weight[:, start:stop])
    return out_lin


def _empty_quantized(like: QuantizedLinear, in_features: int, out_features: int, bias: bool) -> QuantizedLinear:
    return QuantizedLinear(in_features, out_features, bias=bias, quant_type=like.quant_type,
                           group_size=like.group_size, symmetric=like.symmetric, scale_dtype=like.scale_dtype,
                           block_type=like.block_type)


def _check(what: str, count: int, world: int) -> int:
    if count % world:
        raise TensorParallelError(f"{what}={count} does not split across {world} ranks")
    return count // world


def shard_decoder(model: Decoder, group: Any = None) -> Decoder:
    """Keep this rank's slice of every layer of ``model`` (in place; see the module doc)."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    c = model.config
    heads = _check("num_attention_heads", c.num_attention_heads, world)
    kv_heads = _check("num_key_value_heads", c.num_key_value_heads, world)
    inter = _check("intermediate_size", c.intermediate_size, world)
    d = c.head_dim
    unfuse_projections(model)  # the loader fused q/k/v and gate/up: shard them one by one
    for layer in model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        attn.q_proj = _rows(attn.q_proj, rank * heads * d, (rank + 1) * heads * d)
        attn.k_proj = _rows(attn.k_proj, rank * kv_heads * d, (rank + 1) * kv_heads * d)
        attn.v_proj = _rows(attn.v_proj, rank * kv_heads * d, (rank + 1) * kv_heads * d)
        attn.o_proj = RowParallel(_columns(attn.o_proj, rank * heads * d, (rank + 1) * heads * d),
                                  _bias(attn.o_proj), group)
        attn.heads, attn.kv_heads = heads, kv_heads
        mlp.gate_proj = _rows(mlp.gate_proj, rank * inter, (rank + 1) * inter)
        mlp.up_proj = _rows(mlp.up_proj, rank * inter, (rank + 1) * inter)
        mlp.down_proj = RowParallel(_columns(mlp.down_proj, rank * inter, (rank + 1) * inter),
                                    _bias(mlp.down_proj), group)
    # the local shapes: the KV cache (`new_cache`) is allocated for this rank's heads only
    model.config = replace(c, num_attention_heads=heads, num_key_value_heads=kv_heads, intermediate_size=inter)
    fuse_projections(model)
    return model


def _bias(linear: Linear) -> Optional[torch.Tensor]:
    bias = linear.bias
    return None if bias is None else bias.detach().clone()


def shard_llm(llm: Any, tp: int, group: Any = None) -> Any:
    """Split a loaded `LLM` across the ``tp`` ranks of ``group`` (the default group, which
    must have ``tp`` ranks), before its first step compiles; returns ``llm``."""
    if not dist.is_available() or not dist.is_initialized():
        raise TensorParallelError("tensor parallelism needs torch.distributed initialized "
                                  "(run under torchrun, e.g. torchrun --nproc-per-node 2)")
    if dist.get_world_size(group) != tp:
        raise TensorParallelError(f"--tp {tp} but the process group has {dist.get_world_size(group)} ranks")
    shard_decoder(llm.model, group)
    llm.config = llm.model.config
    llm.kv.clear()
    return llm


def init_from_env(tp: int) -> int:
    """Join the process group torchrun describes (gloo: CPU tensors), if not joined yet;
    returns this process's rank."""
    import os

    if not dist.is_initialized():
        if "RANK" not in os.environ:
            raise TensorParallelError(f"--tp {tp} needs torchrun (torchrun --nproc-per-node {tp} -m torchburn.llm ...)")
        dist.init_process_group("gloo")
    return dist.get_rank()


def leave(together: bool = True) -> None:
    """Leave the process group `init_from_env` joined: a barrier (``together``), then the
    group's own teardown. A rank that left at interpreter exit with its gloo group alive could
    abort (`terminate called without an active exception`, SIGABRT, seen twice under a loaded
    CI) while its peer still sent on the pair; both ranks past the barrier have nothing left to
    send. A rank that failed skips the barrier (its peers may wait in another collective;
    torchrun stops them when it exits)."""
    if dist.is_available() and dist.is_initialized():
        try:
            if together:
                dist.barrier()
        finally:
            dist.destroy_process_group()
