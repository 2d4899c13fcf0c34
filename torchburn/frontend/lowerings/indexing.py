"""Indexing: gather, scatter (plain, add, reduce), advanced indexing (`index.Tensor`),
`index_put`, `index_select`, `flip`, `constant_pad_nd`, `slice_scatter`, `as_strided` (of
contiguous inputs); and `getitem`, which picks one result of a multi-result op (max pooling,
sort, var_mean, convolution_backward...).

Index tensors are used as i64. Every index read from a tensor is checked in the kernel
against the indexed size (`checked_index`): one out of range is never used and counts a
fault, and the launcher runs the call again in PyTorch, which raises eager's error. Negative
indices count from the end only where eager allows them (`x[i]`, `take`, `index_put`). Boolean-mask
indexing has a data-dependent result shape and stays in PyTorch.
"""
from __future__ import annotations

import operator
from typing import Any, Optional, Sequence

import torch
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir.expr import Const, Expr
from ...ir.loop import contiguous_strides
from ...ir.ops import infer_types
from ...ir.tensor import Value
from ..builder import Builder, normalize_dim, numel
from ..registry import Unsupported, lowering
from ..symbols import shape_to_exprs

aten = torch.ops.aten


@lowering(operator.getitem)
def getitem(b: Builder, results: Any, i: int) -> Value:
    if not isinstance(results, (tuple, list)):
        raise Unsupported("getitem of something that is not the result tuple of an op")
    v = results[i]
    if not isinstance(v, Value):
        raise Unsupported(f"result {i} was not computed")
    return v


def as_index(b: Builder, idx: Value) -> Value:
    if idx.dtype.is_float or idx.dtype.is_bool:
        raise Unsupported(f"index tensor of dtype {idx.dtype}")
    return b.cast(idx, dt.i64)


# ---- gather and scatter -------------------------------------------------------------------------

def _at_least_1d(b: Builder, *vals: Value) -> list[Value]:
    """0-d operands of gathers and scatters as one-element vectors (the only index is 0)."""
    return [b.reshape(v, (Const(1),)) if v.type.rank == 0 else v for v in vals]


def _shaped_like_result(b: Builder, v: Value) -> Value:
    return b.reshape(v, shape_to_exprs(b.out_meta().shape))


@lowering(aten.gather.default)
def gather(b: Builder, x: Value, dim: int, index: Value, sparse_grad: bool = False) -> Value:
    if x.type.rank <= 1 and index.type.rank <= 1:
        x1, i1 = _at_least_1d(b, x, as_index(b, index))  # a 0-d tensor indexes like [1]
        return _shaped_like_result(b, b.op("gather", x1, i1, dim=0))
    if index.type.rank != x.type.rank:
        # PyTorch accepts an empty index of any rank; the result is empty too.
        if not any(d == Const(0) for d in index.shape):
            raise Unsupported("gather with an index of another rank")
        return b.expand(b.full(0, (), x.dtype), index.shape)
    return b.op("gather", x, as_index(b, index), dim=normalize_dim(dim, x.type.rank))


SCATTER_REDUCE = {"sum": "add", "add": "add", "prod": "mul", "multiply": "mul", "amax": "max", "amin": "min"}
#: The same reductions on bool tensors, done on 0/1 bytes.
BOOL_SCATTER_REDUCE = {"add": "max", "max": "max", "mul": "min", "min": "min"}


