"""The reference engine's interpretation of the scalar ops: each one is `semantics.evaluate`.

The meaning of every op lives in `torchburn/ir/semantics.py`, once; this module only says
which ops the interpreter dispatches (by IR node: `Binary`, `Call`, `Cast`, `Bitcast`,
`Select`) and registers that set, so `semantics.interpretations()` can check that the
reference engine lacks none. Operands are NumPy arrays or scalars, lane-wise for vectors.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import semantics
from ...ir.dtypes import DType

DivisionByZero = semantics.DivisionByZero
IndexOutOfRange = semantics.IndexOutOfRange

#: Ops of `Binary` nodes, of `Call` nodes, and the conversions and selection.
BINARY: frozenset[str] = frozenset(ex.BINARY_OPS)
CALLS: frozenset[str] = frozenset(ex.UNARY_FUNCS) | {"fma", ex.CHECKED_INDEX} | ex.DOT4_CALLS | ex.TILE_DOT_CALLS
OTHER: frozenset[str] = frozenset({"cast", "bitcast", "select"})


def covered() -> frozenset[str]:
    """Every op the interpreter runs."""
    return BINARY | CALLS | OTHER


def handles(op: str, dtype: DType) -> bool:
    """Whether the interpreter runs `op` on `dtype`: every op it dispatches, on every dtype
    (`semantics.evaluate` itself refuses a dtype the op has no meaning on)."""
    return op in covered()


semantics.register_interpretation("reference", handles)


def binary(op: str, dtype: DType, a: Any, b: Any) -> Any:
    """`a op b` for operands of `dtype` (comparisons give bool)."""
    return semantics.evaluate(op, dtype, a, b)


def call(name: str, dtype: DType, args: list[Any]) -> Any:
    """A named function (`exp`, `fma`, `dot4_u8i8_acc`, ...) of operands of `dtype`."""
    return semantics.evaluate(name, dtype, *args)


def cast(value: Any, src: DType, dst: DType) -> Any:
    return semantics.cast_value(value, src, dst)


def bitcast(value: Any, src: DType, dst: DType) -> Any:
    out = semantics.bitcast_value(value, src, dst)
    return np.reshape(out, np.shape(value)) if isinstance(out, np.ndarray) else out


def bitcast_lanes(value: Any, src: DType, lanes_in: int, dst: DType, lanes_out: int) -> Any:
    """`bitcast<dst, lanes_out>` of a `lanes_in`-lane value: its bytes in lane order (lane 0
    lowest, little-endian) regrouped into `lanes_out` lanes of `dst`."""
    return semantics.bitcast_lanes_value(value, src, lanes_in, dst, lanes_out)


def select(dtype: DType, cond: Any, a: Any, b: Any) -> Any:
    return semantics.evaluate("select", dtype, cond, a, b)


#: `VectorReduce` op -> the binary op that folds two lanes.
REDUCE_OPS: dict[str, str] = {op: op for op in ("add", "mul", "min", "max", "and", "or", "xor")}


def vector_reduce(op: str, dtype: DType, value: Any) -> Any:
    """Combine the lanes (last axis) of `value` in `VectorReduce`'s order: float `add`/`mul`
    of a power-of-two lane count as a halving tree (lane i with lane i + n/2, as
    `codegen/llvm/reduce.py`'s reassociable reduction), anything else from the first lane to
    the last; f16 and bf16 lanes are combined in f32 and rounded once at the end."""
    wide = dt.compute_dtype(dtype)
    v = np.asarray(value if wide == dtype else cast(value, dtype, wide))
    fn = REDUCE_OPS[op]
    n = v.shape[-1]
    if wide.kind == "f" and op in ("add", "mul") and n & (n - 1) == 0:
        while v.shape[-1] > 1:
            h = v.shape[-1] // 2
            v = np.asarray(semantics.evaluate(fn, wide, v[..., :h], v[..., h:]))
        acc = v[..., 0]
    else:
        acc = v[..., 0]
        for k in range(1, n):
            acc = semantics.evaluate(fn, wide, acc, v[..., k])
    return acc if wide == dtype else cast(acc, wide, dtype)
