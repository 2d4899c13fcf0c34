"""Decompositions of scatters PyTorch decomposes only into ops we do not lower:
`as_strided_scatter` (PyTorch's goes to `prims.as_strided_scatter`).

`as_strided_scatter(x, src, size, stride, offset)` writes `src` through the strided window
`x.as_strided(size, stride, offset)` of a copy of `x`. On a contiguous `x` that window is a set
of flat positions, `offset + sum(i_k * stride_k)`, so the op is an `index_put` into the
flattened copy:

    flat = x.reshape(-1)
    pos  = offset + i_0 * stride_0 + ... (one position per element of src)
    out  = flat.index_put((pos,), src.reshape(-1)).reshape(x.shape)

Overlapping windows write in order, the last write winning, as eager's copy does on CPU.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

aten = torch.ops.aten


def as_strided_scatter(x: torch.Tensor, src: torch.Tensor, size: Sequence[int], stride: Sequence[int],
                       storage_offset: Optional[int] = None) -> torch.Tensor:
    """The strided window of a contiguous `x` replaced by `src` (module docstring)."""
    if not x.is_contiguous():
        return NotImplemented  # the window is relative to a layout the graph does not fix
    base = x.storage_offset()
    offset = (storage_offset if storage_offset is not None else base) - base
    pos = torch.full((), offset, dtype=torch.int64)
    for k, (n, st) in enumerate(zip(size, stride)):
        shape = [1] * len(size)
        shape[k] = n
        pos = pos + torch.arange(n, dtype=torch.int64).reshape(shape) * st
    pos = pos.expand(tuple(size)).reshape(-1)
    flat = x.reshape(-1)
    out = aten.index_put(flat, [pos], src.to(x.dtype).expand(tuple(size)).reshape(-1))
    return out.reshape(x.shape)


def scatter_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions to add to TorchBurn's table."""
    return {aten.as_strided_scatter.default: as_strided_scatter}
