"""Decomposition of `embedding_bag` (`aten._embedding_bag` and `_embedding_bag_forward_only`),
which PyTorch leaves to its fused CPU kernel, into a gather and segment reductions we lower.

The bags are runs of the 1-d `indices` that start at `offsets[:B]` (B = `len(offsets)`, one less
with `include_last_offset`, whose last offset only marks the end). Each index's bag is the count
of bag starts at or before its position, less one: a `searchsorted(..., right=True)`, which counts
rather than bisects, so it is the kernel's `offset2bag` even for repeated offsets (empty bags).

    bag  = searchsorted(offsets[:B], arange(N), right=True) - 1        # [N]
    rows = weight[indices] * per_sample_weights[:, None]               # [N, D]
    keep = indices != padding_idx                                      # padding rows take no part
    sum  = zeros(B, D).index_put_((bag,), rows * keep, accumulate=True)
    n    = zeros(B).index_put_((bag,), keep, accumulate=True)          # bag sizes
    mean = sum / max(n, 1)
    max  = full(B, D, -inf).scatter_reduce(0, bag, where(keep, rows, -inf), "amax")

Empty bags give zeros in every mode. Max mode's `max_indices` is the word of the first row
reaching the maximum (the kernel replaces its running maximum only on a strictly greater value),
found as the smallest position whose row equals the bag's maximum.

The other three results follow the CPU kernel and its meta function, whose shapes the graph
carries: `offset2bag` is empty in sum mode when the kernel takes its fast path (float or half
weights with unit row stride, no padding index); `bag_size` holds the non-padding counts in
mean and max mode and zeros in sum mode; `max_indices` repeats `bag_size` in mean mode and is
zeros in sum mode. `_embedding_bag_forward_only`'s `bag_size` has one entry per offset (so one
more than there are bags with `include_last_offset`; that entry is zero), as its meta says.

Sums and means of half-precision weights accumulate in float32, as the kernel's fast path does.
Indices are clamped into the table before the gather: eager rejects out-of-range ones, and the
compiled code must not read outside `weight` whatever it is given.

The gradient: the decomposition runs below autograd, so AOTAutograd differentiates
`_embedding_bag` itself and its backward graph holds ATen's fused `_embedding_bag_backward`
(and `_embedding_bag_per_sample_weights_backward` for the per-sample weights), decomposed
here as the CPU kernels compute them. The bags are found again from `offsets` (the forward's
`offset2bag` is empty on the sum fast path), the number of bags is the gradient's row count:

    sum, mean:  grad_weight[indices[i]] += grad[bag[i]] * psw[i] / bag_size[bag[i]] (mean)
    max:        grad_weight[max_indices[b, d], d] += grad[b, d]      (non-empty bags)
    psw:        grad_psw[i] = dot(grad[bag[i]], weight[indices[i]])  (sum mode)

padding indices take no gradient in any of them. `scale_grad_by_freq` stays with PyTorch: its
kernel divides the gradient of the i-th distinct index by the count of the i-th *sorted*
index (of `[1, 1, 4, 7]`, index 4's by the count of 1), which is not the count its
documentation describes, and a compiled gradient is to equal eager's.

`max_norm` makes `F.embedding_bag` (and `F.embedding`) first renormalize, in place, the rows
its indices name: `aten.embedding_renorm` after functionalization. Each named row whose
`norm_type`-norm exceeds `max_norm` is scaled by `max_norm / (norm + 1e-7)`, as the kernel does;
a row named several times is scaled once, so the rows to scale are marked with an `index_put`.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

aten = torch.ops.aten

MODE_SUM, MODE_MEAN, MODE_MAX = 0, 1, 2


def _fast_path_sum(weight: torch.Tensor, per_sample_weights: Optional[torch.Tensor], padding_idx: int) -> bool:
    """Whether the CPU kernel skips `offset2bag` in sum mode (its meta function's test)."""
    fast = weight.dtype in (torch.float32, torch.float16) and weight.stride(1) == 1 and padding_idx < 0
    if per_sample_weights is not None:
        fast = fast and per_sample_weights.stride(0) == 1
    return fast


def _embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, mode: int,
                   per_sample_weights: Optional[torch.Tensor], include_last_offset: bool, padding_idx: int,
                   forward_only: bool) -> Any:
    """The four results of `_embedding_bag` (module docstring); NotImplemented where the kernel's
    inputs are not the 1-d indices and offsets it takes on CPU."""
    if indices.dim() != 1 or offsets.dim() != 1 or weight.dim() != 2 or mode not in (MODE_SUM, MODE_MEAN, MODE_MAX):
        return NotImplemented
    if per_sample_weights is not None and mode != MODE_SUM:
        return NotImplemented  # eager raises; let it
    n, vocab, dim = indices.shape[0], weight.shape[0], weight.shape[1]
    bags = offsets.shape[0] - (1 if include_last_offset else 0)
    if bags < 0 or (vocab == 0 and n > 0):  # eager raises; an empty table has no row to read
        return NotImplemented
    acc = torch.float32 if weight.dtype in (torch.float16, torch.bfloat16) and mode != MODE_MAX else weight.dtype
    idx = indices.to(torch.int64)
    pos = torch.arange(n, dtype=torch.int64, device=indices.device)
    bag = torch.searchsorted(offsets[:bags].to(torch.int64), pos, right=True) - 1
    bag = bag.clamp(0, max(bags - 1, 0))  # in range even for offsets eager would reject
    keep = idx != padding_idx
    rows = weight.index_select(0, idx.clamp(0, max(vocab - 1, 0))).to(acc)
    counts = torch.zeros(bags, dtype=torch.int64, device=weight.device)
    counts = aten.index_put(counts, [bag], keep.to(torch.int64), accumulate=True)
    nonempty = (counts > 0).unsqueeze(1)
    if mode == MODE_MAX:
        lowest = torch.full((), float("-inf"), dtype=acc, device=weight.device)
        vals = torch.where(keep.unsqueeze(1), rows, lowest)
        bag_rows = bag.unsqueeze(1).expand(n, dim)
        best = torch.full((bags, dim), float("-inf"), dtype=acc, device=weight.device)
        best = best.scatter_reduce(0, bag_rows, vals, "amax", include_self=True)
        hits = keep.unsqueeze(1) & (vals == best.gather(0, bag_rows))
        at = torch.where(hits, pos.unsqueeze(1).expand(n, dim), n)  # n: not a candidate
        first = torch.full((bags, dim), n, dtype=torch.int64, device=weight.device)
        first = first.scatter_reduce(0, bag_rows, at, "amin", include_self=True)
        if n == 0:  # no word to read: every bag is empty
            word = torch.zeros((bags, dim), dtype=torch.int64, device=weight.device)
        else:
            word = idx.index_select(0, first.clamp(0, n - 1).reshape(-1)).reshape(bags, dim)
        zero = torch.zeros((), dtype=acc, device=weight.device)
        out = torch.where(nonempty, best, zero)
        max_indices = torch.where(nonempty, word, 0).to(offsets.dtype)
    else:
        if per_sample_weights is not None:
            rows = rows * per_sample_weights.to(acc).unsqueeze(1)
        rows = torch.where(keep.unsqueeze(1), rows, torch.zeros((), dtype=acc, device=weight.device))
        out = torch.zeros((bags, dim), dtype=acc, device=weight.device)
        out = aten.index_put(out, [bag], rows, accumulate=True)
        if mode == MODE_MEAN:
            out = out / counts.clamp(min=1).to(acc).unsqueeze(1)
    if mode == MODE_SUM:
        bag_size = torch.zeros(bags, dtype=offsets.dtype, device=offsets.device)
    else:
        bag_size = counts.to(offsets.dtype)
    if mode == MODE_SUM and _fast_path_sum(weight, per_sample_weights, padding_idx):
        offset2bag = torch.zeros(0, dtype=offsets.dtype, device=offsets.device)
    else:
        offset2bag = bag.to(offsets.dtype)
    if mode != MODE_MAX:
        max_indices = bag_size if mode == MODE_MEAN else torch.zeros(bags, dtype=offsets.dtype, device=offsets.device)
    if forward_only and bags != offsets.shape[0]:  # one entry per offset, the extra one zero
        bag_size = torch.cat([bag_size, torch.zeros(1, dtype=offsets.dtype, device=offsets.device)])
    return out.to(weight.dtype), offset2bag, bag_size, max_indices


