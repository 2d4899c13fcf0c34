"""What an operator emitter needs: the builder, the module, and the operand type.

Emitters for binary operators and math functions are small functions looked up in tables
(`binary.py`, `mathfuncs.py`); each receives an `OpContext` and LLVM operand values, and works
for scalars and vectors alike because the context carries the (possibly vector) LLVM type.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence, Union

import llvmlite.ir as ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from .context import ModuleContext
from .halfconv import from_f32, to_f32
from .types import F32, I1, elem_type, lanes_of, scalar_of, splat_const, vector_of


@dataclass(frozen=True)
class OpContext:
    """Emission context of one operation on operands of `dtype` and LLVM type `type`."""

    b: ir.IRBuilder
    ctx: ModuleContext
    dtype: DType
    type: ir.Type
    fastmath: tuple[str, ...] = ()

    @property
    def lanes(self) -> int:
        return lanes_of(self.type)

    @property
    def bool_type(self) -> ir.Type:
        return vector_of(I1, self.lanes)

    def const(self, value: Union[int, float]) -> ir.Constant:
        """`value` in every lane of the operand type."""
        return splat_const(self.type, value)

    def intrinsic(self, base: str, *args: ir.Value) -> ir.Value:
        """Call an intrinsic overloaded on the operand type, such as `llvm.pow.v16f32`."""
        fn = self.ctx.intrinsic(base, self.type, [a.type for a in args], [self.type])
        return self.b.call(fn, list(args))

    def widened(self) -> "OpContext":
        """The same context with f16/bf16 replaced by f32 (half types compute in f32)."""
        return replace(self, dtype=dt.f32, type=vector_of(F32, self.lanes))

    def to_f32(self, v: ir.Value) -> ir.Value:
        """Widen an operand of this (half) context to f32."""
        return to_f32(self.b, v, self.dtype)

    def from_f32(self, v: ir.Value) -> ir.Value:
        """Round an f32 result back to this (half) context's type."""
        return from_f32(self.b, v, self.dtype)

    def with_dtype(self, dtype: DType) -> "OpContext":
        return replace(self, dtype=dtype, type=vector_of(elem_type(dtype), self.lanes))


def is_half(dtype: DType) -> bool:
    return dtype in (dt.f16, dt.bf16)


def per_lane_call(b: ir.IRBuilder, fn: ir.Function, args: Sequence[ir.Value]) -> ir.Value:
    """Call a scalar function on every lane of vector arguments (scalars are used as they are),
    assembling a vector result. Scalar arguments give a plain call."""
    lanes = max(lanes_of(a.type) for a in args)
    if lanes == 1:
        return b.call(fn, list(args))
    ret = fn.function_type.return_type
    result: ir.Value = ir.Constant(ir.VectorType(ret, lanes), ir.Undefined)
    for i in range(lanes):
        idx = ir.Constant(ir.IntType(32), i)
        lane_args = [b.extract_element(a, idx) if lanes_of(a.type) > 1 else a for a in args]
        result = b.insert_element(result, b.call(fn, lane_args), idx)
    return result


def scalar_type(v: ir.Value) -> ir.Type:
    return scalar_of(v.type)
