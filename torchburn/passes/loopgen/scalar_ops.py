"""Scalar forms of elementwise tensor ops: the expression one element of the result is."""
from __future__ import annotations

from typing import Any, Callable

from ...ir import expr as ex
from ...ir.dtypes import DType
from ...ir.expr import Expr, ScalarType


def binary(op: str, a: Expr, b: Expr) -> Expr:
    if a.type.dtype.is_int:
        return ex.binary(op, a, b)
    rtype = ScalarType(ex.BOOL.dtype, a.type.lanes) if op in ex.COMPARISONS else a.type
    return ex.Binary(op, a, b, rtype)


def unary(name: str, a: Expr) -> Expr:
    return ex.call(name, a)


def constant(value: Any, dtype: DType) -> Expr:
    """A `full` op's value as a constant (or a symbolic size cast to the dtype)."""
    if isinstance(value, Expr):
        return ex.cast(value, dtype)
    return ex.Const(value, ScalarType(dtype))


def where(c: Expr, a: Expr, b: Expr) -> Expr:
    return ex.select(c, a, b)


ScalarFn = Callable[..., Expr]
