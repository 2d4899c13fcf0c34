"""Bounds on the value of an emitted integer, from the instructions that made it.

Instruction selection sometimes has a faster sequence for small operands: `dot4_u8i8_acc`
multiplies bytes pairwise into i16 lanes with `pmaddubsw` when every u8 operand is below 128
(no pair sum can saturate). The bound is read from the LLVM values codegen has just built,
so it sees through `let` bindings and broadcasts without an analysis of the IR:

    %lo = and <16 x i8> %b, <i8 15, ...>                           -> 15
    %sh = lshr <16 x i8> %b, <i8 4, ...>                           -> 15
    %hi = select <16 x i1> %too_far, <16 x i8> zeroinitializer, %sh  -> 15
    %w  = load <16 x i8>, ptr %p                                   -> 255

Anything not understood is bounded by its width (2^bits - 1), so the bound is always sound.
`signed_min` is the same for a lower bound on the signed value: `dot4_i8i8_acc` takes
`pabsb`/`psignb` + `pmaddubsw` when one operand is known above -128 (`llvm.smax(x, -127)`).
"""
from __future__ import annotations

import llvmlite.ir as ir

#: How deep the walk goes before falling back to the type's bound (values are short chains).
MAX_DEPTH = 8


def _width(t: ir.Type) -> int:
    element = t.element if isinstance(t, ir.VectorType) else t
    return element.width if isinstance(element, ir.IntType) else 64


def _elements(c: ir.Constant) -> list[int] | None:
    """The unsigned lanes of an integer constant (undefined lanes left out), or None when
    the constant is not a plain integer or integer vector."""
    bits = _width(c.type)
    value = c.constant
    if isinstance(value, int):
        return [value % (1 << bits)]
    if value is None:  # zeroinitializer
        return [0]
    if isinstance(value, (list, tuple)):
        out: list[int] = []
        for e in value:
            v = e.constant if isinstance(e, ir.Constant) else e
            if isinstance(v, int):
                out.append(v % (1 << bits))
            elif not isinstance(v, type(ir.Undefined)):
                return None
        return out or [0]
    if isinstance(value, type(ir.Undefined)):
        return [0]
    return None


def lane_constants(value: ir.Value) -> list[int] | None:
    """The unsigned lanes of a constant or of a broadcast of one (`insertelement` of a constant
    into lane 0, then a `shufflevector` with an all-zero mask: how codegen splats), else None."""
    if isinstance(value, ir.Constant):
        return _elements(value)
    if isinstance(value, ir.Instruction) and value.opname == "shufflevector":
        inserted, _, mask = value.operands
        if (isinstance(inserted, ir.Instruction) and inserted.opname == "insertelement"
                and isinstance(mask, ir.Constant) and set(_elements(mask) or [1]) == {0}
                and isinstance(inserted.operands[1], ir.Constant)
                and _elements(inserted.operands[2]) == [0]):
            return _elements(inserted.operands[1])
    return None


def unsigned_max(value: ir.Value, depth: int = 0) -> int:
    """An upper bound on `value` read as unsigned (each lane of a vector)."""
    full = (1 << _width(value.type)) - 1
    if depth > MAX_DEPTH:
        return full
    if isinstance(value, ir.Constant):
        lanes = _elements(value)
        return full if lanes is None else min(max(lanes), full)
    if not isinstance(value, ir.Instruction):
        return full
    op = value.opname
    args = value.operands
    if op == "and":
        return min(unsigned_max(a, depth + 1) for a in args)
    if op in ("or", "xor"):
        top = max(unsigned_max(a, depth + 1) for a in args)
        return min(full, (1 << top.bit_length()) - 1)
    if op == "lshr":
        shifts = lane_constants(args[1])
        if shifts:
            return unsigned_max(args[0], depth + 1) >> min(min(shifts), 63)
    if op == "select":
        return max(unsigned_max(args[1], depth + 1), unsigned_max(args[2], depth + 1))
    if op == "zext":
        return unsigned_max(args[0], depth + 1)
    if op == "shufflevector":
        return max(unsigned_max(args[0], depth + 1), unsigned_max(args[1], depth + 1))
    if op == "insertelement":
        return max(unsigned_max(args[0], depth + 1), unsigned_max(args[1], depth + 1))
    return full


def _signed(lane: int, bits: int) -> int:
    return lane - (1 << bits) if lane >> (bits - 1) else lane


def signed_min(value: ir.Value, depth: int = 0) -> int:
    """A lower bound on `value` read as signed (each lane of a vector)."""
    bits = _width(value.type)
    low = -(1 << (bits - 1))
    if depth > MAX_DEPTH:
        return low
    if isinstance(value, ir.Constant):
        lanes = _elements(value)
        return low if lanes is None else min(_signed(v, bits) for v in lanes)
    if not isinstance(value, ir.Instruction):
        return low
    op = value.opname
    args = value.operands
    if op == "call":
        callee = getattr(value, "callee", None)
        name = getattr(callee, "name", "")
        call_args = getattr(value, "args", ())
        if name.startswith("llvm.smax.") and len(call_args) == 2:
            return max(signed_min(call_args[0], depth + 1), signed_min(call_args[1], depth + 1))
        return low
    if op in ("and", "lshr") and unsigned_max(value, depth) < 1 << (bits - 1):
        return 0  # the sign bit is known clear
    if op == "select":
        return min(signed_min(args[1], depth + 1), signed_min(args[2], depth + 1))
    if op == "sext":
        return signed_min(args[0], depth + 1)
    if op == "zext":
        return 0
    if op == "shufflevector":
        return min(signed_min(args[0], depth + 1), signed_min(args[1], depth + 1))
    if op == "insertelement":
        return min(signed_min(args[0], depth + 1), signed_min(args[1], depth + 1))
    lanes = lane_constants(value)
    return low if lanes is None else min(_signed(v, bits) for v in lanes)
