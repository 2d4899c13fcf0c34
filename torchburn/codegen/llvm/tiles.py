"""`tile_dot_u8i8(acc, a, b)` / `tile_dot_i8i8`: a 16 x 16 byte matrix product into i32.

The IR call (see `torchburn.ir.expr.Call`) means, for `acc: i32 x 256`, `a: u8 x 16K` (`i8`
for `tile_dot_i8i8`), `b: i8 x 16K` (K / 4 rows of 64 bytes, "VNNI" order):

    result[16 i + j] = acc[16 i + j] + sum(a[K i + k] * b[64 (k // 4) + 4 j + k % 4] for k < K)

Two lowerings with identical results (exact products, wrapping i32 sums):

- AMX-INT8 (`Target.tile_dot`): the operands become tiles through LLVM's
  `llvm.x86.cast.vector.to.tile` (a vector loaded from memory becomes one `tileloadd` of 16
  rows of K bytes, resp. K / 4 rows of 64; a zero accumulator `tilezero`), one
  `tdpbusd`/`tdpbssd` multiplies them, and `llvm.x86.cast.tile.to.vector` gives the 16 x 16
  sums back (a `tilestored` the following loads read). LLVM's AMX passes infer the tiles'
  shapes from the product and configure the tile registers (`ldtilecfg`) once per function.
  The process must hold the tile state (`codegen/amx.py`; the host target has AMX only then).

      %ta = call x86_amx @llvm.x86.cast.vector.to.tile.v512i8(<512 x i8> %a)
      %tb = call x86_amx @llvm.x86.cast.vector.to.tile.v512i8(<512 x i8> %b)
      %tc = call x86_amx @llvm.x86.tilezero.internal(i16 16, i16 64)
      %td = call x86_amx @llvm.x86.tdpbusd.internal(i16 16, i16 64, i16 32, x86_amx %tc, x86_amx %ta, x86_amx %tb)
      %c  = call <256 x i32> @llvm.x86.cast.tile.to.vector.v256i32(x86_amx %td)

- Anywhere else: row i of the result is K / 4 `dot4_u8i8_acc` (`dot.py`) of a's four bytes
  `a[K i + 4 q ..]` broadcast to 16 lanes by b's row q (`dot4_i8i8_acc` for signed `a`).
"""
from __future__ import annotations

import llvmlite.ir as ir

from ...ir.opnames import TILE_DOT_U8I8, TILE_ROWS
from ..errors import CodegenError
from .context import ModuleContext
from .dot import emit_dot4, emit_dot4_i8i8
from .types import I32, lanes_of

I16 = ir.IntType(16)


class AmxTile(ir.Type):
    """LLVM's `x86_amx`, the type of a tile register's value (llvmlite has no spelling of it)."""

    def _to_string(self) -> str:
        return "x86_amx"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AmxTile)

    def __hash__(self) -> int:
        return hash("x86_amx")


TILE = AmxTile()


def emit_tile_dot(b: ir.IRBuilder, ctx: ModuleContext, name: str, acc: ir.Value, a: ir.Value, w: ir.Value,
                  zero_acc: bool) -> ir.Value:
    """The call's value (`zero_acc`: the accumulator is known zero, a `tilezero` on AMX)."""
    rows = TILE_ROWS
    k = lanes_of(a.type) // rows
    if lanes_of(acc.type) != rows * rows or lanes_of(a.type) != rows * k or lanes_of(w.type) != rows * k \
            or k % 4 or not 4 <= k <= 64:
        raise CodegenError(f"{name} needs i32 x 256 and two 16K-byte operands (K a multiple of 4 "
                           f"up to 64), got {acc.type}, {a.type} and {w.type}")
    if ctx.target.tile_dot():
        return _amx(b, ctx, name, acc, a, w, k, zero_acc)
    return _rows(b, ctx, name, acc, a, w, k)


def _amx(b: ir.IRBuilder, ctx: ModuleContext, name: str, acc: ir.Value, a: ir.Value, w: ir.Value, k: int,
         zero_acc: bool) -> ir.Value:
    rows = TILE_ROWS

    def to_tile(v: ir.Value) -> ir.Value:
        fn = ctx.intrinsic("llvm.x86.cast.vector.to.tile", TILE, [v.type], [v.type])
        return b.call(fn, [v])

    if zero_acc:
        zero = ctx.declare("llvm.x86.tilezero.internal", TILE, [I16, I16])
        tc = b.call(zero, [ir.Constant(I16, rows), ir.Constant(I16, 4 * rows)])
    else:
        tc = to_tile(acc)
    op = "llvm.x86.tdpbusd.internal" if name == TILE_DOT_U8I8 else "llvm.x86.tdpbssd.internal"
    dot = ctx.declare(op, TILE, [I16, I16, I16, TILE, TILE, TILE])
    td = b.call(dot, [ir.Constant(I16, rows), ir.Constant(I16, 4 * rows), ir.Constant(I16, k), tc, to_tile(a), to_tile(w)])
    back = ctx.intrinsic("llvm.x86.cast.tile.to.vector", acc.type, [TILE], [acc.type])
    return b.call(back, [td])


def _rows(b: ir.IRBuilder, ctx: ModuleContext, name: str, acc: ir.Value, a: ir.Value, w: ir.Value, k: int) -> ir.Value:
    rows = TILE_ROWS
    undef_a = ir.Constant(a.type, ir.Undefined)
    undef_w = ir.Constant(w.type, ir.Undefined)
    undef_c = ir.Constant(acc.type, ir.Undefined)
    out_rows = []
    for i in range(rows):
        row = b.shuffle_vector(acc, undef_c, ir.Constant(ir.VectorType(I32, rows), [rows * i + j for j in range(rows)]))
        for q in range(k // 4):
            four = [k * i + 4 * q + t for t in range(4)]
            ab = b.shuffle_vector(a, undef_a, ir.Constant(ir.VectorType(I32, 4 * rows), four * rows))
            wr = b.shuffle_vector(w, undef_w, ir.Constant(ir.VectorType(I32, 4 * rows),
                                                          list(range(4 * rows * q, 4 * rows * (q + 1)))))
            row = emit_dot4(b, ctx, row, ab, wr) if name == TILE_DOT_U8I8 else emit_dot4_i8i8(b, ctx, row, ab, wr)
        out_rows.append(row)
    while len(out_rows) > 1:  # concatenate pairwise
        joined = []
        for x, y in zip(out_rows[0::2], out_rows[1::2]):
            n = lanes_of(x.type)
            joined.append(b.shuffle_vector(x, y, ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))))
        out_rows = joined
    return out_rows[0]



