"""Decompositions of the sampling ops PyTorch has none for: `grid_sampler_3d` (what
`F.grid_sample` calls on 5-d inputs) and `_upsample_bilinear2d_aa` (`F.interpolate(...,
antialias=True)`).

Both become gathers, index arithmetic and matmuls our lowerings already compile, so the
compiler needs no new IR op for them. They follow PyTorch's CPU kernels:

- grid sampling un-normalizes each coordinate (`align_corners` picks the convention), applies
  the padding mode (`zeros`: corners outside read 0; `border`: clamp; `reflection`: mirror,
  then clamp) and interpolates trilinearly or takes the nearest voxel (ties to even);
- anti-aliased bilinear resampling is separable: each output row and column is a normalized
  sum of input pixels weighted by a triangle filter whose support widens by the scale when
  downsampling. We build the two weight matrices from index arithmetic and apply them as
  `W_h @ (x @ W_w^T)`.

Half-precision inputs are computed in float32 and rounded once at the end.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

aten = torch.ops.aten

BILINEAR, NEAREST = 0, 1
ZEROS, BORDER, REFLECTION = 0, 1, 2


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _unnormalize(coord: torch.Tensor, size: int, align_corners: bool) -> torch.Tensor:
    """Grid coordinate in [-1, 1] to a pixel position."""
    if align_corners:
        return (coord + 1) / 2 * (size - 1)
    return ((coord + 1) * size - 1) / 2


def _reflect(coord: torch.Tensor, twice_low: int, twice_high: int) -> torch.Tensor:
    """Mirror `coord` into [twice_low / 2, twice_high / 2] as often as needed."""
    if twice_low == twice_high:
        return torch.zeros_like(coord)
    low = twice_low / 2
    span = (twice_high - twice_low) / 2
    dist = (coord - low).abs()
    extra = torch.fmod(dist, span)
    flips = torch.floor(dist / span)
    even = torch.remainder(flips, 2) == 0
    return torch.where(even, extra + low, span - extra + low)


def _source_coord(coord: torch.Tensor, size: int, padding_mode: int, align_corners: bool) -> torch.Tensor:
    """The pixel position a grid coordinate samples, after the padding mode."""
    pos = _unnormalize(coord, size, align_corners)
    if padding_mode == BORDER:
        pos = pos.clamp(0, size - 1)
    elif padding_mode == REFLECTION:
        pos = _reflect(pos, 0, 2 * (size - 1)) if align_corners else _reflect(pos, -1, 2 * size - 1)
        pos = pos.clamp(0, size - 1)
    return pos


def grid_sampler_3d(inp: torch.Tensor, grid: torch.Tensor, interpolation_mode: int, padding_mode: int,
                    align_corners: bool) -> torch.Tensor:
    """`input [N, C, D, H, W]` sampled at `grid [N, Do, Ho, Wo, 3]` (x, y, z order)."""
    if interpolation_mode not in (BILINEAR, NEAREST) or padding_mode not in (ZEROS, BORDER, REFLECTION):
        return NotImplemented
    n, c, d, h, w = inp.shape
    out_spatial = grid.shape[1:4]
    comp = _compute_dtype(inp.dtype)
    x = inp.to(comp).reshape(n, c, d * h * w)
    g = grid.to(comp).reshape(n, -1, 3)
    sizes = (w, h, d)
    pos = [_source_coord(g[..., k], sizes[k], padding_mode, align_corners) for k in range(3)]

    def sample(corner: list[torch.Tensor]) -> torch.Tensor:
        """Input values at integer (float-typed) positions; 0 outside the volume."""
        inside = None
        idx = []
        for k in range(3):
            ok = (corner[k] >= 0) & (corner[k] <= sizes[k] - 1)
            inside = ok if inside is None else inside & ok
            idx.append(corner[k].clamp(0, sizes[k] - 1).to(torch.int64))
        flat = (idx[2] * h + idx[1]) * w + idx[0]
        vals = torch.gather(x, 2, flat.unsqueeze(1).expand(n, c, flat.shape[1]))
        return torch.where(inside.unsqueeze(1), vals, torch.zeros((), dtype=comp))

    if interpolation_mode == NEAREST:
        out = sample([torch.round(p) for p in pos])
    else:
        lo = [torch.floor(p) for p in pos]
        frac = [p - f for p, f in zip(pos, lo)]
        out = torch.zeros((), dtype=comp)
        for corner in range(8):
            bits = [(corner >> k) & 1 for k in range(3)]
            weight = None
            for k in range(3):
                wk = frac[k] if bits[k] else 1 - frac[k]
                weight = wk if weight is None else weight * wk
            out = out + sample([lo[k] + bits[k] for k in range(3)]) * weight.unsqueeze(1)
    return out.reshape(n, c, *out_spatial).to(inp.dtype)


def _aa_weights(in_size: int, out_size: int, align_corners: bool, scale: Optional[float],
                dtype: torch.dtype) -> torch.Tensor:
    """The `[out_size, in_size]` matrix of normalized triangle-filter weights of one axis,
    computed in `dtype` arithmetic as PyTorch's kernel computes them (float32 for float
    inputs), so the weights round as eager's do."""
    if align_corners:
        ratio = (in_size - 1) / (out_size - 1) if out_size > 1 else 0.0
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
    r = torch.full((), ratio, dtype=dtype)
    one = torch.full((), 1.0, dtype=dtype)
    support = r if ratio >= 1.0 else one
    invscale = one / r if ratio >= 1.0 else one
    i = torch.arange(out_size, dtype=dtype).unsqueeze(1)
    j = torch.arange(in_size, dtype=dtype).unsqueeze(0)
    center = r * (i + 0.5)
    # The window PyTorch visits: [trunc(center - support + 0.5), trunc(center + support + 0.5)).
    first = torch.trunc(center - support + 0.5).clamp(min=0)
    end = torch.trunc(center + support + 0.5).clamp(max=in_size)
    weight = (1 - ((j - center + 0.5) * invscale).abs()).clamp(min=0)
    weight = torch.where((j >= first) & (j < end), weight, torch.zeros((), dtype=dtype))
    total = weight.sum(dim=1, keepdim=True)
    return torch.where(total != 0, weight / torch.where(total != 0, total, one), weight)


def upsample_bilinear2d_aa(inp: torch.Tensor, output_size: list[int], align_corners: bool,
                           scales_h: Optional[float] = None, scales_w: Optional[float] = None) -> torch.Tensor:
    """Anti-aliased bilinear resize of `[N, C, H, W]` to `output_size` (module docstring).

    Like PyTorch, the horizontal pass runs first and its result is rounded to the weights'
    dtype; the sums themselves are taken in float64, so the only rounding left is eager's."""
    if not inp.is_floating_point():
        return NotImplemented  # uint8 has its own fixed-point kernel in PyTorch
    comp = _compute_dtype(inp.dtype)
    h, w = inp.shape[-2:]
    oh, ow = output_size
    wh = _aa_weights(h, oh, align_corners, scales_h, comp).to(torch.float64)
    ww = _aa_weights(w, ow, align_corners, scales_w, comp).to(torch.float64)
    rows = torch.matmul(inp.to(torch.float64), ww.t()).to(comp).to(torch.float64)
    return torch.matmul(wh, rows).to(inp.dtype)


def sampling_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions to add to TorchBurn's table."""
    return {
        aten.grid_sampler_3d.default: grid_sampler_3d,
        aten._upsample_bilinear2d_aa.default: upsample_bilinear2d_aa,
    }
