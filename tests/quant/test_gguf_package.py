"""GGUF import checked against the `gguf` package (ggml's reference Python implementation of
its formats); skipped when `gguf` is not installed.  The format-description tests in
test_gguf_blocks.py run everywhere."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from torchburn.quant import QuantizedLinear

from .ggml_blocks import FORMATS, assert_bit_equal, dequantize, random_blocks

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType  # noqa: E402
from gguf.quants import dequantize as gguf_dequantize  # noqa: E402
from gguf.quants import quantize as gguf_quantize  # noqa: E402

QTYPES = {"Q8_0": GGMLQuantizationType.Q8_0, "Q4_0": GGMLQuantizationType.Q4_0,
          "Q4_1": GGMLQuantizationType.Q4_1}


@pytest.mark.parametrize("fmt", FORMATS)
def test_bit_exact_with_gguf_on_quantized_weights(fmt):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((48, 320)) * 0.05).astype(np.float32)
    w[3] = 0.0  # an all-zero row (d = 0)
    data = gguf_quantize(w, QTYPES[fmt])
    weight = FORMATS[fmt][0](data, w.shape)
    assert_bit_equal(dequantize(weight), gguf_dequantize(data, QTYPES[fmt]))


@pytest.mark.parametrize("fmt", FORMATS)
def test_bit_exact_with_gguf_on_arbitrary_blocks(fmt):
    data = random_blocks(fmt, (12, 128), seed=7)
    weight = FORMATS[fmt][0](data, (12, 128))
    assert_bit_equal(dequantize(weight), gguf_dequantize(data, QTYPES[fmt]))


def test_gguf_file_to_quantized_linear(tmp_path):
    """End to end: write a GGUF file, read it back, import, run the layer."""
    rng = np.random.default_rng(1)
    w = (rng.standard_normal((24, 64)) * 0.1).astype(np.float32)
    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for fmt, qtype in QTYPES.items():
        writer.add_tensor(f"w.{fmt}", gguf_quantize(w, qtype), raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    x = torch.from_numpy(rng.standard_normal((3, 64)).astype(np.float32))
    for tensor in gguf.GGUFReader(str(path)).tensors:
        fmt = tensor.name.split(".")[1]
        shape = tuple(int(n) for n in reversed(tensor.shape))  # GGUF lists ne[0] first
        layer = QuantizedLinear.from_weight(FORMATS[fmt][0](tensor.data, shape))
        expected = gguf_dequantize(np.asarray(tensor.data), QTYPES[fmt])
        torch.testing.assert_close(layer(x), x @ torch.from_numpy(expected).T)
