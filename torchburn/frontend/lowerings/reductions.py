"""Reductions: sum, prod, mean, amax/amin, any/all, argmax/argmin, softmax, log_softmax,
vector norms and dist, histc, segment_reduce.

Half-precision inputs reduce in f32; integer and bool sums accumulate in i64 (torch's rule).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ...ir import dtypes as dt
from ...ir import expr as ex
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


def require_nonempty(name: str, x: Value, dims: tuple[int, ...]) -> None:
    """Leave to PyTorch a max/min/argmax/argmin over an empty dim: eager raises there
    (IndexError or RuntimeError, "Expected reduction dim ... to have non-zero size"), and the
    node left to PyTorch raises the very same error when the compiled graph is called. A dim
    of size 0 is always a constant here (Dynamo specializes sizes 0 and 1); a symbolic one the
    launcher checks at each call (`launcher_gen.nonempty_checks`)."""
    if x.type.rank == 0:
        return
    if any(isinstance(x.shape[d], Const) and int(x.shape[d].value) == 0 for d in dims):
        raise Unsupported(f"{name} over an empty dim: PyTorch raises there")


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
        require_nonempty(f"a{kind}", x, _dims(x, dims))
        return b.cast(_reduce(b, kind, x, _dims(x, dims), keepdim, acc), x.dtype)
    return fn


lowering(aten.amax, aten.max.default)(_minmax("max"))
lowering(aten.amin, aten.min.default)(_minmax("min"))


def _anyall(kind: str) -> Any:
    def fn(b: Builder, x: Value, dims: Any = None, keepdim: bool = False) -> Value:
        out = _reduce(b, kind, b.cast(x, dt.bool_), _dims(x, dims), keepdim, dt.bool_)
        # PyTorch keeps uint8 for uint8 inputs (a 0/1 byte), every other dtype gives bool
        return b.cast(out, dt.u8) if x.dtype == dt.u8 else out
    return fn


lowering(aten.any)(_anyall("any"))
lowering(aten.all)(_anyall("all"))


def _arg(kind: str) -> Any:
    def fn(b: Builder, x: Value, dim: Optional[int] = None, keepdim: bool = False) -> Value:
        require_nonempty(kind, x, tuple(range(x.type.rank)) if dim is None
                         else (normalize_dim(dim, x.type.rank),))
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


@lowering(aten.histc)
def histc(b: Builder, x: Value, bins: int = 100, min: Any = 0, max: Any = 0) -> Value:
    """Counts in `bins` equal bins between min and max (the data's extremes when min == max),
    by PyTorch's rule: bin = trunc((x - left) * bins / (right - left)), the last bin closed,
    values outside [left, right] and NaN not counted. Each bin sums a one-hot [N, bins]."""
    if not x.dtype.is_float:
        raise Unsupported("histc of a non-floating tensor")
    out = b.out_dtype
    t = dt.compute_dtype(x.dtype)
    flat = b.cast(b.reshape(x, (numel(x.shape),)), t)
    if min == max:
        if flat.shape[0] == Const(0):
            left, right = b.full(float(min), (), t), b.full(float(max), (), t)
        else:
            left = b.op("reduce_min", flat, dims=(0,), keepdim=False)
            right = b.op("reduce_max", flat, dims=(0,), keepdim=False)
        same = b.op("eq", left, right)
        left = b.op("where", same, b.elementwise("sub", left, 1.0), left)
        right = b.op("where", same, b.elementwise("add", right, 1.0), right)
    else:
        # Edges are stored in the tensor's dtype, as `linspace(min, max, bins + 1)` would.
        left = b.cast(b.full(float(min), (), x.dtype), t)
        right = b.cast(b.full(float(max), (), x.dtype), t)
    lo, hi = b.expand(left, flat.shape), b.expand(right, flat.shape)
    scaled = b.op("div", b.op("mul", b.op("sub", flat, lo), b.scalar_like(float(bins), flat)), b.op("sub", hi, lo))
    pos = b.cast(scaled, dt.i64)
    last = b.scalar_like(bins - 1, pos)
    pos = b.op("min", pos, last)  # the rightmost bin includes its right edge
    inside = b.op("and", b.op("ge", flat, lo), b.op("le", flat, hi))
    n = flat.shape[0]
    grid = (n, Const(bins))
    ids = b.op("iota", shape=grid, dim=1, start=0, step=1, dtype=dt.i64)
    hit = b.op("and", b.op("eq", b.expand(b.reshape(pos, (n, Const(1))), grid), ids),
               b.expand(b.reshape(inside, (n, Const(1))), grid))
    counts = b.op("reduce_sum", b.cast(hit, t), dims=(0,), keepdim=False)
    return b.cast(counts, out)


_SEGMENT_IDENTITY = {"sum": 0.0, "mean": 0.0, "prod": 1.0, "max": float("-inf"), "min": float("inf")}


@lowering(aten.segment_reduce)
def segment_reduce(b: Builder, data: Value, reduce: str, *, lengths: Optional[Value] = None,
                   indices: Any = None, offsets: Optional[Value] = None, axis: int = 0,
                   unsafe: bool = False, initial: Any = None) -> Value:
    """Reduce consecutive segments of `data` along `axis` (given by `lengths` or `offsets`).

    Segment s covers [start_s, end_s); ends are a running sum of the lengths (a masked sum
    over a triangle, [..., S, S]). Each segment reduces a masked view of the data
    [..., S, N, ...] over N; `initial` joins every segment (and is an empty segment's value;
    without it an empty segment is the reduction's identity, and NaN for mean)."""
    if reduce not in _SEGMENT_IDENTITY or indices is not None:
        raise Unsupported(f"segment_reduce {reduce!r} with indices={indices is not None}")
    out_dtype = b.out_dtype
    acc = dt.compute_dtype(out_dtype)
    if offsets is not None:
        off = b.cast(offsets, dt.i64)
        segs = ex.sub(off.shape[-1], Const(1))
        start = b.op("slice", off, dim=off.type.rank - 1, start=Const(0), end=segs, step=1)
        end = b.op("slice", off, dim=off.type.rank - 1, start=Const(1), end=off.shape[-1], step=1)
        lens = b.op("sub", end, start)
    elif lengths is not None:
        lens = b.cast(lengths, dt.i64)
        segs = lens.shape[-1]
        tri = (segs, segs)
        below = b.op("le", b.op("iota", shape=tri, dim=1, start=0, step=1, dtype=dt.i64),
                     b.op("iota", shape=tri, dim=0, start=0, step=1, dtype=dt.i64))
        lead = lens.shape[:-1]
        spread = b.expand(b.reshape(lens, (*lead, Const(1), segs)), (*lead, segs, segs))
        masked = b.op("where", b.expand(below, spread.shape), spread, b.scalar_like(0, spread))
        end = b.op("reduce_sum", masked, dims=(len(lead) + 1,), keepdim=False)
        start = b.op("sub", end, lens)
    else:
        raise Unsupported("segment_reduce without lengths or offsets")
    nb = lens.type.rank - 1  # batch dims before the segmented axis
    if normalize_dim(axis, data.type.rank) != nb:
        raise Unsupported("segment_reduce with axis other than lengths.dim() - 1")
    n = data.shape[nb]
    rest = data.shape[nb + 1:]
    lead = data.shape[:nb]
    full = (*lead, segs, n, *rest)
    ones = (Const(1),) * len(rest)
    pos = b.op("iota", shape=(segs, n), dim=1, start=0, step=1, dtype=dt.i64)
    pos = b.expand(pos, (*lead, segs, n))
    lo = b.expand(b.reshape(start, (*lead, segs, Const(1))), (*lead, segs, n))
    hi = b.expand(b.reshape(end, (*lead, segs, Const(1))), (*lead, segs, n))
    inside = b.op("and", b.op("ge", pos, lo), b.op("lt", pos, hi))
    inside = b.expand(b.reshape(inside, (*lead, segs, n, *ones)), full)
    values = b.expand(b.reshape(b.cast(data, acc), (*lead, Const(1), n, *rest)), full)
    kind = {"mean": "sum"}.get(reduce, reduce)
    picked = b.op("where", inside, values, b.scalar_like(_SEGMENT_IDENTITY[reduce], values))
    out = b.op(f"reduce_{kind}", picked, dims=(nb + 1,), keepdim=False)
    count = b.expand(b.reshape(b.cast(lens, acc), (*lead, segs, *ones)), out.shape)
    if initial is not None:
        init = b.scalar_like(float(initial), out)
        combine = {"sum": "add", "mean": "add", "prod": "mul", "max": "max", "min": "min"}[reduce]
        out = b.op(combine, out, init)
        if reduce == "mean":
            empty = b.op("eq", count, b.scalar_like(0.0, count))
            out = b.op("where", empty, init, b.op("div", out, count))
    elif reduce == "mean":
        out = b.op("div", out, count)
    return b.cast(out, out_dtype)
