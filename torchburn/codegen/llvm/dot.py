"""`dot4_u8i8_acc(acc, a, b)`: four-way byte dot products accumulated into i32 lanes.

The IR call (see `torchburn.ir.expr.Call`) means, for `acc: i32 x L`, `a: u8 x 4L`,
`b: i8 x 4L`:

    result[i] = acc[i] + sum(i32(a[4 i + j]) * i32(b[4 i + j]) for j in 0..3)

(wrapping i32 addition; four products of a u8 and an i8 never leave i32, so nothing
saturates). Three lowerings, all giving identical results (the tests force each):

- AVX512-VNNI: one `vpdpbusd` per register, the 512-bit form for 16 lanes and, with
  AVX512VL, the 256- and 128-bit forms for 8 and 4 lanes.
- x86 without VNNI, when `a` is known below 128 (`known_bits.unsigned_max`: the nibbles of an
  int4 weight, `b & 15` and `b >> 4`): `pmaddubsw` multiplies the bytes and adds adjacent
  pairs into i16 lanes, `pmaddwd` by ones adds adjacent i16 pairs into i32 lanes, which is
  lane `i`'s four products exactly (llama.cpp's AVX2 quantized dot). A pair sum is at most
  2 * 127 * 128 = 32512 in magnitude, so the saturating i16 add never saturates; a full-range
  `a` (255 * 127 * 2 = 64770) could, and takes the plain sequence. SSSE3 for 4 lanes, AVX2
  for 8, AVX512BW for 16.
  Two such calls nested, `dot4(dot4(acc, a1, b1), a2, b2)` (an int4 group's low and high
  nibbles), add their i16 pair sums before the one `pmaddwd` when the bounds of `a1` and
  `a2` add up to less than 128 (15 + 15: each i16 lane then stays within 2 * 30 * 128).
- Anywhere else: widen both to i32, multiply, and add the four products of each lane with
  shuffles.

`dot4_i8i8_acc(acc, a, b)`, `a` signed too (an int8 weight by int8 activations):

- where one operand is known above -128 (`known_bits.signed_min`: the kernels clamp the
  quantized activations with `max(b, -127)`, a no-op on values that are in [-127, 127] by
  construction): `|a| * sign(b, a)` lane by lane (`pabsb`, `psignb`: b negated where a < 0),
  which is `a * b` with an unsigned first operand, then `vpdpbusd`, or `pmaddubsw` +
  `pmaddwd` (pair sums at most 2 * 128 * 127 = 32512: no saturation) -- llama.cpp's Q8_0
  dot on AVX2. 512-bit vectors have no `psignb`: a select of `-b` and `b`.
- else with VNNI: `vpdpbusd(acc, a ^ 0x80, b) - vpdpbusd(0, 0x80, b)` (`a ^ 0x80 = a + 128`).
- else the widening sequence.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..errors import CodegenError
from ..target import Target
from .context import ModuleContext
from .known_bits import signed_min, unsigned_max
from .types import I32, lanes_of

#: `vpdpbusd` intrinsics by i32 lane count (the features each needs: `ir.target.DOT4_FEATURES`).
_VPDPBUSD: dict[int, str] = {
    16: "llvm.x86.avx512.vpdpbusd.512",
    8: "llvm.x86.avx512.vpdpbusd.256",
    4: "llvm.x86.avx512.vpdpbusd.128",
}


#: `(pmaddubsw, pmaddwd)` by i32 lane count (the features: `ir.target.SMALL_DOT4_FEATURES`).
_MADDUBS: dict[int, tuple[str, str]] = {
    4: ("llvm.x86.ssse3.pmadd.ub.sw.128", "llvm.x86.sse2.pmadd.wd"),
    8: ("llvm.x86.avx2.pmadd.ub.sw", "llvm.x86.avx2.pmadd.wd"),
    16: ("llvm.x86.avx512.pmaddubs.w.512", "llvm.x86.avx512.pmaddw.d.512"),
}
#: `a` below this cannot saturate `pmaddubsw`'s i16 pair sums (see the module docstring).
MADDUBS_A_LIMIT = 128


def has_maddubs_dot4(target: Target, lanes: int) -> bool:
    """Whether `dot4_u8i8_acc` on `lanes` lanes with `a < 128` is `pmaddubsw` + `pmaddwd`."""
    return lanes in _MADDUBS and target.small_dot4(lanes)


def has_native_dot4(target: Target, lanes: int) -> bool:
    """Whether `dot4_u8i8_acc` on `lanes` i32 lanes is one instruction on `target`."""
    return lanes in _VPDPBUSD and target.native_dot4(lanes)


def emit_dot4(b: ir.IRBuilder, ctx: ModuleContext, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
    """The call's value: `vpdpbusd` where `ctx.target` has it, else the portable sequence."""
    lanes = lanes_of(acc.type)
    if lanes_of(a.type) != 4 * lanes or lanes_of(w.type) != 4 * lanes:
        raise CodegenError(f"dot4_u8i8_acc needs 4 x {lanes} bytes per operand, got {a.type} and {w.type}")
    if has_native_dot4(ctx.target, lanes):
        name = _VPDPBUSD[lanes]
        vt = ir.VectorType(I32, lanes)
        fn = ctx.declare(name, vt, [vt, vt, vt])
        return b.call(fn, [acc, b.bitcast(a, vt), b.bitcast(w, vt)])
    if has_maddubs_dot4(ctx.target, lanes) and unsigned_max(a) < MADDUBS_A_LIMIT:
        return _maddubs(b, ctx, lanes, acc, a, w)
    wide = ir.VectorType(I32, 4 * lanes)
    return _lane_sums(b, acc, b.mul(b.zext(a, wide), b.sext(w, wide)), lanes)