def _scatter(b: Builder, x: Value, dim: int, index: Value, src: Any, reduce: str,
             include_self: bool = True) -> Value:
    if x.dtype.is_bool and reduce != "none":
        # PyTorch reduces bools as or (sum, amax) and and (prod, amin): on 0/1 bytes that is
        # max and min, which, unlike a byte sum, cannot wrap however many duplicates there are
        s8 = b.cast(src, dt.u8) if isinstance(src, Value) else src
        out = _scatter(b, b.cast(x, dt.u8), dim, index, s8, BOOL_SCATTER_REDUCE[reduce], include_self)
        return b.cast(out, dt.bool_)
    idx = as_index(b, index)
    if isinstance(src, Value):
        s = b.cast(src, x.dtype)
    else:
        s = b.expand(b.as_tensor(src, x.dtype), idx.shape)
    if x.type.rank == 0 or idx.type.rank == 0:
        if max(x.type.rank, idx.type.rank, s.type.rank) > 1:
            raise Unsupported("scatter with a 0-d index or self and another operand of rank > 1")
        x1, i1, s1 = _at_least_1d(b, x, idx, s)
        out = b.op("scatter", x1, i1, s1, dim=0, reduce=reduce, include_self=bool(include_self))
        return b.reshape(out, x.shape)
    return b.op("scatter", x, idx, s, dim=normalize_dim(dim, x.type.rank), reduce=reduce,
                include_self=bool(include_self))


@lowering(aten.scatter.src, aten.scatter.value)
def scatter(b: Builder, x: Value, dim: int, index: Value, src: Any) -> Value:
    return _scatter(b, x, dim, index, src, "none")


@lowering(aten.scatter.reduce, aten.scatter.value_reduce)
def scatter_reduce_legacy(b: Builder, x: Value, dim: int, index: Value, src: Any, reduce: str) -> Value:
    if reduce not in SCATTER_REDUCE:
        raise Unsupported(f"scatter reduce={reduce!r}")
    return _scatter(b, x, dim, index, src, SCATTER_REDUCE[reduce])


@lowering(aten.scatter_add.default)
def scatter_add(b: Builder, x: Value, dim: int, index: Value, src: Value) -> Value:
    return _scatter(b, x, dim, index, src, "add")


@lowering(aten.scatter_reduce.two)
def scatter_reduce(b: Builder, x: Value, dim: int, index: Value, src: Value, reduce: str,
                   include_self: bool = True) -> Value:
    if reduce == "mean":
        if x.dtype.is_bool:
            raise Unsupported("scatter_reduce mean of bool tensors")
        # sum / count, where count includes self when it takes part; untouched elements keep self.
        total = _scatter(b, x, dim, index, src, "add", include_self)
        ones = b.expand(b.full(1, (), x.dtype), index.shape)
        base = b.expand(b.full(1 if include_self else 0, (), x.dtype), x.shape)
        count = _scatter(b, base, dim, index, ones, "add")
        zero = b.expand(b.full(0, (), x.dtype), x.shape)
        safe = b.op("where", b.op("eq", count, zero), b.expand(b.full(1, (), x.dtype), x.shape), count)
        if x.dtype.is_float:
            mean = b.op("div", total, safe)
        else:
            mean = b.op("floordiv", total, safe)
        return b.op("where", b.op("eq", count, zero), x, mean)
    if reduce not in SCATTER_REDUCE:
        raise Unsupported(f"scatter_reduce reduce={reduce!r}")
    return _scatter(b, x, dim, index, src, SCATTER_REDUCE[reduce], include_self)


# ---- advanced indexing ------------------------------------------------------------------------------

def _index_operands(b: Builder, x: Value, indices: Sequence[Optional[Value]]) -> tuple[list[Value], dict[str, Any]]:
    """Broadcast index tensors and the `dims`/`pos` attributes of `index`/`index_put`."""
    dims = [d for d, i in enumerate(indices) if i is not None]
    if not dims:
        raise Unsupported("indexing without index tensors")
    tensors = [i for i in indices if i is not None]
    for t in tensors:
        if t.dtype.is_bool or t.dtype == dt.u8:
            raise Unsupported("boolean mask indexing (the result shape depends on the data)")
    if len(indices) > x.type.rank:
        raise Unsupported("too many indices")
    idx = b.broadcast(*(as_index(b, t) for t in tensors))
    adjacent = dims == list(range(dims[0], dims[0] + len(dims)))
    pos = dims[0] if adjacent else 0
    return idx, dict(dims=tuple(dims), pos=pos)


