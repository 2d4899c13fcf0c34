"""Elementwise ATen ops: math, arithmetic with broadcasting and type promotion, comparisons,
logical and bitwise ops, where, casts, composite activations (gelu, silu, elu, leaky_relu,
hardtanh; the others decompose to these), NaN-ignoring fmax/fmin, angle, ldexp and frexp.
Special functions (Bessel, erfcx, ndtri...) are in `special.py`."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch

from ...ir import dtypes as dt
from ...ir.tensor import Value
from ..builder import PROMOTE, Builder, Operand
from ..dtypes import to_ir
from ..registry import Unsupported, lowering

aten = torch.ops.aten
prims = torch.ops.prims

#: ATen op -> IR op for unary math that promotes integers to float.
FLOAT_UNARY = {
    aten.exp: "exp", aten.exp2: "exp2", aten.expm1: "expm1", aten.log: "log", aten.log2: "log2",
    aten.log10: "log10", aten.log1p: "log1p", aten.sqrt: "sqrt", aten.rsqrt: "rsqrt",
    aten.sin: "sin", aten.cos: "cos", aten.tan: "tan", aten.asin: "asin", aten.acos: "acos",
    aten.atan: "atan", aten.sinh: "sinh", aten.cosh: "cosh", aten.tanh: "tanh",
    aten.asinh: "asinh", aten.acosh: "acosh", aten.atanh: "atanh", aten.erf: "erf",
    aten.erfc: "erfc", aten.erfinv: "erfinv", aten.sigmoid: "sigmoid", aten.reciprocal: "reciprocal",
    aten.lgamma: "lgamma", aten.digamma: "digamma",
}

#: ATen op -> IR op for binary arithmetic with default promotion.
ARITH_BINARY = {
    aten.mul: "mul", aten.maximum: "max", aten.minimum: "min", aten.fmod: "fmod",
    aten.remainder: "remainder", aten.nextafter: "nextafter",
}
#: Binary math that promotes integers to float (`copysign(int, int)` is a float32 tensor).
FLOAT_BINARY = {aten.atan2: "atan2", aten.hypot: "hypot", aten.copysign: "copysign"}
COMPARE = {aten.eq: "eq", aten.ne: "ne", aten.lt: "lt", aten.le: "le", aten.gt: "gt", aten.ge: "ge"}
BITWISE = {aten.bitwise_and: "and", aten.bitwise_or: "or", aten.bitwise_xor: "xor",
           aten.bitwise_left_shift: "shl", aten.bitwise_right_shift: "shr",
           aten.__lshift__: "shl", aten.__rshift__: "shr"}
LOGICAL = {aten.logical_and: "and", aten.logical_or: "or", aten.logical_xor: "xor"}


def _register_table(table: dict[Any, str], kind: PROMOTE, arity: int) -> None:
    for aten_op, ir_name in table.items():
        def fn(b: Builder, *args: Operand, _n: str = ir_name, **kw: Any) -> Value:
            return b.elementwise(_n, *args[:arity], kind=kind)
        lowering(aten_op)(fn)


_register_table(FLOAT_UNARY, PROMOTE.INT_TO_FLOAT, 1)
_register_table(ARITH_BINARY, PROMOTE.DEFAULT, 2)
_register_table(FLOAT_BINARY, PROMOTE.INT_TO_FLOAT, 2)
_register_table(COMPARE, PROMOTE.ALWAYS_BOOL, 2)


def _bitwise(name: str) -> Any:
    def fn(b: Builder, x: Operand, y: Operand, **kw: Any) -> Value:
        comp, res = b.promote(x, y)
        if comp.is_float:
            raise Unsupported("bitwise op on floating point tensors")
        xs, ys = b.broadcast(b.as_tensor(x, comp), b.as_tensor(y, comp))
        return b.op(name, xs, ys)
    return fn


for _op, _name in BITWISE.items():
    lowering(_op)(_bitwise(_name))


def _logical(name: str) -> Any:
    def fn(b: Builder, x: Operand, y: Operand, **kw: Any) -> Value:
        xs, ys = b.broadcast(b.as_tensor(x, dt.bool_), b.as_tensor(y, dt.bool_))
        return b.op(name, xs, ys)
    return fn


for _op, _name in LOGICAL.items():
    lowering(_op)(_logical(_name))


@lowering(aten.logical_not)
def logical_not(b: Builder, x: Value) -> Value:
    return b.op("not", b.as_tensor(x, dt.bool_))


@lowering(aten.bitwise_not)
def bitwise_not(b: Builder, x: Value) -> Value:
    if x.dtype.is_float:
        raise Unsupported("bitwise_not of a floating point tensor")
    return b.op("not", x)


# ---- arithmetic with special arguments ---------------------------------------------------------

def _scaled(b: Builder, y: Operand, alpha: Any) -> Operand:
    if alpha is None or alpha == 1:
        return y
    if isinstance(y, Value):
        return b.elementwise("mul", y, alpha)
    return y * alpha  # type: ignore[operator]


@lowering(aten.add)
def add(b: Builder, x: Operand, y: Operand, alpha: Any = None) -> Value:
    return b.elementwise("add", x, _scaled(b, y, alpha))


@lowering(aten.sub, aten.rsub)
def sub(b: Builder, x: Operand, y: Operand, alpha: Any = None) -> Value:
    assert b.node is not None
    if b.node.target in (aten.rsub.Tensor, aten.rsub.Scalar):
        x, y = y, x
        return b.elementwise("sub", _scaled(b, x, alpha), y)
    return b.elementwise("sub", x, _scaled(b, y, alpha))


@lowering(aten.div, aten.true_divide)
def div(b: Builder, x: Operand, y: Operand, rounding_mode: Optional[str] = None) -> Value:
    if rounding_mode is None:
        return b.elementwise("div", x, y, kind=PROMOTE.INT_TO_FLOAT)
    comp, res = b.promote(x, y)
    xs, ys = b.broadcast(b.as_tensor(x, comp), b.as_tensor(y, comp))
    if rounding_mode == "floor":
        out = b.op("floor", b.op("div", xs, ys)) if comp.is_float else b.op("floordiv", xs, ys)
    elif rounding_mode == "trunc":
        out = b.op("trunc", b.op("div", xs, ys)) if comp.is_float else b.op("div", xs, ys)
    else:
        raise Unsupported(f"div rounding_mode={rounding_mode!r}")
    return b.cast(out, res)


@lowering(aten.floor_divide)
def floor_divide(b: Builder, x: Operand, y: Operand) -> Value:
    return div(b, x, y, rounding_mode="floor")


#: `x ** c` for the constant exponents ATen's CPU kernel computes without `pow`
#: (`PowKernel.cpp`): the same operations in the same order, so the same roundings, and no
#: per-lane libm call (LLVM's `llvm.pow` on a vector is one `powf` call per lane).
_POW_FORMS = {2.0: "square", 3.0: "cube", -2.0: "inverse_square", 0.5: "sqrt", -0.5: "rsqrt", -1.0: "reciprocal"}


@lowering(aten.pow)
def pow_(b: Builder, x: Operand, y: Operand) -> Value:
    if isinstance(x, Value) and isinstance(y, (int, float)) and not isinstance(y, bool) and float(y) in _POW_FORMS:
        comp, res = b.promote(x, y)
        if comp in (dt.f32, dt.f64):
            xs = b.as_tensor(x, comp)
            form = _POW_FORMS[float(y)]
            if form in ("sqrt", "rsqrt", "reciprocal"):
                out = b.op(form, xs)
            elif form == "inverse_square":
                out = b.op("div", b.scalar_like(1.0, xs), b.op("mul", xs, xs))
            else:
                out = b.op("mul", xs, xs)
                if form == "cube":
                    out = b.op("mul", out, xs)
            return b.cast(out, res)
    return b.elementwise("pow", x, y)


@lowering(aten.neg)
def neg(b: Builder, x: Value) -> Value:
    if x.dtype.is_bool:
        raise Unsupported("negation of a bool tensor")
    return b.elementwise("neg", x)


@lowering(aten.abs)
def abs_(b: Builder, x: Value) -> Value:
    return x if x.dtype.is_bool else b.elementwise("abs", x)


@lowering(aten.sign, aten.sgn)
def sign(b: Builder, x: Value) -> Value:
    return x if x.dtype.is_bool else b.elementwise("sign", x)


def _rounding(name: str) -> Any:
    def fn(b: Builder, x: Value, decimals: int = 0) -> Value:
        if not x.dtype.is_float:
            return x
        if decimals:
            scale = 10.0 ** decimals
            return b.elementwise("div", b.elementwise(name, b.elementwise("mul", x, scale)), scale)
        return b.elementwise(name, x)
    return fn


for _op, _name in ((aten.floor, "floor"), (aten.ceil, "ceil"), (aten.round, "round"), (aten.trunc, "trunc")):
    lowering(_op)(_rounding(_name))


def _predicate(name: str, for_ints: bool) -> Any:
    def fn(b: Builder, x: Value) -> Value:
        if not x.dtype.is_float:
            return b.expand(b.full(for_ints, (), dt.bool_), x.shape)
        return b.op(name, b.to_compute(x))
    return fn


lowering(aten.isnan)(_predicate("isnan", False))
lowering(aten.isinf)(_predicate("isinf", False))
lowering(aten.isfinite)(_predicate("isfinite", True))


@lowering(aten.signbit)
def signbit(b: Builder, x: Value) -> Value:
    """Floats test the sign bit (so -0.0 and -nan count); a signed integer's sign bit is set
    exactly when it is negative; unsigned integers and bools have none."""
    if x.dtype.is_float:
        return b.op("signbit", b.to_compute(x))
    if x.dtype.is_int and x.dtype.is_signed:
        return b.elementwise("lt", x, 0, kind=PROMOTE.ALWAYS_BOOL)
    return b.expand(b.full(False, (), dt.bool_), x.shape)


@lowering(aten.where.self, aten.where.ScalarSelf, aten.where.ScalarOther, aten.where.Scalar)
def where(b: Builder, cond: Operand, x: Operand, y: Operand) -> Value:
    comp, res = b.promote(x, y)
    c = b.as_tensor(cond, dt.bool_)
    cs, xs, ys = b.broadcast(c, b.as_tensor(x, res), b.as_tensor(y, res))
    return b.op("where", cs, xs, ys)


@lowering(aten.clamp, aten.clamp_min, aten.clamp_max)
def clamp(b: Builder, x: Value, lo: Operand = None, hi: Operand = None) -> Value:
    assert b.node is not None
    if b.node.target in (aten.clamp_max.default, aten.clamp_max.Tensor):
        lo, hi = None, lo
    out: Operand = x
    if lo is not None:
        out = b.elementwise("max", out, lo)
    if hi is not None:
        out = b.elementwise("min", out, hi)
    if not isinstance(out, Value):
        raise Unsupported("clamp without bounds")
    return b.cast(out, b.out_dtype)


@lowering(aten.relu)
def relu(b: Builder, x: Value) -> Value:
    if x.dtype.is_bool:
        raise Unsupported("relu of a bool tensor")
    return b.elementwise("max", x, 0)


# ---- casts and identities ----------------------------------------------------------------------

def _cpu_only(node: torch.fx.Node) -> Optional[str]:
    dev = node.kwargs.get("device")
    if dev is not None and torch.device(dev).type != "cpu":
        return f"copy to device {dev}"
    return None


@lowering(aten._to_copy, supports=_cpu_only)
def to_copy(b: Builder, x: Value, dtype: Any = None, **kw: Any) -> Value:
    return _copy(b, x if dtype is None else b.cast(x, to_ir(dtype)))


@lowering(prims.convert_element_type)
def convert_element_type(b: Builder, x: Value, dtype: Any) -> Value:
    return b.cast(x, to_ir(dtype))


def _copy(b: Builder, x: Value) -> Value:
    # A value computed in the graph is already fresh memory; the runtime copies graph inputs
    # that are returned directly, so identity is a correct clone here.
    return x


@lowering(aten.clone, aten.alias, aten.lift_fresh_copy, aten.contiguous, aten.detach)
def clone(b: Builder, x: Value, **kw: Any) -> Value:
    return _copy(b, x)


# ---- composite activations ---------------------------------------------------------------------

@lowering(aten.gelu)
def gelu(b: Builder, x: Value, approximate: str = "none") -> Value:
    xc = b.to_compute(x)
    if approximate == "tanh":
        inner = b.elementwise("mul", b.elementwise("add", xc, b.elementwise("mul", b.elementwise("mul", xc, xc), b.elementwise("mul", xc, 0.044715))), math.sqrt(2.0 / math.pi))
        out = b.elementwise("mul", b.elementwise("mul", xc, 0.5), b.elementwise("add", b.op("tanh", inner), 1.0))
    elif approximate == "none":
        cdf = b.elementwise("add", b.op("erf", b.elementwise("mul", xc, math.sqrt(0.5))), 1.0)
        out = b.elementwise("mul", b.elementwise("mul", xc, 0.5), cdf)
    else:
        raise Unsupported(f"gelu approximate={approximate!r}")
    return b.cast(out, x.dtype)


@lowering(aten.silu)
def silu(b: Builder, x: Value) -> Value:
    xc = b.to_compute(x)
    return b.cast(b.elementwise("mul", xc, b.op("sigmoid", xc)), x.dtype)


@lowering(aten.elu)
def elu(b: Builder, x: Value, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Value:
    """`x > 0 ? scale * x : alpha * scale * expm1(input_scale * x)` (also selu and celu)."""
    xc = b.to_compute(x)
    neg = b.elementwise("mul", b.op("expm1", b.elementwise("mul", xc, input_scale)), alpha * scale)
    pos = b.elementwise("mul", xc, scale)
    return b.cast(b.op("where", _positive(b, xc), pos, neg), x.dtype)


@lowering(aten.leaky_relu)
def leaky_relu(b: Builder, x: Value, negative_slope: Any = 0.01) -> Value:
    xc = b.to_compute(x)
    neg = b.elementwise("mul", xc, negative_slope)
    return b.cast(b.op("where", _positive(b, xc), xc, b.cast(neg, xc.dtype)), x.dtype)


def _positive(b: Builder, x: Value) -> Value:
    return b.op("gt", x, b.scalar_like(0, x))


@lowering(aten.hardtanh)
def hardtanh(b: Builder, x: Value, min_val: Any = -1.0, max_val: Any = 1.0) -> Value:
    """clamp(x, min_val, max_val) in x's own dtype (relu6 is hardtanh(0, 6))."""
    xc = b.to_compute(x)
    lo = b.expand(b.as_tensor(min_val, xc.dtype), xc.shape)
    hi = b.expand(b.as_tensor(max_val, xc.dtype), xc.shape)
    return b.cast(b.op("min", b.op("max", xc, lo), hi), x.dtype)