def _lane_sums(b: ir.IRBuilder, acc: ir.Value, products: ir.Value, lanes: int) -> ir.Value:
    """`acc[i] + products[4 i] + ... + products[4 i + 3]` (the portable sequence)."""
    total = acc
    for j in range(4):
        if lanes == 1:
            total = b.add(total, b.extract_element(products, ir.Constant(I32, j)))
            continue
        mask = ir.Constant(ir.VectorType(I32, lanes), [4 * i + j for i in range(lanes)])
        part = b.shuffle_vector(products, ir.Constant(products.type, ir.Undefined), mask)
        total = b.add(total, part)
    return total


#: `psignb` by i32 lane count (none for 512 bits).
_PSIGNB: dict[int, str] = {4: "llvm.x86.ssse3.psign.b.128", 8: "llvm.x86.avx2.psign.b"}


def emit_dot4_i8i8(b: ir.IRBuilder, ctx: ModuleContext, acc: ir.Value, a: ir.Value, w: ir.Value) -> ir.Value:
    """`dot4_i8i8_acc`'s value (module docstring)."""
    lanes = lanes_of(acc.type)
    if lanes_of(a.type) != 4 * lanes or lanes_of(w.type) != 4 * lanes:
        raise CodegenError(f"dot4_i8i8_acc needs 4 x {lanes} bytes per operand, got {a.type} and {w.type}")
    native = has_native_dot4(ctx.target, lanes)
    bytes_t = ir.VectorType(ir.IntType(8), 4 * lanes)
    if native or has_maddubs_dot4(ctx.target, lanes):
        if signed_min(a) > -128:
            a, w = w, a  # the operand negated by sign() must not be -128
        if signed_min(w) > -128:
            magnitude = b.call(ctx.declare(f"llvm.abs.v{4 * lanes}i8", bytes_t, [bytes_t, ir.IntType(1)]),
                               [a, ir.Constant(ir.IntType(1), 0)])
            signed = _sign(b, ctx, lanes, w, a)
            if native:
                return emit_dot4(b, ctx, acc, magnitude, signed)
            return _maddubs(b, ctx, lanes, acc, magnitude, signed)
    if native:
        flip = ir.Constant(bytes_t, [-128 & 0xFF] * (4 * lanes))
        shifted = emit_dot4(b, ctx, acc, b.xor(a, flip), w)
        zero = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)
        return b.sub(shifted, emit_dot4(b, ctx, zero, flip, w))
    wide = ir.VectorType(I32, 4 * lanes)
    products = b.mul(b.sext(a, wide), b.sext(w, wide))
    return _lane_sums(b, acc, products, lanes)