def embedding_bag(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor, scale_grad_by_freq: bool = False,
                  mode: int = MODE_SUM, sparse: bool = False, per_sample_weights: Optional[torch.Tensor] = None,
                  include_last_offset: bool = False, padding_idx: int = -1) -> Any:
    """`aten._embedding_bag` (module docstring); `scale_grad_by_freq` and `sparse` only shape the
    gradient, which AOTAutograd derives from this decomposition."""
    return _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx,
                          forward_only=False)


def embedding_bag_forward_only(weight: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                               scale_grad_by_freq: bool = False, mode: int = MODE_SUM, sparse: bool = False,
                               per_sample_weights: Optional[torch.Tensor] = None, include_last_offset: bool = False,
                               padding_idx: int = -1) -> Any:
    """`aten._embedding_bag_forward_only`: the same results, `bag_size` one entry per offset."""
    return _embedding_bag(weight, indices, offsets, mode, per_sample_weights, include_last_offset, padding_idx,
                          forward_only=True)


def embedding_renorm(weight: torch.Tensor, indices: torch.Tensor, max_norm: float, norm_type: float) -> torch.Tensor:
    """`weight` with the rows `indices` names scaled down to norm `max_norm` (module docstring)."""
    if weight.dim() != 2:
        return NotImplemented
    vocab = weight.shape[0]
    idx = indices.reshape(-1).to(torch.int64).clamp(0, max(vocab - 1, 0))
    named = torch.zeros(vocab, dtype=torch.bool, device=weight.device)
    named = aten.index_put(named, [idx], torch.ones((), dtype=torch.bool, device=weight.device))
    wide = weight.to(torch.float32) if weight.dtype in (torch.float16, torch.bfloat16) else weight
    norms = torch.linalg.vector_norm(wide, norm_type, dim=1)  # unrounded, as the kernel's
    scale = torch.where(named & (norms > max_norm), max_norm / (norms + 1e-7), 1.0)
    return (wide * scale.unsqueeze(1)).to(weight.dtype)


