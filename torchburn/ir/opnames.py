"""The names of the IR's scalar operations, in one place.

`expr.py` builds nodes with these names and `semantics.py` defines what each means; both
import them from here, so neither imports the other's module to learn the names.
"""
from __future__ import annotations

#: Binary operators with an infix spelling, in the order of their precedence groups.
INFIX_OPS: dict[str, str] = {
    "add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "mod": "%",
    "eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=",
    "and": "&", "or": "|", "xor": "^", "shl": "<<", "shr": ">>",
}
#: Binary operators spelt as calls: `min(a, b)`.
NAMED_BINARY_OPS: frozenset[str] = frozenset(
    {"min", "max", "pow", "atan2", "fmod", "remainder", "copysign", "hypot", "nextafter"}
)
#: The byte dot-product calls (see `expr.Call`): an i32 accumulator and two byte vectors,
#: unsigned by signed or signed by signed.
DOT4_U8I8 = "dot4_u8i8_acc"
DOT4_I8I8 = "dot4_i8i8_acc"
DOT4_CALLS: frozenset[str] = frozenset({DOT4_U8I8, DOT4_I8I8})
#: The byte tile products (see `expr.Call`): a 16 x 16 i32 accumulator, a 16 x K byte tile
#: (unsigned or signed) and a K x 16 signed byte tile in four-byte groups (AMX's `tdpbusd`,
#: `tdpbssd`).
TILE_DOT_U8I8 = "tile_dot_u8i8"
TILE_DOT_I8I8 = "tile_dot_i8i8"
TILE_DOT_CALLS: frozenset[str] = frozenset({TILE_DOT_U8I8, TILE_DOT_I8I8})
#: Rows and columns of a tile product's result (its accumulator has TILE_ROWS * TILE_ROWS lanes).
TILE_ROWS = 16
COMPARISONS: frozenset[str] = frozenset({"eq", "ne", "lt", "le", "gt", "ge"})
BINARY_OPS: frozenset[str] = frozenset(INFIX_OPS) | NAMED_BINARY_OPS

#: Functions of one argument. Float math follows C99/IEEE semantics.
UNARY_FUNCS: frozenset[str] = frozenset({
    "neg", "not", "abs", "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sqrt", "rsqrt",
    "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh",
    "erf", "erfc", "erfinv", "sigmoid", "floor", "ceil", "round", "trunc", "sign", "reciprocal",
    "isnan", "isinf", "isfinite", "lgamma", "digamma", "signbit",
})
#: Unary functions whose result is a bool whatever the operand.
PREDICATES: frozenset[str] = frozenset({"isnan", "isinf", "isfinite", "signbit"})
#: The checked index: `checked_index(i, n)` is `i` where `0 <= i < n`; elsewhere it is 0 and
#: the access is a fault (`semantics.IndexOutOfRange`; native code counts it, see
#: `codegen/llvm/faults.py`). Index values read from tensors go through it.
CHECKED_INDEX = "checked_index"
#: Calls that are neither binary operators nor unary functions.
OTHER_CALLS: frozenset[str] = frozenset({"fma", CHECKED_INDEX}) | DOT4_CALLS | TILE_DOT_CALLS
#: Every scalar operation an interpretation of the IR implements: the binary operators, the
#: calls, and the nodes `cast`, `bitcast` and `select`.
SCALAR_OPS: frozenset[str] = BINARY_OPS | UNARY_FUNCS | OTHER_CALLS | {"cast", "bitcast", "select"}