def _sign(b: ir.IRBuilder, ctx: ModuleContext, lanes: int, value: ir.Value, sign_of: ir.Value) -> ir.Value:
    """`value` negated where `sign_of < 0` (zero where it is 0 with `psignb`; the product with
    `|sign_of| = 0` is 0 either way)."""
    bytes_t = value.type
    name = _PSIGNB.get(lanes)
    if name is not None:
        return b.call(ctx.declare(name, bytes_t, [bytes_t, bytes_t]), [value, sign_of])
    zero = ir.Constant(bytes_t, [0] * (4 * lanes))
    return b.select(b.icmp_signed("<", sign_of, zero), b.sub(zero, value), value)


def emit_dot4_pair(b: ir.IRBuilder, ctx: ModuleContext, acc: ir.Value, first: tuple[ir.Value, ir.Value],
                   second: tuple[ir.Value, ir.Value]) -> ir.Value | None:
    """`dot4(dot4(acc, *first), *second)` as two `pmaddubsw`, one i16 add and one `pmaddwd`,
    or None when that is not exact (bounds) or not available (target, lanes)."""
    lanes = lanes_of(acc.type)
    if has_native_dot4(ctx.target, lanes) or not has_maddubs_dot4(ctx.target, lanes):
        return None
    (a1, w1), (a2, w2) = first, second
    if any(lanes_of(v.type) != 4 * lanes for v in (a1, w1, a2, w2)):
        return None
    if unsigned_max(a1) + unsigned_max(a2) >= MADDUBS_A_LIMIT:
        return None
    pairs = b.add(_byte_pairs(b, ctx, lanes, a1, w1), _byte_pairs(b, ctx, lanes, a2, w2))
    return b.add(acc, _pair_sums(b, ctx, lanes, pairs))


def _maddubs(b: ir.IRBuilder, ctx: ModuleContext, lanes: int, acc: ir.Value, a: ir.Value,
             w: ir.Value) -> ir.Value:
    """`acc + pmaddwd(pmaddubsw(a, w), 1)`: exact when every lane of `a` is below 128."""
    return b.add(acc, _pair_sums(b, ctx, lanes, _byte_pairs(b, ctx, lanes, a, w)))


def _byte_pairs(b: ir.IRBuilder, ctx: ModuleContext, lanes: int, a: ir.Value, w: ir.Value) -> ir.Value:
    """`pmaddubsw(a, w)`: `2 lanes` i16 sums of adjacent byte products."""
    bytes_t, i16_t = ir.VectorType(ir.IntType(8), 4 * lanes), ir.VectorType(ir.IntType(16), 2 * lanes)
    return b.call(ctx.declare(_MADDUBS[lanes][0], i16_t, [bytes_t, bytes_t]), [a, w])


def _pair_sums(b: ir.IRBuilder, ctx: ModuleContext, lanes: int, pairs: ir.Value) -> ir.Value:
    """`pmaddwd(pairs, 1)`: `lanes` i32 sums of adjacent i16 lanes."""
    i16_t = ir.VectorType(ir.IntType(16), 2 * lanes)
    fn = ctx.declare(_MADDUBS[lanes][1], ir.VectorType(I32, lanes), [i16_t, i16_t])
    return b.call(fn, [pairs, ir.Constant(i16_t, [1] * (2 * lanes))])