def _nan_ignoring(name: str) -> Any:
    """fmax/fmin: like max/min, but a NaN operand yields the other one."""
    def fn(b: Builder, x: Operand, y: Operand) -> Value:
        comp, res = b.promote(x, y)
        xs, ys = b.broadcast(b.as_tensor(x, comp), b.as_tensor(y, comp))
        out = b.op(name, xs, ys)
        if comp.is_float:
            out = b.op("where", b.op("isnan", xs), ys, b.op("where", b.op("isnan", ys), xs, out))
        return b.cast(out, res)
    return fn


lowering(aten.fmax)(_nan_ignoring("max"))
lowering(aten.fmin)(_nan_ignoring("min"))


@lowering(aten.angle)
def angle(b: Builder, x: Value) -> Value:
    """For real tensors: pi where x < 0, else 0; NaN stays NaN."""
    comp, res = b.promote(x, kind=PROMOTE.INT_TO_FLOAT)
    xc = b.cast(x, comp)
    zero = b.scalar_like(0.0, xc)
    out = b.op("where", b.op("lt", xc, zero), b.scalar_like(math.pi, xc), zero)
    out = b.op("where", b.op("isnan", xc), xc, out)
    return b.cast(out, res)


@lowering(aten.ldexp.Tensor)
def ldexp(b: Builder, x: Operand, other: Operand) -> Value:
    """x * 2**other, computed in the promoted float dtype."""
    comp, res = b.promote(x, other, kind=PROMOTE.INT_TO_FLOAT)
    xs, os = b.broadcast(b.as_tensor(x, comp), b.as_tensor(other, comp))
    return b.cast(b.op("mul", xs, b.op("exp2", os)), res)


