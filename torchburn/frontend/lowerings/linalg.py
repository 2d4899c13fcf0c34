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


@lowering(aten.addmv)
def addmv(b: Builder, bias: Value, x: Value, v: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    """beta * bias + alpha * (x @ v); with beta == 0 the bias is ignored (NaN included)."""
    col = b.reshape(v, (*v.shape, 1))
    prod = _matmul(b, x, col)
    prod = _scale(b, b.reshape(prod, prod.shape[:-1]), alpha)
    return _add_bias(b, prod, bias, beta, x.dtype)


@lowering(aten.addbmm)
def addbmm(b: Builder, bias: Value, x: Value, y: Value, beta: Any = 1, alpha: Any = 1) -> Value:
    """beta * bias + alpha * sum over the batch of x[i] @ y[i]."""
    prod = b.op("reduce_sum", _matmul(b, x, y), dims=(0,), keepdim=False)
    return _add_bias(b, _scale(b, prod, alpha), bias, beta, x.dtype)


def _add_bias(b: Builder, prod: Value, bias: Value, beta: Any, dtype: Any) -> Value:
    if beta == 0:
        return b.cast(prod, dtype)
    bias_c = _scale(b, b.to_compute(bias), beta)
    return b.cast(b.elementwise("add", prod, bias_c), dtype)
