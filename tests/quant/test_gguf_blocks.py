"""GGUF Q8_0/Q4_0/Q4_1 import: bit-exact against the format description (pure numpy, one
block at a time). test_gguf_package.py also checks against the `gguf` package."""
from __future__ import annotations

import zlib

import numpy as np
import pytest
import torch

from torchburn.quant import import_gguf_q4_0, import_gguf_q4_1, import_gguf_q8_0

from .ggml_blocks import (
    FORMATS,
    assert_bit_equal,
    dequantize,
    random_blocks,
    reference_dequantize,
)


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("shape", [(1, 32), (5, 96), (16, 256)])
def test_import_is_bit_exact_to_format_description(fmt, shape):
    data = random_blocks(fmt, shape, seed=zlib.crc32(f"{fmt}{shape}".encode()))
    weight = FORMATS[fmt][0](data, shape)
    assert_bit_equal(dequantize(weight), reference_dequantize(data, fmt, shape))


def test_imported_layout_keeps_the_file_bytes():
    data = random_blocks("Q4_1", (3, 64), seed=0)
    weight = import_gguf_q4_1(data, (3, 64))
    blocks = data.reshape(3, 2, 20)
    assert weight.group_size == 32 and not weight.symmetric
    assert weight.scales.dtype == weight.mins.dtype == torch.float16
    assert np.array_equal(weight.packed.numpy(), blocks[:, :, 4:].reshape(3, 32))
    assert np.array_equal(weight.scales.numpy().view(np.uint8).reshape(3, 2, 2), blocks[:, :, 0:2])
    assert np.array_equal(weight.mins.numpy().view(np.uint8).reshape(3, 2, 2), blocks[:, :, 2:4])
    q8 = import_gguf_q8_0(random_blocks("Q8_0", (2, 32), seed=1), (2, 32))
    assert q8.qweight.dtype == torch.int8 and q8.scales.shape == (2, 1) and q8.group_size == 32


def test_import_owns_its_memory():
    data = random_blocks("Q8_0", (2, 64), seed=2)
    weight = import_gguf_q8_0(data, (2, 64))
    before = dequantize(weight).copy()
    data[:] = 0
    assert_bit_equal(dequantize(weight), before)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: import_gguf_q8_0(np.zeros(34, dtype=np.uint8), (1, 64)), "needs 68"),
        (lambda: import_gguf_q8_0(np.zeros(34, dtype=np.int8), (1, 32)), "uint8"),
        (lambda: import_gguf_q4_0(np.zeros(18, dtype=np.uint8), (1, 16)), "multiple of the block"),
        (lambda: import_gguf_q4_1(np.zeros(20, dtype=np.uint8), (20,)), "out_features, in_"),
        (lambda: import_gguf_q4_1(b"\0" * 20, (1, 32)), "numpy array"),
    ],
)
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


@pytest.mark.parametrize("seed", range(3))
def test_q4_k_import_is_within_half_precision_of_the_sub_block(seed: int) -> None:
    """Q4_K -> int4 group 32 with mins: every weight equals gguf-py's within 2^-10 of its
    sub-block's range (the scale and min products rounded to float16; subnormal ones to half
    an ulp of 2^-24), through the int4
    dequantizer, and the codes are exactly the file's."""
    gguf = pytest.importorskip("gguf")
    from tests.quant.test_block_types import random_blocks
    from torchburn.quant import dequantize_int4, import_gguf_q4_k

    rows, nb = 5, 3
    raw = random_blocks("Q4_K", rows, nb, seed)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_K).astype(np.float64)
    w = import_gguf_q4_k(raw.reshape(-1), (rows, nb * 256))
    assert (w.group_size, w.packed.shape, w.scales.shape, w.mins.shape) == (32, (rows, nb * 128), (rows, nb * 8), (rows, nb * 8))
    got = dequantize_int4(w).double().numpy()
    spread = np.maximum(15 * np.abs(w.scales.double().numpy()), np.abs(w.mins.double().numpy()))
    err = np.abs(got - ref).reshape(rows, nb * 8, 32).max(-1)
    # float16 rounding: half an ulp, 2^-11 relative, or 2^-25 below the normal range
    assert np.all(err <= 2 * spread * 2.0 ** -11 + 16 * 2.0 ** -25)  # the scale's and the min's
    # the codes: the file's nibbles, moved to our order
    qs = raw.reshape(rows, nb, 144)[:, :, 16:].reshape(rows, nb, 4, 32)
    file_codes = np.stack([qs & 15, qs >> 4], axis=3).reshape(rows, nb * 256)
    packed = w.packed.numpy().reshape(rows, nb * 8, 16)
    ours = np.concatenate([packed & 15, packed >> 4], axis=-1).reshape(rows, nb * 256)
    np.testing.assert_array_equal(ours, file_codes)


def test_q4_k_import_rejects_bad_sizes() -> None:
    from torchburn.quant import import_gguf_q4_k

    with pytest.raises(ValueError, match="multiple of the block size 256"):
        import_gguf_q4_k(np.zeros(144, np.uint8), (1, 128))
    with pytest.raises(ValueError, match="needs 288"):
        import_gguf_q4_k(np.zeros(144, np.uint8), (1, 512))
