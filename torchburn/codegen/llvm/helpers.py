"""Internal helper functions emitted into a module on first use.

Some operations need loops or many branches (integer power, digamma) or are long enough that
inlining them at every use would bloat the IR (erfinv). Each is one internal scalar function
per module; vector uses call it lane by lane, and LLVM inlines it where that pays. The
algorithms follow torch's CPU implementations so results match eager mode.
"""
from __future__ import annotations

import math

import llvmlite.ir as ir

from .context import ModuleContext
from .types import F64, I1

# erfinv: torch's `calc_erfinv` rational approximations (central and tail regions).
_ERFINV_A = (0.886226899, -1.645349621, 0.914624893, -0.140543331)
_ERFINV_B = (-2.118377725, 1.442710462, -0.329097515, 0.012229801)
_ERFINV_C = (-1.970840454, -1.624906493, 3.429567803, 1.641345311)
_ERFINV_D = (3.543889200, 1.637067800)
_ERFINV_CENTRAL = 0.7

# digamma: asymptotic series coefficients and digamma(10) (torch's `calc_digamma`).
_DIGAMMA_A = (8.33333333333333333333e-2, -2.10927960927960927961e-2, 7.57575757575757575758e-3,
              -4.16666666666666666667e-3, 3.96825396825396825397e-3, -8.33333333333333333333e-3,
              8.33333333333333333333e-2)
_PSI_10 = 2.25175258906672110764


def _f(v: float) -> ir.Constant:
    return ir.Constant(F64, v)


def _f64_intrinsic(ctx: ModuleContext, b: ir.IRBuilder, name: str, *args: ir.Value) -> ir.Value:
    fn = ctx.intrinsic(name, F64, [F64] * len(args), [F64])
    return b.call(fn, list(args))


def _horner(b: ir.IRBuilder, x: ir.Value, coeffs: tuple[float, ...]) -> ir.Value:
    """coeffs[0] * x^(n-1) + ... + coeffs[-1], evaluated by Horner's rule."""
    acc: ir.Value = _f(coeffs[0])
    for c in coeffs[1:]:
        acc = b.fadd(b.fmul(acc, x), _f(c))
    return acc


# ---- integer power ---------------------------------------------------------------------------

def ipow(ctx: ModuleContext, ty: ir.IntType, signed: bool) -> ir.Function:
    """`base ** exp` on integers by repeated squaring (wrapping like C). A negative exponent
    gives 0, except for base 1 (gives 1) and base -1 (gives +-1), as torch does."""
    name = f"torchburn.ipow.{'i' if signed else 'u'}{ty.width}"
    return ctx.helper(name, ty, [ty, ty], lambda c, fn: _build_ipow(fn, ty, signed))


def _build_ipow(fn: ir.Function, ty: ir.IntType, signed: bool) -> None:
    base, exp = fn.args
    entry = fn.append_basic_block("entry")
    negative = fn.append_basic_block("negative")
    head = fn.append_basic_block("head")
    body = fn.append_basic_block("body")
    done = fn.append_basic_block("done")
    zero, one = ir.Constant(ty, 0), ir.Constant(ty, 1)

    b = ir.IRBuilder(entry)
    is_neg = b.icmp_signed("<", exp, zero) if signed else ir.Constant(I1, 0)
    b.cbranch(is_neg, negative, head)

    b.position_at_end(negative)
    odd = b.icmp_unsigned("!=", b.and_(exp, one), zero)
    minus_one = ir.Constant(ty, -1)
    for_minus_one = b.select(odd, minus_one, one)
    r = b.select(b.icmp_signed("==", base, minus_one), for_minus_one, zero)
    b.ret(b.select(b.icmp_signed("==", base, one), one, r))

    b.position_at_end(head)
    acc = b.phi(ty, "acc")
    sq = b.phi(ty, "sq")
    e = b.phi(ty, "e")
    b.cbranch(b.icmp_unsigned("==", e, zero), done, body)

    b.position_at_end(body)
    bit = b.icmp_unsigned("!=", b.and_(e, one), zero)
    acc2 = b.select(bit, b.mul(acc, sq), acc)
    sq2 = b.mul(sq, sq)
    e2 = b.lshr(e, one)
    b.branch(head)
    acc.add_incoming(one, entry)
    acc.add_incoming(acc2, body)
    sq.add_incoming(base, entry)
    sq.add_incoming(sq2, body)
    e.add_incoming(exp, entry)
    e.add_incoming(e2, body)

    b.position_at_end(done)
    b.ret(acc)


# ---- erfinv ------------------------------------------------------------------------------------

def erfinv_f64(ctx: ModuleContext) -> ir.Function:
    """Inverse error function in f64: a rational first guess refined by two Newton steps on
    `erf(x) = y` (libm `erf`); exact at the ends: +-1 -> +-inf, |y| > 1 -> NaN."""
    return ctx.helper("torchburn.erfinv.f64", F64, [F64], _build_erfinv)


