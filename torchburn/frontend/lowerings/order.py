"""Order statistics and searches: median, nanmedian, kthvalue (through the IR's stable
`argsort`, NaN last, as PyTorch orders them), mode (all-pairs counts), searchsorted and
bucketize (counting the comparisons a binary search makes, over a [..., values, sequence]
grid), nonzero_static (positions found through a running count).

Indices follow the stable order: among equal values the earliest wins, and a row with NaN
has its median (and its k-th value past the numbers) at the position of a NaN in order.
"""
from __future__ import annotations

from typing import Any, Optional, Union

import torch

from ...ir import dtypes as dt
from ...ir.expr import Const
from ...ir.tensor import Value
from ..builder import Builder, normalize_dim, numel
from ..registry import Unsupported, lowering

aten = torch.ops.aten


def _sorted(b: Builder, x: Value, d: int) -> tuple[Value, Value]:
    """(values in ascending order along d, the permutation)."""
    key = b.cast(x, dt.i64) if x.dtype.is_bool else b.to_compute(x)
    perm = b.op("argsort", key, dim=d, descending=False)
    return b.op("gather", x, perm, dim=d), perm


def _take(b: Builder, vals: Value, perm: Value, d: int, pos: Union[int, Value],
          keepdim: bool) -> tuple[Value, Value]:
    """Element `pos` (an int, or an i64 tensor of the keepdim shape) along d of both."""
    if isinstance(pos, int):
        v = b.op("slice", vals, dim=d, start=Const(pos), end=Const(pos + 1), step=1)
        i = b.op("slice", perm, dim=d, start=Const(pos), end=Const(pos + 1), step=1)
    else:
        v, i = b.op("gather", vals, pos, dim=d), b.op("gather", perm, pos, dim=d)
    if not keepdim:
        shape = tuple(s for k, s in enumerate(vals.shape) if k != d)
        v, i = b.reshape(v, shape), b.reshape(i, shape)
    return v, i


def _nan_count(b: Builder, x: Value, d: int) -> Value:
    """The number of NaNs along d (keepdim), as i64."""
    if not x.dtype.is_float:
        return b.full(0, tuple(Const(1) if k == d else s for k, s in enumerate(x.shape)), dt.i64)
    nans = b.cast(b.op("isnan", b.to_compute(x)), dt.i64)
    return b.op("reduce_sum", nans, dims=(d,), keepdim=True)


