"""`dot4_u8i8_acc(acc, a, b)`: four-way byte dot products accumulated into i32 lanes.

The IR call (see `torchburn.ir.expr.Call`) means, for `acc: i32 x L`, `a: u8 x 4L`,
`b: i8 x 4L`:

    result[i] = acc[i] + sum(i32(a[4 i + j]) * i32(b[4 i + j]) for j in 0..3)

(wrapping i32 addition; four products of a u8 and an i8 never leave i32, so nothing
saturates). On a CPU with AVX512-VNNI this is one `vpdpbusd` per register: the 512-bit form
for 16 lanes and, with AVX512VL, the 256- and 128-bit forms for 8 and 4 lanes. Anywhere else
(no VNNI, other lane counts, other architectures) the same value comes from the plain
sequence: widen both to i32, multiply, and add the four products of each lane with
shuffles; LLVM turns that into whatever widening multiply-adds the target has. Both ways
give identical results, which the tests check by forcing a target without the feature.
"""
from __future__ import annotations

import llvmlite.ir as ir

from ..errors import CodegenError
from ..target import Target
from .context import ModuleContext
from .types import I32, lanes_of

#: `vpdpbusd` intrinsics by i32 lane count (the features each needs: `ir.target.DOT4_FEATURES`).
_VPDPBUSD: dict[int, str] = {
    16: "llvm.x86.avx512.vpdpbusd.512",
    8: "llvm.x86.avx512.vpdpbusd.256",
    4: "llvm.x86.avx512.vpdpbusd.128",
}


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
    wide = ir.VectorType(I32, 4 * lanes)
    products = b.mul(b.zext(a, wide), b.sext(w, wide))
    total = acc
    for j in range(4):
        if lanes == 1:
            total = b.add(total, b.extract_element(products, ir.Constant(I32, j)))
            continue
        mask = ir.Constant(ir.VectorType(I32, lanes), [4 * i + j for i in range(lanes)])
        part = b.shuffle_vector(products, ir.Constant(wide, ir.Undefined), mask)
        total = b.add(total, part)
    return total
