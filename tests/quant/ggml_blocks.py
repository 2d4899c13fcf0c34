"""Shared test helpers: ggml block formats decoded straight from their description, and
random block bytes with finite float16 fields."""
from __future__ import annotations

import numpy as np

from torchburn.quant import (
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    dequantize_int8,
    import_gguf_q4_0,
    import_gguf_q4_1,
    import_gguf_q8_0,
)

FORMATS = {
    # name: (importer, bytes per block)
    "Q8_0": (import_gguf_q8_0, 34),
    "Q4_0": (import_gguf_q4_0, 18),
    "Q4_1": (import_gguf_q4_1, 20),
}


def reference_dequantize(data: np.ndarray, fmt: str, shape: tuple[int, int]) -> np.ndarray:
    """Straight from the block structs, one block at a time (float32 arithmetic as ggml)."""
    out_features, in_features = shape
    block_bytes = FORMATS[fmt][1]
    blocks = data.reshape(-1, block_bytes)
    result = np.empty((blocks.shape[0], 32), dtype=np.float32)
    for i, block in enumerate(blocks):
        d = np.float32(block[0:2].view("<f2")[0])
        if fmt == "Q8_0":
            result[i] = block[2:].view(np.int8).astype(np.float32) * d
            continue
        qs = block[4:] if fmt == "Q4_1" else block[2:]
        codes = np.concatenate([qs & 0x0F, qs >> 4]).astype(np.float32)
        if fmt == "Q4_0":
            result[i] = (codes - np.float32(8)) * d
        else:
            m = np.float32(block[2:4].view("<f2")[0])
            result[i] = codes * d + m
    return result.reshape(out_features, in_features)


def random_blocks(fmt: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """Arbitrary block bytes with finite float16 fields (incl. negatives, zeros, subnormals)."""
    rng = np.random.default_rng(seed)
    out_features, in_features = shape
    block_bytes = FORMATS[fmt][1]
    n_blocks = out_features * in_features // 32
    blocks = rng.integers(0, 256, size=(n_blocks, block_bytes), dtype=np.uint8)
    n_fields = 2 if fmt == "Q4_1" else 1
    for field in range(n_fields):
        values = (rng.standard_normal(n_blocks) * 10.0 ** rng.integers(-7, 3, n_blocks))
        values[::7] = 0.0
        values[1::11] = -0.0
        values[2::13] = 6e-8  # float16 subnormal
        blocks[:, 2 * field : 2 * field + 2] = values.astype("<f2").view(np.uint8).reshape(-1, 2)
    return blocks.reshape(out_features, -1)


def dequantize(weight: Int8Weight | Int4Weight) -> np.ndarray:
    deq = dequantize_int8(weight) if isinstance(weight, Int8Weight) else dequantize_int4(weight)
    return deq.numpy()


def assert_bit_equal(a: np.ndarray, b: np.ndarray) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype == np.float32
    assert np.array_equal(a.view(np.uint32), b.view(np.uint32))