def _median(b: Builder, x: Value, d: int, keepdim: bool, ignore_nan: bool) -> tuple[Value, Value]:
    n = x.shape[d]
    if not isinstance(n, Const) or int(n.value) == 0:
        raise Unsupported("median of an empty or symbolically sized dim")
    vals, perm = _sorted(b, x, d)
    nan = _nan_count(b, x, d)
    size = b.scalar_like(int(n.value), nan)
    if ignore_nan:
        # The middle of the numbers (NaNs sort last); a row of NaNs takes its first NaN.
        numbers = b.op("sub", size, nan)
        pos = b.op("max", b.elementwise("floordiv", b.elementwise("sub", numbers, 1), 2), b.scalar_like(0, nan))
    else:
        # NaN propagates: the first NaN in order when there is one.
        middle = b.scalar_like((int(n.value) - 1) // 2, nan)
        pos = b.op("where", b.op("gt", nan, b.scalar_like(0, nan)), b.op("sub", size, nan), middle)
    return _take(b, vals, perm, d, pos, keepdim)


def _median_lowering(ignore_nan: bool) -> Any:
    def whole(b: Builder, x: Value) -> Value:
        if x.type.rank == 0:
            return x
        flat = b.reshape(x, (numel(x.shape),))
        return _median(b, flat, 0, False, ignore_nan)[0]

    def along(b: Builder, x: Value, dim: int, keepdim: bool = False) -> tuple[Value, Value]:
        if x.type.rank == 0:
            return x, b.full(0, (), dt.i64)
        return _median(b, x, normalize_dim(dim, x.type.rank), bool(keepdim), ignore_nan)

    return whole, along


_whole, _along = _median_lowering(ignore_nan=False)
lowering(aten.median.default)(_whole)
lowering(aten.median.dim)(_along)
_whole, _along = _median_lowering(ignore_nan=True)
lowering(aten.nanmedian.default)(_whole)
lowering(aten.nanmedian.dim)(_along)


@lowering(aten.kthvalue.default)
def kthvalue(b: Builder, x: Value, k: Any, dim: int = -1, keepdim: bool = False) -> tuple[Value, Value]:
    """The k-th smallest (1-based) along dim, NaN counting as the largest."""
    if x.type.rank == 0:
        return x, b.full(0, (), dt.i64)
    if not isinstance(k, int):
        raise Unsupported("kthvalue with a symbolic k")
    d = normalize_dim(dim, x.type.rank)
    vals, perm = _sorted(b, x, d)
    return _take(b, vals, perm, d, k - 1, bool(keepdim))


# ---- searches ---------------------------------------------------------------------------------------

def _search(b: Builder, seq: Value, values: Union[Value, int, float], right: bool, out_int32: bool,
            sorter: Optional[Value] = None) -> Value:
    """Insertion points of `values` in the sorted last dim of `seq`: the count of elements a
    lower bound passes (`!(s >= v)`) or an upper bound passes (`!(s > v)`); NaN values go last."""
    comp, _ = b.promote(seq, values)
    if sorter is not None:
        seq = b.op("gather", seq, b.cast(sorter, dt.i64), dim=seq.type.rank - 1)
    s = b.as_tensor(seq, comp)
    v = b.as_tensor(values, comp)
    m = s.shape[-1]
    if s.type.rank == 1:
        s = b.reshape(s, (*(Const(1),) * v.type.rank, m))
    else:
        s = b.reshape(s, (*s.shape[:-1], Const(1), m))
    v = b.reshape(v, (*v.shape, Const(1)))
    s, v = b.broadcast(s, v)
    passed = b.op("not", b.op("gt" if right else "ge", s, v))
    count = b.op("reduce_sum", b.cast(passed, dt.i64), dims=(s.type.rank - 1,), keepdim=False)
    return b.cast(count, dt.i32 if out_int32 else dt.i64)


@lowering(aten.searchsorted.Tensor, aten.searchsorted.Scalar)
def searchsorted(b: Builder, seq: Value, values: Union[Value, int, float], *, out_int32: bool = False,
                 right: bool = False, side: Optional[str] = None, sorter: Optional[Value] = None) -> Value:
    return _search(b, seq, values, bool(right) or side == "right", bool(out_int32), sorter)


@lowering(aten.bucketize.Tensor, aten.bucketize.Scalar)
def bucketize(b: Builder, values: Union[Value, int, float], boundaries: Value, *, out_int32: bool = False,
              right: bool = False) -> Value:
    return _search(b, boundaries, values, bool(right), bool(out_int32))



@lowering(aten.mode.default)
def mode(b: Builder, x: Value, dim: int = -1, keepdim: bool = False) -> tuple[Value, Value]:
    """The most frequent value along dim (the smallest among equally frequent ones) and the
    index of its last occurrence, as PyTorch's CPU kernel gives them: counts from an
    all-pairs comparison [..., n, n] (quadratic in the row length)."""
    if x.type.rank == 0:
        return x, b.full(0, (), dt.i64)
    d = normalize_dim(dim, x.type.rank)
    key = b.cast(x, dt.i64) if x.dtype.is_bool else b.to_compute(x)
    rows = b.reshape(key, (*key.shape[:d + 1], Const(1), *key.shape[d + 1:]))
    cols = b.reshape(key, (*key.shape[:d], Const(1), *key.shape[d:]))
    rows, cols = b.broadcast(rows, cols)
    counts = b.op("reduce_sum", b.cast(b.op("eq", rows, cols), dt.i64), dims=(d + 1,), keepdim=False)
    best = b.expand(b.op("reduce_max", counts, dims=(d,), keepdim=True), counts.shape)
    top = b.op("eq", counts, best)
    big = float("inf") if key.dtype.is_float else (1 << (key.dtype.bits - 1)) - 1
    value = b.op("reduce_min", b.op("where", top, key, b.scalar_like(big, key)), dims=(d,), keepdim=True)
    pos = b.op("iota", shape=key.shape, dim=d, start=0, step=1, dtype=dt.i64)
    at_value = b.op("eq", key, b.expand(value, key.shape))
    index = b.op("reduce_max", b.op("where", at_value, pos, b.scalar_like(-1, pos)), dims=(d,), keepdim=True)
    if not keepdim:
        shape = tuple(s for k, s in enumerate(key.shape) if k != d)
        value, index = b.reshape(value, shape), b.reshape(index, shape)
    return b.cast(value, x.dtype), index


@lowering(aten.nonzero_static.default)
def nonzero_static(b: Builder, x: Value, *, size: int, fill_value: int = -1) -> Value:
    """The coordinates [size, ndim] of the first `size` non-zero elements in row-major order,
    rows past the count filled with `fill_value`. Element i is the r-th non-zero when it is
    non-zero and the running count of non-zeros reaches r + 1 at i (a scan); each output row
    sums its one match over a [size, numel] grid."""
    if not isinstance(size, int):
        raise Unsupported("nonzero_static with a symbolic size")
    if x.type.rank == 0:
        return b.full(0, (Const(size), Const(0)), dt.i64)
    n = numel(x.shape)
    flat = b.reshape(x, (n,))
    values = flat if flat.dtype.is_bool else b.to_compute(flat)
    nonzero = b.op("ne", values, b.scalar_like(False if flat.dtype.is_bool else 0, values))
    ones = b.cast(nonzero, dt.i64)
    running = b.op("scan", ones, dim=0, kind="add")
    grid = (Const(size), n)
    row = b.op("iota", shape=grid, dim=0, start=1, step=1, dtype=dt.i64)
    col = b.op("iota", shape=grid, dim=1, start=0, step=1, dtype=dt.i64)
    match = b.op("and", b.expand(b.reshape(nonzero, (Const(1), n)), grid),
                 b.op("eq", b.expand(b.reshape(running, (Const(1), n)), grid), row))
    found = b.op("reduce_any", match, dims=(1,), keepdim=True)
    where = b.op("reduce_sum", b.op("where", match, col, b.scalar_like(0, col)), dims=(1,), keepdim=True)
    columns = []
    stride = 1
    dims: list[tuple[int, int]] = []
    for s in reversed(x.shape):
        if not isinstance(s, Const):
            raise Unsupported("nonzero_static of a symbolically shaped tensor")
        dims.append((stride, int(s.value)))
        stride *= int(s.value)
    for stride_k, size_k in reversed(dims):
        coord = b.elementwise("remainder", b.elementwise("floordiv", where, stride_k), size_k)
        columns.append(b.op("where", found, coord, b.scalar_like(fill_value, coord)))
    return columns[0] if len(columns) == 1 else b.op("concat", *columns, dim=1)
