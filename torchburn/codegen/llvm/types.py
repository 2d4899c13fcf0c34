"""IR dtypes as LLVM types, and LLVM constants of IR types.

Two views of each dtype: the *register* type an SSA value has (bool is `i1`) and the *storage*
type its memory has (bool is one byte, `i8`, holding 0 or 1, as in torch). Vector expressions
(`lanes > 1`) become LLVM vectors of the register type.

llvmlite has no `bfloat`; `BFloatType` adds it with the same constant spelling LLVM accepts
for `half` (a double-precision hex literal whose value the narrow type represents exactly),
so constants are rounded to the narrow type here first.
"""
from __future__ import annotations

import math
from typing import Union

import llvmlite.ir as ir
from llvmlite.ir.types import _BaseFloatType, _format_double

from ...ir import dtypes as dt
from ...ir import semantics as sem
from ...ir.dtypes import DType
from ...ir.expr import ScalarType
from ..errors import CodegenError


class BFloatType(_BaseFloatType):
    """LLVM's `bfloat` (brain float 16), missing from llvmlite."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"

    def format_constant(self, value: float) -> str:
        return _format_double(round_bf16(value))


BFloatType._create_instance()


class _HalfType(ir.HalfType):
    """`half` whose constants round (llvmlite's raise on values beyond the f16 range)."""

    def format_constant(self, value: float) -> str:
        return _format_double(round_f16(value))


_HalfType._create_instance()

I1 = ir.IntType(1)
I8 = ir.IntType(8)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
F32 = ir.FloatType()
F64 = ir.DoubleType()
HALF = _HalfType()
BFLOAT = BFloatType()
PTR = ir.PointerType()
VOID = ir.VoidType()

_REGISTER_TYPES: dict[DType, ir.Type] = {
    dt.bool_: I1, dt.i8: I8, dt.u8: I8, dt.i16: ir.IntType(16), dt.i32: I32, dt.i64: I64,
    dt.f16: HALF, dt.bf16: BFLOAT, dt.f32: F32, dt.f64: F64,
}


def elem_type(dtype: DType) -> ir.Type:
    """The register type of one element (bool is `i1`)."""
    try:
        return _REGISTER_TYPES[dtype]
    except KeyError:
        raise CodegenError(f"dtype {dtype} has no LLVM type") from None


def storage_type(dtype: DType) -> ir.Type:
    """The in-memory type of one element (bool is a byte)."""
    return I8 if dtype.is_bool else elem_type(dtype)


def reg_type(st: ScalarType) -> ir.Type:
    """The register type of an expression type: a scalar or an LLVM vector."""
    e = elem_type(st.dtype)
    return e if st.lanes == 1 else ir.VectorType(e, st.lanes)


def vector_of(t: ir.Type, lanes: int) -> ir.Type:
    return t if lanes == 1 else ir.VectorType(t, lanes)


def scalar_of(t: ir.Type) -> ir.Type:
    """The element type of a vector type, or the type itself."""
    return t.element if isinstance(t, ir.VectorType) else t


def lanes_of(t: ir.Type) -> int:
    return t.count if isinstance(t, ir.VectorType) else 1


def round_f16(v: float) -> float:
    """`v` rounded to half precision as the IR's casts round (`semantics.cast_value`: through
    f32, overflow gives a signed infinity)."""
    return float(sem.cast_value(v, dt.f64, dt.f16))


def round_bf16(v: float) -> float:
    """`v` rounded to bfloat16 as the IR's casts round (through f32, ties to even)."""
    if math.isnan(v):
        return v
    return float(sem.cast_value(v, dt.f64, dt.bf16))


def const(st: ScalarType, value: Union[int, float, bool]) -> ir.Constant:
    """An LLVM constant of an IR type; vectors are splats."""
    e = elem_type(st.dtype)
    if st.dtype.is_bool:
        v: Union[int, float] = int(bool(value))
    elif st.dtype.is_float:
        v = float(value)
        if math.isnan(v) and st.dtype.bits < 64:
            # a NaN's payload need not fit the narrower type (LLVM rejects `bfloat
            # 0x7FF8000000000001`); the IR leaves NaN bits unspecified, so take the quiet NaN
            v = math.nan
        elif st.dtype == dt.bf16:
            v = round_bf16(v)  # LLVM takes only exactly representable constants
    else:
        v = _wrap_int(int(value), st.dtype)
    c = ir.Constant(e, v)
    return c if st.lanes == 1 else ir.Constant(ir.VectorType(e, st.lanes), [c] * st.lanes)


def splat_const(t: ir.Type, value: Union[int, float]) -> ir.Constant:
    """A constant of LLVM type `t` (scalar or vector) with every lane `value`."""
    if isinstance(t, ir.VectorType):
        return ir.Constant(t, [ir.Constant(t.element, value)] * t.count)
    return ir.Constant(t, value)


def _wrap_int(v: int, dtype: DType) -> int:
    """The value's bit pattern as a signed integer of the dtype's width (LLVM prints integer
    constants signed: u8 255 is `i8 -1`)."""
    return sem.wrap_int(v, _SIGNED_OF_WIDTH[dtype.bits])


_SIGNED_OF_WIDTH: dict[int, DType] = {8: dt.i8, 16: dt.i16, 32: dt.i32, 64: dt.i64}


def mangle(t: ir.Type) -> str:
    """The overload suffix LLVM intrinsics use for a type: `f32`, `v16f32`, `i64`, `p0`."""
    if isinstance(t, ir.VectorType):
        return f"v{t.count}{mangle(t.element)}"
    if isinstance(t, ir.PointerType):
        return "p0"
    if isinstance(t, ir.IntType):
        return f"i{t.width}"
    names = {F32: "f32", F64: "f64", HALF: "f16", BFLOAT: "bf16"}
    for k, name in names.items():
        if t == k:
            return name
    raise CodegenError(f"no intrinsic suffix for LLVM type {t}")