def _bags_of(offsets: torch.Tensor, n: int, bags: int) -> torch.Tensor:
    """Each of `n` indices' bag, from the first `bags` offsets (module docstring)."""
    pos = torch.arange(n, dtype=torch.int64, device=offsets.device)
    bag = torch.searchsorted(offsets[:bags].to(torch.int64), pos, right=True) - 1
    return bag.clamp(0, max(bags - 1, 0))


def embedding_bag_backward(grad: torch.Tensor, indices: torch.Tensor, offsets: torch.Tensor,
                           offset2bag: torch.Tensor, bag_size: torch.Tensor, maximum_indices: torch.Tensor,
                           num_weights: int, scale_grad_by_freq: bool, mode: int, sparse: bool,
                           per_sample_weights: Optional[torch.Tensor], padding_idx: int = -1) -> Any:
    """`aten._embedding_bag_backward`, dense (module docstring): the weight's gradient."""
    if sparse or scale_grad_by_freq or indices.dim() != 1 or offsets.dim() != 1 or grad.dim() != 2 \
            or mode not in (MODE_SUM, MODE_MEAN, MODE_MAX):
        return NotImplemented
    n, bags, dim = indices.shape[0], grad.shape[0], grad.shape[1]
    acc = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    out = torch.zeros((num_weights, dim), dtype=acc, device=grad.device)
    if mode == MODE_MAX:
        rows = maximum_indices.to(torch.int64).clamp(0, max(num_weights - 1, 0))
        live = (bag_size[:bags] > 0).unsqueeze(1)  # (a padding index is never a bag's maximum)
        vals = torch.where(live, grad.to(acc), torch.zeros((), dtype=acc, device=grad.device))
        cols = torch.arange(dim, device=grad.device).unsqueeze(0).expand(bags, dim)
        return aten.index_put(out, [rows, cols], vals, accumulate=True).to(grad.dtype)
    idx = indices.to(torch.int64)
    safe = idx.clamp(0, max(num_weights - 1, 0))
    bag = _bags_of(offsets, n, bags)
    scale = torch.where(idx != padding_idx, 1.0, 0.0).to(acc)
    if per_sample_weights is not None:
        scale = scale * per_sample_weights.to(acc)
    if mode == MODE_MEAN:
        scale = scale / bag_size.index_select(0, bag).clamp(min=1).to(acc)
    rows = grad.to(acc).index_select(0, bag) * scale.unsqueeze(1)
    return aten.index_put(out, [safe], rows, accumulate=True).to(grad.dtype)


def embedding_bag_per_sample_weights_backward(grad: torch.Tensor, weight: torch.Tensor, indices: torch.Tensor,
                                              offsets: torch.Tensor, offset2bag: torch.Tensor, mode: int,
                                              padding_idx: int = -1) -> Any:
    """`aten._embedding_bag_per_sample_weights_backward` (module docstring)."""
    if mode != MODE_SUM or indices.dim() != 1 or offsets.dim() != 1 or grad.dim() != 2:
        return NotImplemented
    n, vocab = indices.shape[0], weight.shape[0]
    acc = torch.float32 if grad.dtype in (torch.float16, torch.bfloat16) else grad.dtype
    idx = indices.to(torch.int64)
    bag = _bags_of(offsets, n, grad.shape[0])
    rows = weight.index_select(0, idx.clamp(0, max(vocab - 1, 0))).to(acc)
    dots = (grad.to(acc).index_select(0, bag) * rows).sum(1)
    return torch.where(idx != padding_idx, dots, torch.zeros((), dtype=acc, device=grad.device)).to(grad.dtype)


def embedding_bag_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions to add to TorchBurn's table."""
    return {
        aten._embedding_bag.default: embedding_bag,
        aten._embedding_bag_forward_only.default: embedding_bag_forward_only,
        aten.embedding_renorm.default: embedding_renorm,
        aten._embedding_bag_backward.default: embedding_bag_backward,
        aten._embedding_bag_per_sample_weights_backward.default: embedding_bag_per_sample_weights_backward,
    }

