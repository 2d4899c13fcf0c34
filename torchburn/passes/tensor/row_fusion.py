"""Row fusion: compute row reductions inside the elementwise kernel that consumes them.

Softmax, LayerNorm and RMSNorm reduce each row and then transform every element of the row
with the row's statistics. Left to the plain rules of `fuse`, every reduction is a kernel of
its own and the row is written and read back between them (softmax: max, exp, sum and divide,
four kernels and a full-size temporary). Here the reductions join the kernel of their
elementwise consumer instead; `lower-to-loops` then computes, for each row, the reductions
(each an inner loop over the row, in dependence order) and the row's scalar values once, and
then the row's elements in a last inner loop. The row is read from memory once; the later
loops find it in the cache.

Rules, for an elementwise kernel root `K` of shape `(*rows, *cols)`:

- a reduction may join when it reduces trailing dims of a value of `K`'s shape with
  `keepdim` (its result is `(*rows, 1, ...)`), and every user of its result is computed in `K`;
- values derived from a joining reduction reach `K`'s shape only through `expand`s that
  broadcast trailing size-1 dims, and elementwise ops: then every such value is indexed by the
  row alone and is computed once per row, never once per element;
- an elementwise op that was a kernel root because it has several users (`exp(x - max)`, read
  by the sum and by the division) joins when all its users are in `K`; it is then computed in
  each loop that reads it (the sum's and the final one), a recomputation bounded by
  `max_row_recompute_cost` per extra use, far cheaper than the memory round trip it replaces;
- nothing joins a kernel that holds a matrix product (a GEMM with an epilogue), and no value
  is computed in two kernels: whatever has a user outside `K` stays as it was, and so does
  what would join behind a value the plain rules inline into another kernel as well.

Sibling reductions over the same input (`sum(x)` and `sum(x * x)`) land in the same kernel,
and each reads the row while it is in the cache.

Before (softmax after the plain rules; four kernels):

    %0 = reduce_max(%x) {dims = [1], keepdim = true, kernel = 0} : f32[8, 16]
    %1 = expand(%0) {shape = [8, 16], fused_into = [1]} : f32[8, 16]
    %2 = sub(%x, %1) {fused_into = [1]} : f32[8, 16]
    %3 = exp(%2) {kernel = 1} : f32[8, 16]
    %4 = reduce_sum(%3) {dims = [1], keepdim = true, kernel = 2} : f32[8, 1]
    %5 = expand(%4) {shape = [8, 16], fused_into = [3]} : f32[8, 16]
    %6 = div(%3, %5) {kernel = 3} : f32[8, 16]

After (one kernel):

    %0 = reduce_max(%x) {dims = [1], keepdim = true, fused_into = [0]} : f32[8, 1]
    %1 = expand(%0) {shape = [8, 16], fused_into = [0]} : f32[8, 16]
    %2 = sub(%x, %1) {fused_into = [0]} : f32[8, 16]
    %3 = exp(%2) {fused_into = [0]} : f32[8, 16]
    %4 = reduce_sum(%3) {dims = [1], keepdim = true, fused_into = [0]} : f32[8, 1]
    %5 = expand(%4) {shape = [8, 16], fused_into = [0]} : f32[8, 16]
    %6 = div(%3, %5) {kernel = 0} : f32[8, 16]
"""
from __future__ import annotations

from typing import Callable, Optional

from ...ir.expr import Const, Expr
from ...ir.ops import get_op
from ...ir.tensor import Graph, Op, Value

