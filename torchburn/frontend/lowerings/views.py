"""View and shape ops. In the IR they are index remappings: fusion folds them into the
loads of their consumers, so a view never copies unless it is a graph output. Diagonals are
strided slices of the flattened pair of dims; `unfold` and `diagonal_scatter` gather."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir.expr import Const, Expr
from ...ir.tensor import Value
from ..builder import Builder, normalize_dim, numel
from ..registry import Unsupported, lowering
from ..symbols import UnsupportedSymbolic, shape_to_exprs, size_to_expr

aten = torch.ops.aten
prims = torch.ops.prims


def _as_dims(sizes: Sequence[Any]) -> list[Expr]:
    return [ex.as_expr(s) if isinstance(s, (int, Expr)) else ex.as_expr(int(s)) for s in sizes]


def _infer_minus_one(x: Value, sizes: Sequence[Any]) -> tuple[Expr, ...]:
    dims = _as_dims(sizes)
    unknown = [i for i, d in enumerate(dims) if d == Const(-1)]
    if len(unknown) > 1:
        raise Unsupported("view with more than one -1")
    if unknown:
        known = numel([d for i, d in enumerate(dims) if i != unknown[0]])
        dims[unknown[0]] = ex.floordiv(numel(x.shape), known)
    return tuple(dims)


@lowering(aten.view, aten._unsafe_view, aten.reshape, aten.view_copy)
def view(b: Builder, x: Value, sizes: Sequence[Any]) -> Value:
    assert b.node is not None
    if b.node.target == aten.view.dtype:
        raise Unsupported("view as another dtype (bit reinterpretation)")
    # The traced result shape is exact and simplified (`s0 * s1 // s1` is already `s0`).
    meta = b.node.meta.get("val")
    if isinstance(meta, torch.Tensor):
        try:
            return b.reshape(x, shape_to_exprs(meta.shape))
        except UnsupportedSymbolic:
            pass
    return b.reshape(x, _infer_minus_one(x, sizes))


@lowering(aten.permute, aten.permute_copy)
def permute(b: Builder, x: Value, dims: Sequence[int]) -> Value:
    rank = x.type.rank
    dims = tuple(normalize_dim(d, rank) for d in dims)
    if dims == tuple(range(rank)):
        return x
    return b.op("permute", x, dims=dims)


@lowering(aten.t)
def t(b: Builder, x: Value) -> Value:
    return x if x.type.rank < 2 else b.op("permute", x, dims=(1, 0))


@lowering(aten.transpose.int)
def transpose(b: Builder, x: Value, d0: int, d1: int) -> Value:
    rank = x.type.rank
    if rank == 0:
        return x
    d0, d1 = normalize_dim(d0, rank), normalize_dim(d1, rank)
    dims = list(range(rank))
    dims[d0], dims[d1] = dims[d1], dims[d0]
    return permute(b, x, dims)


@lowering(aten.expand, aten.expand_copy)
def expand(b: Builder, x: Value, sizes: Sequence[Any], implicit: bool = False) -> Value:
    dims = _as_dims(sizes)
    offset = len(dims) - x.type.rank
    shape = tuple(x.shape[i - offset] if d == Const(-1) else d for i, d in enumerate(dims))
    return b.expand(x, shape)


@lowering(aten.squeeze, aten.squeeze_copy)
def squeeze(b: Builder, x: Value, dims: Any = None) -> Value:
    rank = x.type.rank
    if dims is None:
        sel = set(range(rank))
    else:
        sel = {normalize_dim(d, rank) for d in ([dims] if isinstance(dims, int) else dims)}
    shape = tuple(d for i, d in enumerate(x.shape) if not (i in sel and d == Const(1)))
    return b.reshape(x, shape)


@lowering(aten.unsqueeze, aten.unsqueeze_copy)
def unsqueeze(b: Builder, x: Value, dim: int) -> Value:
    dim = normalize_dim(dim, x.type.rank + 1)
    shape = list(x.shape)
    shape.insert(dim, Const(1))
    return b.reshape(x, shape)


def _clamp_index(v: Any, size: Expr, default: Any) -> Expr:
    """Python slice semantics for a start/end bound: negative counts from the end, clamp."""
    if v is None:
        return ex.as_expr(default)
    if isinstance(v, int):
        if v == 0:  # sizes are never negative: min(0, size) is 0 (and keeps the length exact)
            return Const(0)
        if isinstance(size, Const):
            n = int(size.value)
            v = v + n if v < 0 else v
            return Const(min(max(v, 0), n))
        if v >= 0:
            return ex.minimum(Const(v), size) if v < 2**62 else size
        return ex.maximum(ex.add(size, Const(v)), Const(0))
    # A symbolic bound: assume it is within range (Dynamo guards sizes it derives bounds from).
    return ex.minimum(ex.as_expr(v), size)


@lowering(aten.slice.Tensor, aten.slice_copy.Tensor)
def slice_(b: Builder, x: Value, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Value:
    if x.type.rank == 0:
        raise Unsupported("slice of a 0-d tensor")
    dim = normalize_dim(dim, x.type.rank)
    if step is None:
        step = 1
    if not isinstance(step, int) or step <= 0:
        raise Unsupported("slice step must be a positive integer")
    size = x.shape[dim]
    lo = _clamp_index(start, size, 0)
    hi = _clamp_index(end, size, size)
    if isinstance(hi, Const) and isinstance(lo, Const):
        hi = Const(max(int(hi.value), int(lo.value)))
    elif lo != Const(0):  # a clamped end is never negative: max(hi, 0) is hi
        hi = ex.maximum(hi, lo)
    if lo == Const(0) and step == 1 and not isinstance(hi, Const):
        hi = _traced_length(b, dim, hi)
    if lo == Const(0) and hi == size and step == 1:
        return x
    return b.op("slice", x, dim=dim, start=lo, end=hi, step=step)


def _traced_length(b: Builder, dim: int, hi: Expr) -> Expr:
    """The length of a slice from 0, as Dynamo's shape environment knows it: `y[:, :n]` with
    `n <= y.shape[1]` guarded has length `n`, where our clamp says `min(n, s1)` (and a later
    broadcast against another tensor of length `n` could not prove them equal). `hi` when
    the traced shape is not at hand."""
    val = b.node.meta.get("val") if b.node is not None else None
    if not isinstance(val, torch.Tensor) or val.dim() <= dim:
        return hi
    try:
        return size_to_expr(val.shape[dim])
    except UnsupportedSymbolic:
        return hi


@lowering(aten.select.int, aten.select_copy.int)
def select(b: Builder, x: Value, dim: int, index: Any) -> Value:
    dim = normalize_dim(dim, x.type.rank)
    size = x.shape[dim]
    if isinstance(index, int):
        if isinstance(size, Const):
            n = int(size.value)
            if not -n <= index < n:
                raise Unsupported(f"select index {index} out of range for size {n}")
            index = index % n
        elif index < 0:
            index = ex.add(size, Const(index))
    start = ex.as_expr(index)
    sliced = b.op("slice", x, dim=dim, start=start, end=ex.add(start, Const(1)), step=1)
    shape = tuple(d for i, d in enumerate(sliced.shape) if i != dim)
    return b.reshape(sliced, shape)


@lowering(aten.cat)
def cat(b: Builder, tensors: Sequence[Value], dim: int = 0) -> Value:
    out_dtype = b.out_dtype
    parts = [t for t in tensors if not (t.type.rank == 1 and t.shape[0] == Const(0))]
    if not parts:  # only legacy empty [0] operands: the result is empty too
        return b.full(0, (Const(0),), out_dtype)
    dim = normalize_dim(dim, parts[0].type.rank)
    parts = [b.cast(t, out_dtype) for t in parts]
    if len(parts) == 1:
        return parts[0]
    return b.op("concat", *parts, dim=dim)


@lowering(aten.narrow_copy)
def narrow_copy(b: Builder, x: Value, dim: int, start: Any, length: Any) -> Value:
    if isinstance(start, int) and isinstance(length, int):
        return slice_(b, x, dim, start, start + length)
    return slice_(b, x, dim, start, ex.add(ex.as_expr(start), ex.as_expr(length)))


@lowering(aten.split_with_sizes, aten.split_with_sizes_copy)
def split_with_sizes(b: Builder, x: Value, sizes: Sequence[Any], dim: int = 0) -> tuple[Value, ...]:
    dim = normalize_dim(dim, x.type.rank)
    parts = []
    start: Expr = Const(0)
    for s in sizes:
        end = ex.add(start, ex.as_expr(s))
        parts.append(b.op("slice", x, dim=dim, start=start, end=end, step=1))
        start = end
    return tuple(parts)


@lowering(aten.unbind_copy.int)
def unbind_copy(b: Builder, x: Value, dim: int = 0) -> tuple[Value, ...]:
    size = x.shape[normalize_dim(dim, x.type.rank)]
    if not isinstance(size, Const):
        raise Unsupported("unbind of a symbolic dimension")
    return tuple(select(b, x, dim, i) for i in range(int(size.value)))


@lowering(aten.diagonal, aten.diagonal_copy)
def diagonal(b: Builder, x: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Value:
    """The diagonal as a strided slice of the two dims flattened: element (i, i + offset) of
    an [n1, n2] matrix is at `start + i * (n2 + 1)` of its row-major flattening."""
    rank = x.type.rank
    d1, d2 = normalize_dim(dim1, rank), normalize_dim(dim2, rank)
    if d1 == d2:
        raise Unsupported("diagonal with dim1 == dim2")
    others = [d for d in range(rank) if d not in (d1, d2)]
    y = permute(b, x, [*others, d1, d2])
    n1, n2 = x.shape[d1], x.shape[d2]
    start: Expr
    if offset >= 0:
        length = ex.maximum(ex.minimum(n1, ex.sub(n2, Const(offset))), Const(0))
        start = Const(offset)
    else:
        length = ex.maximum(ex.minimum(ex.add(n1, Const(offset)), n2), Const(0))
        start = ex.mul(Const(-offset), n2)
    step = ex.add(n2, Const(1))
    flat = b.reshape(y, (*y.shape[:-2], ex.mul(n1, n2)))
    # The slice stops right after its last element (or at its start when it is empty).
    end = ex.add(start, ex.maximum(ex.sub(ex.mul(length, step), n2), Const(0)))
    return b.op("slice", flat, dim=len(others), start=start, end=end, step=step)


@lowering(aten.repeat)
def repeat(b: Builder, x: Value, repeats: Sequence[Any]) -> Value:
    """Tile: each dim `d` of size `s` repeated `r` times is a new [r, s] pair expanded from
    [1, s] and merged into `r * s`."""
    reps = _as_dims(repeats)
    if len(reps) < x.type.rank:
        raise Unsupported("repeat with fewer repeats than dims")
    shape = (Const(1),) * (len(reps) - x.type.rank) + x.shape
    if all(r == Const(1) for r in reps):
        return b.reshape(x, shape)  # no tiling: the input itself (as the launcher copies it)
    paired = b.reshape(x, [d for s in shape for d in (Const(1), s)])
    expanded = b.expand(paired, [d for r, s in zip(reps, shape) for d in (r, s)])
    return b.reshape(expanded, [ex.mul(r, s) for r, s in zip(reps, shape)])


@lowering(aten.unfold, aten.unfold_copy)
def unfold(b: Builder, x: Value, dimension: int, size: int, step: int) -> Value:
    """Windows of `size` every `step` along `dimension`, as a new last dim: a gather along
    the unfolded dim (moved last) with indices `w * step + j`."""
    if x.type.rank == 0:
        return b.reshape(x, (Const(1),))
    rank = x.type.rank
    d = normalize_dim(dimension, rank)
    n = x.shape[d]
    windows = ex.add(ex.floordiv(ex.sub(n, Const(size)), Const(step)), Const(1))
    others = [i for i in range(rank) if i != d]
    y = permute(b, x, [*others, d])
    grid = (windows, Const(size))
    idx = b.op("add", b.op("iota", shape=grid, dim=0, start=0, step=step, dtype=dt.i64),
               b.op("iota", shape=grid, dim=1, start=0, step=1, dtype=dt.i64))
    lead = y.shape[:-1]
    idx = b.expand(b.reshape(idx, (ex.mul(windows, Const(size)),)), (*lead, ex.mul(windows, Const(size))))
    picked = b.reshape(b.op("gather", y, idx, dim=rank - 1), (*lead, windows, Const(size)))
    # picked is [others..., windows, size]; put `windows` back at position d.
    order = [*range(d), rank - 1, *range(d, rank - 1), rank]
    return permute(b, picked, order)


@lowering(aten.copy)
def copy(b: Builder, dst: Value, src: Value, non_blocking: bool = False) -> Value:
    """The functional copy: `src` cast to `dst`'s dtype and broadcast to its shape."""
    return b.expand(b.cast(src, dst.dtype), dst.shape)


