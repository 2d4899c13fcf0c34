"""The decoder: one ``nn.Module`` definition for every supported family, configured by
`DecoderConfig`.

A step takes token ids, their rope positions, the cache slots they go to and, per batch row,
the first slot that holds a real token (rows are left-padded), plus ``past``: the KV cache's
slots up to the step's own (`kv_cache.KVCache.past`, a view whose length is a dynamic
dimension when compiled).  It attends over the slots of ``past`` before ``slots[0]`` and its
own tokens with masks built from those tensors and returns its logits and its new keys and
values, which the engine's step writes into ``past`` in the same graph
(`engine.LLM._eager_step`).  The position is data, never a Python int, and the past's length is
symbolic, so one compiled step serves every position and attention costs the tokens so far,
not ``max_context``.

Shapes: ``B`` batch, ``T`` tokens in this step, ``P`` past slots read, ``H``
query heads, ``K`` key/value heads (``H = K * G``), ``D`` head dim.

The families (`families.py`) differ only in what the config switches on: the MLP's activation
(SwiGLU or GeGLU), q/k norms, "sandwich" norms (Gemma: a norm on the attention's and the MLP's
outputs before each is added back, named as Hugging Face names them), a scaled embedding,
soft-capped attention scores and logits, and the sliding-window layers' own rope base.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from ...frontend.attention_op import attention
from .config import DecoderConfig
from .kv_cache import KVCache
from .rope import (apply_rope, cos_sin, dynamic_inv_freq, local_inv_freq, longrope_inv_freq,
                   rope_parameters)

#: Score given to masked keys: finite, so a fully masked (padding) row stays finite too.
MASKED = torch.finfo(torch.float32).min


def _additive(allowed: torch.Tensor) -> torch.Tensor:
    """A boolean mask as scores to add: 0 where allowed, `MASKED` (finite) elsewhere."""
    return torch.where(allowed, 0.0, MASKED)


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


class HalfLinear(nn.Linear):
    """A linear layer whose weight is stored as float16 (`quant="f16"`) and multiplied in
    float32: the GPU engine keeps the weight in f16 storage (half the bytes a decode step
    reads) and converts each element as its matrix-vector product loads it; the bias and
    every activation stay float32."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight.to(x.dtype), self.bias)


class HalfEmbedding(nn.Embedding):
    """A token embedding stored as float16 (`quant="f16"`): the gathered rows are float32."""

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(ids, self.weight).float()


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(x / cap)``: Gemma 2's bound on attention scores and logits."""
    return torch.tanh(x / cap) * cap