#: Reductions that may join a row kernel (`argmax`/`argmin` carry an index and stay alone).
ROW_REDUCTIONS = frozenset({"reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "reduce_any", "reduce_all"})


def _category(op: Op) -> str:
    return get_op(op.name).category


def _is_one(d: Expr) -> bool:
    return isinstance(d, Const) and d.value == 1


def _row_prefix(shape: tuple[Expr, ...], full: tuple[Expr, ...]) -> bool:
    """`shape` is `full` with a suffix of dims set to 1 (indexed by the leading dims alone)."""
    if len(shape) != len(full):
        return False
    j = len(full)
    while j > 0 and _is_one(shape[j - 1]):
        j -= 1
    return shape[:j] == full[:j]


def _joinable_reduction(op: Op, full: tuple[Expr, ...]) -> bool:
    """A keepdim reduction over trailing dims of a value of the kernel's shape."""
    if op.name not in ROW_REDUCTIONS or not op.attrs.get("keepdim", False):
        return False
    src = op.operands[0]
    if src.shape != full:
        return False
    rank = len(full)
    dims = sorted(d % rank for d in op.attrs["dims"]) if rank else []
    return bool(dims) and dims == list(range(rank - len(dims), rank))


def _members(root: Op, inlined: set[Op], excluded: set[Op], full: tuple[Expr, ...]) -> tuple[set[Op], set[Op]]:
    """Ops computed in `root`'s kernel if every candidate joined: (all of them, the joining roots)."""
    members: set[Op] = set()
    joining: set[Op] = set()
    stack: list[Value] = list(root.operands)
    while stack:
        p = stack.pop().producer
        if p is None or p in members or p in excluded:
            continue
        if p in inlined:
            members.add(p)
        elif len(p.results) == 1 and (_joinable_reduction(p, full) or _category(p) == "elementwise"):
            members.add(p)
            joining.add(p)
        else:
            continue
        stack.extend(p.operands)
    return members, joining


def _indexed_by_row(root: Op, members: set[Op], joining: set[Op], order: dict[Op, int]) -> bool:
    """Every value derived from a joining reduction is read either at the row's index (row
    shape) or through elementwise ops of the kernel's shape, so reductions run once per row."""
    full = root.result.shape
    kind: dict[Value, str] = {}  # "row" or "full", for values derived from a joining reduction
    for op in sorted(members | {root}, key=order.__getitem__):
        derived = [kind[v] for v in op.operands if v in kind]
        if op in joining and op.name in ROW_REDUCTIONS:
            if "row" in derived:
                return False
            kind[op.result] = "row"
            continue
        if not derived:
            continue
        cat = _category(op)
        if cat == "elementwise":
            shape = op.result.shape
            if shape == full and all(k == "full" for k in derived):
                kind[op.result] = "full"
            elif shape != full and all(k == "row" for k in derived) and _row_prefix(shape, full):
                kind[op.result] = "row"
            else:
                return False
        elif op.name == "expand" and derived == ["row"] and op.result.shape == full \
                and _row_prefix(op.operands[0].shape, full):
            kind[op.result] = "full"
        else:
            return False
    return True


def _joining_behind(op: Op, members: set[Op], joining: set[Op]) -> set[Op]:
    """The joining roots `op` reads, through members of the kernel."""
    found: set[Op] = set()
    seen: set[Op] = set()
    stack = [v.producer for v in op.operands]
    while stack:
        p = stack.pop()
        if p is None or p in seen or p not in members:
            continue
        seen.add(p)
        if p in joining:
            found.add(p)
        stack.extend(v.producer for v in p.operands)
    return found


def _group(root: Op, users: dict[Value, list[Op]], outputs: set[Value], inlined: set[Op],
           too_costly: Callable[[Op, set[Op], int, int], bool], max_cost: int,
           order: dict[Op, int]) -> Optional[set[Op]]:
    """The kernel roots that join `root`'s kernel, or None."""
    full = root.result.shape
    excluded: set[Op] = set()
    while True:
        members, joining = _members(root, inlined, excluded, full)
        inside = members | {root}
        bad = set()
        both = inlined | joining
        for p in joining:
            uses = users.get(p.result, [])
            if p.result in outputs or any(u not in inside for u in uses):
                bad.add(p)
            elif _category(p) == "elementwise" and too_costly(p, both, len(uses), max_cost):
                bad.add(p)
        # A value the plain rules already inline into another kernel as well takes whatever
        # joins behind it there too: a row reduction would run once per element of that
        # kernel. What joins behind such a value stays out.
        for p in members - joining:
            if any(u not in inside for u in users.get(p.result, [])):
                bad |= _joining_behind(p, members, joining)
        if not bad:
            break
        excluded |= bad
    if not any(p.name in ROW_REDUCTIONS for p in joining):
        return None
    if any(_category(p) == "contraction" for p in members):
        return None
    if not _indexed_by_row(root, members, joining, order):
        return None
    return joining


def row_groups(graph: Graph, users: dict[Value, list[Op]], outputs: set[Value], inlined: set[Op],
               epilogue_roots: set[Op], too_costly: Callable[[Op, set[Op], int, int], bool],
               max_cost: int) -> set[Op]:
    """The kernel roots to inline into the row kernels of `graph` (see the module docstring).

    `inlined` holds the ops `fuse` already inlines; `epilogue_roots` the kernels that hold a
    matmul; `too_costly(op, inlined, uses, max_cost)` whether recomputing `op` for each of
    its uses costs more than `max_cost` beyond the first."""
    joined: set[Op] = set()
    order = {op: k for k, op in enumerate(graph.ops)}
    for root in reversed(graph.ops):
        if root in inlined or root in joined or root in epilogue_roots or _category(root) != "elementwise":
            continue
        if len(root.results) != 1:
            continue
        group = _group(root, users, outputs, inlined | joined, too_costly, max_cost, order)
        if group:
            joined |= group
    return joined