@lowering(aten.frexp.Tensor)
def frexp(b: Builder, x: Value) -> tuple[Value, Value]:
    """(mantissa, exponent) with x = mantissa * 2**exponent and 0.5 <= |mantissa| < 1; zero,
    inf and NaN give (x, 0). Computed in f64, where scaling by a power of two is exact (in two
    steps, so that 2**-exponent of a subnormal does not overflow)."""
    if not x.dtype.is_float:
        raise Unsupported("frexp of a non-floating tensor")
    xd = b.cast(x, dt.f64)
    e = b.elementwise("add", b.op("floor", b.op("log2", b.op("abs", xd))), 1.0)
    half = b.op("floor", b.elementwise("mul", e, -0.5))
    m = b.op("mul", b.op("mul", xd, b.op("exp2", half)), b.op("exp2", b.op("sub", b.op("neg", e), half)))
    mag = b.op("abs", m)
    too_big = b.op("ge", mag, b.scalar_like(1.0, mag))
    too_small = b.op("lt", mag, b.scalar_like(0.5, mag))
    m = b.op("where", too_big, b.elementwise("mul", m, 0.5), b.op("where", too_small, b.elementwise("mul", m, 2.0), m))
    e = b.op("where", too_big, b.elementwise("add", e, 1.0), b.op("where", too_small, b.elementwise("sub", e, 1.0), e))
    plain = b.op("or", b.op("eq", xd, b.scalar_like(0.0, xd)), b.op("not", b.op("isfinite", xd)))
    m = b.op("where", plain, xd, m)
    e = b.op("where", plain, b.scalar_like(0.0, e), e)
    return b.cast(m, x.dtype), b.cast(e, dt.i32)