def _meta(arg: Any) -> Any:
    return arg.meta.get("val") if isinstance(arg, torch.fx.Node) else arg


def _mask_indices(node: torch.fx.Node) -> Optional[str]:
    """Boolean masks select a data-dependent number of elements; `index_put` takes one mask
    over the leading dims with one value for all selected rows (a `where`)."""
    indices = [_meta(i) for i in node.args[1]]  # type: ignore[union-attr]
    masks = [i for i in indices if isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)]
    if not masks:
        return None
    if node.target in (aten.index_put.default, aten._unsafe_index_put.default) and len(indices) == 1:
        x, values = _meta(node.args[0]), _meta(node.args[2])
        mask = masks[0]
        rest = x.dim() - mask.dim()
        same = rest >= 0 and all(statically_known_true(a == b) for a, b in zip(x.shape, mask.shape))
        if same and (not isinstance(values, torch.Tensor) or values.dim() <= rest
                     or (values.dim() == rest + 1 and statically_known_true(values.shape[0] == 1))):
            return None
    return "boolean mask indexing (the result shape depends on the data)"


@lowering(aten.index.Tensor, supports=_mask_indices)
def index(b: Builder, x: Value, indices: Sequence[Optional[Value]]) -> Value:
    idx, attrs = _index_operands(b, x, indices)
    return b.op("index", x, *idx, **attrs)


def _masked_put(b: Builder, x: Value, mask: Value, values: Any, accumulate: bool) -> Value:
    """`x[mask] = values` where `values` is the same for every selected row (one row, or
    fewer dims than the rows): a `where`, with no data-dependent shape."""
    m = mask.type.rank
    rest = x.shape[m:]
    if isinstance(values, Value):
        if values.type.rank > len(rest):
            if values.type.rank != len(rest) + 1 or values.shape[0] != Const(1):
                raise Unsupported("boolean mask index_put with one value per selected row")
            values = b.reshape(values, values.shape[1:])
    vals = b.expand(b.as_tensor(values, x.dtype), x.shape)
    cond = b.expand(b.reshape(b.cast(mask, dt.bool_), (*mask.shape, *(Const(1),) * len(rest))), x.shape)
    if accumulate:
        if x.dtype.is_bool:  # a bool sum is an or
            return b.op("or", x, b.op("where", cond, vals, b.expand(b.full(False, (), x.dtype), x.shape)))
        zero = b.expand(b.full(0, (), x.dtype), x.shape)
        return b.op("add", x, b.op("where", cond, vals, zero))
    return b.op("where", cond, vals, x)


@lowering(aten.index_put.default, aten._unsafe_index_put.default, supports=_mask_indices)
def index_put(b: Builder, x: Value, indices: Sequence[Optional[Value]], values: Any,
              accumulate: bool = False) -> Value:
    return _index_put(b, x, indices, values, accumulate, wrap=True)


def _index_put(b: Builder, x: Value, indices: Sequence[Optional[Value]], values: Any,
               accumulate: bool, wrap: bool) -> Value:
    """`index_put`; `wrap`: negative indices count from the end (else they are out of range)."""
    if (len(indices) == 1 and isinstance(indices[0], Value) and indices[0].dtype in (dt.bool_, dt.u8)
            and indices[0].shape == x.shape[:indices[0].type.rank]):
        return _masked_put(b, x, indices[0], values, accumulate)
    idx, attrs = _index_operands(b, x, indices)
    (indexed,) = infer_types("index", [x.type, *(i.type for i in idx)], attrs)
    shape = indexed.shape
    if x.dtype.is_bool and accumulate:
        # a bool sum is an or: count the trues in i32 (no realistic number of duplicates
        # overflows it), then test for nonzero
        counts = b.op("index_put", b.cast(x, dt.i32), b.expand(b.as_tensor(values, dt.i32), shape), *idx,
                      accumulate=True, wrap=wrap, **attrs)
        return b.cast(counts, dt.bool_)
    vals = b.expand(b.as_tensor(values, x.dtype), shape)
    return b.op("index_put", x, vals, *idx, accumulate=bool(accumulate), wrap=wrap, **attrs)


