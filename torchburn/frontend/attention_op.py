"""The attention custom op, ``torchburn::attention``: what the compiler lowers to the IR's one
`attention` op (one kernel: `passes/loopgen/attention.py`).

    torchburn::attention(Tensor q, Tensor[] keys, Tensor[] values, Tensor?[] masks,
                         float scale, bool causal) -> Tensor

``q`` is ``[*B, Hq, Tq, D]``; segment ``s`` is ``keys[s] [*B, Hk, Tk_s, D]`` and ``values[s]
[*B, Hk, Tk_s, Dv]`` with ``Hq`` a multiple of ``Hk`` (grouped-query attention); the softmax
runs over the keys of all segments together, so a model attends over its KV cache and the
step's new keys without concatenating them. ``masks`` (empty, or one per segment, each None or
broadcastable to ``[*B, Hq, Tq, Tk_s]``) are boolean (keep where true) or additive; ``causal`` (one segment)
keeps key ``j <= i``. Computed in float32, returned in ``q``'s dtype.

Two paths reach it: `F.scaled_dot_product_attention` on the CPU (the decomposition of
``_scaled_dot_product_flash_attention_for_cpu`` in `nn_decompositions.py`), and models that
call it directly (the LLM engine's decoder). The eager implementation is the plain formula;
there is no autograd formula (training reaches attention through sdpa, whose backward has its
own decomposition).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def _check(q: Tensor, keys: list[Tensor], values: list[Tensor], masks: list[Optional[Tensor]],
           causal: bool) -> None:
    if not keys or len(keys) != len(values):
        raise ValueError(f"attention: {len(keys)} key and {len(values)} value segments; need one or more of each")
    if masks and len(masks) != len(keys):
        raise ValueError(f"attention: {len(masks)} masks for {len(keys)} segments")
    if causal and len(keys) != 1:
        raise ValueError("attention: causal takes one segment")
    if q.dim() < 3 or not q.is_floating_point():
        raise ValueError(f"attention: q must be a float tensor [*B, H, T, D], got {q.dtype} {list(q.shape)}")
    for k, v in zip(keys, values):
        if k.dim() != q.dim() or v.dim() != q.dim() or k.shape[:-1] != v.shape[:-1] or k.shape[-1] != q.shape[-1] \
                or k.shape[:-3] != q.shape[:-3] or q.shape[-3] % k.shape[-3]:
            raise ValueError(f"attention: k {list(k.shape)} / v {list(v.shape)} do not fit q {list(q.shape)}")
        if v.shape[-1] != values[0].shape[-1]:
            raise ValueError("attention: the value segments differ in head dim")
    for m, k in zip(masks, keys):
        # A mask spans its segment's keys: said as a check, not a test, so that symbolic
        # lengths marked dynamic one by one (the cache view, its mask) become one symbol.
        if m is not None and m.dim() > 0 and m.shape[-1] != 1:   # else it broadcasts over the keys
            torch._check_value(m.shape[-1] == k.shape[-2],
                         lambda m=m, k=k: f"attention: mask {list(m.shape)} does not span keys {list(k.shape)}")


def _scores(q: Tensor, k: Tensor, scale: float) -> Tensor:
    groups = q.shape[-3] // k.shape[-3]
    if groups != 1:
        k = k.repeat_interleave(groups, dim=-3)
    return torch.matmul(q.float(), k.float().transpose(-1, -2)) * scale


@torch.library.custom_op("torchburn::attention", mutates_args=())
def attention(q: Tensor, keys: list[Tensor], values: list[Tensor], masks: list[Optional[Tensor]],
              scale: float, causal: bool) -> Tensor:
    """``softmax(scale * q k^T + mask) v`` over the keys of every segment (module docstring)."""
    _check(q, keys, values, masks, causal)
    parts = []
    for s, k in enumerate(keys):
        sc = _scores(q, k, scale)
        if masks and masks[s] is not None:
            m = masks[s].broadcast_to(sc.shape)
            sc = sc.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else sc + m.float()
        if causal:
            keep = torch.ones(sc.shape[-2:], dtype=torch.bool, device=sc.device).tril()
            sc = sc.masked_fill(~keep, float("-inf"))
        parts.append(sc)
    p = torch.softmax(torch.cat(parts, dim=-1), dim=-1)
    groups = q.shape[-3] // keys[0].shape[-3]
    v = torch.cat(values, dim=-2).float()
    if groups != 1:
        v = v.repeat_interleave(groups, dim=-3)
    return torch.matmul(p, v).to(q.dtype)


@attention.register_fake
def _attention_fake(q: Tensor, keys: list[Tensor], values: list[Tensor], masks: list[Optional[Tensor]],
                    scale: float, causal: bool) -> Tensor:
    _check(q, keys, values, masks, causal)
    return q.new_empty((*q.shape[:-1], values[0].shape[-1]))
