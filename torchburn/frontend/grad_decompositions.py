"""Decompositions of backward kernels PyTorch keeps fused and has no decomposition for, so that a
training step of the models that use them compiles whole instead of leaving them to PyTorch:
weight norm's and pairwise distances'.

Weight normalization (`nn.utils.weight_norm` and its parametrization; wav2vec2's and HuBERT's
positional convolution, vocoders) computes `w = g * v / ||v||`, the norm taken over every dim
but `dim`, and its gradient is the one ATen's `weight_norm_backward` kernel computes:

    grad_g = sum(grad_w * v) / ||v||                    (summed over every dim but `dim`)
    grad_v = g / ||v|| * (grad_w - v * grad_g / ||v||)

with `||v||` the norms the forward saved (shaped like `g`). Half-precision inputs are
computed in float32, as the kernel accumulates.

Pairwise distances (`torch.cdist`, `d[i, j] = ||x1[i] - x2[j]||_p`) differentiate to
`grad_x1[i] = sum_j grad[i, j] * t(x1[i] - x2[j], d[i, j])`, with ATen's per-element term `t`
for each p (zero where the distance is zero):

    p = 0: 0              p = 1: sign(diff)            p = 2: diff / d
    p < 2: sign(diff) |diff|^(p-1) / d^(p-1)   (also 0 where diff = 0 and p < 1)
    p > 2: diff |diff|^(p-2) / d^(p-1)         p = inf: sign(diff) where |diff| = d

The gradient of `x2` is the same op with the arguments swapped (autograd's formula).
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


def cdist_backward(grad: torch.Tensor, x1: torch.Tensor, x2: torch.Tensor, p: float,
                   cdist: torch.Tensor) -> Any:
    """`aten._cdist_backward` (module docstring): the gradient of `x1`."""
    if x1.dim() < 2 or x1.shape[:-2] != grad.shape[:-2] or x2.shape[:-2] != grad.shape[:-2]:
        return NotImplemented  # broadcast batch dims: summing them back is left to PyTorch
    if p == 0:
        return torch.zeros_like(x1)
    diff = x1.unsqueeze(-2) - x2.unsqueeze(-3)                      # [..., P, R, M]
    g, d = grad.unsqueeze(-1), cdist.unsqueeze(-1)
    zero = torch.zeros((), dtype=x1.dtype, device=x1.device)
    if p == 1:
        term = g * torch.sign(diff)
    elif p == 2:
        term = torch.where(d == 0, zero, g * diff / d)
    elif p == float("inf"):
        term = g * torch.sign(diff) * (diff.abs() == d).to(x1.dtype)
    elif p < 2:
        skip = (d == 0) | ((diff == 0) & (p < 1))
        term = torch.where(skip, zero, torch.sign(diff) * diff.abs().pow(p - 1) * g / d.pow(p - 1))
    else:
        term = torch.where(d == 0, zero, diff * diff.abs().pow(p - 2) * g / d.pow(p - 1))
    return term.sum(-2)


def grad_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions to add to TorchBurn's table."""
    return {
        aten._weight_norm_interface_backward.default: weight_norm_interface_backward,
        aten._cdist_backward.default: cdist_backward,
    }
