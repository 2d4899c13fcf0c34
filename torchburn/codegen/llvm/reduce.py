"""`vreduce_<op>(v)`: combine the lanes of a vector into a scalar.

Float `add`/`mul` use `llvm.vector.reduce.fadd/fmul` with the `reassoc` flag, so LLVM reduces
as a tree (log2(lanes) shuffles) instead of lane by lane: a vectorized reduction has already
reassociated the sum, and the lane order of one vector adds nothing exact to preserve. The
start values are the exact identities (-0.0 for add, 1.0 for mul), so signed zeros and NaN
behave as in a sequential sum. Float `min`/`max` use `fminimum`/`fmaximum`, which propagate
NaN like torch.amin/amax. f16/bf16 vectors are reduced in f32 and rounded once at the end.
"""
from __future__ import annotations

from typing import Callable

import llvmlite.ir as ir

from ..errors import CodegenError
from .halfconv import from_f32
from .opcontext import OpContext, is_half
from .types import scalar_of

ReduceFn = Callable[[OpContext, ir.Value], ir.Value]


def _ordered(name: str, start: float) -> ReduceFn:
    """fadd/fmul reductions: a start value and a reassociable tree reduction."""
    def emit(cx: OpContext, v: ir.Value) -> ir.Value:
        elem = scalar_of(cx.type)
        fn = cx.ctx.intrinsic(name, elem, [elem, cx.type], [cx.type])
        return cx.b.call(fn, [ir.Constant(elem, start), v], fastmath=("reassoc",))
    return emit


def _plain(name: str) -> ReduceFn:
    def emit(cx: OpContext, v: ir.Value) -> ir.Value:
        elem = scalar_of(cx.type)
        fn = cx.ctx.intrinsic(name, elem, [cx.type], [cx.type])
        return cx.b.call(fn, [v])
    return emit


FLOAT_REDUCE: dict[str, ReduceFn] = {
    "add": _ordered("llvm.vector.reduce.fadd", -0.0),
    "mul": _ordered("llvm.vector.reduce.fmul", 1.0),
    "min": _plain("llvm.vector.reduce.fminimum"),
    "max": _plain("llvm.vector.reduce.fmaximum"),
}

_INT_COMMON: dict[str, ReduceFn] = {
    "add": _plain("llvm.vector.reduce.add"),
    "mul": _plain("llvm.vector.reduce.mul"),
    "and": _plain("llvm.vector.reduce.and"),
    "or": _plain("llvm.vector.reduce.or"),
    "xor": _plain("llvm.vector.reduce.xor"),
}

SIGNED_REDUCE: dict[str, ReduceFn] = {
    **_INT_COMMON,
    "min": _plain("llvm.vector.reduce.smin"),
    "max": _plain("llvm.vector.reduce.smax"),
}

UNSIGNED_REDUCE: dict[str, ReduceFn] = {
    **_INT_COMMON,
    "min": _plain("llvm.vector.reduce.umin"),
    "max": _plain("llvm.vector.reduce.umax"),
}

#: On bools `add`/`max` mean any and `mul`/`min` mean all.
BOOL_REDUCE: dict[str, ReduceFn] = {
    "and": _plain("llvm.vector.reduce.and"),
    "or": _plain("llvm.vector.reduce.or"),
    "xor": _plain("llvm.vector.reduce.xor"),
    "add": _plain("llvm.vector.reduce.or"),
    "max": _plain("llvm.vector.reduce.or"),
    "mul": _plain("llvm.vector.reduce.and"),
    "min": _plain("llvm.vector.reduce.and"),
}

_TABLES: dict[str, dict[str, ReduceFn]] = {
    "f": FLOAT_REDUCE, "i": SIGNED_REDUCE, "u": UNSIGNED_REDUCE, "b": BOOL_REDUCE,
}


def emit_reduce(cx: OpContext, op: str, v: ir.Value) -> ir.Value:
    """Reduce vector `v` (of `cx.dtype`, type `cx.type`) with `op`."""
    fn = _TABLES[cx.dtype.kind].get(op)
    if fn is None:
        raise CodegenError(f"vreduce_{op} is not defined on {cx.dtype}")
    if not is_half(cx.dtype):
        return fn(cx, v)
    wide = cx.widened()
    return from_f32(cx.b, fn(wide, cx.to_f32(v)), cx.dtype)
