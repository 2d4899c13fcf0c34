"""Stand-in for `torchburn.ir.semantics` until that module lands (deleted then).

Only what the reference engine's own tests need; not a definition anyone else may use.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
from scipy import special

from ...ir.dtypes import DType
from .values import value_dtype


class DivisionByZero(ArithmeticError):
    pass


def _wrap(fn: Any) -> Any:
    def run(*args: Any) -> Any:
        with np.errstate(all="ignore"):
            return fn(*args)
    return run


def _floordiv(a: Any, b: Any) -> Any:
    if np.any(np.asarray(b) == 0):
        raise DivisionByZero("integer division by zero")
    return np.floor_divide(a, b)


def _mod(a: Any, b: Any) -> Any:
    if np.any(np.asarray(b) == 0):
        raise DivisionByZero("integer remainder by zero")
    return np.mod(a, b)


def _div_int(a: Any, b: Any) -> Any:
    if np.any(np.asarray(b) == 0):
        raise DivisionByZero("integer division by zero")
    q = np.abs(a) // np.abs(b)
    return np.where((np.asarray(a) < 0) != (np.asarray(b) < 0), -q, q).astype(np.result_type(a, b))


_FLOAT = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "min": np.minimum,
    "max": np.maximum, "pow": np.power, "atan2": np.arctan2, "fmod": np.fmod, "copysign": np.copysign,
    "hypot": np.hypot, "remainder": lambda a, b: a - np.floor(a / b) * b, "nextafter": np.nextafter,
    "floordiv": lambda a, b: np.floor(a / b), "mod": lambda a, b: a - np.floor(a / b) * b,
    "neg": np.negative, "abs": np.abs, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "log": np.log,
    "log2": np.log2, "log10": np.log10, "log1p": np.log1p, "sqrt": np.sqrt, "rsqrt": lambda x: 1 / np.sqrt(x),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "erf": special.erf, "erfc": special.erfc, "erfinv": special.erfinv,
    "sigmoid": special.expit, "floor": np.floor, "ceil": np.ceil, "round": np.rint, "trunc": np.trunc,
    "sign": np.sign, "reciprocal": lambda x: 1 / x, "lgamma": special.gammaln, "digamma": special.digamma,
    "fma": lambda a, b, c: a * b + c,
}
_INT = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": _div_int, "floordiv": _floordiv,
    "mod": _mod, "min": np.minimum, "max": np.maximum, "and": np.bitwise_and, "or": np.bitwise_or,
    "xor": np.bitwise_xor, "shl": np.left_shift, "shr": np.right_shift, "neg": np.negative, "abs": np.abs,
    "sign": np.sign, "not": np.invert, "pow": np.power,
}
_ANY = {
    "eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
    "ge": np.greater_equal, "isnan": np.isnan, "isinf": np.isinf, "isfinite": np.isfinite, "signbit": np.signbit,
}
_BOOL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor, "not": np.logical_not,
         "min": np.logical_and, "max": np.logical_or}


def evaluate(op: str, dtype: DType, *args: Any) -> Any:
    if op in _ANY:
        return _wrap(_ANY[op])(*args)
    table = _BOOL if dtype.is_bool else _FLOAT if dtype.is_float else _INT
    if op not in table:
        raise NotImplementedError(f"interim semantics: {op} on {dtype}")
    out = _wrap(table[op])(*args)
    return np.asarray(out).astype(value_dtype(dtype), copy=False)


def cast_value(value: Any, src: DType, dst: DType) -> Any:
    with np.errstate(all="ignore"):
        v = np.asarray(value)
        if src.is_float and dst.is_int:
            v = np.trunc(np.nan_to_num(v, nan=0.0, posinf=0.0, neginf=0.0))
        if dst.is_bool:
            return v != 0
        return v.astype(value_dtype(dst))


_ = math
