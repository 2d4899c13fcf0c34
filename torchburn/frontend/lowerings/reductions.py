"""Reductions: sum, prod, mean, amax/amin, any/all, argmax/argmin, softmax, log_softmax.

Half-precision inputs reduce in f32; integer and bool sums accumulate in i64 (torch's rule).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ...ir import dtypes as dt
from ...ir.expr import Const
from ...ir.tensor import Value
from ..builder import Builder, normalize_dim, numel
from ..dtypes import to_ir
from ..registry import Unsupported, lowering

aten = torch.ops.aten


def _dims(x: Value, dims: Any) -> tuple[int, ...]:
    rank = x.type.rank
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({normalize_dim(d, rank) for d in dims}))


def _reduce(b: Builder, kind: str, x: Value, dims: tuple[int, ...], keepdim: bool, acc: dt.DType) -> Value:
    src = b.cast(x, acc)
    if x.type.rank == 0:
        return src
    return b.op(f"reduce_{kind}", src, dims=dims, keepdim=bool(keepdim))


def _sum_like(kind: str) -> Any:
    def fn(b: Builder, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
        assert b.node is not None
        if b.node.target in (aten.sum.default, aten.prod.default):
            dims, keepdim, dtype = None, False, dims if not isinstance(dims, (list, tuple, int)) else None
        out = b.out_dtype
        acc = dt.compute_dtype(out)
        return b.cast(_reduce(b, kind, x, _dims(x, dims), keepdim, acc), out)
    return fn


lowering(aten.sum.dim_IntList, aten.sum.default)(_sum_like("sum"))
lowering(aten.prod.dim_int, aten.prod.default)(_sum_like("prod"))


@lowering(aten.mean.dim, aten.mean.default)
def mean(b: Builder, x: Value, dims: Any = None, keepdim: bool = False, dtype: Any = None) -> Value:
    assert b.node is not None
    if b.node.target == aten.mean.default:
        dims, keepdim = None, False
    out = b.out_dtype
    if not out.is_float:
        raise Unsupported("mean of an integer tensor")
    acc = dt.compute_dtype(out)
    d = _dims(x, dims)
    total = _reduce(b, "sum", x, d, keepdim, acc)
    count = numel([x.shape[i] for i in d]) if x.type.rank else Const(1)
    n = b.cast(b.full(count, (), dt.i64), acc)
    return b.cast(b.op("div", total, b.expand(n, total.shape)), out)


def _minmax(kind: str) -> Any:
    def fn(b: Builder, x: Value, dims: Any = None, keepdim: bool = False) -> Value:
        assert b.node is not None
        if b.node.target in (aten.max.default, aten.min.default):
            dims, keepdim = None, False
        acc = dt.compute_dtype(x.dtype)
        return b.cast(_reduce(b, kind, x, _dims(x, dims), keepdim, acc), x.dtype)
    return fn


lowering(aten.amax, aten.max.default)(_minmax("max"))
lowering(aten.amin, aten.min.default)(_minmax("min"))


def _anyall(kind: str) -> Any:
    def fn(b: Builder, x: Value, dims: Any = None, keepdim: bool = False) -> Value:
        return _reduce(b, kind, b.cast(x, dt.bool_), _dims(x, dims), keepdim, dt.bool_)
    return fn


lowering(aten.any)(_anyall("any"))
lowering(aten.all)(_anyall("all"))


def _arg(kind: str) -> Any:
    def fn(b: Builder, x: Value, dim: Optional[int] = None, keepdim: bool = False) -> Value:
        src = b.to_compute(x)
        if dim is None:
            src = b.reshape(src, (numel(x.shape),))
            d = 0
            if keepdim:
                raise Unsupported(f"{kind} with dim=None and keepdim=True")
        else:
            d = normalize_dim(dim, x.type.rank)
        if src.type.rank == 0:
            return b.full(0, (), dt.i64)
        return b.op(kind, src, dim=d, keepdim=bool(keepdim))
    return fn


lowering(aten.argmax)(_arg("argmax"))
lowering(aten.argmin)(_arg("argmin"))


@lowering(aten._softmax, aten._log_softmax)
def softmax(b: Builder, x: Value, dim: int, half_to_float: bool) -> Value:
    assert b.node is not None
    log = b.node.target == aten._log_softmax.default
    out = b.out_dtype
    xc = b.to_compute(x)
    if xc.type.rank == 0:
        return b.cast(b.full(0.0 if log else 1.0, (), xc.dtype), out)
    d = (normalize_dim(dim, x.type.rank),)
    m = b.op("reduce_max", xc, dims=d, keepdim=True)
    # A row of -inf has max -inf; subtracting it would give NaN where torch gives NaN too.
    shifted = b.op("sub", xc, b.expand(m, xc.shape))
    e = b.op("exp", shifted)
    s = b.op("reduce_sum", e, dims=d, keepdim=True)
    if log:
        res = b.op("sub", shifted, b.expand(b.op("log", s), xc.shape))
    else:
        res = b.op("div", e, b.expand(s, xc.shape))
    return b.cast(res, out)


@lowering(aten.linalg_vector_norm)
def vector_norm(b: Builder, x: Value, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                dtype: Any = None) -> Value:
    """The p-norm over `dim`: max/min of |x| for +-inf, the count of non-zeros for 0,
    (sum |x|^p)^(1/p) otherwise (sqrt of the sum of squares for 2). Computed in f32 for halves."""
    out = b.out_dtype
    acc = dt.compute_dtype(out)
    xc = b.cast(x, acc)
    return b.cast(_norm(b, xc, float(ord), _dims(x, dim), bool(keepdim)), out)


def _norm(b: Builder, xc: Value, p: float, dims: tuple[int, ...], keepdim: bool) -> Value:
    if p == 0:
        nonzero = b.cast(b.op("ne", xc, b.scalar_like(0, xc)), xc.dtype)
        return _reduce(b, "sum", nonzero, dims, keepdim, xc.dtype)
    mag = b.op("abs", xc)
    if p == float("inf"):
        return _reduce(b, "max", mag, dims, keepdim, xc.dtype)
    if p == float("-inf"):
        return _reduce(b, "min", mag, dims, keepdim, xc.dtype)
    if p == 1:
        return _reduce(b, "sum", mag, dims, keepdim, xc.dtype)
    if p == 2:
        return b.op("sqrt", _reduce(b, "sum", b.op("mul", xc, xc), dims, keepdim, xc.dtype))
    total = _reduce(b, "sum", b.op("pow", mag, b.scalar_like(p, mag)), dims, keepdim, xc.dtype)
    return b.op("pow", total, b.scalar_like(1.0 / p, total))


@lowering(aten.dist)
def dist(b: Builder, x: Value, y: Value, p: Any = 2) -> Value:
    """The p-norm of x - y over all elements."""
    out = b.out_dtype
    acc = dt.compute_dtype(out)
    xs, ys = b.broadcast(b.cast(x, acc), b.cast(y, acc))
    diff = b.op("sub", xs, ys)
    return b.cast(_norm(b, diff, float(p), tuple(range(diff.type.rank)), False), out)
