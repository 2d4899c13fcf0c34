"""Named functions (`Call` nodes): unary math, predicates, `fma`, and named binary ops.

Three sources, chosen per function by table:
- LLVM intrinsics where LLVM has one (`llvm.exp`, `llvm.tanh`, `llvm.roundeven` for `round`,
  which rounds half to even like torch); they work lane-wise on vectors.
- libm symbols otherwise (`erff`, `expm1f`, `lgammaf`, ...), called lane by lane on vectors;
  the JIT resolves them from the process. A later pass replaces hot transcendentals with IR
  polynomials, so this path only has to be correct.
- Short inline formulas (sigmoid, rsqrt, sign, predicates) and module helpers (erfinv and
  digamma in f64, following torch's algorithms).
f16/bf16 arguments are computed in f32 and rounded back, as torch does.
"""
from __future__ import annotations

import math
from typing import Callable, Sequence

import llvmlite.ir as ir

from ...ir.expr import NAMED_BINARY_OPS, UNARY_FUNCS
from ..errors import CodegenError
from . import helpers
from .binary import emit_binary
from .faults import record_fault_if
from .opcontext import OpContext, is_half, per_lane_call
from .types import F32, F64, I1, scalar_of, splat_const, vector_of

UnaryFn = Callable[[OpContext, ir.Value], ir.Value]

#: Functions LLVM has intrinsics for: IR name -> intrinsic.
INTRINSIC_UNARY: dict[str, str] = {
    "exp": "llvm.exp", "exp2": "llvm.exp2", "log": "llvm.log", "log2": "llvm.log2",
    "log10": "llvm.log10", "sqrt": "llvm.sqrt", "abs": "llvm.fabs",
    "sin": "llvm.sin", "cos": "llvm.cos", "tan": "llvm.tan", "asin": "llvm.asin",
    "acos": "llvm.acos", "atan": "llvm.atan", "sinh": "llvm.sinh", "cosh": "llvm.cosh",
    "tanh": "llvm.tanh", "floor": "llvm.floor", "ceil": "llvm.ceil", "trunc": "llvm.trunc",
    "round": "llvm.roundeven",
}
#: Functions taken from libm: IR name -> double-precision symbol (`f` suffix for float).
LIBM_UNARY: dict[str, str] = {
    "expm1": "expm1", "log1p": "log1p", "asinh": "asinh", "acosh": "acosh", "atanh": "atanh",
    "erf": "erf", "erfc": "erfc", "lgamma": "lgamma",
}


def _intrinsic(name: str) -> UnaryFn:
    return lambda cx, x: cx.intrinsic(name, x)


def _libm(name: str) -> UnaryFn:
    def emit(cx: OpContext, x: ir.Value) -> ir.Value:
        elem = scalar_of(cx.type)
        fn = cx.ctx.declare(name + "f" if elem == F32 else name, elem, [elem])
        return per_lane_call(cx.b, fn, [x])
    return emit


def _via_f64_helper(get: Callable) -> UnaryFn:
    """Call an f64 helper function lane by lane, converting from and to the operand type."""
    def emit(cx: OpContext, x: ir.Value) -> ir.Value:
        fn = get(cx.ctx)
        if scalar_of(cx.type) == F64:
            return per_lane_call(cx.b, fn, [x])
        wide = cx.b.fpext(x, vector_of(F64, cx.lanes))
        return cx.b.fptrunc(per_lane_call(cx.b, fn, [wide]), cx.type)  # f32 only: halves widen first
    return emit


def _sigmoid(cx: OpContext, x: ir.Value) -> ir.Value:
    one = cx.const(1.0)
    return cx.b.fdiv(one, cx.b.fadd(one, cx.intrinsic("llvm.exp", cx.b.fneg(x))))


def _rsqrt(cx: OpContext, x: ir.Value) -> ir.Value:
    return cx.b.fdiv(cx.const(1.0), cx.intrinsic("llvm.sqrt", x))


