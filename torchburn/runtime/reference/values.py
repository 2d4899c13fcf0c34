"""How the reference engine holds IR values and buffer memory in NumPy.

Every dtype but bf16 is held as the NumPy dtype of the same name (`f16` as `float16`, `bool`
as `bool_`, index as `int64`). NumPy has no bfloat16: a bf16 buffer's memory is read as
`uint16` and its values are held as `float32` numbers that are exactly representable in bf16
(the scalar semantics round every bf16 result to bf16).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir.dtypes import DType

_VALUE = {
    dt.bool_: np.bool_, dt.i8: np.int8, dt.i16: np.int16, dt.i32: np.int32, dt.i64: np.int64,
    dt.u8: np.uint8, dt.f16: np.float16, dt.bf16: np.float32, dt.f32: np.float32, dt.f64: np.float64,
}
_STORAGE = {**_VALUE, dt.bf16: np.uint16}


def value_dtype(d: DType) -> np.dtype:
    """The NumPy dtype values of IR dtype `d` are computed in."""
    return np.dtype(_VALUE[d])


def storage_dtype(d: DType) -> np.dtype:
    """The NumPy dtype of `d`'s memory (the same width as the IR dtype)."""
    return np.dtype(_STORAGE[d])


def bf16_to_f32(bits: Any) -> Any:
    """bf16 bit patterns (uint16) -> their float32 values (exact)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16(values: Any) -> Any:
    """float32 values -> bf16 bit patterns, rounding to nearest even (NaN stays a quiet NaN)."""
    v = np.asarray(values, dtype=np.float32)
    bits = v.view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    nan = np.isnan(v)
    out = np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x40), rounded)
    return out.astype(np.uint16)


def load_values(raw: Any, d: DType) -> Any:
    """Memory (in `storage_dtype(d)`) -> values (in `value_dtype(d)`)."""
    return bf16_to_f32(raw) if d == dt.bf16 else raw


def store_values(values: Any, d: DType) -> Any:
    """Values -> memory contents of dtype `d`."""
    if d == dt.bf16:
        return f32_to_bf16(values)
    return np.asarray(values).astype(storage_dtype(d), copy=False)


def constant(value: Any, d: DType) -> Any:
    """A literal of dtype `d` as a NumPy scalar (bf16 literals rounded to bf16)."""
    if d == dt.bf16:
        return np.float32(bf16_to_f32(f32_to_bf16(np.float32(value))))
    if d.is_int:  # an out-of-range literal wraps, as in memory
        bits = d.bits
        v = int(value) & ((1 << bits) - 1)
        if d.is_signed and v >= 1 << (bits - 1):
            v -= 1 << bits
        return value_dtype(d).type(v)
    return value_dtype(d).type(value)
