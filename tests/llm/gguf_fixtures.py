"""Tiny GGUF files written from tiny transformers models the way llama.cpp's converter
(``convert_hf_to_gguf.py``) writes them: its tensor names (gguf-py's own `TensorNameMap` for the
architecture), its metadata keys, and its conventions -- Llama's Q/K rows permuted for the
interleaved rope, Gemma's norm weights stored as ``1 + w``, Llama 3's rope scaling as a
``rope_freqs`` tensor of per-frequency divisors, Phi-3's LongRoPE as ``rope_factors_long``/
``_short`` tensors and an attention factor."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np
import torch

#: transformers ``model_type`` -> llama.cpp architecture.
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3",
             "gemma2": "gemma2", "gemma3_text": "gemma3", "phi3": "phi3"}


def permute_qk(w: torch.Tensor, heads: int) -> torch.Tensor:
    """llama.cpp's Q/K row order for its interleaved rope: within each head, the rows of the
    first and second halves alternate."""
    rows = w.shape[0]
    return w.reshape(heads, 2, rows // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(params: dict[str, Any], head_dim: int) -> np.ndarray:
    """The per-frequency divisors llama.cpp's converter derives from a ``llama3`` rope scaling."""
    base = float(params["rope_theta"])
    factor = float(params["factor"])
    low, high = float(params["low_freq_factor"]), float(params["high_freq_factor"])
    original = float(params["original_max_position_embeddings"])
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < original / high:
            out.append(1.0)
        elif wavelen > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def _metadata(w: Any, cfg: Any, arch: str, n_vocab: int) -> None:
    import gguf

    c = cfg
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    w.add_block_count(c.num_hidden_layers)
    w.add_context_length(c.max_position_embeddings)
    w.add_embedding_length(c.hidden_size)
    w.add_feed_forward_length(c.intermediate_size)
    w.add_head_count(c.num_attention_heads)
    w.add_head_count_kv(c.num_key_value_heads)
    w.add_layer_norm_rms_eps(c.rms_norm_eps)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_vocab_size(n_vocab)
    params = c.rope_parameters
    if arch == "gemma2":
        w.add_attn_logit_softcapping(c.attn_logit_softcapping)
        w.add_final_logit_softcapping(c.final_logit_softcapping)
        w.add_sliding_window(c.sliding_window)
    elif arch == "gemma3":
        full = params["full_attention"]
        w.add_rope_freq_base(full["rope_theta"])
        w.add_rope_freq_base_swa(params["sliding_attention"]["rope_theta"])
        if full.get("rope_type") == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full["factor"])
        w.add_sliding_window(c.sliding_window)
        w.add_sliding_window_pattern([t == "sliding_attention" for t in c.layer_types])
        if c.final_logit_softcapping:
            w.add_final_logit_softcapping(c.final_logit_softcapping)
    else:
        w.add_rope_freq_base(params["rope_theta"])
        w.add_rope_dimension_count(head_dim)
        if getattr(c, "sliding_window", None):
            w.add_sliding_window(c.sliding_window)
    if arch == "phi3":
        w.add_rope_scaling_orig_ctx_len(c.original_max_position_embeddings)
        if params.get("rope_type") == "longrope":
            scale = c.max_position_embeddings / c.original_max_position_embeddings
            w.add_rope_scaling_attn_factors(
                math.sqrt(1 + math.log(scale) / math.log(c.original_max_position_embeddings)))


def _tensors(model: Any, arch: str) -> list[tuple[str, np.ndarray]]:
    import gguf

    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, c.num_hidden_layers)
    out = []
    state = model.state_dict()
    tied = bool(getattr(c, "tie_word_embeddings", False))
    for hf_name, value in state.items():
        if hf_name == "lm_head.weight" and tied:
            continue
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if name is None:
            raise AssertionError(f"no GGUF name for {hf_name}")
        t = value.detach().float()
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_q.bias")):
            t = permute_qk(t, c.num_attention_heads)
        if arch == "llama" and name.endswith(("attn_k.weight", "attn_k.bias")):
            t = permute_qk(t, c.num_key_value_heads)
        if arch in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
            t = t + 1
        out.append((name, t.numpy()))
    params = c.rope_parameters
    if arch == "llama" and params.get("rope_type") == "llama3":
        out.append(("rope_freqs.weight", llama3_rope_factors(params, head_dim)))
    if arch == "phi3" and params.get("rope_type") == "longrope":
        out.append(("rope_factors_long.weight", np.array(params["long_factor"], dtype=np.float32)))
        out.append(("rope_factors_short.weight", np.array(params["short_factor"], dtype=np.float32)))
    return out


def write_gguf(model: Any, path: Path, tokenizer: Optional[dict[str, Any]] = None,
               dtype: str = "F32", edit: Optional[Callable[[Any, dict[str, np.ndarray]], None]] = None) -> Path:
    """``model`` (a transformers causal LM) as a GGUF file at ``path``; ``tokenizer``: the
    ``tokenizer.*`` metadata to write (`tokenizer_fixtures`), else a placeholder vocabulary.
    ``dtype``: F32 or F16 for the 2-D weights (1-D tensors stay F32, as llama.cpp keeps them).
    ``edit(writer, tensors)``: a test's change to the metadata or the tensors before writing."""
    import gguf

    arch = GGUF_ARCH[model.config.model_type]
    n_vocab = model.config.vocab_size
    w = gguf.GGUFWriter(str(path), arch)
    _metadata(w, model.config, arch, n_vocab)
    meta = tokenizer or {"tokenizer.ggml.model": "gpt2",
                         "tokenizer.ggml.tokens": [f"<t{i}>" for i in range(n_vocab)],
                         "tokenizer.ggml.token_type": [1] * n_vocab,
                         "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                         "tokenizer.ggml.padding_token_id": 0}
    add_tokenizer_metadata(w, meta)
    tensors = dict(_tensors(model, arch))
    if edit is not None:
        edit(w, tensors)
    for name, array in tensors.items():
        if dtype == "F16" and array.ndim == 2:
            array = array.astype(np.float16)
        w.add_tensor(name, np.ascontiguousarray(array))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def add_tokenizer_metadata(w: Any, meta: dict[str, Any]) -> None:
    """Write ``tokenizer.*`` keys with the value types llama.cpp's converter uses."""
    for key, value in meta.items():
        if key == "tokenizer.ggml.scores":
            w.add_array(key, [float(v) for v in value])
        elif key == "tokenizer.ggml.token_type":
            w.add_array(key, [int(v) for v in value])
        elif isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        elif isinstance(value, str):
            w.add_string(key, value)
        else:
            raise AssertionError(f"{key}: {type(value).__name__}")
