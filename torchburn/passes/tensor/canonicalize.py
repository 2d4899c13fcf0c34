"""`canonicalize`: local clean-ups of the tensor graph, written as rewrite patterns.

Runs before `fuse` in the default pipeline, so fusion sees fewer, simpler ops. Each rule is a
`RewritePattern` (see `pattern.py`) and the pass is the list of them; every rule keeps the
exact results of the graph:

| pattern | rewrite |
|---|---|
| `IdentityCast` | `cast(x: T) {dtype = T}` -> `x` |
| `CastOfCast` | `cast(cast(x: A) {dtype = B}) {dtype = C}` -> `cast(x) {dtype = C}` when every A is exactly a B (`x` itself when C is A) |
| `AddZero` | `add(x, 0)`, `add(0, x)`, `sub(x, 0)` -> `x` (float `x + 0.0` only with `ignore_signed_zeros`: `-0.0 + 0.0` is `+0.0`) |
| `MulOne` | `mul(x, 1)`, `mul(1, x)`, `div(x, 1)` -> `x` |
| `PermutePermute` | `permute(permute(x) {dims = p}) {dims = q}` -> `permute(x) {dims = p[q]}`; an identity permute -> `x` |
| `ReshapeReshape` | `reshape(reshape(x))` -> `reshape(x)`; a reshape to the operand's shape -> `x` |
| `ExpandExpand` | `expand(expand(x))` -> `expand(x)`; an expand to the operand's shape -> `x` |
| `DeadOp` | ops nobody reads are erased |

"0" and "1" are `full` constants, possibly seen through views (`expand(reshape(full()))`,
which is how the frontend writes a Python scalar).

Before:

    graph @main(%x: f32[4, 8]) {
      %0 = full() {shape = [], value = 1.0, dtype = f32} : f32[]
      %1 = reshape(%0) {shape = [1, 1]} : f32[1, 1]
      %2 = expand(%1) {shape = [4, 8]} : f32[4, 8]
      %3 = mul(%x, %2) : f32[4, 8]
      %4 = permute(%3) {dims = [1, 0]} : f32[8, 4]
      %5 = permute(%4) {dims = [1, 0]} : f32[4, 8]
      %6 = cast(%5) {dtype = f64} : f64[4, 8]
      %7 = cast(%6) {dtype = f32} : f32[4, 8]
      return %7
    }

After `canonicalize`:

    graph @main(%x: f32[4, 8]) {
      return %x
    }
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Sequence

from ...ir.dtypes import DType
from ...ir.tensor import Op
from ..base import register_pass
from ..pattern import (DeadOp, Pattern, PatternPass, RewritePattern, Rewriter, constant_value,
                      producer)

#: Significand bits (with the implicit one) and exponent bits of each float dtype.
_FLOAT_BITS: dict[str, tuple[int, int]] = {"f16": (11, 5), "bf16": (8, 8), "f32": (24, 8), "f64": (53, 11)}


def exact_conversion(src: DType, dst: DType) -> bool:
    """Whether converting any `src` value to `dst` keeps it exactly (so a round trip through
    `dst` is the identity, and converting onwards from `dst` equals converting from `src`)."""
    if src == dst or src.is_bool:
        return True
    if dst.is_bool:
        return False
    if src.is_int and dst.is_int:
        if src.kind == dst.kind:
            return dst.bits >= src.bits
        return src.kind == "u" and dst.kind == "i" and dst.bits > src.bits
    if src.is_int and dst.is_float:
        magnitude_bits = src.bits - 1 if src.kind == "i" else src.bits
        return magnitude_bits <= _FLOAT_BITS[dst.name][0]
    if src.is_float and dst.is_float:
        (sm, se), (dm, de) = _FLOAT_BITS[src.name], _FLOAT_BITS[dst.name]
        return dm >= sm and de >= se
    return False


class IdentityCast(RewritePattern):
    """`cast(x: T) {dtype = T}` -> `x`.

    Before:

        %0 = cast(%x) {dtype = f32} : f32[4]    # %x: f32[4]

    After: uses of `%0` read `%x`.
    """

    op_name = "cast"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        x = op.operands[0]
        if op.attrs["dtype"] != x.dtype:
            return False
        rewriter.replace_op(op, [x])
        return True


class CastOfCast(RewritePattern):
    """`cast(cast(x: A) {dtype = B}) {dtype = C}` -> `cast(x) {dtype = C}` when A converts to
    B exactly (`x` itself when C is A).

    Before:

        %0 = cast(%x) {dtype = f64} : f64[4]    # %x: f32[4]
        %1 = cast(%0) {dtype = f32} : f32[4]

    After: uses of `%1` read `%x`. (`f32 -> f16 -> f32` is kept: it rounds.)
    """

    op_name = "cast"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        inner = producer(op.operands[0], "cast")
        if inner is None:
            return False
        x = inner.operands[0]
        if not exact_conversion(x.dtype, inner.attrs["dtype"]):
            return False
        target = op.attrs["dtype"]
        if target == x.dtype:
            rewriter.replace_op(op, [x])
        else:
            rewriter.replace_op_with(op, "cast", [x], {"dtype": target})
        return True


def _is_zero(op: Op, i: int, ignore_signed_zeros: bool, negative: bool) -> bool:
    """Operand `i` of `op` is a constant zero that `x + it` (or `x - it` when `negative`)
    leaves `x` exactly."""
    c = constant_value(op.operands[i])
    if c is None or c != 0 or isinstance(c, float) and math.isnan(c):
        return False
    if not op.operands[i].dtype.is_float or ignore_signed_zeros:
        return True
    # x + (-0.0) == x and x - (+0.0) == x for every x, -0.0 included; the others flip -0.0.
    return (math.copysign(1.0, float(c)) < 0) != negative


@dataclass(frozen=True)
class AddZero(RewritePattern):
    """`add(x, 0)`, `add(0, x)`, `sub(x, 0)` -> `x`.

    Before:

        %0 = full() {shape = [4], value = 0, dtype = i32} : i32[4]
        %1 = add(%x, %0) : i32[4]

    After: uses of `%1` read `%x`. For floats `x + 0.0` is kept unless `ignore_signed_zeros`
    (`-0.0 + 0.0` is `+0.0`); `x + -0.0` and `x - 0.0` always fold.
    """

    op_name = ("add", "sub")
    ignore_signed_zeros: bool = False

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        if op.name == "add":
            for keep, zero in ((0, 1), (1, 0)):
                if _is_zero(op, zero, self.ignore_signed_zeros, negative=False):
                    rewriter.replace_op(op, [op.operands[keep]])
                    return True
        elif op.name == "sub" and _is_zero(op, 1, self.ignore_signed_zeros, negative=True):
            rewriter.replace_op(op, [op.operands[0]])
            return True
        return False

    def __repr__(self) -> str:
        return "AddZero"


class MulOne(RewritePattern):
    """`mul(x, 1)`, `mul(1, x)`, `div(x, 1)` -> `x` (exact for every dtype).

    Before:

        %0 = full() {shape = [], value = 1.0, dtype = f32} : f32[]
        %1 = expand(%0) {shape = [4]} : f32[4]
        %2 = mul(%x, %1) : f32[4]

    After: uses of `%2` read `%x`.
    """

    op_name = ("mul", "div")

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        candidates: tuple[tuple[int, int], ...]
        if op.name == "mul":
            candidates = ((0, 1), (1, 0))
        elif op.name == "div":
            candidates = ((0, 1),)
        else:
            return False
        for keep, one in candidates:
            c = constant_value(op.operands[one])
            if c is not None and c == 1:
                rewriter.replace_op(op, [op.operands[keep]])
                return True
        return False


class PermutePermute(RewritePattern):
    """`permute(permute(x) {dims = p}) {dims = q}` -> `permute(x) {dims = [p[i] for i in q]}`,
    and an identity permute -> `x`.

    Before:

        %0 = permute(%x) {dims = [1, 2, 0]} : f32[3, 4, 2]    # %x: f32[2, 3, 4]
        %1 = permute(%0) {dims = [2, 0, 1]} : f32[2, 3, 4]

    After: uses of `%1` read `%x`.
    """

    op_name = "permute"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        dims = tuple(op.attrs["dims"])
        if dims == tuple(range(len(dims))):
            rewriter.replace_op(op, [op.operands[0]])
            return True
        inner = producer(op.operands[0], "permute")
        if inner is None:
            return False
        first = tuple(inner.attrs["dims"])
        composed = tuple(first[d] for d in dims)
        x = inner.operands[0]
        if composed == tuple(range(len(composed))):
            rewriter.replace_op(op, [x])
        else:
            rewriter.replace_op_with(op, "permute", [x], {"dims": composed})
        return True


class ReshapeReshape(RewritePattern):
    """`reshape(reshape(x))` -> `reshape(x)`, and a reshape to the operand's shape -> `x`.

    Before:

        %0 = reshape(%x) {shape = [2, 6]} : f32[2, 6]    # %x: f32[3, 4]
        %1 = reshape(%0) {shape = [12]} : f32[12]

    After:

        %1 = reshape(%x) {shape = [12]} : f32[12]
    """

    op_name = "reshape"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        x = op.operands[0]
        if op.result.shape == x.shape:
            rewriter.replace_op(op, [x])
            return True
        inner = producer(x, "reshape")
        if inner is None:
            return False
        rewriter.replace_op_with(op, "reshape", [inner.operands[0]], {"shape": op.attrs["shape"]})
        return True


class ExpandExpand(RewritePattern):
    """`expand(expand(x))` -> `expand(x)`, and an expand to the operand's shape -> `x`.

    Before:

        %0 = expand(%x) {shape = [1, 4]} : f32[1, 4]     # %x: f32[1, 1]
        %1 = expand(%0) {shape = [3, 4]} : f32[3, 4]

    After:

        %1 = expand(%x) {shape = [3, 4]} : f32[3, 4]
    """

    op_name = "expand"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        x = op.operands[0]
        if op.result.shape == x.shape:
            rewriter.replace_op(op, [x])
            return True
        inner = producer(x, "expand")
        if inner is None:
            return False
        rewriter.replace_op_with(op, "expand", [inner.operands[0]], {"shape": op.attrs["shape"]})
        return True


@register_pass
@dataclass(frozen=True)
class Canonicalize(PatternPass):
    """Fold identities and redundant casts and views; erase dead ops (see the module docstring).

    Before:

        graph @main(%x: f32[4]) {
          %0 = cast(%x) {dtype = f32} : f32[4]
          %1 = exp(%x) : f32[4]
          return %0
        }

    After:

        graph @main(%x: f32[4]) {
          return %x
        }
    """

    name: ClassVar[str] = "canonicalize"
    #: Also fold float `x + 0.0` and `x - (-0.0)`, which turn a `-0.0` into `+0.0`.
    ignore_signed_zeros: bool = False

    def patterns(self) -> Sequence[Pattern]:
        return [IdentityCast(), CastOfCast(), AddZero(self.ignore_signed_zeros), MulOne(),
                PermutePermute(), ReshapeReshape(), ExpandExpand(), DeadOp()]


__all__ = ["AddZero", "Canonicalize", "CastOfCast", "ExpandExpand", "IdentityCast", "MulOne",
           "PermutePermute", "ReshapeReshape", "exact_conversion"]
