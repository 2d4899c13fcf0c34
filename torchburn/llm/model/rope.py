"""Rotary position embeddings: inverse frequencies for each rope scaling type, and the rotation.

The scaling types follow their published definitions (the same ones Hugging Face configs
name): ``linear`` divides positions by ``factor``; ``dynamic`` (NTK) raises the base once the
sequence outgrows ``max_position_embeddings``; ``llama3`` rescales low frequencies smoothly;
``yarn`` blends interpolated and extrapolated frequencies and scales cos/sin by an attention
factor; ``longrope`` (Phi-3) divides each frequency by a listed factor, the ``short_factor``
list while the sequence fits ``original_max_position_embeddings`` and the ``long_factor`` list
beyond, and scales cos/sin by an attention factor; ``freq_factors`` is llama.cpp's form of a
fixed scaling (Llama 3's, in GGUF files as the ``rope_freqs.weight`` tensor): one divisor per
frequency.  Everything except ``dynamic`` and ``longrope`` is a constant computed once at load
time; those two depend on the current length, which is a tensor, so the choice stays inside
the compiled graph.

Gemma 3's sliding-window layers rotate with their own base (``rope_local_base_freq``) and no
scaling: `local_inv_freq`.
"""
from __future__ import annotations

import math


import torch

from .config import ConfigError, DecoderConfig


def _base_inv_freq(theta: float | torch.Tensor, dim: int) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
    return 1.0 / (theta ** exponents)


def _param(scaling: dict, name: str) -> float:
    if scaling.get(name) is None:
        raise ConfigError(f"rope scaling {scaling.get('rope_type')!r} needs {name!r}")
    return float(scaling[name])


def _llama3(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    factor = _param(scaling, "factor")
    low = _param(scaling, "low_freq_factor")
    high = _param(scaling, "high_freq_factor")
    original = _param(scaling, "original_max_position_embeddings")
    wavelen = 2 * math.pi / inv_freq
    low_wavelen, high_wavelen = original / low, original / high
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return torch.where(medium, smoothed, scaled)


def _yarn(config: DecoderConfig, dim: int) -> tuple[torch.Tensor, float]:
    scaling = config.rope_scaling
    base = config.rope_theta
    original = float(scaling.get("original_max_position_embeddings")
                      or config.max_position_embeddings)
    factor = scaling.get("factor")
    factor = float(factor) if factor is not None else config.max_position_embeddings / original

    def mscale(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    attention = scaling.get("attention_factor")
    if attention is None:
        m, m_all = scaling.get("mscale"), scaling.get("mscale_all_dim")
        attention = mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)
    beta_fast = float(scaling.get("beta_fast") or 32)
    beta_slow = float(scaling.get("beta_slow") or 1)

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    pos_freqs = base ** (torch.arange(0, dim, 2).float() / dim)
    inv = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv, float(attention)


def _factors(scaling: dict, name: str, dim: int) -> torch.Tensor:
    values = scaling.get(name)
    if not isinstance(values, (list, tuple)) or len(values) != dim // 2:
        raise ConfigError(f"rope scaling {scaling.get('rope_type')!r} needs {name!r}: a list of "
                          f"{dim // 2} numbers (one per frequency)")
    factors = torch.tensor([float(v) for v in values], dtype=torch.float32)
    if not bool((factors > 0).all()):
        raise ConfigError(f"rope scaling {name!r} must be positive")
    return factors


def _longrope_attention(config: DecoderConfig) -> float:
    scaling = config.rope_scaling
    original = _param(scaling, "original_max_position_embeddings")
    if scaling.get("attention_factor") is not None:
        return float(scaling["attention_factor"])
    factor = scaling.get("factor")
    factor = float(factor) if factor is not None else config.max_position_embeddings / original
    return 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))


def longrope_inv_freq(config: DecoderConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """(short, long) frequencies of a ``longrope`` config."""
    inv = _base_inv_freq(config.rope_theta, config.head_dim)
    scaling = config.rope_scaling
    return (inv / _factors(scaling, "short_factor", config.head_dim),
            inv / _factors(scaling, "long_factor", config.head_dim))


def local_inv_freq(config: DecoderConfig) -> torch.Tensor:
    """Frequencies of the sliding-window layers of a config with ``rope_local_base_freq``."""
    assert config.rope_local_base_freq is not None
    return _base_inv_freq(config.rope_local_base_freq, config.head_dim)


def rope_parameters(config: DecoderConfig) -> tuple[torch.Tensor, float]:
    """(inverse frequencies ``[head_dim // 2]`` float32, cos/sin scale) for a config.

    For ``dynamic`` the frequencies returned are those for lengths up to
    ``max_position_embeddings``; `dynamic_inv_freq` adjusts them to the current length. For
    ``longrope`` they are the short ones (`longrope_inv_freq` gives both).
    """
    dim, kind, scaling = config.head_dim, config.rope_type, config.rope_scaling
    inv = _base_inv_freq(config.rope_theta, dim)
    if kind in ("default", "dynamic"):
        return inv, 1.0
    if kind == "linear":
        return inv / _param(scaling, "factor"), 1.0
    if kind == "llama3":
        return _llama3(inv, scaling), 1.0
    if kind == "yarn":
        return _yarn(config, dim)
    if kind == "longrope":
        return longrope_inv_freq(config)[0], _longrope_attention(config)
    if kind == "freq_factors":
        return inv / _factors(scaling, "freq_factors", dim), 1.0
    raise ConfigError(f"rope scaling type {kind!r} is not supported")


def dynamic_inv_freq(config: DecoderConfig, seq_len: torch.Tensor) -> torch.Tensor:
    """NTK-aware frequencies for a sequence of ``seq_len`` (a 0-d tensor) tokens."""
    dim = config.head_dim
    original = float(config.max_position_embeddings)
    factor = _param(config.rope_scaling, "factor")
    length = torch.clamp(seq_len.float(), min=original)
    base = config.rope_theta * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
    exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=seq_len.device).float() / dim
    return 1.0 / (base ** exponents)


def cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin ``[B, T, head_dim]`` for integer ``positions [B, T]`` (halves repeated)."""
    freqs = positions.float()[..., None] * inv_freq
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * scale, emb.sin() * scale


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [B, H, T, D]`` by ``cos``/``sin [B, T, D]`` (the rotate-half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None] + rotated * sin[:, None]


__all__ = ["rope_parameters", "dynamic_inv_freq", "longrope_inv_freq", "local_inv_freq", "cos_sin",
           "apply_rope"]
