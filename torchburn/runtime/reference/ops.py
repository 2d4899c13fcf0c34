"""The reference engine's interpretation of the scalar ops: each one is `semantics.evaluate`.

The meaning of every op lives in `torchburn/ir/semantics.py`, once; this table only says
how the interpreter calls it (operands are NumPy arrays or scalars, lane-wise for vectors).
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir.dtypes import DType

try:
    from ...ir import semantics
except ImportError:  # until the scalar semantics module is merged
    from . import _interim_semantics as semantics  # type: ignore[no-redef]

DivisionByZero = semantics.DivisionByZero


def binary(op: str, dtype: DType, a: Any, b: Any) -> Any:
    """`a op b` for operands of `dtype` (comparisons give bool)."""
    return semantics.evaluate(op, dtype, a, b)


def call(name: str, dtype: DType, args: list[Any]) -> Any:
    """A named function (`exp`, `fma`, ...) of operands of `dtype`."""
    if name == ex.DOT4_U8I8:
        return dot4_u8i8(*args)
    return semantics.evaluate(name, dtype, *args)


def cast(value: Any, src: DType, dst: DType) -> Any:
    return semantics.cast_value(value, src, dst)


def dot4_u8i8(acc: Any, a: Any, b: Any) -> Any:
    """`dot4_u8i8_acc` (see `ir/expr.py`'s `Call`): vectors on the last axis, i32 wrapping sums."""
    acc = np.asarray(acc, dtype=np.int32)
    prod = np.asarray(a).astype(np.int64) * np.asarray(b).astype(np.int64)
    groups = prod.reshape(prod.shape[:-1] + (acc.shape[-1], 4)).sum(axis=-1)
    return semantics.evaluate("add", dt.i32, acc, groups.astype(np.int32))


#: `VectorReduce` op -> the binary op that folds two lanes.
REDUCE_OPS: dict[str, str] = {"add": "add", "mul": "mul", "min": "min", "max": "max", "and": "and", "or": "or"}


def vector_reduce(op: str, dtype: DType, value: Any) -> Any:
    """Fold the lanes (last axis) of `value` from the first lane to the last."""
    v = np.asarray(value)
    acc = v[..., 0]
    for k in range(1, v.shape[-1]):
        acc = semantics.evaluate(REDUCE_OPS[op], dtype, acc, v[..., k])
    return acc


Handler = Callable[..., Any]
