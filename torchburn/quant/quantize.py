"""Quantizers: float weights -> `Int8Weight` / `Int4Weight`.

Rounding choices (why they are what they are):

* Scales are rounded to the storage dtype *first*, and the codes are computed with the stored
  scale, so the codes are the best ones for the scale that dequantization will actually use.
* INT8 is symmetric, ``scale = absmax / 127``, codes in [-127, 127] (-128 unused, so the
  range is symmetric and negation is exact).
* Symmetric INT4 follows ggml's Q4_0: the element of largest magnitude ``v`` gets
  ``scale = v / -8`` and code 0 (value ``-8 * scale = v``) exactly.  This uses all 16 levels
  (a step of absmax/8 rather than absmax/7), at the price of clipping ``-v`` to ``7 * scale``.
  Scales are therefore signed.
* Asymmetric INT4 follows ggml's Q4_1: ``min = min(group)``, ``scale = (max - min) / 15``,
  ``W = scale * q + min``.
* Rounding is round-half-to-even (`torch.round`); ggml rounds half away from zero, which
  differs only on exact ties and does not matter for accuracy.
"""
from __future__ import annotations

from typing import Optional

import torch

from .layouts import (
    SCALE_DTYPES,
    Int4Weight,
    Int8Weight,
    check_int4_group_size,
    pack_int4,
)


def _check_float_matrix(w: torch.Tensor) -> None:
    if not isinstance(w, torch.Tensor):
        raise ValueError(f"weight must be a torch.Tensor; got {type(w).__name__}")
    if not w.is_floating_point():
        raise ValueError(f"weight must be a floating-point tensor; got {w.dtype}")
    if w.dim() != 2:
        raise ValueError(f"weight must be 2-D [out, in]; got shape {list(w.shape)}")
    if w.numel() and not bool(torch.isfinite(w).all()):
        raise ValueError("weight contains NaN or infinite values")


def _check_scale_dtype(scale_dtype: torch.dtype) -> None:
    if scale_dtype not in SCALE_DTYPES:
        raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}; got {scale_dtype}")


def _store_scales(scales: torch.Tensor, scale_dtype: torch.dtype, what: str) -> torch.Tensor:
    stored = scales.to(scale_dtype)
    if not bool(torch.isfinite(stored).all()):
        raise ValueError(f"{what} overflow {scale_dtype}; weights are too large for it")
    return stored


def _divide_safe(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``w / scale`` with 0 where the scale is 0 (all-zero groups, or underflowed scales)."""
    return torch.where(scale == 0, torch.zeros_like(w), w / torch.where(scale == 0, 1.0, scale))


def quantize_weight_int8(
    w: torch.Tensor,
    group_size: Optional[int] = None,
    scale_dtype: torch.dtype = torch.float32,
) -> Int8Weight:
    """Symmetric INT8 quantization of ``w`` (``[out, in]``, float).

    ``group_size=None`` gives one scale per output channel (``scales: [out]``); an integer
    gives one scale per ``group_size`` consecutive inputs (``scales: [out, in // group_size]``,
    the Q8_0 shape for 32).  Expect a relative Frobenius error of about
    ``0.23% * absmax/rms`` of each group (< 1% for Gaussian rows up to a few thousand wide).
    """
    _check_float_matrix(w)
    _check_scale_dtype(scale_dtype)
    out_features, in_features = w.shape
    g = in_features if group_size is None else group_size
    if not isinstance(g, int) or g < 1 or in_features % g != 0:
        raise ValueError(f"group_size={group_size!r} does not divide in_features={in_features}")
    groups = w.detach().float().reshape(out_features, in_features // g, g)
    absmax = groups.abs().amax(dim=-1, keepdim=True)
    scales = _store_scales(absmax / 127.0, scale_dtype, "INT8 scales")
    codes = torch.round(_divide_safe(groups, scales.float())).clamp_(-127, 127)
    qweight = codes.to(torch.int8).reshape(out_features, in_features)
    scales = scales.reshape(out_features) if group_size is None else scales.squeeze(-1)
    return Int8Weight(qweight=qweight.contiguous(), scales=scales.contiguous())


def quantize_weight_int4_grouped(
    w: torch.Tensor,
    group_size: int = 32,
    symmetric: bool = True,
    scale_dtype: torch.dtype = torch.float32,
) -> Int4Weight:
    """Grouped INT4 quantization of ``w`` (``[out, in]``, float), ggml Q4_0 / Q4_1 style.

    ``symmetric=True``: ``W = scale * (q - 8)``, ``mins=None``.
    ``symmetric=False``: ``W = scale * q + min``.
    Expect a relative Frobenius error of about 8% on Gaussian weights with groups of 32
    (a little more for larger groups).
    """
    _check_float_matrix(w)
    _check_scale_dtype(scale_dtype)
    out_features, in_features = w.shape
    check_int4_group_size(in_features, group_size)
    n_groups = in_features // group_size
    groups = w.detach().float().reshape(out_features, n_groups, group_size)
    if symmetric:
        index = groups.abs().argmax(dim=-1, keepdim=True)
        extreme = torch.gather(groups, -1, index)
        scales = _store_scales(extreme / -8.0, scale_dtype, "INT4 scales")
        codes = torch.round(_divide_safe(groups, scales.float())).add_(8).clamp_(0, 15)
        mins = None
    else:
        low = groups.amin(dim=-1, keepdim=True)
        high = groups.amax(dim=-1, keepdim=True)
        mins = _store_scales(low, scale_dtype, "INT4 mins")
        scales = _store_scales((high - mins.float()) / 15.0, scale_dtype, "INT4 scales")
        codes = torch.round(_divide_safe(groups - mins.float(), scales.float())).clamp_(0, 15)
        mins = mins.reshape(out_features, n_groups).contiguous()
    q = codes.to(torch.uint8).reshape(out_features, in_features)
    return Int4Weight(
        packed=pack_int4(q, group_size),
        scales=scales.reshape(out_features, n_groups).contiguous(),
        mins=mins,
        group_size=group_size,
    )
