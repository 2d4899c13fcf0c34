"""The decoder: one ``nn.Module`` definition for every supported family, configured by
`DecoderConfig`.

A step takes token ids, their rope positions, the cache slots they are written to and, per
batch row, the first slot that holds a real token (rows are left-padded).  It writes the new
keys and values into the static KV cache in place and attends over the whole cache with a
mask built from those tensors, so prefill chunks and decode steps are the same graph shape for
every position: the position is data, never a Python int, and a compiled step is reused as
the sequence grows.

Shapes: ``B`` batch, ``T`` tokens in this step, ``C`` cache slots (``max_context``), ``H``
query heads, ``K`` key/value heads (``H = K * G``), ``D`` head dim.
"""
from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .config import DecoderConfig
from .rope import apply_rope, cos_sin, dynamic_inv_freq, rope_parameters

#: Score given to masked keys: finite, so a fully masked (padding) row stays finite too.
MASKED = torch.finfo(torch.float32).min


class RMSNorm(nn.Module):
    """``x / rms(x) * weight``, computed in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class QuantizedEmbedding(nn.Module):
    """An embedding table kept as INT8 rows with grouped scales (GGUF Q8_0), gathered and
    dequantized per token, so the float table never exists."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor) -> None:
        super().__init__()
        self.register_buffer("qweight", qweight)
        self.register_buffer("scales", scales)
        self.group_size = qweight.shape[1] // scales.shape[1]

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        codes = F.embedding(ids, self.qweight).float()
        scales = F.embedding(ids, self.scales).float()
        b, t, n = codes.shape
        grouped = codes.view(b, t, -1, self.group_size) * scales[..., None]
        return grouped.view(b, t, n)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, window: Optional[int]) -> None:
        super().__init__()
        c = config
        self.heads, self.kv_heads, self.head_dim = (
            c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.window = window
        self.q_proj = nn.Linear(c.hidden_size, self.heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj = nn.Linear(c.hidden_size, self.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj = nn.Linear(c.hidden_size, self.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.o_proj = nn.Linear(self.heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, allowed: torch.Tensor,
        slots: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        k_cache.index_copy_(2, slots, k)
        v_cache.index_copy_(2, slots, v.transpose(1, 2))
        groups = self.heads // self.kv_heads
        # Query heads grouped under their key/value head: [B, K, G*T, D], no cache copy.
        q = q.reshape(b, self.kv_heads, groups * t, self.head_dim)
        scores = torch.matmul(q, k_cache.transpose(2, 3)) * (self.head_dim ** -0.5)
        mask = allowed.repeat(1, 1, groups, 1)
        scores = torch.where(mask, scores, MASKED)
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = torch.matmul(probs, v_cache).view(b, self.heads, t, self.head_dim)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim))


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        c = config
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, window: Optional[int]) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, window)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)


class Decoder(nn.Module):
    """Embedding, decoder layers, final norm and output head.

    Parameter names are Hugging Face's (``model.layers.0.self_attn.q_proj.weight``, ...), so a
    safetensors checkpoint loads by name.
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens: nn.Module = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, w) for w in config.layer_windows)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head: nn.Module = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        inv_freq, self.rope_scale = rope_parameters(config)
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def new_cache(self, batch: int, context: int, dtype: torch.dtype = torch.float32,
                  device: Optional[torch.device] = None) -> list[torch.Tensor]:
        """A zeroed static KV cache: ``[k0, v0, k1, v1, ...]``, each ``[B, K, C, D]``."""
        c = self.config
        shape = (batch, c.num_key_value_heads, context, c.head_dim)
        return [torch.zeros(shape, dtype=dtype, device=device)
                for _ in range(2 * c.num_hidden_layers)]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        starts: torch.Tensor,
        cache: Sequence[torch.Tensor],
        logit_index: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Logits ``[B, T, V]`` (or ``[B, len(logit_index), V]``); updates ``cache`` in place.

        ``positions [B, T]`` are rope positions, ``slots [T]`` the cache slots written,
        ``starts [B]`` each row's first real slot (left padding before it is never attended).
        """
        x = self.embed_tokens(input_ids)
        inv_freq = self.inv_freq
        if self.config.rope_type == "dynamic":
            inv_freq = dynamic_inv_freq(self.config, positions.max() + 1)
        cos, sin = cos_sin(positions, inv_freq, self.rope_scale)
        context = cache[0].shape[2]
        key = torch.arange(context, device=input_ids.device)
        query = slots[:, None]
        causal = (key[None, :] <= query)[None] & (key[None, None, :] >= starts[:, None, None])
        masks: dict[Optional[int], torch.Tensor] = {}
        for i, layer in enumerate(self.layers):
            window = layer.self_attn.window
            if window not in masks:
                allowed = causal if window is None else causal & (query - key[None, :] < window)[None]
                masks[window] = allowed[:, None]
            h = layer.input_layernorm(x)
            x = x + layer.self_attn(h, cos, sin, masks[window], slots, cache[2 * i], cache[2 * i + 1])
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        x = self.norm(x)
        if logit_index is not None:
            x = x.index_select(1, logit_index)
        return self.lm_head(x)
