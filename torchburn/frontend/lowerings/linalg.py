"""Matrix products: mm, bmm, addmm, baddbmm, matmul-family helpers. The IR's `matmul` is
batched with equal batch dims; half-precision operands accumulate in f32."""
from __future__ import annotations

from typing import Any

import torch

from ...ir import dtypes as dt
from ...ir.tensor import Value
from ..builder import Builder
from ..registry import Unsupported, lowering

aten = torch.ops.aten


def _matmul(b: Builder, x: Value, y: Value) -> Value:
    if x.dtype != y.dtype:
        raise Unsupported(f"matmul of {x.dtype} and {y.dtype}")
    if x.dtype.is_bool:
        raise Unsupported("matmul of bool tensors")
    acc = dt.compute_dtype(x.dtype)
    return b.op("matmul", b.cast(x, acc), b.cast(y, acc))


@lowering(aten.mm, aten.bmm)
def mm(b: Builder, x: Value, y: Value) -> Value:
    return b.cast(_matmul(b, x, y), x.dtype)


def _scale(b: Builder, v: Value, s: Any) -> Value:
    return v if s == 1 else b.elementwise("mul", v, s)


@lowering(aten.addmm, aten.baddbmm)
def addmm(b: Builder, bias: Value, x: Value, y: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    prod = _scale(b, _matmul(b, x, y), alpha)
    if beta == 0:
        return b.cast(prod, x.dtype)
    bias_c = _scale(b, b.to_compute(bias), beta)
    return b.cast(b.elementwise("add", prod, bias_c), x.dtype)


@lowering(aten.mv)
def mv(b: Builder, x: Value, v: Value) -> Value:
    col = b.reshape(v, (*v.shape, 1))
    out = _matmul(b, x, col)
    return b.cast(b.reshape(out, out.shape[:-1]), x.dtype)


@lowering(aten.dot)
def dot(b: Builder, x: Value, y: Value) -> Value:
    row = b.reshape(x, (1, *x.shape))
    col = b.reshape(y, (*y.shape, 1))
    out = _matmul(b, row, col)
    return b.cast(b.reshape(out, ()), x.dtype)
