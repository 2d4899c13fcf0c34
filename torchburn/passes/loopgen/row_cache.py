"""Which value of a row kernel is kept in the kernel's output between the row's loops.

A row kernel (`KernelBuilder.row_root`) computes each row's reductions in loops over the row
and then the row's elements in a last loop. When the operand of a reduction is also read by
that last loop at the element's own index (softmax: `exp(x - max)` is summed and then divided
by the sum), the last loop would compute it a second time. Instead, the reduction loop stores
the operand into the output row, which is private to the row and as long as it, and the last
loop loads it back: one `exp` per element instead of two, and a row that stays in the cache.

Before (`exp` twice per element):

    for r9 in 0..16 { let t13 = exp(%x[i0, r9] - t6); %acc10[0] = %acc10[0] + t13 }
    let t15 = 1.0:f32 / %acc10[0]
    for i1 in 0..16 { let t8 = exp(%x[i0, i1] - t6); %out0[i0, i1] = t8 * t15 }

After (the reduction loop also fills the output row):

    for r9 in 0..16 { let t13 = exp(%x[i0, r9] - t6); %acc10[0] = %acc10[0] + t13; %out0[i0, r9] = t13 }
    let t15 = 1.0:f32 / %acc10[0]
    for i1 in 0..16 { let c8 = %out0[i0, i1]; %out0[i0, i1] = c8 * t15 }

Conditions: the output is contiguous (each element its own address, so the row written is the
row's own memory) and has the operand's dtype (no rounding on the way through); the operand is
computed in the kernel by something dearer than a load and a subtraction (`CHEAP_OPS` alone are
recomputed, which costs what the store and the load would); the reduction runs over the
trailing dims, so its loop visits exactly the elements of the output row. The last loop reads
the stored value only at its own index, where nothing has overwritten it yet.
"""
from __future__ import annotations

from typing import Optional

from ...ir import loop as lp
from ...ir.expr import Const, Expr
from ...ir.ops import get_op
from ...ir.tensor import Op, Value

#: Elementwise ops no dearer to recompute than a store and a load of their result.
CHEAP_OPS = frozenset({"add", "sub", "mul", "neg", "abs", "max", "min", "cast", "where", "eq", "ne",
                       "lt", "le", "gt", "ge", "and", "or", "not", "xor", "copysign", "sign",
                       "signbit", "floor", "ceil", "trunc", "round", "shl", "shr"})
#: Reductions whose operand may be cached (their loops visit every element of the row).
CACHING_REDUCTIONS = frozenset({"reduce_sum", "reduce_prod", "reduce_max", "reduce_min"})


def _computed(v: Value, buffers: dict[Value, lp.Buffer]) -> Optional[Op]:
    """The op computing `v` inside the kernel (None for a value read from a buffer)."""
    return None if v in buffers else v.producer


def identity_values(root: Op, buffers: dict[Value, lp.Buffer]) -> set[Value]:
    """Values of the root's shape read by the element loop at the element's own index: the
    root's operands and, through elementwise ops of that shape, theirs."""
    full = root.result.shape
    found: set[Value] = set()
    stack = list(root.operands)
    while stack:
        v = stack.pop()
        p = _computed(v, buffers)
        if v in found or p is None or v.shape != full or get_op(p.name).category != "elementwise":
            continue
        found.add(v)
        stack.extend(p.operands)
    return found


def _is_dear(v: Value, buffers: dict[Value, lp.Buffer]) -> bool:
    """Whether computing `v` in the kernel takes an op outside `CHEAP_OPS`."""
    seen: set[int] = set()
    stack = [v]
    while stack:
        p = _computed(stack.pop(), buffers)
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        cat = get_op(p.name).category
        if cat == "reduction":
            continue  # a row statistic, computed once per row
        if cat == "elementwise" and p.name not in CHEAP_OPS:
            return True
        stack.extend(p.operands)
    return False


def _trailing_reduction(op: Op, full: tuple[Expr, ...]) -> bool:
    if op.name not in CACHING_REDUCTIONS or not op.attrs.get("keepdim", False) or op.operands[0].shape != full:
        return False
    rank = len(full)
    dims = sorted(d % rank for d in op.attrs.get("dims", ())) if rank else []
    return bool(dims) and dims == list(range(rank - len(dims), rank))


def row_index(red: Op, idx: tuple[Expr, ...]) -> tuple[Expr, ...]:
    """The index at which the element `idx` of the kernel reads the keepdim reduction `red`
    (through `expand`): its reduced dims at 0, unless they are of size 1 in the result too."""
    rank = len(idx)
    dims = {d % rank for d in red.attrs["dims"]}
    full = red.operands[0].shape
    return tuple(Const(0) if k in dims and full[k] != Const(1) else e for k, e in enumerate(idx))


def cached_operand(root: Op, out: lp.Buffer, buffers: dict[Value, lp.Buffer]) -> Optional[tuple[Value, Op]]:
    """The value to keep in `out` and the (keepdim, trailing) reduction whose loop stores it,
    or None."""
    full = root.result.shape
    if out.dtype != root.result.dtype or out.shape != full or out.strides != lp.contiguous_strides(full):
        return None
    identity = identity_values(root, buffers)
    seen: set[int] = set()
    stack = list(root.operands)
    while stack:
        p = _computed(stack.pop(), buffers)
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        src = p.operands[0] if p.operands else None
        if src is not None and _trailing_reduction(p, full) and src in identity \
                and src.dtype == out.dtype and _is_dear(src, buffers):
            return src, p
        stack.extend(p.operands)
    return None
