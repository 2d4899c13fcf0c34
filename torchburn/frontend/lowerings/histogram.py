"""Histograms: `histogram` (bin count or bin edges), `histogramdd`'s parts
(`_histogramdd_bin_edges`, `_histogramdd_from_bin_cts`, `_histogramdd_from_bin_tensors`).
`histc`, which bins by plain linear interpolation, is in `reductions.py`.

Bins follow PyTorch's rule: edges are `linspace(left, right, bins + 1)` in the input's dtype
(left and right from `range`, else the data's extremes, widened by 0.5 when equal); a value's
bin is the number of edges at or below it, minus one, the last bin closed on the right;
values outside [first edge, last edge] and NaN are not counted. Counting edges is what
PyTorch's binary search does, and what its linear interpolation with local search agrees
with. Each bin sums a one-hot [points, bins] (weighted when `weight` is given).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ...ir import dtypes as dt
from ...ir.expr import Const
from ...ir.tensor import Value
from ..builder import Builder, numel
from ..registry import Unsupported, lowering

aten = torch.ops.aten


def _points(b: Builder, x: Value) -> Value:
    """The input as [M, D] coordinates in its compute dtype (histogramdd's reading)."""
    if not x.dtype.is_float:
        raise Unsupported("histogram of a non-floating tensor")
    t = dt.compute_dtype(x.dtype)
    d = x.shape[-1] if x.type.rank else Const(1)
    m = numel(x.shape[:-1]) if x.type.rank else Const(1)
    return b.cast(b.reshape(x, (m, d)), t)


def _outer_edges(b: Builder, pts: Value, dim: int, rng: Optional[Sequence[float]]) -> tuple[Value, Value]:
    """(left, right) of one dim as 0-d values: `range`, else the data's min and max (0 and 1
    without data); equal ends are widened by 0.5 each way."""
    t = pts.dtype
    if rng is not None:
        lo, hi = float(rng[2 * dim]), float(rng[2 * dim + 1])
        if lo == hi:
            lo, hi = lo - 0.5, hi + 0.5
        return b.full(lo, (), t), b.full(hi, (), t)
    if pts.shape[0] == Const(0):
        return b.full(0.0, (), t), b.full(1.0, (), t)
    column = b.reshape(b.op("slice", pts, dim=1, start=Const(dim), end=Const(dim + 1), step=1), (pts.shape[0],))
    lo = b.op("reduce_min", column, dims=(0,), keepdim=False)
    hi = b.op("reduce_max", column, dims=(0,), keepdim=False)
    same = b.op("eq", lo, hi)
    lo = b.op("where", same, b.elementwise("sub", lo, 0.5), lo)
    hi = b.op("where", same, b.elementwise("add", hi, 0.5), hi)
    return lo, hi


def _linspace(b: Builder, lo: Value, hi: Value, steps: int, dtype: dt.DType) -> Value:
    """linspace(lo, hi, steps) as PyTorch computes it: from the start below the halfway
    index, back from the end above it, in the dtype of the result."""
    lo, hi = b.cast(lo, dtype), b.cast(hi, dtype)
    t = dt.compute_dtype(dtype)
    lo, hi = b.cast(lo, t), b.cast(hi, t)
    shape = (Const(steps),)
    idx = b.cast(b.op("iota", shape=shape, dim=0, start=0, step=1, dtype=dt.i64), t)
    lo_v, hi_v = b.expand(lo, shape), b.expand(hi, shape)
    step = b.elementwise("div", b.op("sub", hi, lo), float(max(steps - 1, 1)))
    step_v = b.expand(step, shape)
    from_start = b.op("add", lo_v, b.op("mul", step_v, idx))
    back = b.op("sub", b.scalar_like(float(steps - 1), idx), idx)
    from_end = b.op("sub", hi_v, b.op("mul", step_v, back))
    first_half = b.op("lt", idx, b.scalar_like(float(steps // 2), idx))
    return b.cast(b.op("where", first_half, from_start, from_end), dtype)


def _bin_edges(b: Builder, pts: Value, bins: Sequence[int], rng: Optional[Sequence[float]],
               dtype: dt.DType) -> list[Value]:
    edges = []
    for d, count in enumerate(bins):
        lo, hi = _outer_edges(b, pts, d, rng)
        edges.append(_linspace(b, lo, hi, int(count) + 1, dtype))
    return edges


def _hist(b: Builder, pts: Value, edges: Sequence[Value], weight: Optional[Value], density: bool,
          dtype: dt.DType) -> Value:
    """The histogram of [M, D] points over per-dim edges, shaped [bins_0, ..., bins_D-1]."""
    m = pts.shape[0]
    t = pts.dtype
    index: Optional[Value] = None
    inside: Optional[Value] = None
    sizes = []
    for d, e in enumerate(edges):
        ne = e.shape[0]
        if not isinstance(ne, Const):
            raise Unsupported("histogram with a symbolic number of bins")
        n_edges = int(ne.value)
        sizes.append(n_edges - 1)
        col = b.reshape(b.op("slice", pts, dim=1, start=Const(d), end=Const(d + 1), step=1), (m, Const(1)))
        ec = b.cast(e, t)
        grid = (m, ne)
        below = b.cast(b.op("le", b.expand(b.reshape(ec, (Const(1), ne)), grid), b.expand(col, grid)), dt.i64)
        pos = b.elementwise("sub", b.op("reduce_sum", below, dims=(1,), keepdim=False), 1)
        pos = b.op("min", pos, b.scalar_like(n_edges - 2, pos))  # the last bin is closed
        v = b.reshape(col, (m,))
        first = b.op("slice", ec, dim=0, start=Const(0), end=Const(1), step=1)
        last = b.op("slice", ec, dim=0, start=Const(n_edges - 1), end=Const(n_edges), step=1)
        ok = b.op("and", b.op("ge", v, b.expand(first, (m,))), b.op("le", v, b.expand(last, (m,))))
        inside = ok if inside is None else b.op("and", inside, ok)
        index = pos if index is None else b.op("add", b.elementwise("mul", index, n_edges - 1), pos)
    assert index is not None and inside is not None
    total = 1
    for s in sizes:
        total *= s
    grid = (m, Const(total))
    ids = b.op("iota", shape=grid, dim=1, start=0, step=1, dtype=dt.i64)
    hit = b.op("and", b.op("eq", b.expand(b.reshape(index, (m, Const(1))), grid), ids),
               b.expand(b.reshape(inside, (m, Const(1))), grid))
    w = b.scalar_like(1.0, b.cast(ids, t)) if weight is None else b.expand(
        b.reshape(b.cast(weight, t), (m, Const(1))), grid)
    hist = b.op("reduce_sum", b.op("where", hit, w, b.scalar_like(0.0, w)), dims=(0,), keepdim=False)
    hist = b.reshape(hist, tuple(Const(s) for s in sizes))
    if density:
        hist = b.op("div", hist, b.expand(b.op("reduce_sum", hist, dims=tuple(range(len(sizes))), keepdim=False),
                                          hist.shape))
        for d, e in enumerate(edges):
            ec = b.cast(e, t)
            n = sizes[d]
            width = b.op("sub", b.op("slice", ec, dim=0, start=Const(1), end=Const(n + 1), step=1),
                         b.op("slice", ec, dim=0, start=Const(0), end=Const(n), step=1))
            shape = [Const(1)] * len(sizes)
            shape[d] = Const(n)
            hist = b.op("div", hist, b.expand(b.reshape(width, shape), hist.shape))
    return b.cast(hist, dtype)


@lowering(aten.histogram.bin_ct)
def histogram_bin_ct(b: Builder, x: Value, bins: int = 100, *, range: Optional[Sequence[float]] = None,
                     weight: Optional[Value] = None, density: bool = False) -> tuple[Value, Value]:
    pts = _points(b, b.reshape(x, (numel(x.shape), Const(1))))
    edges = _bin_edges(b, pts, [bins], range, x.dtype)
    w = None if weight is None else b.reshape(weight, (numel(weight.shape),))
    return _hist(b, pts, edges, w, density, x.dtype), edges[0]


@lowering(aten.histogram.bins_tensor)
def histogram_bins_tensor(b: Builder, x: Value, bins: Value, *, weight: Optional[Value] = None,
                          density: bool = False) -> tuple[Value, Value]:
    pts = _points(b, b.reshape(x, (numel(x.shape), Const(1))))
    w = None if weight is None else b.reshape(weight, (numel(weight.shape),))
    return _hist(b, pts, [bins], w, density, x.dtype), bins


def _flat_weight(b: Builder, weight: Optional[Value]) -> Optional[Value]:
    return None if weight is None else b.reshape(weight, (numel(weight.shape),))


@lowering(aten._histogramdd_bin_edges)
def histogramdd_bin_edges(b: Builder, x: Value, bins: Sequence[int], *, range: Optional[Sequence[float]] = None,
                          weight: Any = None, density: bool = False) -> list[Value]:
    return _bin_edges(b, _points(b, x), bins, range, x.dtype)


@lowering(aten._histogramdd_from_bin_cts)
def histogramdd_from_bin_cts(b: Builder, x: Value, bins: Sequence[int], *, range: Optional[Sequence[float]] = None,
                             weight: Optional[Value] = None, density: bool = False) -> Value:
    pts = _points(b, x)
    edges = _bin_edges(b, pts, bins, range, x.dtype)
    return _hist(b, pts, edges, _flat_weight(b, weight), density, x.dtype)


@lowering(aten._histogramdd_from_bin_tensors)
def histogramdd_from_bin_tensors(b: Builder, x: Value, bins: Sequence[Value], *, weight: Optional[Value] = None,
                                 density: bool = False) -> Value:
    return _hist(b, _points(b, x), list(bins), _flat_weight(b, weight), density, x.dtype)
