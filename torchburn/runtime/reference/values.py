"""How the reference engine holds IR values and buffer memory in NumPy.

Values are held as `semantics.storage(dtype)` arrays (bf16: f32 arrays holding bf16 numbers,
NumPy has no bfloat16). Memory has the IR dtype's own width: a bf16 buffer is read as
`uint16` bit patterns and converted on every load and store.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir import semantics
from ...ir.dtypes import DType


def value_dtype(d: DType) -> np.dtype:
    """The NumPy dtype values of IR dtype `d` are computed in."""
    return semantics.storage(d)


def storage_dtype(d: DType) -> np.dtype:
    """The NumPy dtype of `d`'s memory (the same width as the IR dtype)."""
    return np.dtype(np.uint16) if d == dt.bf16 else semantics.storage(d)


def bf16_to_f32(bits: Any) -> Any:
    """bf16 bit patterns (uint16) -> their values as float32 (exact)."""
    raw = np.asarray(bits, dtype=np.uint16)
    if raw.ndim == 0:  # one element: a Python float, as `semantics` returns scalars
        return float(semantics.bitcast_value(int(raw.view(np.int16)), dt.i16, dt.bf16))
    return np.asarray(semantics.bitcast_value(raw.view(np.int16), dt.i16, dt.bf16)).reshape(raw.shape)


def f32_to_bf16(values: Any) -> Any:
    """Values -> bf16 bit patterns (uint16), rounding to nearest even."""
    rounded = np.asarray(semantics.round_bf16(np.asarray(values, dtype=np.float32)))
    return np.asarray(semantics.bitcast_value(rounded, dt.bf16, dt.i16)).view(np.uint16).reshape(rounded.shape)


def load_values(raw: Any, d: DType) -> Any:
    """Memory (in `storage_dtype(d)`) -> values (in `value_dtype(d)`)."""
    return bf16_to_f32(raw) if d == dt.bf16 else raw


def store_values(values: Any, d: DType) -> Any:
    """Values -> memory contents of dtype `d` (values are of dtype `d` already)."""
    if d == dt.bf16:
        return f32_to_bf16(values)
    return np.asarray(values).astype(storage_dtype(d), copy=False)


def constant(value: Any, d: DType) -> Any:
    """A literal of dtype `d` as a Python number, brought to the dtype as `semantics` does
    (integers wrap, floats round); `semantics.evaluate` is fastest on Python numbers."""
    return np.asarray(semantics.to_array(value, d)).item()
