"""The type of a tensor value: element dtype and shape (index expressions, symbols allowed).

Its own module so that op definitions (`ops.py`, type inference) and the graph (`tensor.py`,
which infers result types through `ops.py`) both use it without importing each other.

    TensorType.of(f32, [Var("s0"), 1024])   ->   f32[s0, 1024]
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Optional, Union

from .dtypes import DType
from .expr import Const, Expr, as_expr


@dataclass(frozen=True)
class TensorType:
    """Element dtype and shape; each dimension is an index expression (`4`, `s0`, `s0 * 2`)."""

    dtype: DType
    shape: tuple[Expr, ...]

    @staticmethod
    def of(dtype: DType, shape: Iterable[Union[Expr, int]]) -> "TensorType":
        return TensorType(dtype, tuple(as_expr(d) for d in shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def static_shape(self) -> Optional[tuple[int, ...]]:
        """The shape as ints, or None when some dimension is symbolic."""
        if all(isinstance(d, Const) for d in self.shape):
            return tuple(int(d.value) for d in self.shape)  # type: ignore[attr-defined]
        return None

    def with_dtype(self, dtype: DType) -> "TensorType":
        return TensorType(dtype, self.shape)
