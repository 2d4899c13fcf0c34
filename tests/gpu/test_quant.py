"""Quantized linears (`torchburn::linear_int8` / `linear_int4`) on the wgpu engine: the
`qlinear` op lowered by `lower-to-loops-gpu` to one output element per invocation, the
weight dequantized in the loop over k, bias fused; equal to the ops' eager reference."""
from __future__ import annotations

from typing import Optional

import pytest
import torch

from tests.gpu.conftest import check_gpu
from tests.helpers import run_compiled
from torchburn.quant import QuantizedLinear


@pytest.mark.parametrize("quant_type,group,symmetric", [
    ("int8", None, True), ("int8", 32, True), ("int4", 32, True), ("int4", 16, False),
])
def test_quantized_linear_on_gpu(gpu, quant_type: str, group: Optional[int], symmetric: bool) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24)
    layer = QuantizedLinear.from_float(lin, quant_type, group, symmetric, torch.float16)
    check_gpu(layer, torch.randn(3, 64), rtol=1e-4, atol=1e-4)


def kernel_summaries(reports: list) -> list[str]:  # type: ignore[type-arg]
    return [k for r in reports for sg in r.subgraphs for k in sg.kernels]


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_block_weights_on_gpu(gpu, name: str) -> None:  # type: ignore[no-untyped-def]
    """Weights in ggml blocks (`qlinear` kind "blocks"): the plain form generated from the
    block table, on the wgpu engine, equal to the eager op; one row of x (a decode step) takes
    the `blocks` form of the rows mapping (`passes/gpu/block_rows.py`)."""
    from tests.quant.test_block_types import random_blocks
    from torchburn.ir.qblocks import BLOCK_TYPES
    from torchburn.quant import BlockWeight
    from torchburn.quant.blocks import dequantize_blocks

    bt = BLOCK_TYPES[name]
    raw = random_blocks(name, 24, 256 // bt.block, 0)
    layer = QuantizedLinear.from_weight(BlockWeight(torch.from_numpy(raw), name), torch.randn(24))
    check_gpu(layer, torch.randn(3, 256), rtol=1e-4, atol=1e-4)
    # one row: the row's invocations sum in another order than eager (blocks interleaved), so
    # the bound is f32 rounding of the sum of |x| |w| (random scales cancel a lot)
    x = torch.randn(1, 256)
    magnitude = float((x.abs() @ dequantize_blocks(BlockWeight(layer.blocks, name)).abs().t()).max())
    reports = check_gpu(layer, x, rtol=0, atol=1e-5 * magnitude)
    assert any("rows/blocks" in k for k in kernel_summaries(reports)), kernel_summaries(reports)


@pytest.mark.parametrize("name,blocks,lanes", [("Q4_0", 3, 0), ("Q8_0", 5, 64), ("Q4_0", 7, 64), ("Q8_0", 2, 128)])
def test_block_rows_with_a_partial_last_step(gpu, name: str, blocks: int, lanes: int) -> None:  # type: ignore[no-untyped-def]
    """A row's invocations take several blocks a step (32 lanes of 16-element loops: 2; 64 lanes
    of 32: 2; 128 of 32: 4): a block count that is not a multiple leaves invocations idle in the
    last step, and rows past the end idle in the last workgroup; the sum is still exact."""
    from tests.quant.test_block_types import random_blocks
    from torchburn.quant import BlockWeight

    raw = random_blocks(name, 33, blocks, 2)
    layer = QuantizedLinear.from_weight(BlockWeight(torch.from_numpy(raw), name), None)
    x = torch.randn(1, 32 * blocks)
    with torch.no_grad():
        expected = layer(x)
    options = {"passes": {"before-codegen": [f"gpu-map{{row_lanes={lanes}}}"]}} if lanes else None
    out, reports = run_compiled(layer, x, options=options)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert any("rows/blocks" in k for k in kernel_summaries(reports)), kernel_summaries(reports)


@pytest.mark.parametrize("quant_type", ["int8", "int4"])
def test_decode_products_share_workgroups(gpu, quant_type: str) -> None:  # type: ignore[no-untyped-def]
    """One row of x against 96 outputs (a decode step's product): a row of invocations per
    output, several outputs a workgroup, the weight's bytes packed four to a word; int4 takes
    the blocks form over its groups (`build_qlinear_grouped`: a group's scale once, then four
    bytes, one packed word, and four f32 of x an invocation and loop)."""
    torch.manual_seed(1)
    layer = QuantizedLinear.from_float(torch.nn.Linear(512, 96), quant_type, 32, True, torch.float16)
    reports = check_gpu(layer, torch.randn(1, 512), rtol=1e-4, atol=1e-4)
    form = "k0: rows/blocks/vec4" if quant_type == "int4" else "k0: rows/"
    assert any(k.startswith(form) for k in kernel_summaries(reports)), kernel_summaries(reports)


class NormThenProduct(torch.nn.Module):
    """A decoder's RMSNorm feeding a quantized product (q/k/v or gate/up of a decode step):
    `gpu-inline-rows` puts the norm's statistics inside the product's kernel."""

    def __init__(self, layer: torch.nn.Module, k: int) -> None:
        super().__init__()
        self.norm = torch.nn.RMSNorm(k, eps=1e-5)
        torch.nn.init.uniform_(self.norm.weight, 0.5, 1.5)
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(self.norm(x))


@pytest.mark.parametrize("quant_type,block", [("int4", None), ("int8", None), ("Q4_K", "Q4_K"), ("Q8_0", "Q8_0")])
def test_norm_inside_a_block_product_keeps_the_blocks_form(gpu, quant_type: str, block: Optional[str]) -> None:  # type: ignore[no-untyped-def]
    """A norm inlined into a block product (int4 and int8 by groups, ggml blocks): the norm's
    sum of squares runs over the row's invocations first, then the blocks (`_row_reduction` in
    `passes/gpu/block_rows.py`); before, such a kernel left the rows mapping and ran as
    workgroups over a tree (240 us a product on the H100, 11 ms an int4 decode step). Grouped
    int8 (the head of an int4 model) took the flat form without vec4 loads (`k // 32` in the
    scale's index): 347 us for Qwen2.5-0.5B's head on the H100."""
    torch.manual_seed(2)
    k = 512
    x = torch.randn(1, 1, k)
    if block is None:
        layer = QuantizedLinear.from_float(torch.nn.Linear(k, 80), quant_type, 32, True, torch.float16)
        model = NormThenProduct(layer, k)
        reports = check_gpu(model, x, rtol=1e-4, atol=1e-4)
    else:
        from tests.quant.test_block_types import random_blocks
        from torchburn.ir.qblocks import BLOCK_TYPES
        from torchburn.quant import BlockWeight
        from torchburn.quant.blocks import dequantize_blocks

        raw = random_blocks(block, 80, k // BLOCK_TYPES[block].block, 3)
        layer = QuantizedLinear.from_weight(BlockWeight(torch.from_numpy(raw), block), None)
        model = NormThenProduct(layer, k)
        # random scales cancel a lot: the bound is f32 rounding of the sum of |x| |w|
        with torch.no_grad():
            w = dequantize_blocks(BlockWeight(layer.blocks, block)).abs()
            magnitude = float((model.norm(x).abs() @ w.t()).max())
        reports = check_gpu(model, x, rtol=0, atol=1e-5 * magnitude)
    summaries = kernel_summaries(reports)
    assert len(summaries) == 1 and summaries[0].startswith("k1_k0: rows/blocks"), summaries
    if quant_type in ("int4", "int8"):
        assert summaries[0].startswith("k1_k0: rows/blocks/vec4"), summaries


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


def test_inference_weights_are_not_kept_on_the_gpu(gpu) -> None:  # type: ignore[no-untyped-def]
    """The GPU engine's launchers pass no `refresh`, so `keep-constant-prep` does not run for
    it: an f16 weight's cast before a prefill's GEMM stays a grid kernel (guarded by `if
    refresh != 0` it had lost its mapping and ran in one invocation: 190-340 ms to a first
    token on the H100 instead of ~30)."""
    from torchburn.llm.model.decoder import HalfLinear

    torch.manual_seed(3)
    layer = HalfLinear(128, 256, bias=False)
    layer.weight.data = torch.randn(256, 128).half()
    reports = check_gpu(layer, torch.randn(64, 128), rtol=1e-4, atol=1e-4)
    summaries = kernel_summaries(reports)
    assert not any(k.split(": ")[1].startswith("single") for k in summaries), summaries
