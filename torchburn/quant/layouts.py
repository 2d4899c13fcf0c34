"""Storage layouts of quantized weights: `Int8Weight`, `Int4Weight`, their checks, and the
reference dequantization that defines what the bytes mean.

Everything else in `torchburn.quant` (quantizers, GGUF import, custom ops, the compiler's
lowerings) agrees with the definitions here, so this module is the single source of truth.
All weights are for a linear layer ``y = x @ W.T + b`` with ``W`` of shape ``[out, in]``
(torch's ``nn.Linear.weight`` order); groups run along ``in``, the reduction axis.

INT8 (`Int8Weight`)
    ``qweight``: int8 ``[out, in]``, any value in [-128, 127] is valid (our quantizer uses
    [-127, 127]).  ``scales``: float16/bfloat16/float32, either ``[out]`` (per output channel)
    or ``[out, in // group_size]`` (grouped; GGUF Q8_0 is group 32)::

        W[o, k] = f32(scales[o])                       * f32(qweight[o, k])   # per channel
        W[o, k] = f32(scales[o, k // group_size])      * f32(qweight[o, k])   # grouped

INT4 (`Int4Weight`)
    ``packed``: uint8 ``[out, in // 2]``, two 4-bit codes ``q`` in [0, 15] per byte.
    Nibble order (identical to ggml's Q4_0/Q4_1 ``qs`` when group_size == 32): the ``in``
    axis is cut into groups of ``g = group_size`` elements, each stored in ``g // 2`` bytes;
    byte ``j`` of group ``G`` holds element ``G*g + j`` in its low nibble and element
    ``G*g + j + g//2`` in its high nibble::

        byte = packed[o, G*g//2 + j]          (0 <= j < g//2)
        q[o, G*g + j]        = byte & 0x0F
        q[o, G*g + j + g//2] = byte >> 4

    Splitting each group in halves (rather than pairing neighbours) lets a SIMD kernel turn a
    vector of bytes into two *contiguous* vectors of elements with one mask and one shift, with
    no shuffles, and makes GGUF import a plain copy of the ``qs`` bytes.
    ``scales``: float16/bfloat16/float32 ``[out, in // g]``; ``mins``: ``None`` (symmetric) or
    the same dtype and shape as ``scales`` (asymmetric)::

        W[o, k] = f32(scales[o, k // g]) * (f32(q[o, k]) - 8)                      # symmetric
        W[o, k] = f32(scales[o, k // g]) * f32(q[o, k]) + f32(mins[o, k // g])     # asymmetric

    These are exactly ggml's Q4_0 (``d * (q - 8)``) and Q4_1 (``d * q + m``).  A scale may be
    negative (ggml's Q4_0 quantizer makes them so).  An integer zero point ``z`` is the special
    case ``mins = -scales * z``.

Dequantization computes in float32: scales and mins are widened first, then multiplied (and
added).  With float16 scales the product ``d * q`` is exact in float32 (11 + 8 significant
bits), so the only rounding is the ``+ m`` of the asymmetric form; that is why our values equal
ggml's bit for bit, whether or not a kernel contracts the two into a fused multiply-add.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator, Optional

import torch

#: Scale (and min) dtypes accepted in every layout.
SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _check_scale_tensor(name: str, t: torch.Tensor, shape: tuple[int, ...]) -> None:
    if t.dtype not in SCALE_DTYPES:
        allowed = ", ".join(_dtype_name(d) for d in SCALE_DTYPES)
        raise ValueError(f"{name} must have dtype {allowed}; got {_dtype_name(t.dtype)}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}; got {list(t.shape)}")


def check_int8_layout(qweight: torch.Tensor, scales: torch.Tensor) -> int:
    """Validate an INT8 weight (dtypes and shapes only, so it runs on fake tensors too).

    Returns the group size (``in_features`` for per-channel scales).  Raises ValueError
    naming the problem.
    """
    if qweight.dtype != torch.int8:
        raise ValueError(f"qweight must have dtype int8; got {_dtype_name(qweight.dtype)}")
    if qweight.dim() != 2:
        raise ValueError(f"qweight must be 2-D [out, in]; got shape {list(qweight.shape)}")
    out_features, in_features = qweight.shape
    if scales.dim() == 1:
        _check_scale_tensor("scales", scales, (out_features,))
        return in_features
    if scales.dim() != 2 or scales.shape[0] != out_features or scales.shape[1] == 0:
        raise ValueError(
            f"scales must be [out]={[out_features]} (per channel) or [out, in // group_size] "
            f"(grouped); got shape {list(scales.shape)}"
        )
    n_groups = scales.shape[1]
    if in_features % n_groups != 0:
        raise ValueError(
            f"scales has {n_groups} groups per row, which does not divide "
            f"in_features={in_features}"
        )
    _check_scale_tensor("scales", scales, (out_features, n_groups))
    return in_features // n_groups


def check_int4_layout(
    packed: torch.Tensor,
    scales: torch.Tensor,
    mins: Optional[torch.Tensor],
    group_size: int,
) -> None:
    """Validate an INT4 weight (dtypes and shapes only, so it runs on fake tensors too).

    Raises ValueError naming the problem.
    """
    if packed.dtype != torch.uint8:
        raise ValueError(f"packed must have dtype uint8; got {_dtype_name(packed.dtype)}")
    if packed.dim() != 2:
        raise ValueError(f"packed must be 2-D [out, in // 2]; got shape {list(packed.shape)}")
    out_features, in_features = packed.shape[0], packed.shape[1] * 2
    check_int4_group_size(in_features, group_size)
    n_groups = in_features // group_size
    _check_scale_tensor("scales", scales, (out_features, n_groups))
    if mins is not None:
        _check_scale_tensor("mins", mins, (out_features, n_groups))
        if mins.dtype != scales.dtype:
            raise ValueError(
                f"mins must have the dtype of scales ({_dtype_name(scales.dtype)}); "
                f"got {_dtype_name(mins.dtype)}"
            )


def check_int4_group_size(in_features: int, group_size: int) -> None:
    """The INT4 constraints on ``in_features`` and ``group_size``; ValueError if violated."""
    if in_features % 2 != 0:
        raise ValueError(
            f"in_features={in_features} is odd; INT4 packs two values per byte and needs it even"
        )
    if not isinstance(group_size, int) or group_size < 2 or group_size % 2 != 0:
        raise ValueError(
            f"group_size must be a positive even integer (32, 64 or 128 are usual); "
            f"got {group_size!r}"
        )
    if in_features % group_size != 0:
        raise ValueError(
            f"group_size={group_size} does not divide in_features={in_features}"
        )


@dataclass(frozen=True, eq=False)
class Int8Weight:
    """A symmetric INT8 weight: ``W[o, k] = scales[o (, k // group_size)] * qweight[o, k]``.

    See the module docstring for the exact layout.  ``scales`` of shape ``[out]`` means one
    scale per output channel; ``[out, in // g]`` means groups of ``g`` along ``in``.
    """

    qweight: torch.Tensor
    scales: torch.Tensor

    def __post_init__(self) -> None:
        check_int8_layout(self.qweight, self.scales)

    @property
    def out_features(self) -> int:
        return self.qweight.shape[0]

    @property
    def in_features(self) -> int:
        return self.qweight.shape[1]

    @property
    def group_size(self) -> int:
        """Elements sharing one scale along ``in``; ``in_features`` when per channel."""
        if self.scales.dim() == 1:
            return self.in_features
        return self.in_features // self.scales.shape[1]

    @property
    def per_channel(self) -> bool:
        return self.scales.dim() == 1

    def _parts(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (self.qweight, self.scales)

    # Tuple-like, so that the seed's ``qweight, scales = quantize_weight_int8(w)`` works
    # while the attributes and checks stay.
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._parts())

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return self._parts()[index]


@dataclass(frozen=True, eq=False)
class Int4Weight:
    """A grouped INT4 weight, packed two codes per byte (see the module docstring).

    ``mins is None``: symmetric, ``W = scales * (q - 8)`` (ggml Q4_0).
    Otherwise asymmetric, ``W = scales * q + mins`` (ggml Q4_1).
    """

    packed: torch.Tensor
    scales: torch.Tensor
    mins: Optional[torch.Tensor]
    group_size: int

    def __post_init__(self) -> None:
        check_int4_layout(self.packed, self.scales, self.mins, self.group_size)

    @property
    def out_features(self) -> int:
        return self.packed.shape[0]

    @property
    def in_features(self) -> int:
        return self.packed.shape[1] * 2

    @property
    def symmetric(self) -> bool:
        return self.mins is None

    def _parts(self) -> tuple[torch.Tensor, ...]:
        if self.mins is None:
            return (self.packed, self.scales)
        return (self.packed, self.scales, self.mins)

    # Tuple-like, so that the seed's ``packed, scales = quantize_weight_int4_grouped(w)``
    # works (``packed, scales, mins = ...`` when asymmetric) while the attributes and
    # checks stay; ``group_size`` is an attribute only.
    def __iter__(self) -> Iterator[torch.Tensor]:
        return iter(self._parts())

    def __len__(self) -> int:
        return len(self._parts())

    def __getitem__(self, index: int) -> torch.Tensor:
        return self._parts()[index]


def pack_int4(q: torch.Tensor, group_size: int) -> torch.Tensor:
    """Pack 4-bit codes ``q`` (uint8 ``[out, in]``, values 0..15) into ``[out, in // 2]``
    in the group-halves nibble order of the module docstring."""
    if q.dtype != torch.uint8 or q.dim() != 2:
        raise ValueError(
            f"q must be a 2-D uint8 tensor; got {_dtype_name(q.dtype)} {list(q.shape)}"
        )
    out_features, in_features = q.shape
    check_int4_group_size(in_features, group_size)
    if q.numel() and int(q.max()) > 15:
        raise ValueError(f"4-bit codes must be in [0, 15]; got a maximum of {int(q.max())}")
    halves = q.reshape(out_features, in_features // group_size, 2, group_size // 2)
    packed = halves[:, :, 0, :] | (halves[:, :, 1, :] << 4)
    return packed.reshape(out_features, in_features // 2).contiguous()


def unpack_int4(packed: torch.Tensor, group_size: int) -> torch.Tensor:
    """Inverse of `pack_int4`: uint8 codes 0..15 of shape ``[out, in]``."""
    if packed.dtype != torch.uint8 or packed.dim() != 2:
        raise ValueError(
            f"packed must be a 2-D uint8 tensor; "
            f"got {_dtype_name(packed.dtype)} {list(packed.shape)}"
        )
    out_features, in_features = packed.shape[0], packed.shape[1] * 2
    check_int4_group_size(in_features, group_size)
    groups = packed.reshape(out_features, in_features // group_size, group_size // 2)
    q = torch.cat([groups & 0x0F, groups >> 4], dim=-1)
    return q.reshape(out_features, in_features)


def dequantize_int8(weight: Int8Weight) -> torch.Tensor:
    """The float32 ``[out, in]`` matrix an `Int8Weight` stands for (the layout's definition)."""
    return dequantize_int8_rows(weight.qweight, weight.scales)


def dequantize_int4(weight: Int4Weight) -> torch.Tensor:
    """The float32 ``[out, in]`` matrix an `Int4Weight` stands for (the layout's definition)."""
    return dequantize_int4_rows(weight.packed, weight.scales, weight.mins, weight.group_size)


def dequantize_int8_rows(
    qweight: torch.Tensor, scales: torch.Tensor, out: Optional[torch.Tensor] = None
) -> torch.Tensor:
    """`dequantize_int8` on raw tensors (any slice of rows); no validation, for hot paths.

    ``out`` (float32, ``qweight``'s shape, contiguous) is written and returned when given:
    the op implementations reuse one buffer across slices, because a fresh multi-megabyte
    allocation per slice costs more in page faults than the arithmetic.
    """
    rows, in_features = qweight.shape
    w = torch.empty(rows, in_features, device=qweight.device) if out is None else out
    w.copy_(qweight)  # int8 -> float32, exact
    if scales.dim() == 1:
        return w.mul_(scales.float()[:, None])
    n_groups = scales.shape[1]
    w.view(rows, n_groups, in_features // n_groups).mul_(scales.float()[:, :, None])
    return w


def dequantize_int4_rows(
    packed: torch.Tensor,
    scales: torch.Tensor,
    mins: Optional[torch.Tensor],
    group_size: int,
    out: Optional[torch.Tensor] = None,
    codes: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """`dequantize_int4` on raw tensors (any slice of rows); no validation, for hot paths.

    A few whole-tensor passes (mask, shift, widen, scale), never a Python loop over rows.
    ``out`` (float32 ``[rows, in]``) and ``codes`` (uint8 ``[rows, in]``) are optional
    reusable buffers, as in `dequantize_int8_rows`.
    """
    rows, half_in = packed.shape
    in_features = half_in * 2
    n_groups = in_features // group_size
    half = group_size // 2
    groups = packed.reshape(rows, n_groups, half)
    if codes is None:
        codes = torch.empty(rows, in_features, dtype=torch.uint8, device=packed.device)
    q = codes.view(rows, n_groups, group_size)
    torch.bitwise_and(groups, 0x0F, out=q[:, :, :half])
    torch.bitwise_right_shift(groups, 4, out=q[:, :, half:])
    w = torch.empty(rows, in_features, device=packed.device) if out is None else out
    w.copy_(codes)  # uint8 -> float32, exact
    w3 = w.view(rows, n_groups, group_size)
    if mins is None:
        w3.sub_(8.0).mul_(scales.float()[:, :, None])
    else:
        # Two roundings (multiply, then add) as in ggml; the product is exact for f16 scales.
        w3.mul_(scales.float()[:, :, None]).add_(mins.float()[:, :, None])
    return w