def _float_sign(cx: OpContext, x: ir.Value) -> ir.Value:
    """1 for x > 0, -1 for x < 0, else +0 (NaN and both zeros give 0, as torch.sign)."""
    zero = cx.const(0.0)
    neg = cx.b.select(cx.b.fcmp_ordered("<", x, zero), cx.const(-1.0), zero)
    return cx.b.select(cx.b.fcmp_ordered(">", x, zero), cx.const(1.0), neg)


def _isinf(cx: OpContext, x: ir.Value) -> ir.Value:
    return cx.b.fcmp_ordered("==", cx.intrinsic("llvm.fabs", x), cx.const(math.inf))


def _isfinite(cx: OpContext, x: ir.Value) -> ir.Value:
    return cx.b.fcmp_ordered("<", cx.intrinsic("llvm.fabs", x), cx.const(math.inf))


def _float_signbit(cx: OpContext, x: ir.Value) -> ir.Value:
    """The sign bit, read through an integer of the same width (true for -0.0 and -NaN)."""
    int_type = vector_of(ir.IntType(cx.dtype.bits), cx.lanes)
    return cx.b.icmp_signed("<", cx.b.bitcast(x, int_type), splat_const(int_type, 0))


FLOAT_UNARY: dict[str, UnaryFn] = {
    **{name: _intrinsic(intr) for name, intr in INTRINSIC_UNARY.items()},
    **{name: _libm(sym) for name, sym in LIBM_UNARY.items()},
    "neg": lambda cx, x: cx.b.fneg(x),
    "sigmoid": _sigmoid,
    "rsqrt": _rsqrt,
    "reciprocal": lambda cx, x: cx.b.fdiv(cx.const(1.0), x),
    "sign": _float_sign,
    "isnan": lambda cx, x: cx.b.fcmp_unordered("uno", x, x),
    "isinf": _isinf,
    "isfinite": _isfinite,
    "signbit": _float_signbit,
    "erfinv": _via_f64_helper(helpers.erfinv_f64),
    "digamma": _via_f64_helper(helpers.digamma_f64),
}


def _bool_const(cx: OpContext, value: bool) -> ir.Value:
    return splat_const(cx.bool_type, int(value))


def _identity(cx: OpContext, x: ir.Value) -> ir.Value:
    return x


def _int_sign(cx: OpContext, x: ir.Value) -> ir.Value:
    zero = cx.const(0)
    pos = cx.b.zext(cx.b.icmp_signed(">", x, zero), cx.type)
    neg = cx.b.zext(cx.b.icmp_signed("<", x, zero), cx.type)
    return cx.b.sub(pos, neg)


_INT_COMMON: dict[str, UnaryFn] = {
    "not": lambda cx, x: cx.b.xor(x, cx.const(-1)),
    "floor": _identity, "ceil": _identity, "round": _identity, "trunc": _identity,
    "isnan": lambda cx, x: _bool_const(cx, False),
    "isinf": lambda cx, x: _bool_const(cx, False),
    "isfinite": lambda cx, x: _bool_const(cx, True),
}

SIGNED_UNARY: dict[str, UnaryFn] = {
    **_INT_COMMON,
    "neg": lambda cx, x: cx.b.sub(cx.const(0), x),
    "abs": lambda cx, x: cx.b.call(cx.ctx.intrinsic("llvm.abs", cx.type, [cx.type, I1], [cx.type]),
                                   [x, ir.Constant(I1, 0)]),
    "sign": _int_sign,
    "signbit": lambda cx, x: cx.b.icmp_signed("<", x, cx.const(0)),
}

UNSIGNED_UNARY: dict[str, UnaryFn] = {
    **_INT_COMMON,
    "neg": lambda cx, x: cx.b.sub(cx.const(0), x),
    "abs": _identity,
    "sign": lambda cx, x: cx.b.zext(cx.b.icmp_unsigned("!=", x, cx.const(0)), cx.type),
    "signbit": lambda cx, x: _bool_const(cx, False),
}

