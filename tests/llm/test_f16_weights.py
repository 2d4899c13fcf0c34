"""`quant="f16"`: the float linears and the token embedding stored as float16, multiplied in
float32 (`HalfLinear`, `HalfEmbedding`): loaded, fused and tied as float weights are, read back
from the weight cache alike, refused on the CPU engine; in eager PyTorch the model computes
exactly what the float32 model computes on the same weights rounded to float16 (the GPU
engine's decode against the CPU engine's: tests/llm/test_gpu_decode_agreement.py)."""
from __future__ import annotations

import copy

import pytest
import torch

from .conftest import tiny_tokenizer


def _rounded_checkpoint(tiny_checkpoint, tmp_path, arch: str = "llama"):  # type: ignore[no-untyped-def]
    """The tiny checkpoint with every weight rounded to float16 (saved as float32)."""
    model, _ = tiny_checkpoint(arch)
    rounded = copy.deepcopy(model)
    with torch.no_grad():
        for p in rounded.parameters():
            p.copy_(p.half().float())
    folder = tmp_path / f"rounded_{arch}"
    rounded.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer(folder)
    return folder


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_f16_weights_compute_the_rounded_float_model(tiny_checkpoint, tmp_path, arch: str) -> None:
    from torchburn.llm.model.decoder import HalfEmbedding, HalfLinear
    from torchburn.llm.model.safetensors_loader import load_safetensors_model

    folder = _rounded_checkpoint(tiny_checkpoint, tmp_path, arch)
    half = load_safetensors_model(folder, "f16")
    full = load_safetensors_model(folder, None)
    linears = [m for m in half.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is HalfLinear and m.weight.dtype == torch.float16 for m in linears)
    assert type(half.embed_tokens) is HalfEmbedding and half.embed_tokens.weight.dtype == torch.float16
    # sibling projections fused as for float32 weights (q, k, v as one; gate and up as one)
    assert half.layers[0].self_attn.qkv_proj is not None and half.layers[0].mlp.gate_up_proj is not None
    assert all(p.dtype == torch.float32 for n, p in half.named_parameters() if "norm" in n or n.endswith("bias"))
    if half.config.tie_word_embeddings:
        assert half.lm_head.weight is half.embed_tokens.weight
    ids = torch.tensor([[5, 17, 99, 3]])
    with torch.no_grad():
        a = half(ids, *_step_args(half, ids))[0]
        b = full(ids, *_step_args(full, ids))[0]
    assert a.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def _step_args(model, ids):  # type: ignore[no-untyped-def]
    """positions, slots, starts, an empty cache and no logit index for one prefill."""
    n = ids.shape[1]
    cache = model.new_cache(1, 16)
    return (torch.arange(n)[None], torch.arange(n), torch.zeros(1, dtype=torch.long), cache.past(0, n), None)


def test_f16_is_refused_on_the_cpu_engine(tiny_checkpoint) -> None:
    from torchburn.llm import LLM

    _, folder = tiny_checkpoint("llama")
    with pytest.raises(ValueError, match="f16.*GPU engine"):
        LLM.from_pretrained(folder, device="cpu", quant="f16")
    with pytest.raises(ValueError, match="'f16'"):
        LLM.from_pretrained(folder, device="cpu", quant="f8")


def test_f16_weights_from_the_weight_cache(tiny_checkpoint, tmp_path, monkeypatch) -> None:
    from torchburn.llm.model.decoder import HalfLinear
    from torchburn.llm.model.safetensors_loader import load_safetensors_model
    from torchburn.llm.model.weight_cache import STATS, cached_load
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path / "cache"))
    reload_config()
    try:
        _, folder = tiny_checkpoint("llama")
        build = lambda record: (load_safetensors_model(folder, "f16", record), {})  # noqa: E731
        first, _ = cached_load(folder, "f16", build)
        hits = STATS.hits
        again, _ = cached_load(folder, "f16", build)
        assert STATS.hits == hits + 1
        for model in (first, again):
            qkv = model.layers[0].self_attn.qkv_proj
            assert type(qkv) is HalfLinear and qkv.weight.dtype == torch.float16
        torch.testing.assert_close(again.layers[1].mlp.down_proj.weight, first.layers[1].mlp.down_proj.weight)
    finally:
        monkeypatch.undo()
        reload_config()
