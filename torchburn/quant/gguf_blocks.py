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


def _blocks(data: np.ndarray, shape: Sequence[int], block_bytes: int, fmt: str) -> np.ndarray:
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
    if in_features % GGML_BLOCK_SIZE != 0:
        raise ValueError(
            f"{fmt} in_features={in_features} is not a multiple of the block size "
            f"{GGML_BLOCK_SIZE}"
        )
    blocks_per_row = in_features // GGML_BLOCK_SIZE
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