BOOL_UNARY: dict[str, UnaryFn] = {
    "not": lambda cx, x: cx.b.xor(x, cx.const(1)),
    "abs": _identity, "sign": _identity,
    "floor": _identity, "ceil": _identity, "round": _identity, "trunc": _identity,
    "isnan": lambda cx, x: _bool_const(cx, False),
    "isinf": lambda cx, x: _bool_const(cx, False),
    "isfinite": lambda cx, x: _bool_const(cx, True),
    "signbit": lambda cx, x: _bool_const(cx, False),
}

#: Unary functions by operand kind ("f", "i", "u", "b"), keyed by the IR's names.
UNARY_TABLES: dict[str, dict[str, UnaryFn]] = {
    "f": FLOAT_UNARY, "i": SIGNED_UNARY, "u": UNSIGNED_UNARY, "b": BOOL_UNARY,
}


def emit_unary(cx: OpContext, name: str, x: ir.Value) -> ir.Value:
    """`name(x)` for an operand of `cx.dtype`; half floats are computed in f32."""
    fn = UNARY_TABLES[cx.dtype.kind].get(name)
    if fn is None:
        raise CodegenError(f"function {name!r} is not defined on {cx.dtype}")
    if not is_half(cx.dtype):
        return fn(cx, x)
    wide = cx.widened()
    result = fn(wide, cx.to_f32(x))
    return cx.from_f32(result) if result.type == wide.type else result


CallFn = Callable[[OpContext, Sequence[ir.Value]], ir.Value]


def _float_fma(cx: OpContext, args: Sequence[ir.Value]) -> ir.Value:
    if is_half(cx.dtype):
        wide = cx.widened()
        return cx.from_f32(wide.intrinsic("llvm.fma", *(cx.to_f32(a) for a in args)))
    return cx.intrinsic("llvm.fma", *args)


def _int_fma(cx: OpContext, args: Sequence[ir.Value]) -> ir.Value:
    return cx.b.add(cx.b.mul(args[0], args[1]), args[2])


#: `fma(a, b, c)` by operand kind: one rounding on floats (`llvm.fma`), wrapping on integers.
FMA: dict[str, CallFn] = {"f": _float_fma, "i": _int_fma, "u": _int_fma}


def _fma(cx: OpContext, args: Sequence[ir.Value]) -> ir.Value:
    fn = FMA.get(cx.dtype.kind)
    if fn is None:
        raise CodegenError(f"fma is not defined on {cx.dtype}")
    return fn(cx, args)


def _checked_index(cx: OpContext, args: Sequence[ir.Value]) -> ir.Value:
    """`checked_index(i, n)`: one unsigned compare (a negative `i` is above every size), a
    fault counted where it fails (`faults.py`: the launcher then runs the call in PyTorch, which
    raises eager's error), and 0 there so the access stays inside the buffer."""
    i, n = args
    ok = cx.b.icmp_unsigned("<", i, n)
    record_fault_if(cx.b, cx.ctx, cx.b.not_(ok))
    return cx.b.select(ok, i, cx.const(0))


def _as_binary(name: str) -> CallFn:
    return lambda cx, args: emit_binary(cx, name, args[0], args[1])


def _as_unary(name: str) -> CallFn:
    return lambda cx, args: emit_unary(cx, name, args[0])


#: Every `Call` name with its arity and emitter: unary functions, `fma`, and the binary ops
#: spelt as calls (`min(a, b)`). `dot4_u8i8_acc`, whose operands differ in type, is a node
#: handler of `expr.py`.
CALLS: dict[str, tuple[int, CallFn]] = {
    "fma": (3, _fma),
    "checked_index": (2, _checked_index),
    **{name: (2, _as_binary(name)) for name in sorted(NAMED_BINARY_OPS)},
    **{name: (1, _as_unary(name)) for name in sorted(UNARY_FUNCS)},
}


def emit_call(cx: OpContext, name: str, args: Sequence[ir.Value]) -> ir.Value:
    """Any `Call` of `CALLS`, for operands of `cx.dtype`."""
    entry = CALLS.get(name)
    if entry is None or entry[0] != len(args):
        raise CodegenError(f"unknown function {name!r} with {len(args)} arguments")
    return entry[1](cx, args)
