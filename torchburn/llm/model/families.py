"""The model families we run, each described by what sets it apart from a Llama decoder.

A family is data, not a class: `config.from_hf_dict` and `gguf_loader.gguf_config` read a
checkpoint's configuration into one `DecoderConfig` with the help of the family's entry, and
`model.Decoder` is built from that config alone.  What a family can differ in:

* how its checkpoints name it: Hugging Face ``model_type`` values and the GGUF
  ``general.architecture`` llama.cpp writes;
* structure: an always-present q/k/v bias (Qwen2), q/k RMSNorm (Qwen3, Gemma 3), "sandwich"
  norms around attention and MLP (Gemma 2/3), the embedding scaled by ``sqrt(hidden)``
  (Gemma), the MLP's activation (SiLU, or GELU-tanh for Gemma's GeGLU);
* conventions of its files: Gemma's Hugging Face checkpoints store each RMSNorm weight as
  ``w`` for a norm that multiplies by ``1 + w`` (llama.cpp's converter stores ``1 + w``; we
  add the 1 when loading a safetensors file, so the model runs one plain RMSNorm);
  llama.cpp permutes the Q/K rows of ``llama`` files (`gguf_loader.unpermute_rows`);
* its sliding-window layout when the config does not list ``layer_types``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class Family:
    """What one family of decoder checkpoints sets beyond the common fields."""

    #: Our name (`DecoderConfig.architecture`).
    name: str
    #: Hugging Face ``config.json`` ``model_type`` values of this family.
    hf_model_types: tuple[str, ...]
    #: GGUF ``general.architecture`` values llama.cpp writes for it.
    gguf_archs: tuple[str, ...]
    #: MLP activation: ``silu`` (SwiGLU) or ``gelu_tanh`` (GeGLU).
    hidden_act: str = "silu"
    #: q/k/v always have biases (Qwen2), whatever ``attention_bias`` says.
    qkv_bias: bool = False
    #: RMSNorm on each head's queries and keys before rope.
    qk_norm: bool = False
    #: Norms after attention and after the MLP too (Gemma 2/3), each added back after its norm.
    sandwich_norms: bool = False
    #: The token embedding is multiplied by ``sqrt(hidden_size)``.
    scale_embedding: bool = False
    #: Hugging Face checkpoints store RMSNorm weights minus this (Gemma: 1).
    hf_norm_offset: float = 0.0
    #: llama.cpp permuted the Q/K rows of this family's GGUF files.
    gguf_permuted_qk: bool = False
    #: ``tie_word_embeddings`` when config.json does not say.
    tie_default: bool = False
    #: Sliding layers when config.json gives ``sliding_window`` but no ``layer_types``:
    #: ``all``, ``none``, or a period ``n`` (layer ``i`` slides unless ``(i + 1) % n == 0``).
    window_pattern: Optional[str | int] = None


FAMILIES: tuple[Family, ...] = (
    Family("llama", ("llama",), ("llama",), gguf_permuted_qk=True),
    Family("mistral", ("mistral",), (), window_pattern="all"),
    Family("qwen2", ("qwen2",), ("qwen2",), qkv_bias=True),
    Family("qwen3", ("qwen3",), ("qwen3",), qk_norm=True),
    Family("gemma2", ("gemma2",), ("gemma2",), hidden_act="gelu_tanh", sandwich_norms=True,
           scale_embedding=True, hf_norm_offset=1.0, tie_default=True, window_pattern=2),
    Family("gemma3", ("gemma3_text",), ("gemma3",), hidden_act="gelu_tanh", qk_norm=True,
           sandwich_norms=True, scale_embedding=True, hf_norm_offset=1.0, tie_default=True,
           window_pattern=6),
    Family("phi3", ("phi3",), ("phi3",), window_pattern="all"),
)

BY_NAME = {f.name: f for f in FAMILIES}
BY_HF_TYPE = {t: f for f in FAMILIES for t in f.hf_model_types}
BY_GGUF_ARCH = {a: f for f in FAMILIES for a in f.gguf_archs}

#: Our activations by the names Hugging Face configs use for them.
HF_ACTIVATIONS = {"silu": "silu", "swish": "silu", "gelu_pytorch_tanh": "gelu_tanh",
                  "gelu_new": "gelu_tanh", "gelu_tanh": "gelu_tanh"}


def sliding_layers(fam: Family, n_layers: int, pattern: Optional[str | int] = None) -> list[bool]:
    """Which layers use the sliding window by the family's (or the given) pattern."""
    pattern = fam.window_pattern if pattern is None else pattern
    if pattern == "all":
        return [True] * n_layers
    if isinstance(pattern, int) and pattern > 0:
        return [(i + 1) % pattern != 0 for i in range(n_layers)]
    return [False] * n_layers
