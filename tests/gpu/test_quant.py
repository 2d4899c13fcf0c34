"""Quantized linears (`torchburn::linear_int8` / `linear_int4`) on the wgpu engine: the
`qlinear` op lowered by `lower-to-loops-gpu` to one output element per invocation, the
weight dequantized in the loop over k, bias fused; equal to the ops' eager reference."""
from __future__ import annotations

from typing import Optional

import pytest
import torch

from tests.gpu.conftest import check_gpu
from torchburn.quant import QuantizedLinear


@pytest.mark.parametrize("quant_type,group,symmetric", [
    ("int8", None, True), ("int8", 32, True), ("int4", 32, True), ("int4", 16, False),
])
def test_quantized_linear_on_gpu(gpu, quant_type: str, group: Optional[int], symmetric: bool) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24)
    layer = QuantizedLinear.from_float(lin, quant_type, group, symmetric, torch.float16)
    check_gpu(layer, torch.randn(3, 64), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_block_weights_on_gpu(gpu, name: str) -> None:  # type: ignore[no-untyped-def]
    """Weights in ggml blocks (`qlinear` kind "blocks"): the plain form generated from the
    block table, on the wgpu engine, equal to the eager op."""
    from tests.quant.test_block_types import random_blocks
    from torchburn.ir.qblocks import BLOCK_TYPES
    from torchburn.quant import BlockWeight

    bt = BLOCK_TYPES[name]
    raw = random_blocks(name, 24, 256 // bt.block, 0)
    layer = QuantizedLinear.from_weight(BlockWeight(torch.from_numpy(raw), name), torch.randn(24))
    check_gpu(layer, torch.randn(3, 256), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["Q4_0", "Q4_K", "Q6_K"])  # what files give their embedding
def test_block_embedding_on_gpu(gpu, name: str) -> None:  # type: ignore[no-untyped-def]
    """A token embedding in ggml blocks (`embedding_blocks`: rows gathered, then `dequantize`)
    runs on the wgpu engine: a model step with it does not leave the GPU."""
    from tests.quant.test_block_types import random_blocks
    from torchburn.ir.qblocks import BLOCK_TYPES
    from torchburn.quant import BlockEmbedding, BlockWeight

    bt = BLOCK_TYPES[name]
    raw = random_blocks(name, 40, 512 // bt.block, 1)
    emb = BlockEmbedding(BlockWeight(torch.from_numpy(raw), name))
    check_gpu(emb, torch.tensor([[3, 0, 39], [5, 5, 1]]), rtol=0, atol=0)
