"""Binary operators: one table per kind of operand (float, signed, unsigned, bool).

Semantics (see `ir/expr.py`):
- `floordiv` and `mod`/`remainder` round toward negative infinity (Python); on floats they
  follow torch's `div_floor_floating` and `remainder` exactly (sign of zero included).
- `div` is `fdiv` on floats and truncating (`sdiv`/`udiv`) on integers; `fmod` is C's fmod.
- Integer division and remainder never execute a division by 0 or by -1 (x86 traps, LLVM
  calls both undefined): they divide by a safe divisor, give `-a` (wrapping) for `a / -1`,
  and count a lane whose divisor is 0 as a fault (`faults.py`), which the launcher turns into
  eager's error. A constant divisor other than 0 and -1 is divided by directly.
- `min`/`max` on floats propagate NaN (`llvm.minimum`/`llvm.maximum`, like torch.minimum).
- Comparisons are ordered, except `ne`, which is true when either side is NaN.
- Shifts by the bit width or more give 0 (`>>` of a negative signed value gives -1), as torch
  does, instead of LLVM's poison.
- Integer `pow` is repeated squaring in a helper (`helpers.ipow`); float `pow` is `llvm.pow`.
- f16/bf16 operands are computed in f32 and rounded back: exact for + - * / (f32 has more
  than twice the precision) and what torch does for everything else, except `nextafter`,
  which steps in the half's own precision (`HALF_OWN_PRECISION`).
The definitions are `ir/semantics.py`'s; `tests/codegen/test_semantics_agreement.py` checks.
"""
from __future__ import annotations

from typing import Callable, Optional

import llvmlite.ir as ir

from ..errors import CodegenError
from . import helpers
from .faults import record_fault_if
from .opcontext import OpContext, is_half, per_lane_call
from ...ir import dtypes as dt
from .types import F32, scalar_of, splat_const, vector_of

BinaryFn = Callable[[OpContext, ir.Value, ir.Value], ir.Value]

_CMP_SYMBOLS = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">="}


# ---- floats --------------------------------------------------------------------------------------

def _fcmp(op: str) -> BinaryFn:
    sym = _CMP_SYMBOLS[op]
    if op == "ne":
        return lambda cx, a, b: cx.b.fcmp_unordered(sym, a, b)
    return lambda cx, a, b: cx.b.fcmp_ordered(sym, a, b)