@lowering(aten.diagonal_scatter)
def diagonal_scatter(b: Builder, x: Value, src: Value, offset: int = 0, dim1: int = 0, dim2: int = 1) -> Value:
    """`x` with the diagonal that `diagonal(x, offset, dim1, dim2)` views replaced by `src`:
    with the two dims moved last, element (i, j) takes `src[..., i or j]` where j - i == offset."""
    rank = x.type.rank
    d1, d2 = normalize_dim(dim1, rank), normalize_dim(dim2, rank)
    if d1 == d2:
        raise Unsupported("diagonal_scatter with dim1 == dim2")
    length = src.shape[-1]
    if length == Const(0):
        return x
    others = [d for d in range(rank) if d not in (d1, d2)]
    order = [*others, d1, d2]
    xp = permute(b, x, order)
    n1, n2 = x.shape[d1], x.shape[d2]
    grid = (n1, n2)
    rows = b.op("iota", shape=grid, dim=0, start=0, step=1, dtype=dt.i64)
    cols = b.op("iota", shape=grid, dim=1, start=0, step=1, dtype=dt.i64)
    on_diagonal = b.op("eq", b.op("sub", cols, rows), b.scalar_like(offset, rows))
    # Position along the diagonal, clamped so that off-diagonal elements index in range.
    pos = rows if offset >= 0 else cols
    pos = b.op("min", pos, b.scalar_like(ex.sub(length, Const(1)), pos))
    lead = xp.shape[:-2]
    source = b.expand(b.reshape(b.cast(src, x.dtype), (*lead, length, Const(1))), (*lead, length, n2))
    picked = b.op("gather", source, b.expand(pos, xp.shape), dim=rank - 2)
    out = b.op("where", b.expand(on_diagonal, xp.shape), picked, xp)
    inverse = [order.index(d) for d in range(rank)]
    return permute(b, out, inverse)
