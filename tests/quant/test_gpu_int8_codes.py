"""GGUF Q5_0 and Q6_K blocks as grouped INT8 codes for the GPU engine
(`quant/blocks.block_rows_as_int8`, `llm/model/gpu_weights.lay_out_for_gpu`): the same float32
weights bit for bit, and a model's linears converted and stacked where they became alike."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from tests.quant.test_block_types import random_blocks
from torchburn.quant import BlockWeight, QuantizedLinear
from torchburn.llm.model.gpu_weights import GPU_INT8_CODES
from torchburn.quant.blocks import block_rows_as_int8


def _dequantized(w: object) -> torch.Tensor:
    q, s = w.qweight, w.scales  # type: ignore[attr-defined]
    return (q.float().reshape(q.shape[0], s.shape[1], -1) * s.float()[:, :, None]).reshape(q.shape)


@pytest.mark.parametrize("name", sorted(GPU_INT8_CODES))
@pytest.mark.parametrize("seed", range(4))
def test_codes_hold_ggmls_weights_bit_for_bit(name: str, seed: int) -> None:
    """Random blocks (normal, subnormal, zero and negative float16 scales): the int8 codes times
    their scales are gguf-py's dequantized weights, bit for bit."""
    raw = random_blocks(name, 5, 3, seed)
    w = block_rows_as_int8(torch.from_numpy(raw), name)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    got = _dequantized(w).numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
    assert int(w.qweight.min()) >= (-16 if name == "Q5_0" else -32)
    assert int(w.qweight.max()) <= (15 if name == "Q5_0" else 31)


@pytest.mark.parametrize("name", sorted(GPU_INT8_CODES))
def test_rows_converted_in_chunks_are_the_rows_converted_at_once(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchburn.quant import blocks

    raw = torch.from_numpy(random_blocks(name, 7, 2, 9))
    whole = block_rows_as_int8(raw, name)
    monkeypatch.setattr(blocks, "CONVERT_ROWS", 3)  # 7 rows: chunks of 3, 3 and 1
    chunked = block_rows_as_int8(raw, name)
    assert torch.equal(whole.qweight, chunked.qweight) and torch.equal(whole.scales, chunked.scales)


def test_wrong_bytes_are_refused() -> None:
    with pytest.raises(ValueError, match="Q5_0 rows of 23 bytes are not whole blocks"):
        block_rows_as_int8(torch.zeros(2, 23, dtype=torch.uint8), "Q5_0")
    with pytest.raises(ValueError, match="Q5_1 weights have offsets"):  # d q + m: not symmetric
        block_rows_as_int8(torch.zeros(2, 24, dtype=torch.uint8), "Q5_1")


def test_a_model_is_laid_out_for_the_gpu() -> None:
    """q and k in Q5_0 beside a v in Q8_0 (our int8, group 32, float16 scales): converted, the
    three are alike and become one QKV linear; the down projection in Q6_K becomes int8 with
    16-weight groups; the layer computes what it did."""
    from torch import nn

    from torchburn.llm.model.gpu_weights import lay_out_for_gpu

    def blocks(name: str, rows: int, k: int, seed: int) -> QuantizedLinear:
        raw = random_blocks(name, rows, k // GPU_BLOCK[name], seed)
        return QuantizedLinear.from_weight(BlockWeight(torch.from_numpy(raw), name))

    GPU_BLOCK = {"Q5_0": 32, "Q6_K": 256}
    v_raw = random_blocks("Q8_0", 64, 8, 3)
    from torchburn.quant import import_gguf_q8_0

    attn = nn.Module()
    attn.q_proj, attn.k_proj = blocks("Q5_0", 256, 256, 1), blocks("Q5_0", 64, 256, 2)
    attn.v_proj = QuantizedLinear.from_weight(import_gguf_q8_0(v_raw, (64, 256)))
    attn.qkv_proj = None
    mlp = nn.Module()
    mlp.gate_proj, mlp.up_proj, mlp.down_proj = (blocks("Q5_0", 512, 256, 4), blocks("Q5_0", 512, 256, 5),
                                                 blocks("Q6_K", 256, 512, 6))
    mlp.gate_up_proj = None
    layer = nn.Module()
    layer.self_attn, layer.mlp = attn, mlp
    model = nn.Module()
    model.layers = nn.ModuleList([layer])
    attn.v_proj.bias = torch.randn(64)  # biases (as Qwen2's q, k, v) go with their rows
    attn.q_proj.bias, attn.k_proj.bias = torch.randn(256), torch.randn(64)
    x, h = torch.randn(3, 256), torch.randn(3, 512)
    before = [attn.q_proj(x), attn.k_proj(x), attn.v_proj(x), mlp.gate_proj(x), mlp.up_proj(x), mlp.down_proj(h)]
    assert lay_out_for_gpu(model) == 5
    assert attn.q_proj is None and attn.qkv_proj.quant_type == "int8" and attn.qkv_proj.group_size == 32
    assert mlp.gate_up_proj.quant_type == "int8" and mlp.down_proj.group_size == 16
    qkv, gate_up = attn.qkv_proj(x), mlp.gate_up_proj(x)
    after = [*qkv.split([256, 64, 64], -1), *gate_up.split([512, 512], -1), mlp.down_proj(h)]
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_blocks_fused_at_load_and_a_tied_head_on_the_embeddings_blocks() -> None:
    """A QKV linear the loader already stacked (all Q5_0) is converted whole; a head that runs
    on the token embedding's own Q6_K blocks keeps them (no second copy of the vocabulary)."""
    from torch import nn

    from torchburn.llm.model.fuse import stack_linears
    from torchburn.llm.model.gpu_weights import lay_out_for_gpu
    from torchburn.quant import BlockEmbedding

    parts = [QuantizedLinear.from_weight(BlockWeight(torch.from_numpy(random_blocks("Q5_0", n, 8, n)), "Q5_0"))
             for n in (256, 64, 64)]
    attn = nn.Module()
    attn.qkv_proj = stack_linears(parts)
    x = torch.randn(2, 256)
    before = attn.qkv_proj(x)
    table = BlockWeight(torch.from_numpy(random_blocks("Q6_K", 320, 1, 11)), "Q6_K")
    model = nn.Module()
    model.attn = attn
    model.embed_tokens = BlockEmbedding(table)
    model.lm_head = QuantizedLinear.from_weight(table)
    assert lay_out_for_gpu(model) == 1
    assert attn.qkv_proj.quant_type == "int8"
    torch.testing.assert_close(attn.qkv_proj(x), before, rtol=1e-5, atol=1e-5)
    assert model.lm_head.block_type == "Q6_K" and model.lm_head.blocks is table.blocks
