"""The LLVM emitter as one interpretation of the IR's scalar ops (`ir/semantics.py`).

The emitter's handlers are tables keyed by the IR's op names: `binary.TABLES` and
`mathfuncs.UNARY_TABLES` per operand kind, `mathfuncs.FMA`, `mathfuncs.CALLS` (every call
name), `expr._CALL_NODES` (`dot4_u8i8_acc`, `dot4_i8i8_acc`) and `casts._CASTS` (per pair of kinds); `Select`
is one `select` instruction. `handles(op, dtype)` reads those tables, and registering it lets
`tests/codegen/test_handler_coverage.py` check that every op the semantics define on a dtype
has an LLVM handler. Adding an op: define it in `ir/semantics.py`, add its entry here.
"""
from __future__ import annotations

from ...ir import dtypes as dt
from ...ir import semantics as sem
from ...ir.dtypes import DType
from ...ir.opnames import BINARY_OPS, CHECKED_INDEX, DOT4_CALLS, TILE_DOT_CALLS, UNARY_FUNCS
from . import binary, casts, mathfuncs
from .expr import _CALL_NODES


def handles(op: str, dtype: DType) -> bool:
    """Whether the LLVM emitter has a handler for `op` on operands of `dtype`."""
    kind = dtype.kind
    if op in BINARY_OPS:
        return op in binary.TABLES[kind]
    if op in UNARY_FUNCS:
        return op in mathfuncs.UNARY_TABLES[kind] and op in mathfuncs.CALLS
    if op == "fma":
        return kind in mathfuncs.FMA and op in mathfuncs.CALLS
    if op in DOT4_CALLS or op in TILE_DOT_CALLS:
        return dtype == dt.i32 and op in _CALL_NODES
    if op == CHECKED_INDEX:
        return dtype == dt.i64 and op in mathfuncs.CALLS
    if op == "cast":
        return all(d == dtype or (casts._category(dtype), casts._category(d)) in casts._CASTS
                   for d in dt.ALL_DTYPES)
    if op in ("bitcast", "select"):
        return True  # one LLVM instruction for every dtype (`casts.emit_bitcast`, `select`)
    return False


sem.register_interpretation("llvm", handles)