def _put_along(b: Builder, x: Value, dim: int, index: Value, source: Value, accumulate: bool) -> Value:
    """`index_copy`/`index_add`: `source`'s slices written (or added) at `index` along `dim`;
    eager refuses negative indices here, so they are out of range. A 0-d `x` or `index` acts
    as one element; `source` is taken in the shape the written slices have."""
    if index.type.rank > 1:
        raise Unsupported("index_copy/index_add with an index of more than one dim")
    xr = b.reshape(x, (Const(1),)) if x.type.rank == 0 else x
    idx = b.reshape(index, (Const(1),)) if index.type.rank == 0 else index
    dim = normalize_dim(dim, xr.type.rank)
    shape = tuple(idx.shape[0] if d == dim else n for d, n in enumerate(xr.shape))
    src = b.cast(source, x.dtype)
    if src.shape != shape:
        src = b.reshape(src, shape)
    indices: list[Optional[Value]] = [None] * dim + [idx]
    out = _index_put(b, xr, indices, src, accumulate, wrap=False)
    return b.reshape(out, ()) if x.type.rank == 0 else out


@lowering(aten.index_copy.default)
def index_copy(b: Builder, x: Value, dim: int, index: Value, source: Value) -> Value:
    return _put_along(b, x, dim, index, source, accumulate=False)


@lowering(aten.index_add.default)
def index_add(b: Builder, x: Value, dim: int, index: Value, source: Value, alpha: Any = 1) -> Value:
    if alpha != 1:
        source = b.op("mul", source, b.expand(b.as_tensor(alpha, source.dtype), source.shape))
    return _put_along(b, x, dim, index, source, accumulate=True)


@lowering(aten._unsafe_index.Tensor, supports=_mask_indices)
def unsafe_index(b: Builder, x: Value, indices: Sequence[Optional[Value]]) -> Value:
    return index(b, x, indices)


@lowering(aten.index_select.default)
def index_select(b: Builder, x: Value, dim: int, index: Value) -> Value:
    idx = as_index(b, index)
    if x.type.rank == 0:  # the only valid index is 0: the result is x, shaped like the index
        return b.reshape(x, shape_to_exprs(b.out_meta().shape))
    dim = normalize_dim(dim, x.type.rank)
    if idx.type.rank == 0:
        idx = b.reshape(idx, (Const(1),))
    return b.op("index", x, idx, dims=(dim,), pos=dim, wrap=False)  # eager refuses negatives



@lowering(aten.take.default)
def take(b: Builder, x: Value, index: Value) -> Value:
    """Elements of `x` in row-major order, picked by `index` (negative counts from the end)."""
    flat = b.reshape(x, (numel(x.shape),))
    idx = as_index(b, index)
    if idx.type.rank == 0:
        return b.reshape(b.op("index", flat, b.reshape(idx, (Const(1),)), dims=(0,), pos=0), ())
    return b.op("index", flat, idx, dims=(0,), pos=0)


@lowering(aten.put.default)
def put(b: Builder, x: Value, index: Value, source: Value, accumulate: bool = False) -> Value:
    """`index_put` on the flattened tensor."""
    flat = b.reshape(x, (numel(x.shape),))
    idx = b.reshape(as_index(b, index), (numel(index.shape),))
    vals = b.reshape(b.cast(source, x.dtype), (numel(source.shape),))
    out = b.op("index_put", flat, vals, idx, dims=(0,), pos=0, accumulate=bool(accumulate))
    return b.reshape(out, x.shape)


