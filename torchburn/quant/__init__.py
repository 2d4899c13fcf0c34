"""INT8/INT4 weight quantization for TorchBurn, on the torch side.

* `layouts`: the storage layouts (`Int8Weight`, `Int4Weight`) and their dequantization;
* `quantize`: float -> quantized weights;
* `gguf_blocks`: lossless import of GGUF Q8_0 / Q4_0 / Q4_1 blocks;
* `blocks`: weights kept in ggml's own blocks (`BlockWeight`, every type of `ir.qblocks`);
* `ops`: the ``torchburn::linear_int8`` / ``torchburn::linear_int4`` custom ops;
* `linear`: `QuantizedLinear`; `replace`: `quantize_` for whole models.

See ``docs/quantization.md``.  Importing this package registers the custom ops and nothing
more (no compilation).
"""
from __future__ import annotations

from .blocks import BlockWeight, dequantize_block_rows, dequantize_blocks
from .embedding import BlockEmbedding
from .gguf_blocks import import_gguf_q4_0, import_gguf_q4_1, import_gguf_q4_k, import_gguf_q8_0
from .layouts import (
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    unpack_int4,
)
from .linear import QuantizedLinear
from .ops import linear_blocks, linear_int4, linear_int8
from .quantize import quantize_weight_int4_grouped, quantize_weight_int8
from .replace import QuantizeReport, quantize_

__all__ = [
    "BlockEmbedding",
    "BlockWeight",
    "dequantize_block_rows",
    "dequantize_blocks",
    "Int4Weight",
    "Int8Weight",
    "QuantizeReport",
    "QuantizedLinear",
    "dequantize_int4",
    "dequantize_int8",
    "import_gguf_q4_0",
    "import_gguf_q4_1",
    "import_gguf_q4_k",
    "import_gguf_q8_0",
    "linear_blocks",
    "linear_int4",
    "linear_int8",
    "pack_int4",
    "quantize_",
    "quantize_weight_int4_grouped",
    "quantize_weight_int8",
    "unpack_int4",
]
