"""`torchburn::attention` (`frontend/attention_op.py`) -> the IR's `attention` op: masks are
broadcast to `[*B, Hq, Tq, Tk]` as views (nothing is materialized), the op is one kernel."""
from __future__ import annotations

from typing import Optional

import torch

from ...ir import dtypes as dt
from ...ir.expr import Const
from ...ir.tensor import Value
from .. import attention_op  # noqa: F401  (defines torch.ops.torchburn.attention)
from ..builder import Builder
from ..registry import Unsupported, lowering


def attention_value(b: Builder, q: Value, keys: list[Value], values: list[Value],
                    masks: list[Optional[Value]], scale: float, causal: bool) -> Value:
    """The IR `attention` op for these operands (also used by the sdpa decomposition path)."""
    for v in (q, *keys, *values):
        if not v.dtype.is_float:
            raise Unsupported(f"attention of a {v.dtype} tensor")
    if not isinstance(q.shape[-1], Const) or not isinstance(values[0].shape[-1], Const):
        raise Unsupported("attention with a symbolic head dim")
    if len({v.dtype for v in (q, *keys, *values)}) != 1:
        raise Unsupported("attention operands of mixed dtypes")
    operands = [q]
    for k, v in zip(keys, values):
        operands += [k, v]
    masked = any(m is not None for m in masks)
    if masked:
        for k, m in zip(keys, masks):
            if m is None:  # one segment unmasked among masked ones: keep all its keys
                m = b.full(True, (), dt.bool_)
            if not (m.dtype == dt.bool_ or m.dtype.is_float):
                raise Unsupported(f"attention mask of dtype {m.dtype}")
            operands.append(b.expand(m, (*q.shape[:-1], k.shape[-2])))
    return b.op("attention", *operands, scale=float(scale), causal=bool(causal), masked=masked,
                segments=len(keys))


@lowering(torch.ops.torchburn.attention.default)
def attention(b: Builder, q: Value, keys: list[Value], values: list[Value], masks: list[Optional[Value]],
              scale: float, causal: bool) -> Value:
    return attention_value(b, q, list(keys), list(values), list(masks or []), scale, causal)
