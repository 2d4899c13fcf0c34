"""Lossless import of GGUF (ggml) Q8_0, Q4_0 and Q4_1 blocks into our layouts.

The ggml block structures (little-endian, packed, 32 weights per block, blocks running along
the row, i.e. along ``in_features``)::

    block_q8_0 { f16 d;          int8  qs[32]; }   34 bytes   w[i] = d * qs[i]
    block_q4_0 { f16 d;          uint8 qs[16]; }   18 bytes   w[i] = d * ((nib(i)) - 8)
    block_q4_1 { f16 d; f16 m;   uint8 qs[16]; }   20 bytes   w[i] = d * nib(i) + m

where ``nib(i) = qs[i] & 0xF`` for ``i < 16`` and ``qs[i - 16] >> 4`` for ``i >= 16``.

That nibble order is our INT4 order for group size 32 (see `layouts`), so importing is a
matter of splitting each block into its scale(s) and its code bytes: the codes are copied
as they are and the scales are kept as float16, bit for bit.  Dequantizing the result with
`dequantize_int8` / `dequantize_int4` therefore gives ggml's float32 values exactly.

Shapes: GGUF lists dimensions innermost first (``ne[0]`` = ``in_features``); these functions
take the torch order ``(out_features, in_features)`` of the ``nn.Linear`` weight.  ``data`` is
the tensor's raw bytes as a numpy uint8 array of any shape (for example what
``gguf.GGUFReader`` gives as ``tensor.data``); only its size and order matter.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from .layouts import Int4Weight, Int8Weight

#: Weights per ggml block for the formats imported here.
GGML_BLOCK_SIZE = 32
#: Bytes per block.
Q8_0_BLOCK_BYTES = 2 + 32
Q4_0_BLOCK_BYTES = 2 + 16
Q4_1_BLOCK_BYTES = 2 + 2 + 16
#: Q4_K: a 256-weight super-block of eight 32-weight sub-blocks.
Q4_K_BLOCK = 256
Q4_K_BLOCK_BYTES = 2 + 2 + 12 + 128


def _blocks(data: np.ndarray, shape: Sequence[int], block_bytes: int, fmt: str,
            block: int = GGML_BLOCK_SIZE) -> np.ndarray:
    """Check ``data`` against ``shape`` and view it as ``[out, blocks_per_row, block_bytes]``."""
    if not isinstance(data, np.ndarray):
        raise ValueError(f"{fmt} data must be a numpy array; got {type(data).__name__}")
    if data.dtype != np.uint8:
        raise ValueError(f"{fmt} data must have dtype uint8 (raw bytes); got {data.dtype}")
    if len(shape) != 2:
        raise ValueError(f"{fmt} shape must be (out_features, in_features); got {tuple(shape)}")
    out_features, in_features = (int(s) for s in shape)
    if out_features < 1 or in_features < 1:
        raise ValueError(f"{fmt} shape must be positive; got {tuple(shape)}")
    if in_features % block != 0:
        raise ValueError(f"{fmt} in_features={in_features} is not a multiple of the block size {block}")
    blocks_per_row = in_features // block
    expected = out_features * blocks_per_row * block_bytes
    if data.size != expected:
        raise ValueError(
            f"{fmt} data has {data.size} bytes; shape {tuple(shape)} needs {expected} "
            f"({out_features} rows x {blocks_per_row} blocks x {block_bytes} bytes)"
        )
    return np.ascontiguousarray(data).reshape(out_features, blocks_per_row, block_bytes)


def _f16_field(blocks: np.ndarray, start: int) -> torch.Tensor:
    """The float16 stored at byte ``start`` of every block, as ``[out, blocks_per_row]``."""
    raw = np.array(blocks[:, :, start : start + 2], copy=True)  # own the memory
    return torch.from_numpy(raw.view("<f2").reshape(blocks.shape[:2]).astype(np.float16))


def _code_bytes(blocks: np.ndarray, start: int) -> np.ndarray:
    out_features = blocks.shape[0]
    return np.array(blocks[:, :, start:], copy=True).reshape(out_features, -1)


def import_gguf_q8_0(data: np.ndarray, shape: Sequence[int]) -> Int8Weight:
    """GGUF Q8_0 bytes -> `Int8Weight` with float16 scales ``[out, in // 32]``."""
    blocks = _blocks(data, shape, Q8_0_BLOCK_BYTES, "Q8_0")
    qweight = torch.from_numpy(_code_bytes(blocks, 2).view(np.int8))
    return Int8Weight(qweight=qweight, scales=_f16_field(blocks, 0))


def import_gguf_q4_0(data: np.ndarray, shape: Sequence[int]) -> Int4Weight:
    """GGUF Q4_0 bytes -> symmetric `Int4Weight` (group 32, float16 scales)."""
    blocks = _blocks(data, shape, Q4_0_BLOCK_BYTES, "Q4_0")
    return Int4Weight(
        packed=torch.from_numpy(_code_bytes(blocks, 2)),
        scales=_f16_field(blocks, 0),
        mins=None,
        group_size=GGML_BLOCK_SIZE,
    )


def import_gguf_q4_1(data: np.ndarray, shape: Sequence[int]) -> Int4Weight:
    """GGUF Q4_1 bytes -> asymmetric `Int4Weight` (group 32, float16 scales and mins)."""
    blocks = _blocks(data, shape, Q4_1_BLOCK_BYTES, "Q4_1")
    return Int4Weight(
        packed=torch.from_numpy(_code_bytes(blocks, 4)),
        scales=_f16_field(blocks, 0),
        mins=_f16_field(blocks, 2),
        group_size=GGML_BLOCK_SIZE,
    )


def _q4_k_scales_mins(table: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The eight 6-bit scales and mins of each Q4_K super-block from its 12-byte table
    ``[..., 12]``: numbers 0-3 are the low six bits of bytes 0-3 (scales) and 4-7 (mins);
    numbers 4-7 take their low four bits from the nibbles of bytes 8-11 and their top two
    from the top bits of bytes 0-3 (scales) and 4-7 (mins)."""
    t = table.astype(np.uint8)
    low, high = t[..., 0:4], t[..., 4:8]
    tail = t[..., 8:12]
    scales = np.concatenate([low & 63, (tail & 15) | ((low >> 6) << 4)], axis=-1)
    mins = np.concatenate([high & 63, (tail >> 4) | ((high >> 6) << 4)], axis=-1)
    return scales, mins


def import_gguf_q4_k(data: np.ndarray, shape: Sequence[int]) -> Int4Weight:
    """GGUF Q4_K bytes -> asymmetric `Int4Weight` (group 32, float16 scales and mins), so
    Q4_K weights run the int4 kernels (int8 activations, byte dot products) instead of the
    block table's f32 form.

    A Q4_K super-block is eight sub-blocks of 32 weights, ``w = d sc_j q - dmin m_j`` with
    float16 ``d``, ``dmin`` and 6-bit ``sc_j``, ``m_j``: an `Int4Weight` of group 32 with
    scale ``d sc_j`` and min ``-dmin m_j``. The codes move: Q4_K keeps sub-blocks 2c and
    2c + 1 in the low and high nibbles of the same 32 bytes, our INT4 order keeps a group's
    first and second 16 weights in the low and high nibbles of its own 16 bytes. The one
    approximation is the products ``d sc_j`` and ``dmin m_j`` rounded to float16 (each off by
    at most 2^-11 of itself, so a weight by at most 2^-10 of its sub-block's range, against
    the 4-bit code's steps of 1/15 of it); the bytes
    are 0.625 per weight against Q4_K's 0.5625."""
    blocks = _blocks(data, shape, Q4_K_BLOCK_BYTES, "Q4_K", Q4_K_BLOCK)
    out_features, nb = blocks.shape[:2]
    d = blocks[:, :, 0:2].copy().view("<f2").astype(np.float32)  # [out, nb, 1]
    dmin = blocks[:, :, 2:4].copy().view("<f2").astype(np.float32)
    sc, mn = _q4_k_scales_mins(blocks[:, :, 4:16])
    scales = (d * sc.astype(np.float32)).astype(np.float16).reshape(out_features, nb * 8)
    mins = (-(dmin * mn.astype(np.float32))).astype(np.float16).reshape(out_features, nb * 8)
    qs = blocks[:, :, 16:].reshape(out_features, nb, 4, 1, 32)
    codes = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(out_features, nb, 8, 32)
    packed = (codes[..., :16] | (codes[..., 16:] << 4)).reshape(out_features, nb * 128)
    return Int4Weight(packed=torch.from_numpy(np.ascontiguousarray(packed)),
                      scales=torch.from_numpy(np.ascontiguousarray(scales)),
                      mins=torch.from_numpy(np.ascontiguousarray(mins)), group_size=GGML_BLOCK_SIZE)
