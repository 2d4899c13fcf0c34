"""Conversions between the 16-bit floats and f32, without compiler-runtime calls.

Where the CPU lacks an instruction, LLVM lowers `fptrunc`/`fpext` involving `half`/`bfloat`
(and f64 <-> f16, int -> f16) to compiler-rt functions such as `__truncdfhf2` or
`__truncsfbf2`. The JIT process does not necessarily have them, and an unresolved call
crashes. So all 16-bit float conversions go through f32 here:

- bf16 <-> f32 is done with integer operations: widening is a 16-bit shift; narrowing rounds
  to nearest even and turns NaN into the quiet NaN 0x7FC0, exactly torch's
  `round_to_nearest_even`. Both vectorize to a few instructions.
- f16 <-> f32 uses `fpext`/`fptrunc`, which are single instructions with F16C (x86-64-v3 and
  later) and on AArch64.
- Everything else (f64, integers) reaches the 16-bit types through f32, which is also what
  torch does (`c10::Half`/`c10::BFloat16` convert from float).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from .types import BFLOAT, F32, HALF, I32, lanes_of, scalar_of, splat_const, vector_of

_I16 = ir.IntType(16)


def to_f32(b: ir.IRBuilder, v: ir.Value, dtype: DType) -> ir.Value:
    """Widen an f16/bf16 (vector) value to f32 exactly."""
    lanes = lanes_of(v.type)
    if dtype == dt.f16:
        return b.fpext(v, vector_of(F32, lanes))
    bits = b.zext(b.bitcast(v, vector_of(_I16, lanes)), vector_of(I32, lanes))
    return b.bitcast(b.shl(bits, splat_const(vector_of(I32, lanes), 16)), vector_of(F32, lanes))


def from_f32(b: ir.IRBuilder, v: ir.Value, dtype: DType) -> ir.Value:
    """Round an f32 (vector) value to f16/bf16, to nearest even."""
    lanes = lanes_of(v.type)
    if dtype == dt.f16:
        return b.fptrunc(v, vector_of(HALF, lanes))
    i32 = vector_of(I32, lanes)
    bits = b.bitcast(v, i32)
    lsb = b.and_(b.lshr(bits, splat_const(i32, 16)), splat_const(i32, 1))
    rounded = b.add(bits, b.add(lsb, splat_const(i32, 0x7FFF)))
    top = b.trunc(b.lshr(rounded, splat_const(i32, 16)), vector_of(_I16, lanes))
    is_nan = b.fcmp_unordered("uno", v, v)
    top = b.select(is_nan, splat_const(vector_of(_I16, lanes), 0x7FC0), top)
    return b.bitcast(top, vector_of(BFLOAT, lanes))


def select_bits(b: ir.IRBuilder, cond: ir.Value, x: ir.Value, y: ir.Value) -> ir.Value:
    """`select cond, x, y`; a 16-bit float choice is made on its bits: a CPU without 16-bit
    float arithmetic computes `half`/`bfloat` operations in f32, so a select of them would
    widen both sides and round the result back (for bf16 on x86, a call per lane)."""
    if scalar_of(x.type) not in (HALF, BFLOAT):
        return b.select(cond, x, y)
    bits = vector_of(_I16, lanes_of(x.type))
    return b.bitcast(b.select(cond, b.bitcast(x, bits), b.bitcast(y, bits)), x.type)