def softcapped_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                         masks: list[torch.Tensor], scale: float, cap: float) -> torch.Tensor:
    """`attention`'s result with the scores soft-capped before the masks are added, written
    with plain ops (the fused attention kernel has no soft-capping; these layers concatenate
    the cache with the new keys instead). Grouped-query heads share their key/value head
    through a view: query head ``h`` reads key head ``h // G``."""
    b, h, t, d = q.shape
    k = torch.cat(keys, dim=2)
    v = torch.cat(values, dim=2)
    kv = k.shape[1]
    groups = h // kv
    scores = torch.matmul(q.reshape(b, kv, groups * t, d), k.transpose(-1, -2)) * scale
    scores = softcap(scores, cap).view(b, kv, groups, t, -1)
    scores = scores + torch.cat(masks, dim=-1)[:, :, None]
    p = torch.softmax(scores, dim=-1).view(b, kv, groups * t, -1)
    return torch.matmul(p, v).view(b, h, t, -1)


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig, window: Optional[int]) -> None:
        super().__init__()
        c = config
        self.heads, self.kv_heads, self.head_dim = (
            c.num_attention_heads, c.num_key_value_heads, c.head_dim)
        self.window = window
        self.scale = c.attention_scale
        self.softcap = c.attn_logit_softcapping
        #: Rotated with the sliding layers' own rope base (`DecoderConfig.rope_local_base_freq`).
        self.local_rope = window is not None and c.rope_local_base_freq is not None
        self.q_proj: Optional[nn.Module] = nn.Linear(c.hidden_size, self.heads * c.head_dim, bias=c.qkv_bias)
        self.k_proj: Optional[nn.Module] = nn.Linear(c.hidden_size, self.kv_heads * c.head_dim, bias=c.qkv_bias)
        self.v_proj: Optional[nn.Module] = nn.Linear(c.hidden_size, self.kv_heads * c.head_dim, bias=c.qkv_bias)
        #: q, k and v as one linear once loaded (`fuse.py`), which then replaces the three.
        self.qkv_proj: Optional[nn.Module] = None
        self.o_proj = nn.Linear(self.heads * c.head_dim, c.hidden_size, bias=c.o_bias)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps) if c.qk_norm else None

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, old_mask: torch.Tensor,
        new_mask: torch.Tensor, k_past: torch.Tensor, v_past: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(output, new keys, new values); keys and values are ``[B, K, T, D]``.

        The queries attend to the ``P`` earlier slots in ``k_past``/``v_past`` ``[B, K, P, D]``
        (additive mask ``old_mask [B, 1, T, P]``: 0 or `MASKED`) and to this step's own tokens
        (``new_mask [B, 1, T, T]``): one softmax over both parts, in one `torchburn::attention`
        op (one kernel when compiled: `passes/loopgen/attention.py`), so the cache is never
        concatenated (or copied) with the new keys and the key/value heads are shared by their
        query heads without a repeat.
        """
        b, t, _ = x.shape
        if self.qkv_proj is not None:
            kv = self.kv_heads * self.head_dim
            q, k, v = self.qkv_proj(x).split([self.heads * self.head_dim, kv, kv], -1)
        else:
            assert self.q_proj is not None and self.k_proj is not None and self.v_proj is not None
            q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = q.view(b, t, self.heads, self.head_dim)
        k = k.view(b, t, self.kv_heads, self.head_dim)
        v = v.view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q = apply_rope(q.transpose(1, 2), cos, sin)
        k = apply_rope(k.transpose(1, 2), cos, sin)
        v = v.transpose(1, 2)
        if self.softcap is not None:
            out = softcapped_attention(q, [k_past, k], [v_past, v], [old_mask, new_mask],
                                       self.scale, self.softcap)
        else:
            out = attention(q, [k_past, k], [v_past, v], [old_mask, new_mask], self.scale, False)
        if t == 1:
            # [B, H, 1, D] is [B, 1, H * D] in memory: a plain row for o_proj (a quantized
            # linear streams only such rows; through a transpose it read ~10x slower).
            out = out.reshape(b, 1, self.heads * self.head_dim)
        else:
            out = out.transpose(1, 2).reshape(b, t, self.heads * self.head_dim)
        return self.o_proj(out), k, v


class MLP(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        c = config
        self.gate_proj: Optional[nn.Module] = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.up_proj: Optional[nn.Module] = nn.Linear(c.hidden_size, c.intermediate_size, bias=c.mlp_bias)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=c.mlp_bias)
        #: gate and up as one linear once loaded (`fuse.py`), which then replaces the two.
        self.gate_up_proj: Optional[nn.Module] = None
        self.gelu = c.hidden_act == "gelu_tanh"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gate_up_proj is not None:
            gate, up = self.gate_up_proj(x).chunk(2, -1)
        else:
            assert self.gate_proj is not None and self.up_proj is not None
            gate, up = self.gate_proj(x), self.up_proj(x)
        act = F.gelu(gate, approximate="tanh") if self.gelu else F.silu(gate)
        return self.down_proj(act * up)


class DecoderLayer(nn.Module):
    def __init__(self, config: DecoderConfig, window: Optional[int]) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config, window)
        #: Llama: the MLP's input norm. Sandwich (Gemma): the attention output's norm.
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = MLP(config)
        sandwich = config.sandwich_norms
        self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if sandwich else None
        self.post_feedforward_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps) if sandwich else None

    def residual(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input ``x`` and its attention's output."""
        if self.pre_feedforward_layernorm is not None and self.post_feedforward_layernorm is not None:
            x = x + self.post_attention_layernorm(attn_out)
            return x + self.post_feedforward_layernorm(self.mlp(self.pre_feedforward_layernorm(x)))
        x = x + attn_out
        return x + self.mlp(self.post_attention_layernorm(x))


