"""A GGUF written by gguf-py with a different block type nearly every tensor (random valid
blocks; no quantizer needed): each weight is kept in its type (Q6_K tied embedding and head,
K-quants and Q5_x as blocks, Q4_x/Q8_0 as our INT4/INT8), alike siblings fuse and unlike ones
stay apart, the logits equal those of a float copy holding gguf-py's dequantized weights, and
the weight cache maps the blocks back."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from tests.llm.conftest import full_logits
from tests.quant.test_block_types import random_blocks
from torchburn.ir.qblocks import BLOCK_TYPES
from torchburn.quant import BlockEmbedding, QuantizedLinear

gguf = pytest.importorskip("gguf")

HIDDEN, FFN, VOCAB = 256, 512, 96
#: per layer: GGUF tensor -> type
LAYER_TYPES = [
    {"attn_q": "Q4_K", "attn_k": "Q4_K", "attn_v": "Q4_K", "attn_output": "Q5_0",
     "ffn_gate": "Q3_K", "ffn_up": "Q2_K", "ffn_down": "Q5_1"},
    {"attn_q": "Q5_K", "attn_k": "Q5_K", "attn_v": "Q6_K", "attn_output": "Q8_0",
     "ffn_gate": "Q4_1", "ffn_up": "Q4_1", "ffn_down": "Q4_0"},
]
SHAPES = {"attn_q": (HIDDEN, HIDDEN), "attn_k": (128, HIDDEN), "attn_v": (128, HIDDEN),
          "attn_output": (HIDDEN, HIDDEN), "ffn_gate": (FFN, HIDDEN), "ffn_up": (FFN, HIDDEN),
          "ffn_down": (HIDDEN, FFN)}


def _blocks(name: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """Random `name` blocks of a weight `shape`, scales scaled to weights of about
    1 / sqrt(in) (the f16 fields of `random_blocks` range over several decades)."""
    bt = BLOCK_TYPES[name]
    raw = random_blocks(name, shape[0], shape[1] // bt.block, seed)
    w = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])
    rescale = 1.0 / (np.sqrt(shape[1]) * max(float(np.abs(w).mean()), 1e-6))
    from torchburn.ir.qblocks import f16_offsets

    blocks = raw.reshape(shape[0], -1, bt.nbytes)
    for o in f16_offsets(bt):
        half = blocks[:, :, o:o + 2].copy().view(np.float16)
        blocks[:, :, o:o + 2] = (half.astype(np.float32) * rescale).astype(np.float16).view(np.uint8)
    return blocks.reshape(shape[0], -1)


def write_mixed(path: Path) -> dict[str, tuple[str, np.ndarray]]:
    """The file, and each GGUF tensor's (type, float32 weight as gguf-py dequantizes it)."""
    w = gguf.GGUFWriter(str(path), "llama")
    for add, value in [(w.add_block_count, 2), (w.add_context_length, 64), (w.add_embedding_length, HIDDEN),
                       (w.add_feed_forward_length, FFN), (w.add_head_count, 4), (w.add_head_count_kv, 2)]:
        add(value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([chr(ord("a") + i % 26) * (1 + i // 26) for i in range(VOCAB)])
    w.add_token_types([1] * VOCAB)
    dense: dict[str, tuple[str, np.ndarray]] = {}

    def put(name: str, kind: str, shape: tuple[int, int], seed: int) -> None:
        raw = _blocks(kind, shape, seed)
        qtype = gguf.GGMLQuantizationType[kind]
        w.add_tensor(name, raw, raw_dtype=qtype)
        dense[name] = (kind, gguf.quants.dequantize(raw, qtype))

    put("token_embd.weight", "Q6_K", (VOCAB, HIDDEN), 0)
    for i, types in enumerate(LAYER_TYPES):
        for j, (t, kind) in enumerate(types.items()):
            put(f"blk.{i}.{t}.weight", kind, SHAPES[t], 10 * i + j + 1)
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(HIDDEN, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dense


def float_twin(model: nn.Module) -> nn.Module:
    """A copy of `model` with every quantized module replaced by its float32 dequantization
    (`dequantize_*` of its weight: gguf-py's values)."""
    import copy

    from torchburn.quant import dequantize_blocks, dequantize_int4, dequantize_int8
    from torchburn.quant.blocks import BlockWeight
    from torchburn.quant.layouts import Int8Weight

    twin = copy.deepcopy(model)

    def dense(weight: Any) -> torch.Tensor:
        if isinstance(weight, BlockWeight):
            return dequantize_blocks(weight)
        return dequantize_int8(weight) if isinstance(weight, Int8Weight) else dequantize_int4(weight)

    for name, module in list(twin.named_modules()):
        parent_name, _, attr = name.rpartition(".")
        parent = twin.get_submodule(parent_name) if parent_name else twin
        if isinstance(module, QuantizedLinear):
            lin = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            lin.weight = nn.Parameter(dense(module.quantized_weight()), requires_grad=False)
            if module.bias is not None:
                lin.bias = nn.Parameter(module.bias.detach().clone(), requires_grad=False)
            setattr(parent, attr, lin)
        elif isinstance(module, BlockEmbedding):
            emb = nn.Embedding(*dequantize_blocks(module.weight_blocks()).shape)
            emb.weight = nn.Parameter(dequantize_blocks(module.weight_blocks()), requires_grad=False)
            setattr(parent, attr, emb)
    return twin


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, tuple[str, np.ndarray]]]:
    path = tmp_path_factory.mktemp("mixed") / "mixed.gguf"
    return path, write_mixed(path)


def test_each_tensor_keeps_its_type(mixed: Any) -> None:
    from torchburn.llm.model.gguf_loader import load_gguf_model

    path, dense = mixed
    model, _ = load_gguf_model(path, None)
    assert isinstance(model.embed_tokens, BlockEmbedding) and model.embed_tokens.block_type == "Q6_K"
    head = model.lm_head
    assert isinstance(head, QuantizedLinear) and head.block_type == "Q6_K"
    assert head.blocks.data_ptr() == model.embed_tokens.blocks.data_ptr(), "the tied head reads the embedding's bytes"
    first, second = model.layers
    qkv = first.self_attn.qkv_proj                                   # Q4_K, alike: fused
    assert (qkv.quant_type, qkv.group_size) == ("int4", 32)          # imported as int4 (import_gguf_q4_k)
    assert first.mlp.gate_up_proj is None                            # Q3_K and Q2_K: apart
    assert (first.mlp.gate_proj.block_type, first.mlp.up_proj.block_type) == ("Q3_K", "Q2_K")
    assert first.self_attn.o_proj.block_type == "Q5_0" and first.mlp.down_proj.block_type == "Q5_1"
    assert second.self_attn.qkv_proj is None and second.self_attn.v_proj.block_type == "Q6_K"
    assert second.self_attn.o_proj.quant_type == "int8" and second.mlp.gate_up_proj.quant_type == "int4"
    assert not [n for n, m in model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
    # the embedding dequantizes exactly the rows asked for
    ids = torch.tensor([[5, 0, 95]])
    torch.testing.assert_close(model.embed_tokens(ids)[0], torch.from_numpy(dense["token_embd.weight"][1][[5, 0, 95]]),
                               rtol=0, atol=0)


def test_logits_equal_the_float_twin(mixed: Any) -> None:
    from torchburn.llm.model.gguf_loader import load_gguf_model

    path, _ = mixed
    model, _ = load_gguf_model(path, None)
    twin = float_twin(model)
    ids = torch.tensor([[3, 14, 15, 92, 65, 35, 8, 9, 79]])
    with torch.no_grad():
        ours, ref = full_logits(model, ids), full_logits(twin, ids)
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-4)
    assert float(ref.std()) > 0.1


def test_weight_cache_maps_the_blocks_back(mixed: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torchburn.llm import LLM
    from torchburn.llm.model import weight_cache as wc
    from torchburn.runtime import config

    path, _ = mixed
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path / "cache"))
    config.reload_config()
    try:
        first = LLM.from_pretrained(path, device="cpu", compile=False)
        hits = wc.STATS.hits
        second = LLM.from_pretrained(path, device="cpu", compile=False)
        assert wc.STATS.hits == hits + 1
    finally:
        monkeypatch.undo()
        config.reload_config()
    assert isinstance(second.model.embed_tokens, BlockEmbedding)
    blocks = second.model.layers[0].mlp.gate_proj.blocks  # Q3_K: kept as the file's blocks
    assert not blocks.untyped_storage().resizable(), "mapped from the cache file, not copied"
    assert torch.equal(blocks, first.model.layers[0].mlp.gate_proj.blocks)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        torch.testing.assert_close(full_logits(second.model, ids), full_logits(first.model, ids), rtol=0, atol=0)


def test_compiled_steps_are_one_native_call(mixed: Any) -> None:
    """The Q6_K token embedding compiles with the rest (gathered rows, decoded: `embedding_blocks`'
    lowering), so each step is one native call that the step cache learns; before, the
    embedding stayed in PyTorch and every step of a K-quant GGUF model went through Dynamo
    (a warm start of an 8B file spent ~50 s there). The tokens are the eager model's."""
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams

    path, _ = mixed
    rows = [[3, 14, 15, 92, 65]]
    greedy = SamplingParams(temperature=0.0)
    eager = LLM.from_pretrained(path, device="cpu", compile=False, max_context=32)
    compiled = LLM.from_pretrained(path, device="cpu", compile=True, max_context=32)
    for llm in (eager, compiled):
        llm.eos_ids = frozenset()
    want = [s[0] for s in eager.generate_ids(rows, 4, greedy)]
    assert [s[0] for s in compiled.generate_ids(rows, 4, greedy)] == want
    assert compiled.steps is not None
    assert compiled.steps.stats.recorded == 2 and compiled.steps.stats.unplannable == 0, compiled.steps.stats
