"""Tensor factories: full, zeros/ones (via full), scalar_tensor, arange/iota."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from ...ir import expr as ex
from ...ir.tensor import Value
from ..builder import Builder
from ..dtypes import to_ir
from ..registry import Unsupported, lowering

aten = torch.ops.aten
prims = torch.ops.prims


def _cpu(node: torch.fx.Node) -> Optional[str]:
    dev = node.kwargs.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        return f"factory on device {dev}"
    if node.kwargs.get("pin_memory"):
        return "pinned memory"
    return None


@lowering(aten.full.default, supports=_cpu)
def full(b: Builder, size: Sequence[Any], fill_value: Any, **kw: Any) -> Value:
    dtype = b.out_dtype
    value = fill_value
    if isinstance(value, float) and not dtype.is_float:
        value = int(value) if not dtype.is_bool else bool(value)
    return b.expand(b.full(value, (), dtype), tuple(ex.as_expr(s) for s in size))


@lowering(aten.scalar_tensor.default, supports=_cpu)
def scalar_tensor(b: Builder, value: Any, **kw: Any) -> Value:
    return b.full(value, (), b.out_dtype)


@lowering(aten.zeros.default, aten.empty.memory_format, aten.new_zeros.default, aten.new_empty.default,
          aten.empty_permuted.default, aten.empty_strided.default, aten.new_empty_strided.default, supports=_cpu)
def zeros(b: Builder, *args: Any, **kw: Any) -> Value:
    """zeros, and the `empty` family, whose contents are undefined: zeros too. Requested
    strides or layouts are not kept (graph outputs are contiguous)."""
    size = args[1] if isinstance(args[0], Value) else args[0]
    return b.expand(b.full(0, (), b.out_dtype), tuple(ex.as_expr(s) for s in size))


@lowering(aten.ones.default, aten.new_ones.default, supports=_cpu)
def ones(b: Builder, *args: Any, **kw: Any) -> Value:
    size = args[1] if isinstance(args[0], Value) else args[0]
    return b.expand(b.full(1, (), b.out_dtype), tuple(ex.as_expr(s) for s in size))


@lowering(aten.full_like.default, aten.zeros_like.default, aten.ones_like.default, aten.empty_like.default, supports=_cpu)
def full_like(b: Builder, x: Value, *args: Any, **kw: Any) -> Value:
    assert b.node is not None
    target = b.node.target
    value = 0 if target in (aten.zeros_like.default, aten.empty_like.default) else 1
    if target == aten.full_like.default:
        value = args[0] if args else kw["fill_value"]
    return b.expand(b.full(value, (), b.out_dtype), x.shape)


@lowering(aten.arange.start_step, aten.arange.start, aten.arange.default, supports=_cpu)
def arange(b: Builder, *args: Any, **kw: Any) -> Value:
    meta = b.out_meta()
    n = ex.as_expr(meta.shape[0]) if isinstance(meta.shape[0], int) else None
    if n is None:
        from ..symbols import size_to_expr

        n = size_to_expr(meta.shape[0])
    nums = [a for a in args if not isinstance(a, torch.dtype)]
    start, step = 0, 1
    if len(nums) >= 2:
        start = nums[0]
    if len(nums) >= 3:
        step = nums[2]
    dtype = b.out_dtype
    if (isinstance(start, float) or isinstance(step, float)) and not dtype.is_float:
        raise Unsupported("arange with float bounds into an integer tensor")
    return b.op("iota", shape=(n,), dim=0, start=start, step=step, dtype=dtype)


@lowering(prims.iota.default)
def iota(b: Builder, length: Any, *, start: Any, step: Any, dtype: Any, **kw: Any) -> Value:
    return b.op("iota", shape=(ex.as_expr(length),), dim=0, start=start, step=step, dtype=to_ir(dtype))
