"""Decompositions of backward kernels PyTorch keeps fused and has no decomposition for, so that a
training step of the models that use them compiles whole instead of leaving them to PyTorch.

Weight normalization (`nn.utils.weight_norm` and its parametrization; wav2vec2's and HuBERT's
positional convolution, vocoders) computes `w = g * v / ||v||`, the norm taken over every dim
but `dim`, and its gradient is the one ATen's `weight_norm_backward` kernel computes:

    grad_g = sum(grad_w * v) / ||v||                    (summed over every dim but `dim`)
    grad_v = g / ||v|| * (grad_w - v * grad_g / ||v||)

with `||v||` the norms the forward saved (shaped like `g`). Half-precision inputs are
computed in float32, as the kernel accumulates.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

aten = torch.ops.aten


def weight_norm_interface_backward(grad_w: torch.Tensor, saved_v: torch.Tensor, saved_g: torch.Tensor,
                                   saved_norms: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`aten._weight_norm_interface_backward` (module docstring): `(grad_v, grad_g)`."""
    rank = saved_v.dim()
    keep = dim % rank if rank else 0
    others = [d for d in range(rank) if d != keep]
    wide = torch.float32 if saved_v.dtype in (torch.float16, torch.bfloat16) else saved_v.dtype
    gw, v, g, norms = (t.to(wide) for t in (grad_w, saved_v, saved_g, saved_norms))
    dot = (gw * v).sum(others, keepdim=True) if others else gw * v
    grad_g = dot / norms
    grad_v = (g / norms) * (gw - v * (grad_g / norms))
    return grad_v.to(saved_v.dtype), grad_g.to(saved_g.dtype)


def grad_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions to add to TorchBurn's table."""
    return {aten._weight_norm_interface_backward.default: weight_norm_interface_backward}
