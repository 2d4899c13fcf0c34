"""Matrix products (mm, bmm, addmm, baddbmm, addmv, addbmm, dot, mv), bilinear forms
(`_trilinear`) and distances (cdist, pdist). The IR's `matmul` is batched with equal batch
dims; half-precision operands accumulate in f32."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ...ir import dtypes as dt
from ...ir.expr import Const
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
    col = b.reshape(v, (*v.shape, Const(1)))
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


@lowering(aten._trilinear)
def trilinear(b: Builder, i1: Value, i2: Value, i3: Value, expand1: Sequence[int], expand2: Sequence[int],
              expand3: Sequence[int], sumdim: Sequence[int], unroll_dim: int = 1) -> Value:
    """(F.bilinear) Each input gets size-1 dims inserted at its `expand` positions; the
    product of the three, broadcast, is summed over `sumdim`."""
    out = b.out_dtype
    acc = dt.compute_dtype(out)
    parts = []
    for x, expand in ((i1, expand1), (i2, expand2), (i3, expand3)):
        shape = list(x.shape)
        for d in sorted(expand):
            shape.insert(d, Const(1))
        parts.append(b.reshape(b.cast(x, acc), shape))
    a, c, e = b.broadcast(*parts)
    prod = b.op("mul", b.op("mul", a, c), e)
    if sumdim:
        prod = b.op("reduce_sum", prod, dims=tuple(sorted(set(sumdim))), keepdim=False)
    return b.cast(prod, out)


def _pairwise_norm(b: Builder, diff: Value, p: float) -> Value:
    """The p-norm over the last dim (as torch.cdist: p = 0 counts non-zeros)."""
    from .reductions import _norm

    return _norm(b, diff, p, (diff.type.rank - 1,), False)


@lowering(aten._cdist_forward)
def cdist(b: Builder, x1: Value, x2: Value, p: float, compute_mode: Any = None) -> Value:
    """Distances between the rows of x1 [..., P, M] and x2 [..., R, M], computed directly
    from the differences (PyTorch may use a matrix product for p = 2; the direct form is at
    least as accurate)."""
    out = b.out_dtype
    acc = dt.compute_dtype(out)
    a = b.reshape(b.cast(x1, acc), (*x1.shape[:-1], Const(1), x1.shape[-1]))
    c = b.reshape(b.cast(x2, acc), (*x2.shape[:-2], Const(1), *x2.shape[-2:]))
    a, c = b.broadcast(a, c)
    return b.cast(_pairwise_norm(b, b.op("sub", a, c), float(p)), out)


@lowering(aten._pdist_forward)
def pdist(b: Builder, x: Value, p: float = 2.0) -> Value:
    """Distances of the pairs i < j of rows of x [N, M], in row-major order of (i, j): the
    upper triangle of cdist(x, x), row by row."""
    n = x.shape[0]
    if not isinstance(n, Const):
        raise Unsupported("pdist of a symbolic number of rows")
    rows = int(n.value)
    out = b.out_dtype
    if rows < 2:
        return b.op("full", shape=(Const(0),), value=0.0, dtype=out)
    acc = dt.compute_dtype(out)
    xc = b.cast(x, acc)
    a = b.reshape(xc, (n, Const(1), x.shape[1]))
    c = b.reshape(xc, (Const(1), n, x.shape[1]))
    a, c = b.broadcast(a, c)
    dist = _pairwise_norm(b, b.op("sub", a, c), float(p))
    pieces = [b.reshape(b.op("slice", b.op("slice", dist, dim=0, start=Const(i), end=Const(i + 1), step=1),
                             dim=1, start=Const(i + 1), end=n, step=1), (Const(rows - i - 1),))
              for i in range(rows - 1)]
    flat = pieces[0] if len(pieces) == 1 else b.op("concat", *pieces, dim=0)
    return b.cast(flat, out)