class Decoder(nn.Module):
    """Embedding, decoder layers, final norm and output head.

    Parameter names are Hugging Face's (``model.layers.0.self_attn.q_proj.weight``, ...), so a
    safetensors checkpoint loads by name; once loaded, the sibling projections of each layer
    are fused (``qkv_proj``, ``gate_up_proj``: `fuse.py`) and ``unfuse_projections`` gives
    the checkpoint's names back.
    """

    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens: nn.Module = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            DecoderLayer(config, w) for w in config.layer_windows)
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head: nn.Module = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.build_rope_tables()

    def build_rope_tables(self) -> None:
        """The rope frequency buffers from the config (again after a meta-device build):
        ``inv_freq`` and its cos/sin scale, ``inv_freq_long`` (``longrope``'s long factors),
        ``inv_freq_local`` (the sliding layers' own base)."""
        c = self.config
        with torch.device("cpu"):  # small real tables, also under a meta device (no meta kernels)
            inv_freq, self.rope_scale = rope_parameters(c)
            self.register_buffer("inv_freq", inv_freq, persistent=False)
            if c.rope_type == "longrope":
                self.register_buffer("inv_freq_long", longrope_inv_freq(c)[1], persistent=False)
            if c.rope_local_base_freq is not None:
                self.register_buffer("inv_freq_local", local_inv_freq(c), persistent=False)

    def new_cache(self, batch: int, context: int, dtype: torch.dtype = torch.float32,
                  device: Optional[torch.device] = None) -> KVCache:
        """A zeroed static KV cache for ``batch`` rows and ``context`` slots."""
        return KVCache(self.config, batch, context, dtype, device)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        slots: torch.Tensor,
        starts: torch.Tensor,
        past: torch.Tensor,
        logit_index: Optional[torch.Tensor] = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits ``[B, T, V]`` or ``[B, len(logit_index), V]``, new keys and values
        ``[2 * layers, B, K, T, D]`` to store at ``slots``).

        ``positions [B, T]`` are rope positions, ``slots [T]`` the consecutive cache slots of
        this step's tokens, ``starts [B]`` each row's first real slot (left padding before it
        is never attended), ``past [2 * layers, B, K, P, D]`` the cache's first ``P`` slots
        (`KVCache.past`): only those before ``slots[0]`` are attended (the step's own slots,
        at the end, are masked).
        """
        c = self.config
        x = self.embed_tokens(input_ids)
        if c.embed_scale != 1.0:
            x = x * c.embed_scale
        inv_freq = self.inv_freq
        if c.rope_type == "dynamic":
            inv_freq = dynamic_inv_freq(c, positions.max() + 1)
        elif c.rope_type == "longrope":
            original = int(c.rope_scaling["original_max_position_embeddings"])
            inv_freq = torch.where(positions.max() + 1 > original, self.inv_freq_long, inv_freq)
        ropes = {False: cos_sin(positions, inv_freq, self.rope_scale)}
        if c.rope_local_base_freq is not None:
            ropes[True] = cos_sin(positions, self.inv_freq_local, 1.0)
        query = slots[:, None]
        old_key = torch.arange(past.shape[3], device=input_ids.device)[None, :]
        new_key = slots[None, :]
        row_start = starts[:, None, None]
        old_causal = (old_key < slots[0]).expand(query.shape[0], -1)[None] & (old_key[None] >= row_start)
        new_causal = (new_key <= query)[None] & (new_key[None] >= row_start)
        masks: dict[Optional[int], tuple[torch.Tensor, torch.Tensor]] = {}
        new_kv = []
        for i, layer in enumerate(self.layers):
            window = layer.self_attn.window
            if window not in masks:
                old_ok, new_ok = old_causal, new_causal
                if window is not None:
                    old_ok = old_ok & (query - old_key < window)[None]
                    new_ok = new_ok & (query - new_key < window)[None]
                masks[window] = (_additive(old_ok[:, None]), _additive(new_ok[:, None]))
            h = layer.input_layernorm(x)
            old_ok, new_ok = masks[window]
            cos, sin = ropes[layer.self_attn.local_rope]
            a, k, v = layer.self_attn(h, cos, sin, old_ok, new_ok, past[2 * i], past[2 * i + 1])
            new_kv += [k, v]
            x = layer.residual(x, a)
        x = self.norm(x)
        if logit_index is not None:
            x = x.index_select(1, logit_index)
        logits = self.lm_head(x)
        if c.final_logit_softcapping is not None:
            logits = softcap(logits, c.final_logit_softcapping)
        return logits, torch.stack(new_kv)
