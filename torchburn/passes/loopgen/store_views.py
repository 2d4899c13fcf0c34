"""Stores through views: a kernel that computes an op and stores it at the index a chain of
permutes and reshapes gives its elements, instead of a second kernel copying it there.

PyTorch's SDPA returns a view of a `[B, T, H, D]` buffer; our graph keeps those strides, so the
attention result `[B, H, T, D]` is copied into that layout by a kernel of its own (`fuse`
materializes the view: it is a graph output). With `fuse{attention_views}` the attention op is
computed in the copy's kernel instead, and the lowering makes the attention nest store each
element `(b, h, i, c)` straight at the copy's index of it:

    %0 = attention(%q, %k, %v) {..., fused_into = [0]} : f32[4, 12, 1024, 64]
    %1 = permute(%0) {dims = [2, 0, 1, 3], kernel = 0} : f32[1024, 4, 12, 64]

    ... %out0[i, b, h, c] = t        (the attention nest's store; was %tmp0[b, h, i, c])

Only permutes and reshapes are followed: each maps the elements of its operand one-to-one
onto its result, so the store still writes every output element exactly once.
"""
from __future__ import annotations

from typing import AbstractSet, Optional, Sequence

from ...ir.tensor import Op, Value
from .views import Index, regroup_index

#: Views that place each element of their operand at exactly one index of their result.
STORE_VIEWS = frozenset({"permute", "reshape"})


def forward_index(view: Op, idx: Index) -> Index:
    """The index in `view`'s result of the element at `idx` of its operand (the inverse of
    the load maps of `views.py`)."""
    if view.name == "permute":
        return tuple(idx[d] for d in view.attrs["dims"])
    if view.name == "reshape":
        return regroup_index(idx, view.operands[0].shape, view.result.shape)
    raise ValueError(f"store through {view.name}: not a one-to-one view")


def through(views: Sequence[Op], idx: Index) -> Index:
    """`idx` carried through `views` (the producer's side first) to the last one's result."""
    for view in views:
        idx = forward_index(view, idx)
    return idx


def fused_through_views(root: Op, materialized: AbstractSet[Value], names: AbstractSet[str]) -> Optional[tuple[Op, list[Op]]]:
    """Where kernel root `root` is the last of a chain of `STORE_VIEWS` whose first operand is
    computed in the kernel (no buffer) by an op named in `names`: that op and the chain, its
    side first. None otherwise."""
    views: list[Op] = []
    op = root
    while op.name in STORE_VIEWS:
        views.insert(0, op)
        v = op.operands[0]
        if v in materialized or v.producer is None:
            return None
        op = v.producer
    return (op, views) if views and op.name in names else None


def view_chain_root(value: Value, users: dict[Value, list[Op]], inlined: AbstractSet[Op]) -> Optional[Op]:
    """The kernel root at the end of `value`'s only chain of readers when every reader is a
    `STORE_VIEWS` op read by nothing else, the last one not inlined (it is stored: a graph
    output), the others inlined; else None."""
    while True:
        readers = users.get(value, [])
        if len(readers) != 1 or readers[0].name not in STORE_VIEWS or len(readers[0].results) != 1:
            return None
        view = readers[0]
        if view not in inlined:
            return view
        value = view.result
