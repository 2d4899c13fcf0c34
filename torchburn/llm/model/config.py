"""`DecoderConfig`: the one description of a decoder-only model that `model.Decoder` is built from.

It is read from a Hugging Face ``config.json`` (`from_hf_dict`) or from GGUF metadata
(`gguf_loader`).  Families differ only in fields: Qwen2 has q/k/v biases, Qwen3 q/k RMSNorm,
Mistral a sliding window, Llama 3 a rope scaling type, Gemma 2/3 GeGLU, sandwich norms,
soft-capping and sliding layers with their own rope base, Phi-3 LongRoPE; there is no model
class per family (`families.py` lists what each family sets).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import ConfigError
from .families import BY_HF_TYPE, BY_NAME, FAMILIES, HF_ACTIVATIONS, Family, sliding_layers
from .validate import check_sizes

#: The families we run (`families.FAMILIES`).
SUPPORTED_ARCHITECTURES = tuple(f.name for f in FAMILIES)
#: Rope scaling types we implement (``default`` means none). ``freq_factors`` is llama.cpp's
#: form of a rope scaling: one divisor per frequency (a GGUF ``rope_freqs.weight`` tensor).
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope", "freq_factors")
#: MLP activations (`families.Family.hidden_act`).
ACTIVATIONS = ("silu", "gelu_tanh")


@dataclass(frozen=True)
class DecoderConfig:
    """Everything the decoder needs; field names follow Hugging Face's where they exist."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    rope_theta: float = 10000.0
    #: ``{"rope_type": ..., "factor": ..., ...}`` as in HF; ``rope_type == "default"`` = none.
    rope_scaling: dict[str, Any] = field(default_factory=lambda: {"rope_type": "default"})
    tie_word_embeddings: bool = False
    #: Biases on q/k/v (Qwen2 always; Llama/Qwen3 when ``attention_bias``) and on o.
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    #: Per layer: the sliding window in tokens, or None for full attention.
    layer_windows: tuple[Optional[int], ...] = ()
    bos_token_id: Optional[int] = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: Optional[int] = None
    #: MLP activation of the gate: ``silu`` (SwiGLU) or ``gelu_tanh`` (GeGLU).
    hidden_act: str = "silu"
    #: The token embedding is multiplied by this (Gemma: ``sqrt(hidden_size)``).
    embed_scale: float = 1.0
    #: Norms after attention and after the MLP as well as before (Gemma 2/3).
    sandwich_norms: bool = False
    #: Attention scores are scaled by ``query_pre_attn_scalar ** -0.5`` (None: ``head_dim``).
    query_pre_attn_scalar: Optional[float] = None
    #: ``c * tanh(x / c)`` on the attention scores and on the final logits (Gemma 2).
    attn_logit_softcapping: Optional[float] = None
    final_logit_softcapping: Optional[float] = None
    #: The rope base of the sliding-window layers, which then use no rope scaling (Gemma 3);
    #: None: every layer uses ``rope_theta`` and ``rope_scaling``.
    rope_local_base_freq: Optional[float] = None

    def __post_init__(self) -> None:
        if self.architecture not in SUPPORTED_ARCHITECTURES:
            raise ConfigError(unsupported_message(self.architecture))
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "head_dim",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer; got {value!r}")
        if self.num_attention_heads % self.num_key_value_heads != 0:
            raise ConfigError(
                f"num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )
        if self.head_dim % 2 != 0:
            raise ConfigError(f"head_dim={self.head_dim} must be even for rotary embeddings")
        rope_type = self.rope_scaling.get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ConfigError(f"rope scaling type {rope_type!r} is not supported; supported: "
                              f"{', '.join(ROPE_TYPES)}")
        if len(self.layer_windows) != self.num_hidden_layers:
            raise ConfigError("layer_windows must have one entry per layer")
        if self.hidden_act not in ACTIVATIONS:
            raise ConfigError(f"activation {self.hidden_act!r} is not supported; supported: "
                              f"{', '.join(ACTIVATIONS)}")
        for name in ("query_pre_attn_scalar", "attn_logit_softcapping", "final_logit_softcapping",
                     "rope_local_base_freq"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ConfigError(f"{name} must be positive; got {value!r}")

    @property
    def family(self) -> Family:
        return BY_NAME[self.architecture]

    @property
    def attention_scale(self) -> float:
        """The factor on ``q . k`` before the softmax."""
        return float(self.query_pre_attn_scalar or self.head_dim) ** -0.5

    @property
    def rope_type(self) -> str:
        return str(self.rope_scaling.get("rope_type", "default"))


def unsupported_message(architecture: object) -> str:
    return (f"unsupported architecture {architecture!r}; torchburn.LLM supports "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (Llama incl. SmolLM2 and Llama 3.x, Mistral, "
            f"Qwen2/2.5, Qwen3, Gemma 2, Gemma 3 (text), Phi-3/3.5)")


def _require(cfg: dict[str, Any], key: str, source: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"{source} is missing the key {key!r}")
    return cfg[key]


def _scaling(params: dict[str, Any]) -> tuple[Optional[float], dict[str, Any]]:
    """(theta or None, scaling) of one rope parameter dict (``type`` read as ``rope_type``)."""
    scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    scaling.setdefault("rope_type", "default")
    theta = params.get("rope_theta")
    return (float(theta) if theta is not None else None), scaling


def _rope_from_hf(cfg: dict[str, Any]) -> tuple[float, dict[str, Any], Optional[float]]:
    """(theta, scaling, sliding layers' theta or None) from the transformers-5
    ``rope_parameters`` (flat, or per layer type as Gemma 3 has it) or from the older
    ``rope_theta`` + ``rope_scaling`` (+ ``rope_local_base_freq``) keys."""
    params = cfg.get("rope_parameters")
    local: Optional[float] = None
    if isinstance(params, dict) and isinstance(params.get("full_attention"), dict):
        theta, scaling = _scaling(params["full_attention"])
        sliding = params.get("sliding_attention")
        if isinstance(sliding, dict):
            local, local_scaling = _scaling(sliding)
            if local_scaling.get("rope_type") != "default":
                raise ConfigError(f"rope scaling {local_scaling.get('rope_type')!r} on the "
                                  f"sliding-window layers is not supported")
    elif isinstance(params, dict) and "rope_theta" in params:
        theta, scaling = _scaling(params)
    else:
        theta, scaling = _scaling({"rope_theta": cfg.get("rope_theta", 10000.0),
                                   **(cfg.get("rope_scaling") or {})})
    if local is None and cfg.get("rope_local_base_freq") is not None:
        local = float(cfg["rope_local_base_freq"])
    return (theta if theta is not None else 10000.0), scaling, local


def _rope_from_hf_checked(cfg: dict[str, Any], source: str) -> tuple[float, dict[str, Any], Optional[float]]:
    """`_rope_from_hf`, with a `ConfigError` naming the key for a value of the wrong type."""
    for key in ("rope_parameters", "rope_scaling"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise ConfigError(f"{source}: {key} must be an object; got {type(cfg[key]).__name__}")
    try:
        return _rope_from_hf(cfg)
    except (TypeError, ValueError, OverflowError) as e:
        raise ConfigError(f"{source}: rope_theta/rope_parameters: {e}") from None


def _layer_windows(cfg: dict[str, Any], fam: Family, n_layers: int) -> tuple[Optional[int], ...]:
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n_layers:
        return tuple(window if t == "sliding_attention" and window else None for t in layer_types)
    if fam.name in ("qwen2", "qwen3"):
        if cfg.get("use_sliding_window") and window:
            first = int(cfg.get("max_window_layers", n_layers))
            return tuple(window if i >= first else None for i in range(n_layers))
        return tuple([None] * n_layers)
    if not window:
        return tuple([None] * n_layers)
    pattern = cfg.get("sliding_window_pattern")
    slides = sliding_layers(fam, n_layers, int(pattern) if pattern else None)
    return tuple(int(window) if s else None for s in slides)


def _ids(value: Any) -> tuple[int, ...]:
    """``eos_token_id``: an id, a list of ids, or none."""
    if value is None:
        return ()
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise ConfigError(f"eos_token_id must be a token id or a list of token ids; got {value!r}")
    return tuple(items)


def _phi3_rope(cfg: dict[str, Any], scaling: dict[str, Any]) -> dict[str, Any]:
    """Phi-3's long-context rope: ``su``/``yarn`` in its configs mean LongRoPE (as in
    transformers), whose original length may sit at the config's top level."""
    if scaling.get("rope_type") in ("su", "yarn"):
        scaling["rope_type"] = "longrope"
    if scaling.get("rope_type") == "longrope":
        scaling.setdefault("original_max_position_embeddings",
                           cfg.get("original_max_position_embeddings"))
    return scaling


def _activation(cfg: dict[str, Any], fam: Family) -> str:
    name = cfg.get("hidden_activation") or cfg.get("hidden_act")
    if name is None:
        return fam.hidden_act
    if name not in HF_ACTIVATIONS:
        raise ConfigError(f"activation {name!r} is not supported; supported: "
                          f"{', '.join(sorted(HF_ACTIVATIONS))}")
    return HF_ACTIVATIONS[name]


def from_hf_dict(cfg: dict[str, Any], source: str = "config.json") -> DecoderConfig:
    """Build a `DecoderConfig` from the dictionary of a Hugging Face ``config.json``; every
    size is checked first (`validate.check_sizes`)."""
    arch = cfg.get("model_type")
    if arch == "gemma3" and isinstance(cfg.get("text_config"), dict):
        raise ConfigError("this is a multimodal Gemma 3 checkpoint (model_type 'gemma3'); "
                          "torchburn.LLM runs Gemma 3 text models: a 'gemma3_text' checkpoint, "
                          "or the model's GGUF file")
    fam = BY_HF_TYPE.get(arch) if isinstance(arch, str) else None
    if fam is None:
        raise ConfigError(unsupported_message(arch))
    check_sizes({**cfg, **_rope_from_hf_checked(cfg, source)[1]}, source)
    hidden = int(_require(cfg, "hidden_size", source))
    heads = int(_require(cfg, "num_attention_heads", source))
    n_layers = int(_require(cfg, "num_hidden_layers", source))
    head_dim = cfg.get("head_dim") or hidden // heads
    theta, scaling, local_theta = _rope_from_hf(cfg)
    partial = scaling.pop("partial_rotary_factor", cfg.get("partial_rotary_factor", 1.0))
    if partial is not None and float(partial) != 1.0:
        raise ConfigError(f"partial_rotary_factor={partial} (rope on part of each head) is "
                          f"not supported")
    if fam.name == "phi3":
        scaling = _phi3_rope(cfg, scaling)
    bias = bool(cfg.get("attention_bias", False))
    tie = cfg.get("tie_word_embeddings")
    return DecoderConfig(
        architecture=fam.name,
        vocab_size=int(_require(cfg, "vocab_size", source)),
        hidden_size=hidden,
        intermediate_size=int(_require(cfg, "intermediate_size", source)),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(cfg.get("num_key_value_heads") or heads),
        head_dim=int(head_dim),
        rms_norm_eps=float(_require(cfg, "rms_norm_eps", source)),
        max_position_embeddings=int(cfg.get("max_position_embeddings") or 2048),
        rope_theta=theta,
        rope_scaling=scaling,
        tie_word_embeddings=fam.tie_default if tie is None else bool(tie),
        qkv_bias=fam.qkv_bias or bias,
        o_bias=not fam.qkv_bias and bias,
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=fam.qk_norm,
        layer_windows=_layer_windows(cfg, fam, n_layers),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_ids(cfg.get("eos_token_id")),
        pad_token_id=cfg.get("pad_token_id"),
        hidden_act=_activation(cfg, fam),
        embed_scale=float(hidden) ** 0.5 if fam.scale_embedding else 1.0,
        sandwich_norms=fam.sandwich_norms,
        query_pre_attn_scalar=_float_or_none(cfg.get("query_pre_attn_scalar")),
        attn_logit_softcapping=_float_or_none(cfg.get("attn_logit_softcapping")),
        final_logit_softcapping=_float_or_none(cfg.get("final_logit_softcapping")),
        rope_local_base_freq=(local_theta or 10000.0) if fam.name == "gemma3" else None,
    )


def _float_or_none(value: Any) -> Optional[float]:
    return None if value is None else float(value)
