"""Loop forms of the indexing ops: gathers (`gather`, `index`), `flip`, `pad`,
`slice_scatter` as element rules; scatters (`scatter`, `index_put`), `argsort` and `scan` as
root rules (category `ordered`), which build their kernel's whole body.

Index values read from tensors are wrapped (negative counts from the end, where PyTorch
allows it) and checked against the indexed dim (`checked_index`: one unsigned compare): an
index PyTorch would reject is never used (the kernel reads or writes element 0 instead) and
counts a fault, so the launcher runs the call again in PyTorch, which raises eager's error.

A scatter kernel copies, then updates in the order of the index tensor, serially (duplicate
indices accumulate in order, as in PyTorch's CPU kernels):

    for i0 in 0..4 { for i1 in 0..6 { %out[i0, i1] = %x[i0, i1] } }
    for j2 in 0..4 {
      for j3 in 0..3 {
        let x4 = %idx[j2, j3]
        let t5 = checked_index(x4, 6)
        %out[j2, t5] = %out[j2, t5] + %src[j2, j3]
      }
    }

The update loops are not independent (two iterations may hit one element); `parallelize`
and `vectorize` see the data-dependent store address and leave them serial.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType
from ...ir.tensor import Op, Value
from . import scalar_ops
from .kernel_builder import REDUCE_INIT, Index, KernelBuilder, element_rule, root_rule
from .nn_rules import Accumulator, clamp, in_range

BOOL = ex.BOOL


def index_value(kb: KernelBuilder, v: Value, idx: Index, size: Expr, wrap: bool) -> Expr:
    """The index stored in `v[idx]`, as an i64 position in `[0, size)`, checked (a fault
    where it is out of range; `wrap`: negative counts from the end first)."""
    raw = kb.value_at(v, idx)
    i = kb.bind_invariant(ex.cast(raw, dt.i64)) if raw.dtype != dt.i64 else raw
    if wrap:
        i = kb.bind_invariant(ex.select(ex.binary("lt", i, Const(0)), ex.add(i, size), i))
    return kb.bind_invariant(ex.checked_index(i, size))  # once per row where the index is the row's


# ---- gathers ----------------------------------------------------------------------------------

@element_rule("gather")
def gather(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    src, index = op.operands
    dim = int(op.attrs["dim"])
    pos = index_value(kb, index, idx, src.shape[dim], wrap=False)
    return kb.value_at(src, tuple(pos if d == dim else i for d, i in enumerate(idx)))


def indexed_source(kb: KernelBuilder, op: Op, src: Value, indices: Sequence[Value], idx: Index) -> Index:
    """For `index`-style ops: the `src` index of result element `idx`."""
    dims, pos = tuple(op.attrs["dims"]), int(op.attrs["pos"])
    nb = indices[0].type.rank
    b_idx = idx[pos:pos + nb]
    rest = iter(idx[:pos] + idx[pos + nb:])
    out: list[Expr] = []
    for d in range(src.type.rank):
        if d in dims:
            out.append(index_value(kb, indices[dims.index(d)], b_idx, src.shape[d],
                                   wrap=bool(op.attrs.get("wrap", True))))
        else:
            out.append(next(rest))
    return tuple(out)


@element_rule("index")
def index(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    src = op.operands[0]
    return kb.value_at(src, indexed_source(kb, op, src, op.operands[1:], idx))


@element_rule("flip")
def flip(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    src = op.operands[0]
    dims = {int(d) % max(src.type.rank, 1) for d in op.attrs["dims"]}
    return kb.value_at(src, tuple(ex.sub(ex.sub(src.shape[d], Const(1)), i) if d in dims else i
                                  for d, i in enumerate(idx)))


@element_rule("pad")
def pad(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    src = op.operands[0]
    low, high = op.attrs["low"], op.attrs["high"]
    pos: list[Expr] = []
    valid: Optional[Expr] = None
    for d, i in enumerate(idx):
        p = ex.sub(i, ex.as_expr(low[d]))
        if int(low[d]) > 0 or int(high[d]) > 0:
            p = kb.bind(p, "t")
            ok = in_range(p, src.shape[d])
            valid = ok if valid is None else ex.Binary("and", valid, ok, BOOL)
            p = clamp(p, src.shape[d])
        pos.append(p)
    v = kb.value_at(src, tuple(pos))
    if valid is None:
        return v
    return kb.bind(ex.select(kb.bind(valid), v, scalar_ops.constant(op.attrs["value"], src.dtype)))


@element_rule("slice_scatter")
def slice_scatter(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    x, src = op.operands
    dim = int(op.attrs["dim"])
    start, step = ex.as_expr(op.attrs["start"]), int(op.attrs["step"])
    rel = kb.bind(ex.sub(idx[dim], start), "t")
    j = rel if step == 1 else kb.bind(ex.floordiv(rel, Const(step)), "t")
    inside = in_range(j, src.shape[dim])
    if step > 1:
        inside = ex.Binary("and", inside, ex.binary("eq", ex.mod(rel, Const(step)), Const(0)), BOOL)
    sv = kb.value_at(src, tuple(clamp(j, src.shape[dim]) if d == dim else i for d, i in enumerate(idx)))
    xv = kb.value_at(x, idx)
    return kb.bind(ex.select(kb.bind(inside), sv, xv))


# ---- root rules: copy, then update --------------------------------------------------------------

def _nest(kb: KernelBuilder, shape: tuple[Expr, ...], prefix: str, body_fn: Callable[[Index], None],
          order: Optional[Sequence[int]] = None) -> lp.Stmt:
    """A loop nest over `shape` (loops in `order` of dims, outermost first) whose body
    `body_fn(index)` emits through the builder."""
    vars_ = kb.loops(shape, prefix)
    kb.push()
    body_fn(vars_)
    body = kb.pop()
    order = list(order) if order is not None else list(range(len(shape)))
    origin = (("origin", "; ".join(kb.origins)),) if kb.origins else ()
    return kb.nest(tuple(vars_[d] for d in order), tuple(shape[d] for d in order), body, origin)


def split_nest(kb: KernelBuilder, v: Value, prefix: str, body_fn: Callable[[Index], None]) -> lp.Stmt:
    """A nest over `v`'s shape whose body `body_fn(index)` reads `v` at `index`; when `v` is a
    concat computed in the kernel (`KernelBuilder.concat_parts`), one nest per operand, in
    which `v[index]` is the operand's element (no select, no load of the other operands):

        %out[j0 + 0, j1] = %a[j0, j1]   for j0 in 0..2      (concat(%a, %b) {dim = 0})
        %out[j0 + 2, j1] = %b[j0, j1]   for j0 in 0..3

    and likewise when `v` is a stack of operands (`KernelBuilder.stack_parts`: a reshape to
    ``[N, a, ...]`` of their concat along dim 0), one nest per operand at its index:

        %out[0, j0, j1] = %a[j0, j1]    for j0 in 0..3      (reshape(concat(%a, %b)) [2, 3, 4])
        %out[1, j0, j1] = %b[j0, j1]    for j0 in 0..3"""
    stacked = kb.stack_parts(v)
    if stacked is not None:   # v[i, ...] = operand i's element (`KernelBuilder.stack_parts`)
        nests = []
        for i, operand in enumerate(stacked):
            def one(j: Index, operand: Value = operand, i: int = i) -> None:
                idx = (Const(i), *j)
                kb.define(v, idx, kb.value_at(operand, j))
                body_fn(idx)

            nests.append(_nest(kb, operand.shape, prefix, one))
        return lp.block(*nests)
    parts = kb.concat_parts(v)
    if parts is None:
        return _nest(kb, v.shape, prefix, body_fn)
    nests = []
    for operand, dim, off in parts:
        def part(j: Index, operand: Value = operand, dim: int = dim, off: Expr = off) -> None:
            idx = tuple(ex.add(i, off) if d == dim else i for d, i in enumerate(j))
            kb.define(v, idx, kb.value_at(operand, j))
            body_fn(idx)

        nests.append(_nest(kb, operand.shape, prefix, part))
    return lp.block(*nests)


@root_rule("concat")
def concat(kb: KernelBuilder, op: Op, out: lp.Buffer) -> lp.Stmt:
    """A stored concat: one copy nest per operand (`split_nest`), or the element nest where
    the lowering keeps one nest (GPUs)."""
    if not kb.split_concats:
        return kb.element_root(op, out)
    _origin(kb, op)
    kb.used_buffers[out.name] = out
    dim = op.attrs["dim"] % max(len(op.result.shape), 1)
    nests = []
    off: Expr = Const(0)
    for operand in op.operands:
        def part(j: Index, operand: Value = operand, off: Expr = off) -> None:
            idx = tuple(ex.add(i, off) if d == dim else i for d, i in enumerate(j))
            kb.emit(lp.Store(out.name, idx, kb.value_at(operand, j)))

        nests.append(_nest(kb, operand.shape, "i", part))
        off = ex.add(off, operand.shape[dim])
    return lp.block(*nests)


def copy_into(kb: KernelBuilder, src: Value, out: lp.Buffer) -> lp.Stmt:
    """`out[i] = src[i]` over the whole result (fused producers of `src` are computed here)."""
    kb.used_buffers[out.name] = out
    return _nest(kb, out.shape, "i", lambda i: kb.emit(lp.Store(out.name, i, kb.value_at(src, i))))


def _origin(kb: KernelBuilder, op: Op) -> None:
    if op.loc and op.loc not in kb.origins:
        kb.origins.append(op.loc)


SCATTER_IDENTITY = {"add": "reduce_sum", "mul": "reduce_prod", "max": "reduce_max", "min": "reduce_min"}


def _combine(reduce: str, cur: Expr, new: Expr) -> Expr:
    if reduce == "none":
        return new
    return scalar_ops.binary(reduce, cur, new)


@root_rule("scatter")
def scatter(kb: KernelBuilder, op: Op, out: lp.Buffer) -> lp.Stmt:
    x, index, src = op.operands
    dim = int(op.attrs["dim"])
    reduce = op.attrs["reduce"]
    _origin(kb, op)
    # in place (`out` is `x`'s own buffer, see lower-to-loops): only the scattered elements
    phases = [] if op.attrs.get("inplace") else [copy_into(kb, x, out)]

    def target(j: Index) -> Index:
        t = index_value(kb, index, j, out.shape[dim], wrap=False)
        return tuple(t if d == dim else i for d, i in enumerate(j))

    if reduce != "none" and not op.attrs.get("include_self", True):
        init = REDUCE_INIT[SCATTER_IDENTITY[reduce]](out.dtype)
        phases.append(_nest(kb, index.shape, "j", lambda j: kb.emit(lp.Store(out.name, target(j), init))))

    def update(j: Index) -> None:
        tgt = target(j)
        cur = ex.Load(out.name, tgt, ScalarType(out.dtype))
        kb.emit(lp.Store(out.name, tgt, _combine(reduce, cur, kb.value_at(src, j))))

    phases.append(_nest(kb, index.shape, "j", update))
    if not phases:
        kb.used_buffers[out.name] = out
    return lp.block(*phases)


@root_rule("index_put")
def index_put(kb: KernelBuilder, op: Op, out: lp.Buffer) -> lp.Stmt:
    x, values = op.operands[0], op.operands[1]
    indices = op.operands[2:]
    accumulate = bool(op.attrs["accumulate"])
    _origin(kb, op)
    # in place (`out` is `x`'s own buffer, see lower-to-loops): only the written elements
    copy = lp.block() if op.attrs.get("inplace") else copy_into(kb, x, out)

    def update(j: Index) -> None:
        tgt = indexed_source(kb, op, x, indices, j)
        v = kb.value_at(values, j)
        if accumulate:
            v = scalar_ops.binary("add", ex.Load(out.name, tgt, ScalarType(out.dtype)), v)
        kb.emit(lp.Store(out.name, tgt, v))

    kb.used_buffers[out.name] = out
    return lp.block(copy, split_nest(kb, values, "j", update))


# ---- sorting and scans --------------------------------------------------------------------------

def _before(a: Expr, b: Expr, descending: bool) -> Expr:
    """Whether `a` sorts strictly before `b` (NaN above every number)."""
    if descending:
        first = scalar_ops.binary("gt", a, b)
        if a.dtype.is_float:
            first = ex.Binary("or", first, ex.Binary("and", ex.call("isnan", a), ex.call("not", ex.call("isnan", b)), BOOL), BOOL)
        return first
    first = scalar_ops.binary("lt", a, b)
    if a.dtype.is_float:
        first = ex.Binary("or", first, ex.Binary("and", ex.call("not", ex.call("isnan", a)), ex.call("isnan", b), BOOL), BOOL)
    return first


def _same(a: Expr, b: Expr) -> Expr:
    eq = scalar_ops.binary("eq", a, b)
    if a.dtype.is_float:
        eq = ex.Binary("or", eq, ex.Binary("and", ex.call("isnan", a), ex.call("isnan", b), BOOL), BOOL)
    return eq


#: Merge passes of the argsort kernel come in pairs; 32 pairs sort rows of up to 4**32.
_MERGE_PAIRS = 32


def _merge_pass(kb: KernelBuilder, x: Value, dim: int, row: Index, src: lp.Buffer, dst: lp.Buffer,
                width: Expr, descending: bool) -> lp.Stmt:
    """One bottom-up merge pass along a row: the sorted runs of length `width` of
    permutation `src` merge pairwise into `dst`. Output position `k` takes the next element of
    the left run unless the right run's next element sorts strictly before it (stability);
    the two run cursors live in local buffers reset at the start of each pair of runs."""
    n = x.shape[dim]
    cur = {side: lp.Buffer(kb.fresh(f"{side}cur"), dt.i64, (Const(1),), (Const(1),), "local")
           for side in ("l", "r")}
    (k,) = kb.loops((n,), "m")

    def at(pos: Expr) -> Index:
        return tuple(pos if d == dim else v for d, v in enumerate(row))

    kb.push()
    pair = kb.bind(ex.mul(width, Const(2)), "t")
    lo = kb.bind(ex.mul(ex.floordiv(k, pair), pair), "t")
    mid = kb.bind(ex.minimum(ex.add(lo, width), n), "t")
    hi = kb.bind(ex.minimum(ex.add(lo, pair), n), "t")
    fresh = kb.bind(ex.binary("eq", k, lo), "t")
    li = kb.bind(ex.select(fresh, lo, ex.Load(cur["l"].name, (Const(0),), ex.INDEX)), "t")
    ri = kb.bind(ex.select(fresh, mid, ex.Load(cur["r"].name, (Const(0),), ex.INDEX)), "t")
    last = ex.sub(n, Const(1))
    lperm = kb.bind(clamp(kb.bind(ex.Load(src.name, at(ex.minimum(li, last)), ex.INDEX)), n))
    rperm = kb.bind(clamp(kb.bind(ex.Load(src.name, at(ex.minimum(ri, last)), ex.INDEX)), n))
    lkey = kb.value_at(x, at(lperm))
    rkey = kb.value_at(x, at(rperm))
    left_done = ex.binary("ge", li, mid)
    right_first = ex.Binary("or", left_done, _before(rkey, lkey, descending), BOOL)
    take_right = kb.bind(ex.Binary("and", ex.binary("lt", ri, hi), right_first, BOOL))
    kb.emit(lp.Store(dst.name, at(k), ex.select(take_right, rperm, lperm)))
    kb.emit(lp.Store(cur["l"].name, (Const(0),), ex.select(take_right, li, ex.add(li, Const(1)))))
    kb.emit(lp.Store(cur["r"].name, (Const(0),), ex.select(take_right, ex.add(ri, Const(1)), ri)))
    loop = kb.nest((k,), (n,), kb.pop())
    return lp.block(lp.Alloc(cur["l"]), lp.Alloc(cur["r"]), loop)


@root_rule("argsort")
def argsort(kb: KernelBuilder, op: Op, out: lp.Buffer) -> lp.Stmt:
    """A stable bottom-up merge sort of each row's positions, O(n log n): the identity
    permutation, then merge passes of widths 1, 2, 4, ... ping-ponging between the result and
    a workspace buffer of the same shape. Passes come in pairs (result -> workspace of width
    `w`, workspace -> result of width `2w`) so the last one always writes the result; a pair
    runs while `w < n` (a pass whose width covers the row is a plain copy). Keys are read
    through the permutation (fused producers recomputed there), NaN sorting above every number.

        alloc %w: i64[1] local
        %w[0] = 1
        for q in 0..32 {
          if %w[0] < n { merge(%out -> %ws, %w[0]); merge(%ws -> %out, 2 * %w[0]) }
          %w[0] = %w[0] * 4
        }
    """
    x = op.operands[0]
    dim = int(op.attrs["dim"])
    descending = bool(op.attrs["descending"])
    n = x.shape[dim]
    _origin(kb, op)
    kb.used_buffers[out.name] = out
    ws = kb.scratch(out.dtype, out.shape)
    others = [d for d in range(x.type.rank) if d != dim]

    def body(outer: Index) -> None:
        row: list[Expr] = [Const(0)] * x.type.rank
        for d, v in zip(others, outer):
            row[d] = v
        row_idx = tuple(row)
        (k,) = kb.loops((n,), "i")
        kb.emit(kb.nest((k,), (n,), lp.Store(out.name, tuple(k if d == dim else v for d, v in enumerate(row_idx)), k)))
        width = lp.Buffer(kb.fresh("width"), dt.i64, (Const(1),), (Const(1),), "local")
        kb.emit(lp.Alloc(width))
        kb.emit(lp.Store(width.name, (Const(0),), Const(1)))
        (q,) = kb.loops((Const(_MERGE_PAIRS),), "q")
        kb.push()
        w = kb.bind(ex.Load(width.name, (Const(0),), ex.INDEX), "t")
        kb.push()
        first = _merge_pass(kb, x, dim, row_idx, out, ws, w, descending)
        second = _merge_pass(kb, x, dim, row_idx, ws, out, ex.mul(w, Const(2)), descending)
        kb.emit(lp.block(first, second))
        kb.emit(lp.If(ex.binary("lt", w, n), kb.pop()))
        kb.emit(lp.Store(width.name, (Const(0),), ex.mul(w, Const(4))))
        kb.emit(kb.nest((q,), (Const(_MERGE_PAIRS),), kb.pop()))

    shape = tuple(x.shape[d] for d in others)
    return _nest(kb, shape, "i", body)


def _log_add_exp(a: Expr, b: Expr) -> Expr:
    """`log(exp(a) + exp(b))` as PyTorch's logcumsumexp computes it: `max + log1p(exp(min -
    max))`, except equal infinities (which give `a`); NaN propagates."""
    lo, hi = ex.minimum(a, b), ex.maximum(a, b)
    same_inf = ex.Binary("and", scalar_ops.binary("eq", lo, hi), ex.call("not", ex.call("isfinite", lo)), BOOL)
    res = ex.select(same_inf, a, scalar_ops.binary("add", ex.call("log1p", ex.call("exp", scalar_ops.binary("sub", lo, hi))), hi))
    any_nan = ex.Binary("or", ex.call("isnan", a), ex.call("isnan", b), BOOL)
    return ex.select(any_nan, scalar_ops.binary("add", a, b), res)


def _arg_step(kb: KernelBuilder, x: Value, i: Index, dim: int, prev: Expr, kind: str) -> Expr:
    """cummax/cummin's index update: move to `i` when `x[i]` is NaN, or when the running
    extreme `x[prev]` is not NaN and `x[i] >= x[prev]` (`<=` for argmin)."""
    xi = kb.value_at(x, i)
    best = kb.value_at(x, tuple(clamp(prev, x.shape[dim]) if d == dim else v for d, v in enumerate(i)))
    take = scalar_ops.binary("ge" if kind == "argmax" else "le", xi, best)
    if xi.dtype.is_float:
        take = ex.Binary("or", ex.call("isnan", xi),
                         ex.Binary("and", ex.call("not", ex.call("isnan", best)), take, BOOL), BOOL)
    return ex.select(take, i[dim], prev)


@root_rule("scan")
def scan(kb: KernelBuilder, op: Op, out: lp.Buffer) -> lp.Stmt:
    """`out[.., i, ..] = out[.., i - 1, ..] op x[.., i, ..]`, with the scanned dim innermost."""
    x = op.operands[0]
    dim = int(op.attrs["dim"])
    kind = op.attrs["kind"]
    _origin(kb, op)
    kb.used_buffers[out.name] = out

    def body(i: Index) -> None:
        prev_idx = tuple(ex.maximum(ex.sub(v, Const(1)), Const(0)) if d == dim else v for d, v in enumerate(i))
        prev = kb.bind(ex.Load(out.name, prev_idx, ScalarType(out.dtype)))
        first = ex.binary("eq", i[dim], Const(0))
        if kind in ("argmax", "argmin"):
            step = _arg_step(kb, x, i, dim, prev, kind)
            kb.emit(lp.Store(out.name, i, ex.select(first, Const(0), step)))
            return
        xi = kb.value_at(x, i)
        step = _log_add_exp(prev, xi) if kind == "logaddexp" else scalar_ops.binary(kind, prev, xi)
        kb.emit(lp.Store(out.name, i, ex.select(first, xi, step)))

    order = [d for d in range(x.type.rank) if d != dim] + [dim]
    return _nest(kb, x.shape, "i", body, order)