def _build_erfinv(ctx: ModuleContext, fn: ir.Function) -> None:
    (y,) = fn.args
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    ay = _f64_intrinsic(ctx, b, "llvm.fabs", y)
    # Central region |y| <= 0.7: x = y * A(z) / B(z), z = y^2.
    z = b.fmul(y, y)
    num = _horner(b, z, _ERFINV_A[::-1])
    den = b.fadd(b.fmul(_horner(b, z, _ERFINV_B[::-1]), z), _f(1.0))
    central = b.fdiv(b.fmul(y, num), den)
    # Tail: z = sqrt(-log((1 - |y|) / 2)), x = sign(y) * C(z) / D(z).
    zt = _f64_intrinsic(ctx, b, "llvm.sqrt", b.fneg(_f64_intrinsic(
        ctx, b, "llvm.log", b.fmul(b.fsub(_f(1.0), ay), _f(0.5)))))
    numt = _horner(b, zt, _ERFINV_C[::-1])
    dent = b.fadd(b.fmul(_horner(b, zt, _ERFINV_D[::-1]), zt), _f(1.0))
    tail = _f64_intrinsic(ctx, b, "llvm.copysign", b.fdiv(numt, dent), y)
    x = b.select(b.fcmp_ordered("<=", ay, _f(_ERFINV_CENTRAL)), central, tail)
    erf = ctx.declare("erf", F64, [F64])
    two_over_sqrt_pi = _f(2.0 / math.sqrt(math.pi))
    for _ in range(2):
        resid = b.fsub(b.call(erf, [x]), y)
        slope = b.fmul(two_over_sqrt_pi, _f64_intrinsic(ctx, b, "llvm.exp", b.fneg(b.fmul(x, x))))
        x = b.fsub(x, b.fdiv(resid, slope))
    inf = _f64_intrinsic(ctx, b, "llvm.copysign", _f(math.inf), y)
    x = b.select(b.fcmp_ordered("==", ay, _f(1.0)), inf, x)
    x = b.select(b.fcmp_ordered(">", ay, _f(1.0)), _f(math.nan), x)
    b.ret(x)


# ---- digamma -----------------------------------------------------------------------------------

def digamma_f64(ctx: ModuleContext) -> ir.Function:
    """digamma (psi) in f64: poles at 0 (-> -+inf) and negative integers (NaN), reflection for
    negative x, recurrence up to x >= 10, then the asymptotic series."""
    return ctx.helper("torchburn.digamma.f64", F64, [F64], _build_digamma)


def _build_digamma(ctx: ModuleContext, fn: ir.Function) -> None:
    (x,) = fn.args
    entry = fn.append_basic_block("entry")
    pole = fn.append_basic_block("pole")
    check_neg = fn.append_basic_block("check_neg")
    neg_int = fn.append_basic_block("neg_int")
    start = fn.append_basic_block("start")
    head = fn.append_basic_block("head")
    step = fn.append_basic_block("step")
    after = fn.append_basic_block("after")
    ten = fn.append_basic_block("ten")
    series = fn.append_basic_block("series")

    b = ir.IRBuilder(entry)
    b.cbranch(b.fcmp_ordered("==", x, _f(0.0)), pole, check_neg)

    b.position_at_end(pole)
    b.ret(_f64_intrinsic(ctx, b, "llvm.copysign", _f(math.inf), b.fneg(x)))

    b.position_at_end(check_neg)
    is_neg = b.fcmp_ordered("<", x, _f(0.0))
    trunc = _f64_intrinsic(ctx, b, "llvm.trunc", x)
    is_int = b.fcmp_ordered("==", x, trunc)
    b.cbranch(b.and_(is_neg, is_int), neg_int, start)

    b.position_at_end(neg_int)
    b.ret(_f(math.nan))

    # Reflection for x < 0: psi(x) = psi(1 - x) - pi / tan(pi * frac(x)).
    b.position_at_end(start)
    frac = b.fsub(x, trunc)
    tan = _f64_intrinsic(ctx, b, "llvm.tan", b.fmul(_f(math.pi), frac))
    reflect = b.fsub(_f(0.0), b.fdiv(_f(math.pi), tan))
    x0 = b.select(is_neg, b.fsub(_f(1.0), x), x)
    r0 = b.select(is_neg, reflect, _f(0.0))
    b.branch(head)

    # Recurrence: psi(x) = psi(x + 1) - 1/x until x >= 10.
    b.position_at_end(head)
    xv = b.phi(F64, "x")
    rv = b.phi(F64, "acc")
    b.cbranch(b.fcmp_ordered("<", xv, _f(10.0)), step, after)
    b.position_at_end(step)
    r_next = b.fsub(rv, b.fdiv(_f(1.0), xv))
    x_next = b.fadd(xv, _f(1.0))
    b.branch(head)
    xv.add_incoming(x0, start)
    xv.add_incoming(x_next, step)
    rv.add_incoming(r0, start)
    rv.add_incoming(r_next, step)

    b.position_at_end(after)
    b.cbranch(b.fcmp_ordered("==", xv, _f(10.0)), ten, series)
    b.position_at_end(ten)
    b.ret(b.fadd(rv, _f(_PSI_10)))

    b.position_at_end(series)
    zz = b.fdiv(_f(1.0), b.fmul(xv, xv))
    poly = b.fmul(zz, _horner(b, zz, _DIGAMMA_A))
    poly = b.select(b.fcmp_ordered("<", xv, _f(1.0e17)), poly, _f(0.0))
    log = _f64_intrinsic(ctx, b, "llvm.log", xv)
    res = b.fsub(b.fsub(b.fadd(rv, log), b.fdiv(_f(0.5), xv)), poly)
    b.ret(res)
