"""`known_bits.unsigned_max`: a sound upper bound read from emitted LLVM values."""
from __future__ import annotations

import llvmlite.ir as ir

from torchburn.codegen.llvm.known_bits import lane_constants, unsigned_max

I8x16 = ir.VectorType(ir.IntType(8), 16)


def _builder() -> tuple[ir.IRBuilder, ir.Argument]:
    module = ir.Module()
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), [I8x16]), name="f")
    return ir.IRBuilder(fn.append_basic_block()), fn.args[0]


def _splat(b: ir.IRBuilder, value: int) -> ir.Value:
    one = b.insert_element(ir.Constant(I8x16, ir.Undefined), ir.Constant(ir.IntType(8), value), ir.Constant(ir.IntType(32), 0))
    return b.shuffle_vector(one, ir.Constant(I8x16, ir.Undefined), ir.Constant(ir.VectorType(ir.IntType(32), 16), [0] * 16))


def test_masks_shifts_and_selects_bound_the_value() -> None:
    b, x = _builder()
    assert unsigned_max(x) == 255
    assert unsigned_max(b.and_(x, _splat(b, 15))) == 15
    assert unsigned_max(b.and_(x, ir.Constant(I8x16, [3] * 8 + [12] * 8))) == 12
    shifted = b.lshr(x, _splat(b, 4))
    assert unsigned_max(shifted) == 15
    assert unsigned_max(b.select(ir.Constant(ir.VectorType(ir.IntType(1), 16), [1] * 16),
                                 ir.Constant(I8x16, [0] * 16), shifted)) == 15
    assert unsigned_max(b.or_(b.and_(x, _splat(b, 5)), _splat(b, 8))) == 15
    assert lane_constants(_splat(b, 7)) == [7]


def test_unknown_values_are_bounded_by_their_width() -> None:
    b, x = _builder()
    assert unsigned_max(b.add(b.and_(x, _splat(b, 15)), _splat(b, 1))) == 255  # add is not followed
    assert unsigned_max(b.lshr(x, x)) == 255  # shift by a non-constant
    wide = b.zext(b.and_(x, _splat(b, 15)), ir.VectorType(ir.IntType(32), 16))
    assert unsigned_max(wide) == 15
    assert unsigned_max(ir.Constant(ir.IntType(8), -1)) == 255