@lowering(aten.index_reduce.default)
def index_reduce(b: Builder, x: Value, dim: int, index: Value, source: Value, reduce: str,
                 include_self: bool = True) -> Value:
    """`scatter_reduce` with the 1-d index broadcast along the other dims of `source`."""
    if x.type.rank == 0:
        return scatter_reduce(b, x, 0, index, source, reduce, include_self)
    dim = normalize_dim(dim, x.type.rank)
    idx = as_index(b, index)
    if idx.type.rank == 0:
        idx = b.reshape(idx, (Const(1),))
    shape: list[Expr] = [Const(1)] * source.type.rank
    shape[dim] = idx.shape[0]
    full_index = b.expand(b.reshape(idx, shape), source.shape)
    return scatter_reduce(b, x, dim, full_index, source, reduce, include_self)


# ---- flips, padding, slice scatter --------------------------------------------------------------

@lowering(aten.flip.default)
def flip(b: Builder, x: Value, dims: Sequence[int]) -> Value:
    if x.type.rank == 0 or not dims:
        return x
    return b.op("flip", x, dims=tuple(sorted({normalize_dim(d, x.type.rank) for d in dims})))


@lowering(aten.constant_pad_nd.default)
def constant_pad_nd(b: Builder, x: Value, pad: Sequence[int], value: Any = 0) -> Value:
    rank = x.type.rank
    if len(pad) % 2 or len(pad) // 2 > rank or not all(isinstance(p, int) for p in pad):
        raise Unsupported(f"pad {pad} for rank {rank}")
    low, high = [0] * rank, [0] * rank
    for k in range(len(pad) // 2):
        low[rank - 1 - k] = int(pad[2 * k])
        high[rank - 1 - k] = int(pad[2 * k + 1])
    if not any(low) and not any(high):
        return x
    if x.dtype.is_bool:
        value = bool(value)
    elif not x.dtype.is_float:
        if isinstance(value, float) and not value.is_integer():
            raise Unsupported("fractional pad value for an integer tensor")
        value = int(value)
    else:
        value = float(value)
    return b.op("pad", x, low=tuple(low), high=tuple(high), value=value)


@lowering(aten.replication_pad1d_backward.default, aten.replication_pad2d_backward.default,
          aten.replication_pad3d_backward.default)
def replication_pad_backward(b: Builder, grad: Value, x: Value, padding: Sequence[int]) -> Value:
    """Each padded dim in turn: output position `o` came from input `clamp(o - low)`, so the
    gradient scatter-adds along that dim (the edges collect the gradients of their copies)."""
    rank = x.type.rank
    out = b.to_compute(grad) if grad.dtype.is_float else grad
    for k in range(len(padding) // 2):
        d = rank - 1 - k
        n = x.shape[d]
        pos = b.op("iota", shape=out.shape, dim=d, start=-int(padding[2 * k]), step=1, dtype=dt.i64)
        lo = b.expand(b.full(0, (), dt.i64), out.shape)
        hi = b.expand(b.full(ex.sub(n, Const(1)), (), dt.i64), out.shape)
        src_idx = b.op("min", b.op("max", pos, lo), hi)
        shape = tuple(n if i == d else s for i, s in enumerate(out.shape))
        zeros = b.expand(b.full(0, (), out.dtype), shape)
        out = b.op("scatter", zeros, src_idx, out, dim=d, reduce="add", include_self=True)
    return b.cast(out, grad.dtype)


@lowering(aten.slice_scatter.default)
def slice_scatter(b: Builder, x: Value, src: Value, dim: int = 0, start: Any = None, end: Any = None,
                  step: int = 1) -> Value:
    dim = normalize_dim(dim, x.type.rank)
    size = x.shape[dim]
    if start is None:
        start = 0
    if not isinstance(start, int) or not isinstance(step, int) or step <= 0:
        raise Unsupported("slice_scatter with a symbolic start or a non-positive step")
    if start < 0:
        if not isinstance(size, Const):
            raise Unsupported("slice_scatter with a negative start on a symbolic dim")
        start = max(start + int(size.value), 0)
    return b.op("slice_scatter", x, b.cast(src, x.dtype), dim=dim, start=start, step=step)


def _mask_ranks(b: Builder, mask: Value, shape: tuple[Expr, ...]) -> tuple[Value, Value]:
    """The mask broadcast to `shape`, and each element's rank among the selected ones
    (row-major, from 0): the running count of the mask minus one."""
    m = b.expand(b.as_tensor(mask, dt.bool_), shape)
    n = numel(shape)
    count = b.op("scan", b.reshape(b.cast(m, dt.i64), (n,)), dim=0, kind="add")
    return m, b.op("sub", count, b.expand(b.full(1, (), dt.i64), (n,)))


@lowering(aten.masked_scatter.default)
def masked_scatter(b: Builder, x: Value, mask: Value, source: Value) -> Value:
    """The k-th selected element (row-major) takes `source.flatten()[k]`: k is the running count
    of the mask, so the shape does not depend on the data."""
    shape = b.broadcast_shapes(x.shape, mask.shape)
    x = b.expand(x, shape)
    m, rank = _mask_ranks(b, mask, shape)
    src = b.reshape(b.cast(source, x.dtype), (numel(source.shape),))
    picked = b.reshape(b.op("index", src, rank, dims=(0,), pos=0), shape)
    return b.op("where", m, picked, x)


@lowering(aten.masked_scatter_backward.default)
def masked_scatter_backward(b: Builder, grad: Value, mask: Value, sizes: Sequence[Any]) -> Value:
    """The gradient of `source`: selected gradients in order, zeros after them. Unselected
    elements add a zero at some rank, so a scatter-add needs no data-dependent shape."""
    m, rank = _mask_ranks(b, mask, grad.shape)
    shape = shape_to_exprs(b.out_meta().shape)
    n = numel(shape)
    zero = b.expand(b.full(0, (), grad.dtype), grad.shape)
    picked = b.reshape(b.op("where", m, grad, zero), (numel(grad.shape),))
    out = b.op("scatter", b.expand(b.full(0, (), grad.dtype), (n,)), rank, picked, dim=0, reduce="add",
               include_self=True)
    return b.reshape(out, shape)


# ---- as_strided ----------------------------------------------------------------------------------

def _contiguous_input(node: torch.fx.Node) -> Optional[str]:
    src = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(src, torch.Tensor):
        return "as_strided of a non-tensor"
    if not src.is_contiguous() or src.storage_offset() != 0:
        return "as_strided of a non-contiguous view (its storage layout is not the IR's)"
    return None


@lowering(aten.as_strided.default, aten.as_strided_copy.default, supports=_contiguous_input)
def as_strided(b: Builder, x: Value, size: Sequence[Any], stride: Sequence[Any], storage_offset: Any = None) -> Value:
    """On a contiguous input, element `i` of the result is element `offset + sum(i * stride)`
    of the input in row-major order: a reshape when the strides are the contiguous ones, a
    gather from the flattened input otherwise."""
    shape = tuple(ex.as_expr(s) for s in size)
    strides = tuple(ex.as_expr(s) for s in stride)
    offset = ex.as_expr(storage_offset or 0)
    total = numel(x.shape)
    dense = all(s == c or d == Const(1) for s, c, d in zip(strides, contiguous_strides(shape), shape))
    if dense and offset == Const(0) and numel(shape) == total:
        return b.reshape(x, shape)
    pos = b.expand(b.full(offset, (), dt.i64), shape)
    for d, (n, s) in enumerate(zip(shape, strides)):
        if n == Const(1) or s == Const(0):
            continue
        along = b.op("iota", shape=shape, dim=d, start=0, step=1, dtype=dt.i64)
        pos = b.op("add", pos, b.op("mul", along, b.expand(b.full(s, (), dt.i64), shape)))
    flat = b.reshape(x, (total,))
    return b.op("index", flat, pos, dims=(0,), pos=0)

