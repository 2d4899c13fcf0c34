"""Sibling projections as one linear: q/k/v as ``qkv_proj``, gate/up as ``gate_up_proj``.

The query, key and value projections of a layer read the same input, and so do the gate and
up projections of its MLP. As one linear (their weights' rows stacked) a decode step reads x
once, quantizes it once (int8 activations), and runs one kernel and one parallel region
instead of three (or two); the outputs are split again by views:

    q_proj [576 x 576], k_proj [192 x 576], v_proj [192 x 576]  ->  qkv_proj [960 x 576]
    qkv = qkv_proj(x);  q, k, v = qkv.split([576, 192, 192], -1)

Linears are fused only when they are alike: all float ``nn.Linear`` of one dtype, or all
`QuantizedLinear` of one layout (kind, block type, group size, symmetry, scale dtype); biases all present
or all absent. A GGUF file that stores, say, V in another type than Q and K keeps them apart.
Rows of a quantized weight hold whole groups, so stacking rows keeps every group as it was.

`fuse_pair_names` lists what a fused module replaces, so the loader (`weights.WeightSink`)
can record fused tensors for the weight cache and put them back from it.
"""
from __future__ import annotations

from typing import Optional, Sequence, Union

import torch
from torch import nn

from ...quant import QuantizedLinear
from .decoder import HalfLinear

Linear = Union[nn.Linear, QuantizedLinear]

#: (parent module attribute path, fused name, parts) of each fusion, inside one layer.
FUSIONS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("self_attn", "qkv_proj", ("q_proj", "k_proj", "v_proj")),
    ("mlp", "gate_up_proj", ("gate_proj", "up_proj")),
)

_QUANT_BUFFERS = ("qweight", "packed", "blocks", "scales", "mins")


def _layout(linear: nn.Module) -> Optional[tuple[object, ...]]:
    """What must agree for linears to be stacked (None: not a linear we fuse)."""
    if isinstance(linear, QuantizedLinear):
        return ("q", linear.quant_type, linear.block_type, linear.group_size, linear.symmetric, linear.scale_dtype,
                linear.in_features, linear.bias is not None,
                tuple(name for name in _QUANT_BUFFERS if linear._buffers.get(name) is not None))
    if type(linear) in (nn.Linear, HalfLinear):
        return ("f", type(linear), linear.weight.dtype, linear.in_features, linear.bias is not None)
    return None


def can_fuse(linears: Sequence[nn.Module]) -> bool:
    """Whether `linears` are alike enough to be one linear (module docstring)."""
    layouts = [_layout(m) for m in linears]
    if layouts[0] is None or any(lay != layouts[0] for lay in layouts):
        return False
    return not any(p.is_meta for m in linears for p in list(m.parameters()) + list(m.buffers()))


def _quantized_like(src: QuantizedLinear, out_features: int) -> QuantizedLinear:
    """An empty (meta) `QuantizedLinear` of `src`'s layout with `out_features` rows."""
    return QuantizedLinear(src.in_features, out_features, bias=src.bias is not None, quant_type=src.quant_type,
                           group_size=src.group_size, symmetric=src.symmetric, scale_dtype=src.scale_dtype,
                           device="meta", block_type=src.block_type)


def stack_linears(linears: Sequence[Linear]) -> Linear:
    """One linear whose output rows are those of `linears`, in order (new tensors)."""
    first = linears[0]
    out_features = sum(m.out_features for m in linears)
    if isinstance(first, QuantizedLinear):
        fused = _quantized_like(first, out_features)
        for name in _QUANT_BUFFERS:
            if first._buffers.get(name) is not None:
                fused._buffers[name] = torch.cat([m._buffers[name] for m in linears])
        if first.bias is not None:  # a buffer, or a parameter when the loader put it
            fused._buffers["bias"] = torch.cat([m.bias.detach() for m in linears])  # type: ignore[union-attr]
        return fused
    fused_f = type(first)(first.in_features, out_features, bias=first.bias is not None, device="meta",
                          dtype=first.weight.dtype)
    fused_f.weight = nn.Parameter(torch.cat([m.weight for m in linears]), requires_grad=False)
    if first.bias is not None:
        fused_f.bias = nn.Parameter(torch.cat([m.bias for m in linears]), requires_grad=False)  # type: ignore[misc]
    return fused_f


def split_linear(fused: Linear, sizes: Sequence[int]) -> list[Linear]:
    """The linears of `sizes` output rows each that `fused` stacks (views of its tensors)."""
    out: list[Linear] = []
    start = 0
    for n in sizes:
        rows = slice(start, start + n)
        if isinstance(fused, QuantizedLinear):
            part = _quantized_like(fused, n)
            for name in _QUANT_BUFFERS:
                t = fused._buffers.get(name)
                if t is not None:
                    part._buffers[name] = t[rows]
            if fused.bias is not None:
                part._buffers["bias"] = fused.bias.detach()[rows]
            out.append(part)
        else:
            lin = nn.Linear(fused.in_features, n, bias=fused.bias is not None, device="meta",
                            dtype=fused.weight.dtype)
            lin.weight = nn.Parameter(fused.weight[rows], requires_grad=False)
            if fused.bias is not None:
                lin.bias = nn.Parameter(fused.bias[rows], requires_grad=False)  # type: ignore[misc]
            out.append(lin)
        start += n
    return out


def part_sizes(config: object, fused: str) -> tuple[int, ...]:
    """Output rows of each part of the fused linear `fused` of a layer of `config`."""
    c = config
    if fused == "qkv_proj":
        kv = c.num_key_value_heads * c.head_dim  # type: ignore[attr-defined]
        return (c.num_attention_heads * c.head_dim, kv, kv)  # type: ignore[attr-defined]
    if fused == "gate_up_proj":
        return (c.intermediate_size, c.intermediate_size)  # type: ignore[attr-defined]
    raise ValueError(f"no fused linear {fused!r}")


def fuse_layer(layer: nn.Module) -> list[str]:
    """Fuse the alike sibling projections of one decoder layer in place; the fused names."""
    done = []
    for parent_name, fused, parts in FUSIONS:
        parent = getattr(layer, parent_name)
        if getattr(parent, fused, None) is not None:
            continue
        linears = [getattr(parent, p, None) for p in parts]
        if any(m is None for m in linears) or not can_fuse(linears):
            continue
        setattr(parent, fused, stack_linears(linears))  # type: ignore[arg-type]
        for p in parts:
            setattr(parent, p, None)
        done.append(f"{parent_name}.{fused}")
    return done


def fuse_projections(model: nn.Module) -> int:
    """Fuse every layer's alike projections (module docstring); how many fusions were made."""
    return sum(len(fuse_layer(layer)) for layer in model.layers)  # type: ignore[union-attr]


def unfuse_projections(model: nn.Module) -> None:
    """Back to separate projections (views of the fused tensors), as a checkpoint names them."""
    for layer in model.layers:  # type: ignore[union-attr]
        for parent_name, fused, parts in FUSIONS:
            parent = getattr(layer, parent_name)
            module = getattr(parent, fused, None)
            if module is None:
                continue
            for p, lin in zip(parts, split_linear(module, part_sizes(model.config, fused))):
                setattr(parent, p, lin)
            setattr(parent, fused, None)
