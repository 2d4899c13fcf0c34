"""Decompositions TorchBurn adds for neural-network ops PyTorch has none for: CPU attention
(forward and backward), `nn.TransformerEncoderLayer`'s fused inference path, and the oneDNN
LSTM layer (`mkldnn_rnn_layer`) that torch's own `lstm` decomposition calls on CPU when no
gradient is needed.

`F.scaled_dot_product_attention` on CPU reaches AOTAutograd as
`_scaled_dot_product_flash_attention_for_cpu`. Its forward becomes our `torchburn::attention`
op (one flash-attention kernel, `frontend/attention_op.py`), plus the log-sum-exp written with
torch ops, which dead-code elimination drops unless something reads it (our backward does not).
Its backward is PyTorch's fused `..._backward` kernel; the decomposition here recomputes the
attention probabilities from `q`, `k` and the mask (it does not trust the forward's second
result) and applies the softmax-matmul chain rule:

    P  = softmax(q k^T * scale + mask)
    dV = P^T dO
    dP = dO V^T
    dS = P * (dP - rowsum(dP * P))
    dQ = dS k * scale,   dK = dS^T q * scale
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional

import torch

aten = torch.ops.aten


def sdpa_flash_cpu_backward(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                            value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                            dropout_p: float, is_causal: bool, attn_mask: Optional[torch.Tensor] = None,
                            scale: Optional[float] = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    if dropout_p != 0.0:
        return NotImplemented
    dtype = query.dtype
    compute = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    q, k, v, do = (t.to(compute) for t in (query, key, value, grad_out))
    hq, hk = q.shape[1], k.shape[1]
    rep = hq // hk
    if rep != 1:  # grouped-query attention: each key/value head serves `rep` query heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    scores = torch.matmul(q, k.transpose(-2, -1)) * s
    L, S = q.shape[-2], k.shape[-2]
    if is_causal:
        keep = torch.ones(L, S, dtype=torch.bool, device=q.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            scores = scores.masked_fill(attn_mask.logical_not(), float("-inf"))
        else:
            scores = scores + attn_mask.to(compute)
    p = torch.softmax(scores, dim=-1)
    dv = torch.matmul(p.transpose(-2, -1), do)
    dp = torch.matmul(do, v.transpose(-2, -1))
    ds = p * (dp - (dp * p).sum(dim=-1, keepdim=True))
    dq = torch.matmul(ds, k) * s
    dk = torch.matmul(ds.transpose(-2, -1), q) * s
    if rep != 1:
        n = dk.shape[0]
        dk = dk.reshape(n, hk, rep, S, -1).sum(dim=2)
        dv = dv.reshape(n, hk, rep, S, -1).sum(dim=2)
    return dq.to(dtype), dk.to(dtype), dv.to(dtype)


def sdpa_flash_cpu(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, dropout_p: float = 0.0,
                   is_causal: bool = False, *, attn_mask: Optional[torch.Tensor] = None,
                   scale: Optional[float] = None) -> Any:
    """(output, logsumexp) as the fused CPU kernel returns them; the output keeps the kernel's
    `[B, L, H, D]` memory order (PyTorch's own decomposition does the same)."""
    from .attention_op import attention

    if dropout_p != 0.0 or query.dim() != 4 or not query.is_floating_point():
        return NotImplemented
    s = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
    masks = [] if attn_mask is None else [attn_mask]
    out = attention(query, [key], [value], masks, float(s), bool(is_causal))
    out = out.permute(2, 0, 1, 3).contiguous(memory_format=torch.contiguous_format).permute(1, 2, 0, 3)
    rep = query.shape[1] // key.shape[1]
    k = key.repeat_interleave(rep, dim=1) if rep != 1 else key
    scores = torch.matmul(query.float(), k.float().transpose(-2, -1)) * s
    if is_causal:
        keep = torch.ones(scores.shape[-2:], dtype=torch.bool, device=query.device).tril()
        scores = scores.masked_fill(keep.logical_not(), float("-inf"))
    if attn_mask is not None:
        scores = (scores.masked_fill(attn_mask.logical_not(), float("-inf")) if attn_mask.dtype == torch.bool
                  else scores + attn_mask.float())
    return out, torch.logsumexp(scores, dim=-1)


def transformer_encoder_layer_fwd(src: torch.Tensor, embed_dim: int, num_heads: int, qkv_weight: torch.Tensor,
                                  qkv_bias: torch.Tensor, proj_weight: torch.Tensor, proj_bias: torch.Tensor,
                                  use_gelu: bool, norm_first: bool, eps: float, norm_weight_1: torch.Tensor,
                                  norm_bias_1: torch.Tensor, norm_weight_2: torch.Tensor, norm_bias_2: torch.Tensor,
                                  ffn_weight_1: torch.Tensor, ffn_bias_1: torch.Tensor, ffn_weight_2: torch.Tensor,
                                  ffn_bias_2: torch.Tensor, mask: Optional[torch.Tensor] = None,
                                  mask_type: Optional[int] = None) -> torch.Tensor:
    """`nn.TransformerEncoderLayer`'s inference fast path (eval, no grad, batch first), as
    PyTorch's `transformer_encoder_layer_forward` computes it: attention through
    `scaled_dot_product_attention`, then the feed-forward block, with post- or pre-norm."""
    if src.is_nested or src.dim() != 3:
        return NotImplemented
    attn_mask = None
    if mask is not None:
        if mask.dtype == torch.bool:  # the native kernels' boolean masks mark what to drop
            mask = torch.zeros(mask.shape, dtype=src.dtype, device=src.device).masked_fill(mask, float("-inf"))
        if mask_type == 1:  # key padding mask [B, S]
            attn_mask = mask.view(mask.shape[0], 1, 1, mask.shape[-1])
        else:  # [L, S] or already [B, H, L, S]
            attn_mask = mask
    b, n, _ = src.shape
    head = embed_dim // num_heads

    def attention(x: torch.Tensor) -> torch.Tensor:
        q, k, v = torch.nn.functional.linear(x, qkv_weight, qkv_bias).chunk(3, dim=-1)
        q, k, v = (t.reshape(b, n, num_heads, head).transpose(1, 2) for t in (q, k, v))
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        return torch.nn.functional.linear(a.transpose(1, 2).reshape(b, n, embed_dim), proj_weight, proj_bias)

    def norm(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.layer_norm(x, (embed_dim,), w, bias, eps)

    def ffn(x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.linear(x, ffn_weight_1, ffn_bias_1)
        h = torch.nn.functional.gelu(h) if use_gelu else torch.relu(h)
        return torch.nn.functional.linear(h, ffn_weight_2, ffn_bias_2)

    x = src
    if norm_first:
        x = x + attention(norm(x, norm_weight_1, norm_bias_1))
        return x + ffn(norm(x, norm_weight_2, norm_bias_2))
    x = norm(x + attention(x), norm_weight_1, norm_bias_1)
    return norm(x + ffn(x), norm_weight_2, norm_bias_2)


def mkldnn_rnn_layer(input: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, w3: torch.Tensor,
                     hx: Optional[torch.Tensor], cx: Optional[torch.Tensor], reverse: bool, batch_sizes: list[int],
                     mode: int, hidden_size: int, num_layers: int, has_biases: bool, bidirectional: bool,
                     batch_first: bool, train: bool) -> Any:
    """One LSTM layer (`mode` 2, oneDNN's `rnn_kind::LSTM`) over a padded sequence, as the
    oneDNN kernel computes it: the input projection of every step at once, then per step

        gates = x_t W_ih^T + b_ih + h W_hh^T + b_hh;   i, f, g, o = chunks of 4
        c = sigmoid(f) c + sigmoid(i) tanh(g);         h = sigmoid(o) tanh(c)

    (`w0`, `w1` are W_ih, W_hh; `w2`, `w3` the biases). Results: every step's `h`, the last `h`
    and `c` shaped like `hx` and `cx`, and the kernel's workspace, empty in inference."""
    if mode != 2 or batch_sizes or num_layers != 1 or bidirectional or hx is None or cx is None \
            or hx.dim() != 3 or hx.shape[0] != 1:
        return NotImplemented
    x = input.transpose(0, 1) if batch_first else input
    ih = torch.nn.functional.linear(x, w0, w2 if has_biases else None)
    h, c = hx[0], cx[0]
    steps = []
    for t in range(x.shape[0]):
        step = x.shape[0] - 1 - t if reverse else t
        gates = ih[step] + torch.nn.functional.linear(h, w1, w3 if has_biases else None)
        i, f, g, o = gates.chunk(4, dim=-1)
        c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        h = torch.sigmoid(o) * torch.tanh(c)
        steps.append(h)
    if reverse:
        steps.reverse()
    out = torch.stack(steps, 1 if batch_first else 0)
    workspace = torch.empty(0, dtype=torch.uint8, device=input.device)
    return out, h.unsqueeze(0), c.unsqueeze(0), workspace


def nn_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decompositions to add to TorchBurn's table."""
    return {
        aten._scaled_dot_product_flash_attention_for_cpu.default: sdpa_flash_cpu,
        aten._scaled_dot_product_flash_attention_for_cpu_backward.default: sdpa_flash_cpu_backward,
        aten._transformer_encoder_layer_fwd.default: transformer_encoder_layer_fwd,
        aten.mkldnn_rnn_layer.default: mkldnn_rnn_layer,
    }
