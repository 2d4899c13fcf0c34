"""Our `Decoder` against transformers on tiny random Llama, Qwen2, Qwen3, Mistral, Gemma 2,
Gemma 3 and Phi-3 checkpoints: prefill logits and 16 decode steps, batch 1 and a left-padded
batch 2, eager and compiled with the torchburn backend."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from torchburn.llm.model.safetensors_loader import load_safetensors_model

from .conftest import VOCAB, assert_same_logits, hf_logits, our_logits

ARCHS = ["llama", "qwen2", "qwen3", "mistral", "gemma2", "gemma3", "phi3"]
BATCHES = {1: [[5, 17, 99, 250, 3, 41, 7, 8, 200, 13]],
           2: [[5, 17, 99, 250, 3, 41, 7, 8, 200, 13], [44, 12, 300, 9]]}


def _decode_tokens(batch: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(7)
    return torch.randint(3, VOCAB, (batch, 16), generator=g)


@pytest.mark.parametrize("batch", [1, 2])
@pytest.mark.parametrize("arch", ARCHS)
def test_eager_logits_match_transformers(tiny_checkpoint, arch: str, batch: int) -> None:
    hf, folder = tiny_checkpoint(arch)
    ours = load_safetensors_model(folder, None)
    rows, steps = BATCHES[batch], _decode_tokens(batch)
    assert_same_logits(our_logits(ours, ours, rows, steps), hf_logits(hf, rows, steps), rows)


COMPILED = [("llama", 1), ("llama", 2), ("qwen2", 2), ("qwen3", 2), ("mistral", 2), ("gemma2", 2),
            ("gemma3", 2), ("phi3", 2)]


@pytest.mark.parametrize("arch,batch", COMPILED)
def test_compiled_logits_match_transformers(tiny_checkpoint, arch: str, batch: int) -> None:
    hf, folder = tiny_checkpoint(arch)
    ours = load_safetensors_model(folder, None)

    def step(*args):  # type: ignore[no-untyped-def]
        return ours(*args)

    compiled = torch.compile(step, backend="torchburn", dynamic=False)
    rows, steps = BATCHES[batch], _decode_tokens(batch)
    assert_same_logits(our_logits(compiled, ours, rows, steps, dynamic=True),
                       hf_logits(hf, rows, steps), rows)


def test_sliding_window_is_used(tiny_checkpoint) -> None:
    """The Mistral window (6) is shorter than the test sequence, so ignoring it would fail."""
    hf, folder = tiny_checkpoint("mistral")
    ours = load_safetensors_model(folder, None)
    assert {layer.self_attn.window for layer in ours.layers} == {6}
    rows, steps = BATCHES[1], _decode_tokens(1)
    for layer in ours.layers:
        layer.self_attn.window = None
    with pytest.raises(AssertionError):
        assert_same_logits(our_logits(ours, ours, rows, steps), hf_logits(hf, rows, steps), rows)


def _no_attn_softcap(model):  # type: ignore[no-untyped-def]
    for layer in model.layers:
        layer.self_attn.softcap = None


def _no_window(model):  # type: ignore[no-untyped-def]
    for layer in model.layers:
        layer.self_attn.window = None


def _no_local_rope(model):  # type: ignore[no-untyped-def]
    for layer in model.layers:
        layer.self_attn.local_rope = False


def _short_rope_only(model):  # type: ignore[no-untyped-def]
    model.inv_freq_long = model.inv_freq


def _config(**changes):  # type: ignore[no-untyped-def]
    def change(model):  # type: ignore[no-untyped-def]
        model.config = replace(model.config, **changes)
    return change


def _norms_minus_one(model):  # type: ignore[no-untyped-def]
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            p.data -= 1.0


FEATURES = [
    ("gemma2", "attention soft-capping", _no_attn_softcap),
    ("gemma2", "final soft-capping", _config(final_logit_softcapping=None)),
    ("gemma2", "embedding scale", _config(embed_scale=1.0)),
    ("gemma2", "sliding window", _no_window),
    ("gemma2", "norm weights stored as w for 1 + w", _norms_minus_one),
    ("gemma3", "local rope base", _no_local_rope),
    ("gemma3", "sliding window", _no_window),
    ("phi3", "long rope factors", _short_rope_only),
    ("phi3", "sliding window", _no_window),
]


@pytest.mark.parametrize("arch,feature,change", FEATURES, ids=[f"{a}-{f}" for a, f, _ in FEATURES])
def test_family_features_are_used(tiny_checkpoint, arch: str, feature: str, change) -> None:  # type: ignore[no-untyped-def]
    """Each family's particular feature changes the tiny model's logits beyond the tolerance of
    the agreement tests, so their passing says each one is implemented as transformers has it."""
    hf, folder = tiny_checkpoint(arch)
    ours = load_safetensors_model(folder, None)
    rows, steps = BATCHES[2], _decode_tokens(2)
    ref = hf_logits(hf, rows, steps)
    assert_same_logits(our_logits(ours, ours, rows, steps), ref, rows)
    change(ours)
    with pytest.raises(AssertionError):
        assert_same_logits(our_logits(ours, ours, rows, steps), ref, rows)


@pytest.mark.parametrize("quant,atol", [("int8", 0.05), ("int4", 0.3)])
def test_quantized_on_load_stays_close(tiny_checkpoint, quant: str, atol: float) -> None:
    from torchburn.quant import QuantizedLinear

    hf, folder = tiny_checkpoint("qwen2")
    ours = load_safetensors_model(folder, quant)
    kinds = {m.quant_type for m in ours.modules() if isinstance(m, QuantizedLinear)}
    assert kinds == ({"int8"} if quant == "int8" else {"int8", "int4"})
    assert type(ours.embed_tokens).__name__ == "QuantizedEmbedding"
    assert ours.lm_head.qweight is ours.embed_tokens.qweight  # tied: one copy of the bytes
    rows, steps = BATCHES[1], _decode_tokens(1)[:, :2]
    got, ref = our_logits(ours, ours, rows, steps), hf_logits(hf, rows, steps)
    err = max((a - b).abs().max().item() for a, b in zip(got[1:], ref[1:]))
    assert 0 < err < atol


def test_sharded_checkpoint_loads(tiny_checkpoint, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """``model.safetensors.index.json`` with several shards gives the same model."""
    hf, _ = tiny_checkpoint("qwen3")
    hf.save_pretrained(tmp_path, safe_serialization=True, max_shard_size="100KB")
    assert (tmp_path / "model.safetensors.index.json").is_file()
    assert len(list(tmp_path.glob("*.safetensors"))) > 1
    ours = load_safetensors_model(tmp_path, None)
    rows, steps = BATCHES[1], _decode_tokens(1)[:, :2]
    assert_same_logits(our_logits(ours, ours, rows, steps), hf_logits(hf, rows, steps), rows)


def test_compiled_int4_model_matches_its_eager_run(tiny_checkpoint, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """Quantized linears and the INT8 embedding/head compile too (float activations: exact)."""
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")
    reload_config()
    try:
        _, folder = tiny_checkpoint("llama")
        ours = load_safetensors_model(folder, "int4")

        def step(*args):  # type: ignore[no-untyped-def]
            return ours(*args)

        compiled = torch.compile(step, backend="torchburn", dynamic=False)
        rows, steps = BATCHES[1], _decode_tokens(1)[:, :3]
        expected = our_logits(ours, ours, rows, steps)
        got = our_logits(compiled, ours, rows, steps, dynamic=True)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, atol=1e-4, rtol=0)
    finally:
        monkeypatch.undo()
        reload_config()


def test_decode_step_has_one_attention_kernel_per_layer(tiny_checkpoint) -> None:
    """The decode step's attention (cache + new key, GQA, masks) is one kernel per layer: no
    matmul, softmax or reduction kernel comes from `Attention.forward` besides it."""
    from torchburn.llm import LLM
    from torchburn.llm.cli.profile import profile_decode

    _, folder = tiny_checkpoint("llama")
    llm = LLM.from_pretrained(folder, device="cpu", max_context=64)
    prof = profile_decode(llm, steps=1, filled=8)
    origins = [dict(prof.program.kernel(c.kernel).attrs).get("origin", "") for c in prof.program.calls]
    attn = [o for o in origins if "torchburn.attention" in o]
    assert len(attn) == llm.config.num_hidden_layers == 2, origins
    assert not [o for o in origins if "Attention.forward" in o and "torchburn.attention" not in o
                and any(op in o for op in ("aten.amax", "aten.exp", "aten.bmm", "aten.mm", "aten.sum"))], origins


@pytest.mark.parametrize("quant,atol", [("int8", 0.05), ("int4", 0.3)])
def test_phi3_fused_tensors_quantize_on_load(tiny_checkpoint, quant: str, atol: float) -> None:
    """Phi-3 stores q/k/v and gate/up fused: they are quantized as they come, one linear each."""
    from torchburn.quant import QuantizedLinear

    hf, folder = tiny_checkpoint("phi3")
    ours = load_safetensors_model(folder, quant)
    for layer in ours.layers:
        assert isinstance(layer.self_attn.qkv_proj, QuantizedLinear) and layer.self_attn.q_proj is None
        assert isinstance(layer.mlp.gate_up_proj, QuantizedLinear) and layer.mlp.gate_proj is None
        assert layer.self_attn.qkv_proj.quant_type == quant
    rows, steps = BATCHES[1], _decode_tokens(1)[:, :2]
    got, ref = our_logits(ours, ours, rows, steps), hf_logits(hf, rows, steps)
    err = max((a - b).abs().max().item() for a, b in zip(got[1:], ref[1:]))
    assert 0 < err < atol
