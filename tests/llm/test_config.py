"""Configs: families, rope scaling against transformers' definitions, clear errors."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from torchburn.llm.model.config import ConfigError, from_hf_dict
from torchburn.llm.model.rope import dynamic_inv_freq, rope_parameters

from .conftest import COMMON, hf_config, transformers

ROPES = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
     "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
     "beta_fast": 16.0, "mscale": 1.0, "mscale_all_dim": 0.5},
]


@pytest.mark.parametrize("rope", ROPES, ids=lambda r: r["rope_type"])
def test_rope_scaling_matches_transformers(rope: dict) -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = transformers.LlamaConfig(**COMMON, rope_parameters={"rope_theta": 10000.0, **rope})
    ours = from_hf_dict(cfg.to_dict())
    ref_inv, ref_scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](cfg, "cpu")
    inv, scale = rope_parameters(ours)
    if rope["rope_type"] == "dynamic":
        ref_inv, _ = ROPE_INIT_FUNCTIONS["dynamic"](cfg, "cpu", seq_len=700)
        inv = dynamic_inv_freq(ours, torch.tensor(700))
    torch.testing.assert_close(inv, ref_inv.float(), rtol=1e-6, atol=0)
    assert scale == pytest.approx(ref_scale)


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_family_fields(arch: str) -> None:
    c = from_hf_dict(hf_config(arch).to_dict())
    assert c.qkv_bias == (arch == "qwen2") and not c.o_bias
    assert c.qk_norm == (arch == "qwen3")
    assert c.layer_windows == ((6, 6) if arch == "mistral" else (None, None))
    assert c.head_dim == (32 if arch == "qwen3" else 16)


def test_unknown_architecture_names_the_supported_ones() -> None:
    with pytest.raises(ConfigError, match="unsupported architecture 'gpt_neox'.*llama, mistral, qwen2, qwen3"):
        from_hf_dict({"model_type": "gpt_neox", "hidden_size": 8})


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "num_hidden_layers",
                                 "vocab_size", "intermediate_size", "rms_norm_eps"])
def test_missing_config_key_is_named(key: str) -> None:
    cfg = hf_config("llama").to_dict()
    del cfg[key]
    with pytest.raises(ConfigError, match=f"missing the key '{key}'"):
        from_hf_dict(cfg)


def test_wrong_safetensors_shapes_fail_before_loading(tiny_checkpoint, tmp_path: Path) -> None:
    """A config that disagrees with the tensors fails on the header check, naming the tensor."""
    import shutil

    from torchburn.llm.model.safetensors_loader import load_safetensors_model
    from torchburn.llm.model.weights import WeightError

    _, folder = tiny_checkpoint("llama")
    copy = tmp_path / "m"
    shutil.copytree(folder, copy)
    cfg = json.loads((copy / "config.json").read_text())
    cfg["intermediate_size"] = 128
    (copy / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(WeightError, match=r"mlp\.\w+_proj\.weight.*shape.*128"):
        load_safetensors_model(copy, None)


def test_missing_tensors_are_listed(tiny_checkpoint, tmp_path: Path) -> None:
    import shutil

    from safetensors.torch import load_file, save_file

    from torchburn.llm.model.safetensors_loader import load_safetensors_model
    from torchburn.llm.model.weights import WeightError

    _, folder = tiny_checkpoint("llama")
    copy = tmp_path / "m"
    shutil.copytree(folder, copy)
    tensors = load_file(str(copy / "model.safetensors"))
    del tensors["model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, str(copy / "model.safetensors"))
    with pytest.raises(WeightError, match="lacks tensors: layers.1.mlp.up_proj.weight"):
        load_safetensors_model(copy, None)


def test_not_a_safetensors_file(tiny_checkpoint, tmp_path: Path) -> None:
    import shutil

    from torchburn.llm.model.safetensors_loader import load_safetensors_model
    from torchburn.llm.model.weights import WeightError

    _, folder = tiny_checkpoint("llama")
    copy = tmp_path / "m"
    shutil.copytree(folder, copy)
    (copy / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(WeightError, match="not a readable safetensors"):
        load_safetensors_model(copy, None)


def test_hub_offline_without_cache_is_clear(monkeypatch, tmp_path: Path) -> None:
    from torchburn.llm.model.source import SourceError, resolve

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(SourceError, match="HF_HUB_OFFLINE is set and the model is not in the"):
        resolve("nobody-here/no-such-model")


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "phi3"])
def test_new_family_fields(arch: str) -> None:
    c = from_hf_dict(hf_config(arch).to_dict())
    gemma = arch.startswith("gemma")
    assert c.hidden_act == ("gelu_tanh" if gemma else "silu")
    assert c.sandwich_norms == gemma and c.tie_word_embeddings == gemma
    assert c.embed_scale == (8.0 if gemma else 1.0)
    assert c.qk_norm == (arch == "gemma3")
    assert c.attn_logit_softcapping == (0.5 if arch == "gemma2" else None)
    assert c.layer_windows == {"gemma2": (6, None), "gemma3": (5,) * 5 + (None,),
                               "phi3": (9, 9)}[arch]
    assert c.rope_local_base_freq == (100.0 if arch == "gemma3" else None)
    assert c.rope_type == {"gemma2": "default", "gemma3": "linear", "phi3": "longrope"}[arch]


def test_gemma3_old_style_config_keys() -> None:
    """``rope_theta`` + ``rope_local_base_freq`` + ``rope_scaling`` + ``sliding_window_pattern``
    (configs written before transformers 5) read as the per-layer-type form does."""
    cfg = {**COMMON, "model_type": "gemma3_text", "num_hidden_layers": 4, "head_dim": 16,
           "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
           "rope_scaling": {"rope_type": "linear", "factor": 8.0}, "sliding_window": 512,
           "sliding_window_pattern": 2, "query_pre_attn_scalar": 256}
    c = from_hf_dict(cfg)
    assert c.layer_windows == (512, None, 512, None)
    assert (c.rope_theta, c.rope_local_base_freq, c.rope_scaling) == (
        1e6, 1e4, {"rope_type": "linear", "factor": 8.0})
    assert c.attention_scale == 256 ** -0.5


def test_longrope_matches_transformers() -> None:
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from torchburn.llm.model.rope import longrope_inv_freq

    cfg = hf_config("phi3")
    ours = from_hf_dict(cfg.to_dict())
    short, long = longrope_inv_freq(ours)
    ref_short, ref_scale = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu")
    ref_long, _ = ROPE_INIT_FUNCTIONS["longrope"](cfg, "cpu", seq_len=17)
    torch.testing.assert_close(short, ref_short, rtol=1e-6, atol=0)
    torch.testing.assert_close(long, ref_long, rtol=1e-6, atol=0)
    assert rope_parameters(ours)[1] == pytest.approx(ref_scale)


@pytest.mark.parametrize("cfg,message", [
    ({"model_type": "gemma3", "text_config": {}}, "multimodal Gemma 3"),
    ({**COMMON, "model_type": "phi3", "rms_norm_eps": 1e-5, "partial_rotary_factor": 0.75},
     "partial_rotary_factor"),
    ({**COMMON, "model_type": "gemma2", "rms_norm_eps": 1e-5, "hidden_activation": "relu"},
     "activation 'relu'"),
])
def test_new_family_refusals_name_the_problem(cfg: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        from_hf_dict(cfg)
