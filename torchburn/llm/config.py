"""`DecoderConfig`: the one description of a decoder-only model that `model.Decoder` is built from.

It is read from a Hugging Face ``config.json`` (`from_hf_dict`) or from GGUF metadata
(`gguf_loader`).  Families differ only in fields: Qwen2 has q/k/v biases, Qwen3 q/k RMSNorm,
Mistral a sliding window, Llama 3 a rope scaling type; there is no model class per family.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import ConfigError
from .validate import check_sizes

#: ``model_type`` values we run, and what each one sets beyond the common fields.
SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2", "qwen3")
#: Rope scaling types we implement (``default`` means none).
ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn")


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

    @property
    def rope_type(self) -> str:
        return str(self.rope_scaling.get("rope_type", "default"))


def unsupported_message(architecture: object) -> str:
    return (f"unsupported architecture {architecture!r}; torchburn.LLM supports "
            f"{', '.join(SUPPORTED_ARCHITECTURES)} (Llama incl. SmolLM2, Mistral, Qwen2/2.5, Qwen3)")


def _require(cfg: dict[str, Any], key: str, source: str) -> Any:
    if key not in cfg or cfg[key] is None:
        raise ConfigError(f"{source} is missing the key {key!r}")
    return cfg[key]


def _rope_from_hf(cfg: dict[str, Any]) -> tuple[float, dict[str, Any]]:
    """(theta, scaling) from either the transformers-5 ``rope_parameters`` or the older
    ``rope_theta`` + ``rope_scaling`` keys."""
    params = cfg.get("rope_parameters")
    if isinstance(params, dict) and "rope_theta" in params:
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
        theta = float(params["rope_theta"])
    else:
        theta = float(cfg.get("rope_theta", 10000.0))
        scaling = dict(cfg.get("rope_scaling") or {})
    if "type" in scaling and "rope_type" not in scaling:
        scaling["rope_type"] = scaling.pop("type")
    scaling.setdefault("rope_type", "default")
    return theta, scaling


def _rope_from_hf_checked(cfg: dict[str, Any], source: str) -> tuple[float, dict[str, Any]]:
    """`_rope_from_hf`, with a `ConfigError` naming the key for a value of the wrong type."""
    for key in ("rope_parameters", "rope_scaling"):
        if cfg.get(key) is not None and not isinstance(cfg[key], dict):
            raise ConfigError(f"{source}: {key} must be an object; got {type(cfg[key]).__name__}")
    try:
        return _rope_from_hf(cfg)
    except (TypeError, ValueError, OverflowError) as e:
        raise ConfigError(f"{source}: rope_theta/rope_parameters: {e}") from None


def _layer_windows(cfg: dict[str, Any], arch: str, n_layers: int) -> tuple[Optional[int], ...]:
    window = cfg.get("sliding_window")
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and len(layer_types) == n_layers:
        return tuple(window if t == "sliding_attention" and window else None for t in layer_types)
    if arch == "mistral":
        return tuple([window or None] * n_layers)
    if arch in ("qwen2", "qwen3") and cfg.get("use_sliding_window") and window:
        first = int(cfg.get("max_window_layers", n_layers))
        return tuple(window if i >= first else None for i in range(n_layers))
    return tuple([None] * n_layers)


def _ids(value: Any) -> tuple[int, ...]:
    if value is None:
        return ()
    if isinstance(value, (list, tuple)):
        return tuple(int(v) for v in value)
    return (int(value),)


def from_hf_dict(cfg: dict[str, Any], source: str = "config.json") -> DecoderConfig:
    """Build a `DecoderConfig` from the dictionary of a Hugging Face ``config.json``; every
    size is checked first (`validate.check_sizes`)."""
    arch = cfg.get("model_type")
    if not isinstance(arch, str) or arch not in SUPPORTED_ARCHITECTURES:
        raise ConfigError(unsupported_message(arch))
    check_sizes({**cfg, **_rope_from_hf_checked(cfg, source)[1]}, source)
    hidden = int(_require(cfg, "hidden_size", source))
    heads = int(_require(cfg, "num_attention_heads", source))
    n_layers = int(_require(cfg, "num_hidden_layers", source))
    head_dim = cfg.get("head_dim") or hidden // heads
    theta, scaling = _rope_from_hf(cfg)
    return DecoderConfig(
        architecture=arch,
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
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        qkv_bias=arch == "qwen2" or bool(cfg.get("attention_bias", False)),
        o_bias=arch != "qwen2" and bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)),
        qk_norm=arch == "qwen3",
        layer_windows=_layer_windows(cfg, arch, n_layers),
        bos_token_id=cfg.get("bos_token_id"),
        eos_token_ids=_ids(cfg.get("eos_token_id")),
        pad_token_id=cfg.get("pad_token_id"),
    )
