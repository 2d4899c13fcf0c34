"""Sorting and scans: sort, topk, cumsum, cumprod, logcumsumexp, cummax/cummin, and max/min
along a dim with their indices.

`sort` and `topk` compute the sorting permutation with the IR's `argsort` (a stable rank
sort, quadratic in the row length: meant for the short rows models sort) and gather the
values with it. PyTorch's own sort is not stable unless asked; with ties the indices may
differ from eager's (the values never do). Scans accumulate in f64 for f32 inputs, as
PyTorch's CPU kernels do.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir.expr import Const
from ...ir.tensor import Value
from ..builder import Builder, normalize_dim
from ..registry import lowering
from .reductions import require_nonempty

aten = torch.ops.aten


def _sortable(b: Builder, x: Value) -> Value:
    if x.dtype.is_bool:
        return b.cast(x, dt.i64)
    return b.to_compute(x)


def _sort(b: Builder, x: Value, dim: int, descending: bool) -> tuple[Value, Value]:
    if x.type.rank == 0:
        return x, b.full(0, (), dt.i64)
    d = normalize_dim(dim, x.type.rank)
    perm = b.op("argsort", _sortable(b, x), dim=d, descending=bool(descending))
    return b.op("gather", x, perm, dim=d), perm


@lowering(aten.sort.default)
def sort(b: Builder, x: Value, dim: int = -1, descending: bool = False) -> tuple[Value, Value]:
    return _sort(b, x, dim, descending)


@lowering(aten.sort.stable)
def sort_stable(b: Builder, x: Value, *, stable: Optional[bool] = None, dim: int = -1,
                descending: bool = False) -> tuple[Value, Value]:
    return _sort(b, x, dim, descending)


@lowering(aten.topk.default)
def topk(b: Builder, x: Value, k: Any, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Value, Value]:
    if x.type.rank == 0:
        return x, b.full(0, (), dt.i64)
    d = normalize_dim(dim, x.type.rank)
    perm = b.op("argsort", _sortable(b, x), dim=d, descending=bool(largest))
    kk = ex.as_expr(k) if isinstance(k, int) else k
    if kk != x.shape[d]:
        perm = b.op("slice", perm, dim=d, start=Const(0), end=kk, step=1)
    return b.op("gather", x, perm, dim=d), perm


def _scan(kind: str) -> Any:
    def fn(b: Builder, x: Value, dim: int, dtype: Any = None) -> Value:
        out = b.out_dtype
        if x.type.rank == 0:
            return b.cast(x, out)
        acc = dt.f64 if out == dt.f32 else dt.compute_dtype(out)
        res = b.op("scan", b.cast(x, acc), dim=normalize_dim(dim, x.type.rank), kind=kind)
        return b.cast(res, out)
    return fn


lowering(aten.cumsum.default)(_scan("add"))
lowering(aten.cumprod.default)(_scan("mul"))
lowering(aten.logcumsumexp.default)(_scan("logaddexp"))


def _cum_extreme(kind: str) -> Any:
    def fn(b: Builder, x: Value, dim: int) -> tuple[Value, Value]:
        if x.type.rank == 0:
            return x, b.full(0, (), dt.i64)
        d = normalize_dim(dim, x.type.rank)
        where = b.op("scan", _sortable(b, x), dim=d, kind=kind)
        return b.op("gather", x, where, dim=d), where
    return fn


lowering(aten.cummax.default)(_cum_extreme("argmax"))
lowering(aten.cummin.default)(_cum_extreme("argmin"))


def _extreme(kind: str) -> Any:
    def fn(b: Builder, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
        if x.type.rank == 0:
            return x, b.full(0, (), dt.i64)
        d = normalize_dim(dim, x.type.rank)
        require_nonempty(kind, x, (d,))
        xc = _sortable(b, x)
        values = b.op(f"reduce_{kind}", xc, dims=(d,), keepdim=bool(keepdim))
        where = b.op(f"arg{kind}", xc, dim=d, keepdim=bool(keepdim))
        return b.cast(values, x.dtype), where
    return fn


lowering(aten.max.dim)(_extreme("max"))
lowering(aten.min.dim)(_extreme("min"))