def _float_floordiv(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    """torch's div_floor_floating: floor((a - fmod(a, b)) / b), corrected for rounding."""
    bb = cx.b
    zero, one = cx.const(0.0), cx.const(1.0)
    mod = bb.frem(a, b)
    div = bb.fdiv(bb.fsub(a, mod), b)
    mod_nonzero = bb.fcmp_unordered("!=", mod, zero)
    signs_differ = bb.xor(bb.fcmp_ordered("<", b, zero), bb.fcmp_ordered("<", mod, zero))
    div = bb.select(bb.and_(mod_nonzero, signs_differ), bb.fsub(div, one), div)
    floor = cx.intrinsic("llvm.floor", div)
    floor = bb.select(bb.fcmp_ordered(">", bb.fsub(div, floor), cx.const(0.5)), bb.fadd(floor, one), floor)
    zero_result = cx.intrinsic("llvm.copysign", zero, bb.fdiv(a, b))
    result = bb.select(bb.fcmp_unordered("!=", div, zero), floor, zero_result)
    return bb.select(bb.fcmp_ordered("==", b, zero), bb.fdiv(a, b), result)


def _float_mod(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    """torch.remainder: fmod, then add the divisor when the signs of result and divisor differ."""
    bb = cx.b
    zero = cx.const(0.0)
    mod = bb.frem(a, b)
    nonzero = bb.fcmp_ordered("!=", mod, zero)
    signs_differ = bb.xor(bb.fcmp_ordered("<", b, zero), bb.fcmp_ordered("<", mod, zero))
    return bb.select(bb.and_(nonzero, signs_differ), bb.fadd(mod, b), mod)


def _intrinsic2(name: str) -> BinaryFn:
    return lambda cx, a, b: cx.intrinsic(name, a, b)


def _libm2(name: str) -> BinaryFn:
    """A two-argument libm function (`hypotf`/`hypot`), called lane by lane for vectors."""
    def emit(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
        elem = scalar_of(cx.type)
        symbol = name + "f" if elem == F32 else name
        fn = cx.ctx.declare(symbol, elem, [elem, elem])
        return per_lane_call(cx.b, fn, [a, b])
    return emit


FLOAT_OPS: dict[str, BinaryFn] = {
    "add": lambda cx, a, b: cx.b.fadd(a, b, flags=cx.fastmath),
    "sub": lambda cx, a, b: cx.b.fsub(a, b, flags=cx.fastmath),
    "mul": lambda cx, a, b: cx.b.fmul(a, b, flags=cx.fastmath),
    "div": lambda cx, a, b: cx.b.fdiv(a, b),
    "floordiv": _float_floordiv,
    "mod": _float_mod,
    "remainder": _float_mod,
    "fmod": lambda cx, a, b: cx.b.frem(a, b),
    "min": _intrinsic2("llvm.minimum"),
    "max": _intrinsic2("llvm.maximum"),
    "pow": _intrinsic2("llvm.pow"),
    "atan2": _intrinsic2("llvm.atan2"),
    "copysign": _intrinsic2("llvm.copysign"),
    "hypot": _libm2("hypot"),
    "nextafter": _libm2("nextafter"),
    **{op: _fcmp(op) for op in _CMP_SYMBOLS},
}


# ---- integers ------------------------------------------------------------------------------------

def _floor_adjust(cx: OpContext, r: ir.Value, b: ir.Value) -> ir.Value:
    """True where a truncating remainder `r` needs the floor correction (r != 0, sign(r) != sign(b))."""
    bb = cx.b
    zero = cx.const(0)
    return bb.and_(bb.icmp_signed("!=", r, zero), bb.icmp_signed("<", bb.xor(r, b), zero))


def _const_lanes(v: ir.Value) -> Optional[list[int]]:
    """The integer value of every lane of a constant, or None for a value known only at run time."""
    if not isinstance(v, ir.Constant):
        return None
    c = v.constant
    items = c if isinstance(c, (list, tuple)) else [v]
    values = [x.constant if isinstance(x, ir.Constant) else x for x in items]
    return [int(x) for x in values] if all(isinstance(x, int) for x in values) else None


def _safe_divisor(cx: OpContext, b: ir.Value, signed: bool) -> tuple[ir.Value, Optional[ir.Value]]:
    """The divisor to divide by, never 0 (nor -1 when signed), and where it was -1 (None when
    it cannot be). A divisor lane of 0 is counted as a fault (`faults.py`); a constant divisor
    known to be safe is used as it is, so `x // 8` stays a shift."""
    lanes = _const_lanes(b)
    if lanes is not None and all(x != 0 and not (signed and x == -1) for x in lanes):
        return b, None
    bb = cx.b
    zero = bb.icmp_signed("==", b, cx.const(0))
    record_fault_if(bb, cx.ctx, zero)
    if not signed:
        return bb.select(zero, cx.const(1), b), None
    minus_one = bb.icmp_signed("==", b, cx.const(-1))
    return bb.select(bb.or_(zero, minus_one), cx.const(1), b), minus_one


def _negated_where(cx: OpContext, minus_one: Optional[ir.Value], a: ir.Value, q: ir.Value) -> ir.Value:
    """`q`, but `-a` (wrapping: INT_MIN stays INT_MIN) where the divisor was -1."""
    if minus_one is None:
        return q
    return cx.b.select(minus_one, cx.b.sub(cx.const(0), a), q)


def _int_div(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    """Truncating division; by -1 it is negation (INT_MIN / -1 wraps to INT_MIN)."""
    safe, minus_one = _safe_divisor(cx, b, signed=True)
    return _negated_where(cx, minus_one, a, cx.b.sdiv(a, safe))


def _int_fmod(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    """C's `%`; by -1 it is 0 (dividing by the safe divisor 1 gives that)."""
    safe, _ = _safe_divisor(cx, b, signed=True)
    return cx.b.srem(a, safe)


def _int_floordiv(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    safe, minus_one = _safe_divisor(cx, b, signed=True)
    q, r = cx.b.sdiv(a, safe), cx.b.srem(a, safe)
    q = cx.b.select(_floor_adjust(cx, r, safe), cx.b.sub(q, cx.const(1)), q)
    return _negated_where(cx, minus_one, a, q)


def _int_mod(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    safe, _ = _safe_divisor(cx, b, signed=True)
    r = cx.b.srem(a, safe)
    return cx.b.select(_floor_adjust(cx, r, safe), cx.b.add(r, safe), r)


def _uint_div(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    safe, _ = _safe_divisor(cx, b, signed=False)
    return cx.b.udiv(a, safe)


def _uint_rem(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    safe, _ = _safe_divisor(cx, b, signed=False)
    return cx.b.urem(a, safe)


def _shift_too_far(cx: OpContext, amount: ir.Value) -> ir.Value:
    width = scalar_of(cx.type).width
    return cx.b.icmp_unsigned(">=", amount, cx.const(width))


def _shl(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    return cx.b.select(_shift_too_far(cx, b), cx.const(0), cx.b.shl(a, b))


def _ashr(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    width = scalar_of(cx.type).width
    clamped = cx.b.select(_shift_too_far(cx, b), cx.const(width - 1), b)
    return cx.b.ashr(a, clamped)


def _lshr(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    return cx.b.select(_shift_too_far(cx, b), cx.const(0), cx.b.lshr(a, b))


def _ipow(signed: bool) -> BinaryFn:
    def emit(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
        return per_lane_call(cx.b, helpers.ipow(cx.ctx, scalar_of(cx.type), signed), [a, b])
    return emit


def _icmp(op: str, signed: bool) -> BinaryFn:
    sym = _CMP_SYMBOLS[op]
    if signed:
        return lambda cx, a, b: cx.b.icmp_signed(sym, a, b)
    return lambda cx, a, b: cx.b.icmp_unsigned(sym, a, b)


_INT_COMMON: dict[str, BinaryFn] = {
    "add": lambda cx, a, b: cx.b.add(a, b),
    "sub": lambda cx, a, b: cx.b.sub(a, b),
    "mul": lambda cx, a, b: cx.b.mul(a, b),
    "and": lambda cx, a, b: cx.b.and_(a, b),
    "or": lambda cx, a, b: cx.b.or_(a, b),
    "xor": lambda cx, a, b: cx.b.xor(a, b),
    "shl": _shl,
}

SIGNED_OPS: dict[str, BinaryFn] = {
    **_INT_COMMON,
    "div": _int_div,
    "floordiv": _int_floordiv,
    "mod": _int_mod,
    "remainder": _int_mod,
    "fmod": _int_fmod,
    "min": _intrinsic2("llvm.smin"),
    "max": _intrinsic2("llvm.smax"),
    "shr": _ashr,
    "pow": _ipow(signed=True),
    **{op: _icmp(op, signed=True) for op in _CMP_SYMBOLS},
}

UNSIGNED_OPS: dict[str, BinaryFn] = {
    **_INT_COMMON,
    "div": _uint_div,
    "floordiv": _uint_div,
    "mod": _uint_rem,
    "remainder": _uint_rem,
    "fmod": _uint_rem,
    "min": _intrinsic2("llvm.umin"),
    "max": _intrinsic2("llvm.umax"),
    "shr": _lshr,
    "pow": _ipow(signed=False),
    **{op: _icmp(op, signed=False) for op in _CMP_SYMBOLS},
}

#: Bools are i1: `add` is logical or and `mul` logical and (as torch's bool arithmetic).
BOOL_OPS: dict[str, BinaryFn] = {
    "and": lambda cx, a, b: cx.b.and_(a, b),
    "or": lambda cx, a, b: cx.b.or_(a, b),
    "xor": lambda cx, a, b: cx.b.xor(a, b),
    "add": lambda cx, a, b: cx.b.or_(a, b),
    "mul": lambda cx, a, b: cx.b.and_(a, b),
    "min": lambda cx, a, b: cx.b.and_(a, b),
    "max": lambda cx, a, b: cx.b.or_(a, b),
    **{op: _icmp(op, signed=False) for op in _CMP_SYMBOLS},
}

#: Binary operators by operand kind ("f", "i", "u", "b"), keyed by the IR's names.
TABLES: dict[str, dict[str, BinaryFn]] = {"f": FLOAT_OPS, "i": SIGNED_OPS, "u": UNSIGNED_OPS, "b": BOOL_OPS}


def _half_nextafter(cx: OpContext, a: ir.Value, b: ir.Value) -> ir.Value:
    """nextafter in f16/bf16's own precision (`ir/semantics.py`, as torch): one step on the
    16-bit pattern; after +-0 comes the smallest subnormal with b's sign; a == b gives b."""
    bb = cx.b
    bits = vector_of(ir.IntType(16), cx.lanes)
    wide = cx.widened()
    a32, b32 = cx.to_f32(a), cx.to_f32(b)
    zero = wide.const(0.0)
    ua, ub = bb.bitcast(a, bits), bb.bitcast(b, bits)
    away = bb.icmp_unsigned("==", bb.fcmp_ordered("<", a32, b32), bb.fcmp_ordered(">", a32, zero))
    one = splat_const(bits, 1)
    r = bb.select(away, bb.add(ua, one), bb.sub(ua, one))
    tiny = bb.select(bb.fcmp_ordered("<", b32, zero), splat_const(bits, -0x7FFF), one)
    r = bb.select(bb.fcmp_ordered("==", a32, zero), tiny, r)
    r = bb.select(bb.fcmp_ordered("==", a32, b32), ub, r)
    nan = splat_const(bits, 0x7E00 if cx.dtype == dt.f16 else 0x7FC0)
    r = bb.select(bb.fcmp_unordered("uno", a32, b32), nan, r)
    return bb.bitcast(r, cx.type)


#: Ops that f16/bf16 compute in their own precision rather than in f32.
HALF_OWN_PRECISION: dict[str, BinaryFn] = {"nextafter": _half_nextafter}


def emit_binary(cx: OpContext, op: str, a: ir.Value, b: ir.Value) -> ir.Value:
    """`a op b` for operands of `cx.dtype`; half floats are computed in f32."""
    fn = TABLES[cx.dtype.kind].get(op)
    if fn is None:
        raise CodegenError(f"binary op {op!r} is not defined on {cx.dtype}")
    if not is_half(cx.dtype):
        return fn(cx, a, b)
    own = HALF_OWN_PRECISION.get(op)
    if own is not None:
        return own(cx, a, b)
    wide = cx.widened()
    result = fn(wide, cx.to_f32(a), cx.to_f32(b))
    return cx.from_f32(result) if result.type == wide.type else result

