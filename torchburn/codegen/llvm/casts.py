"""Value conversions between IR dtypes (`cast<T>(x)`) and bit reinterpretation (`bitcast`).

Semantics follow torch on x86:
- float -> int truncates toward zero; into 8/16-bit integers (u8 included) it converts to i32
  first and then wraps, so `-1.0 -> u8` is 255, `300.0 -> u8` is 44 and `1e10 -> i16` is 0
  (x86's INT_MIN for an out-of-range i32, wrapped), as torch gives. The definition is
  `ir/semantics.cast_value`.
- float -> bool is `x != 0` (NaN is true); int -> bool is `x != 0`.
- bool -> number is 0 or 1; unsigned integers zero-extend, signed ones sign-extend.
- f16 and bf16 convert to and from everything through f32 (`halfconv.py`), as torch does and
  so that no compiler-runtime helper is ever called.
"""
from __future__ import annotations

from typing import Callable

import llvmlite.ir as ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ...ir.expr import ScalarType
from ..errors import CodegenError
from .halfconv import from_f32, to_f32
from .opcontext import is_half
from .types import F32, I32, reg_type, splat_const, vector_of

CastFn = Callable[[ir.IRBuilder, ir.Value, DType, DType, ir.Type], ir.Value]


def _category(d: DType) -> str:
    return "b" if d.is_bool else "f" if d.is_float else "u" if d.kind == "u" else "i"


def _int_to_int(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType, to: ir.Type) -> ir.Value:
    if dst.bits == src.bits:
        return v
    if dst.bits < src.bits:
        return b.trunc(v, to)
    return b.sext(v, to) if src.kind == "i" else b.zext(v, to)


def _bool_to_int(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType, to: ir.Type) -> ir.Value:
    return b.zext(v, to)


def _to_bool(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType, to: ir.Type) -> ir.Value:
    if is_half(src):
        v = to_f32(b, v, src)
    zero = splat_const(v.type, 0)
    if src.is_float:
        return b.fcmp_unordered("!=", v, zero)
    return b.icmp_unsigned("!=", v, zero)


def _int_to_float(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType, to: ir.Type) -> ir.Value:
    target = vector_of(F32, _lanes(v)) if is_half(dst) else to
    f = b.sitofp(v, target) if src.kind == "i" else b.uitofp(v, target)
    return from_f32(b, f, dst) if is_half(dst) else f


def _bool_to_float(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType, to: ir.Type) -> ir.Value:
    return b.select(v, splat_const(to, 1.0), splat_const(to, 0.0))


def _float_to_int(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType, to: ir.Type) -> ir.Value:
    if is_half(src):
        v = to_f32(b, v, src)
    if dst.bits >= 32:
        return b.fptosi(v, to) if dst.kind == "i" else b.fptoui(v, to)
    wide = b.fptosi(v, vector_of(I32, _lanes(v)))
    return b.trunc(wide, to)


def _float_to_float(b: ir.IRBuilder, v: ir.Value, src: DType, dst: DType, to: ir.Type) -> ir.Value:
    lanes = _lanes(v)
    if is_half(src):
        v, src = to_f32(b, v, src), dt.f32
    if is_half(dst):
        if src == dt.f64:
            v = b.fptrunc(v, vector_of(F32, lanes))
        return from_f32(b, v, dst)
    if src == dst:
        return v
    return b.fpext(v, to) if dst.bits > src.bits else b.fptrunc(v, to)


def _lanes(v: ir.Value) -> int:
    return v.type.count if isinstance(v.type, ir.VectorType) else 1


_CASTS: dict[tuple[str, str], CastFn] = {
    ("i", "i"): _int_to_int, ("i", "u"): _int_to_int, ("u", "i"): _int_to_int, ("u", "u"): _int_to_int,
    ("b", "i"): _bool_to_int, ("b", "u"): _bool_to_int,
    ("i", "b"): _to_bool, ("u", "b"): _to_bool, ("f", "b"): _to_bool,
    ("i", "f"): _int_to_float, ("u", "f"): _int_to_float, ("b", "f"): _bool_to_float,
    ("f", "i"): _float_to_int, ("f", "u"): _float_to_int,
    ("f", "f"): _float_to_float,
}


def emit_cast(b: ir.IRBuilder, v: ir.Value, src: ScalarType, dst: ScalarType) -> ir.Value:
    """Convert `v` of IR type `src` to IR type `dst` (same lane count)."""
    if src.lanes != dst.lanes:
        raise CodegenError(f"cast from {src} to {dst} changes the number of lanes")
    if src.dtype == dst.dtype:
        return v
    fn = _CASTS[(_category(src.dtype), _category(dst.dtype))]
    return fn(b, v, src.dtype, dst.dtype, reg_type(dst))


def emit_bitcast(b: ir.IRBuilder, v: ir.Value, src: ScalarType, dst: ScalarType) -> ir.Value:
    """Reinterpret bits. A bool is the byte 0/1, so bool <-> i8/u8 extends or compares. The
    lanes may change with the total width kept (`<16 x i32>` as `<64 x i8>`)."""
    if src.lanes != dst.lanes and src.lanes * src.dtype.bits == dst.lanes * dst.dtype.bits \
            and not (src.dtype.is_bool or dst.dtype.is_bool):
        return b.bitcast(v, reg_type(dst))
    if src.lanes != dst.lanes or src.dtype.bits != dst.dtype.bits:
        raise CodegenError(f"bitcast from {src} to {dst} changes the width")
    if src.dtype == dst.dtype:
        return v
    if src.dtype.is_bool or dst.dtype.is_bool:
        if src.dtype.is_float or dst.dtype.is_float:
            raise CodegenError(f"bitcast between {src} and {dst} is not supported")
        return emit_cast(b, v, src, dst)
    return b.bitcast(v, reg_type(dst))
