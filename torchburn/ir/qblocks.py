"""Block layouts of ggml (GGUF) quantized weights: each type a layout plus the IR expressions
that dequantize one element, from which the compiler generates its kernels and `torchburn.quant`
its eager reference.

A ggml weight row is a sequence of blocks of `block` weights stored in `nbytes` bytes each. A
block is cut into *runs* of `run` consecutive weights that share one scale (and one offset)
and whose codes are read with the same shifts and masks from consecutive bytes, so

    W[b block + r run + l] = f32(code(r)) * scale(r) + offset(r)      (0 <= l < run)

where `code(r)` is an i32 expression of the lane `LANE` (= `l`, an index) and `scale(r)`,
`offset(r)` are f32 expressions free of `LANE`. All three read the block's bytes through
loads of the placeholder buffer `BLOCK` (u8, indexed by the byte offset inside the block):
a kernel replaces `%blk[o]` by `%q[n, b nbytes + o]`, the eager reference by a gather from
the block tensor. A new type is one more entry of `BLOCK_TYPES`; no kernel is written by hand.

For example Q4_K's second run (weights 32..63 of a 256-weight block: the high nibbles of
bytes 16..47, scale and min number 1 of the 6-bit table at bytes 4..15):

    code(1)   = cast<i32>(%blk[16 + l] >> 4:u8 & 15:u8)
    scale(1)  = f16(%blk[0..1]) * cast<f32>(%blk[5] & 63:u8)
    offset(1) = -(f16(%blk[2..3]) * cast<f32>(%blk[9] & 63:u8))

The products and sums are the ones gguf-py's `gguf.quants.dequantize` computes, in its order
(`scale` is its `d * sc`, the element `scale * q + offset`), so an evaluation that rounds each
operation once gives its float32 values bit for bit.

This module is data and expressions only (no torch): `ir/ops.py` reads the sizes,
`passes/quant/qlinear_blocks.py` builds the kernels, `quant/blocks.py` the reference.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from . import dtypes as dt
from . import expr as ex
from .expr import Const, Expr, ScalarType, Var

#: The placeholder buffer of one block's bytes (u8, index = byte offset in the block).
BLOCK = "blk"
#: The lane within a run (an index from 0 to `run - 1`).
LANE = Var("l")

U8 = ScalarType(dt.u8)
I32 = ScalarType(dt.i32)
F32 = ScalarType(dt.f32)


@dataclass(frozen=True)
class BlockType:
    """One ggml block type (see the module docstring for the meaning of the fields)."""

    name: str
    #: The `GGMLQuantizationType` value in GGUF headers.
    ggml_type: int
    block: int
    nbytes: int
    run: int
    code: Callable[[int], Expr]
    scale: Callable[[int], Expr]
    offset: Callable[[int], Optional[Expr]]
    #: `wide(c)`: the codes of the WIDE weights `WIDE c + l` (0 <= l < WIDE) as one expression
    #: of the lane (the form of `code`: an i32 of a u8 expression, minus a constant), for the
    #: int8-activation kernel's byte vectors (`passes/quant/qlinear_blocks_i8.py`). A K-quant's
    #: two runs of 16 read the same bytes with the same shifts (`code(2 c)` holds for 32
    #: lanes); a legacy block's halves are the low and high nibbles of the same 16 bytes, read
    #: twice (`%blk[2 + l % 16]`) and picked by lane. None: not given.
    wide: Optional[Callable[[int], Expr]] = None

    @property
    def runs(self) -> int:
        return self.block // self.run

    def row_bytes(self, in_features: int) -> int:
        """Bytes of one row of `in_features` weights (a multiple of `block`)."""
        return in_features // self.block * self.nbytes


# ---- expression helpers ------------------------------------------------------------------

def byte(offset: Expr | int) -> Expr:
    """The u8 at `offset` of the block."""
    return ex.Load(BLOCK, (ex.as_expr(offset),), U8)


def u8(value: int) -> Expr:
    return Const(value, U8)


def bits(value: Expr, shift: int | Expr, mask: int) -> Expr:
    """`(value >> shift) & mask` on u8."""
    shifted = value if isinstance(shift, int) and shift == 0 else ex.Binary(
        "shr", value, u8(shift) if isinstance(shift, int) else shift, U8)
    return ex.Binary("and", shifted, u8(mask), U8)


def shl(value: Expr, shift: int) -> Expr:
    return ex.Binary("shl", value, u8(shift), U8) if shift else value


def bor(a: Expr, b: Expr) -> Expr:
    return ex.Binary("or", a, b, a.type)


def i32(value: Expr) -> Expr:
    return ex.cast(value, dt.i32)


def f32(value: Expr) -> Expr:
    return ex.cast(value, dt.f32)


def minus(value: Expr, c: int) -> Expr:
    """An i32 expression minus a constant."""
    return ex.Binary("sub", value, Const(c, I32), I32)


def half(offset: int) -> Expr:
    """The little-endian float16 at bytes `offset`, `offset + 1`, widened to f32."""
    lo = ex.cast(byte(offset), dt.i16)
    hi = ex.Binary("shl", ex.cast(byte(offset + 1), dt.i16), Const(8, ScalarType(dt.i16)), ScalarType(dt.i16))
    raw = ex.Binary("or", lo, hi, ScalarType(dt.i16))
    return f32(ex.Bitcast(raw, ScalarType(dt.f16)))


def mul(a: Expr, b: Expr) -> Expr:
    return ex.Binary("mul", a, b, F32)


def neg(a: Expr) -> Expr:
    return ex.Call("neg", (a,), F32)


def lane(offset: int) -> Expr:
    """The byte index `offset + l`."""
    return ex.add(Const(offset), LANE)


#: Weights per `wide` code vector (one 256-bit register of bytes).
WIDE = 32


def lane_lt(n: int) -> Expr:
    """`l < n` (a bool of the lane)."""
    return ex.Binary("lt", LANE, Const(n), ScalarType(dt.bool_))


def _wide_nibbles(qs: int) -> Expr:
    """The 32 low four bits of a legacy block: weight l < 16 is the low nibble of qs[l], weight
    l >= 16 the high nibble of qs[l - 16] (both halves read from one 16-byte load)."""
    b = byte(ex.add(Const(qs), ex.Binary("mod", LANE, Const(16), LANE.type)))
    # a select of two different operations (a mask, a shift): of two shifts LLVM makes one
    # lane-varying shift, which x86 has only for 16-bit lanes (seven instructions for bytes)
    return ex.Select(lane_lt(16), bits(b, 0, 15), ex.Binary("shr", b, u8(4), U8), U8)


def _wide_fifth(qh: int) -> Expr:
    """Bit l of the little-endian 32-bit word at qh, as 16 or 0 (a test against a constant
    mask: a lane-varying byte shift has no instruction on x86)."""
    word = byte(ex.add(Const(qh), ex.Binary("floordiv", LANE, Const(8), LANE.type)))
    mask = ex.Binary("shl", u8(1), ex.cast(ex.Binary("mod", LANE, Const(8), LANE.type), dt.u8), U8)
    set_ = ex.Binary("ne", ex.Binary("and", word, mask, U8), u8(0), ScalarType(dt.bool_))
    return ex.Select(set_, u8(16), u8(0), U8)


# ---- the legacy 32-weight blocks ------------------------------------------------------------
# Runs of 16: weights 0..15 are the low nibbles of qs[0..15], weights 16..31 the high ones
# (Q8_0: one run of 32 signed bytes). Q5_x keep the fifth bits in a 32-bit word `qh`, bit e for
# weight e: lane l of run r takes byte qh[2 r + l // 8] (one of two, a select) shifted by l % 8.

def _nibble(qs: int, r: int) -> Expr:
    """Q4/Q5 low four bits of weight `16 r + l`."""
    return bits(byte(lane(qs)), 4 * r, 15)


def _q5_code(qh: int, qs: int, r: int) -> Expr:
    first = ex.Binary("lt", LANE, Const(8), ScalarType(dt.bool_))
    word = ex.Select(first, byte(qh + 2 * r), byte(qh + 2 * r + 1), U8)
    high = bits(word, ex.cast(ex.Binary("and", LANE, Const(7), LANE.type), dt.u8), 1)
    return i32(bor(_nibble(qs, r), shl(high, 4)))


LEGACY = (
    BlockType("Q4_0", 2, 32, 18, 16,
              code=lambda r: minus(i32(_nibble(2, r)), 8),
              scale=lambda r: half(0), offset=lambda r: None,
              wide=lambda c: minus(i32(_wide_nibbles(2)), 8)),
    BlockType("Q4_1", 3, 32, 20, 16,
              code=lambda r: i32(_nibble(4, r)),
              scale=lambda r: half(0), offset=lambda r: half(2),
              wide=lambda c: i32(_wide_nibbles(4))),
    BlockType("Q5_0", 6, 32, 22, 16,
              code=lambda r: minus(_q5_code(2, 6, r), 16),
              scale=lambda r: half(0), offset=lambda r: None,
              wide=lambda c: minus(i32(bor(_wide_nibbles(6), _wide_fifth(2))), 16)),
    BlockType("Q5_1", 7, 32, 24, 16,
              code=lambda r: _q5_code(4, 8, r),
              scale=lambda r: half(0), offset=lambda r: half(2),
              wide=lambda c: i32(bor(_wide_nibbles(8), _wide_fifth(4)))),
    BlockType("Q8_0", 8, 32, 34, 32,
              code=lambda r: i32(ex.Bitcast(byte(lane(2)), ScalarType(dt.i8))),
              scale=lambda r: half(0), offset=lambda r: None),
)


# ---- K-quants: 256-weight super-blocks ---------------------------------------------------------

def _q2_code(r: int) -> Expr:
    # weight 16 r + l = 128 n + 32 j + 16 h + l: qs[32 n + 16 h + l] >> 2 j
    n, j, h = r // 8, (r % 8) // 2, r % 2
    return i32(bits(byte(lane(16 + 32 * n + 16 * h)), 2 * j, 3))


def _q3_code(r: int) -> Expr:
    # low two bits as Q2_K (qs at 32); the third from hmask[16 h + l] bit 4 n + j, subtracting
    # 4 where it is clear: (low | high << 2) - 4
    n, j, h = r // 8, (r % 8) // 2, r % 2
    low = bits(byte(lane(32 + 32 * n + 16 * h)), 2 * j, 3)
    high = bits(byte(lane(16 * h)), 4 * n + j, 1)
    return minus(i32(bor(low, shl(high, 2))), 4)


def _q3_scale(r: int) -> Expr:
    # 16 six-bit scales: low nibbles at scales[r % 8] >> 4 (r // 8), high pairs at
    # scales[8 + r % 4] >> 2 (r // 4); minus 32
    low = bits(byte(96 + r % 8), 4 * (r // 8), 15)
    high = bits(byte(96 + 8 + r % 4), 2 * (r // 4), 3)
    sc = minus(i32(bor(low, shl(high, 4))), 32)
    return mul(half(108), f32(sc))


def _k4_scale_min(scales: int, j: int) -> tuple[Expr, Expr]:
    """Scale and min number `j` (0..7) of the 12-byte 6-bit table of Q4_K/Q5_K."""
    if j < 4:
        return bits(byte(scales + j), 0, 63), bits(byte(scales + 4 + j), 0, 63)
    sc = bor(bits(byte(scales + 4 + j), 0, 15), bits(byte(scales + j - 4), 2, 0x30))
    mn = bor(bits(byte(scales + 4 + j), 4, 15), bits(byte(scales + j), 2, 0x30))
    return sc, mn


def _k4_nibble(qs: int, r: int) -> Expr:
    # run r = 2 c + h: weights 64 c + 32 h + l are qs[32 c + l] >> 4 h
    return bits(byte(lane(qs + 32 * (r // 2))), 4 * (r % 2), 15)


def _k_scale(r: int) -> Expr:
    return mul(half(0), f32(_k4_scale_min(4, r)[0]))


def _k_offset(r: int) -> Expr:
    return neg(mul(half(2), f32(_k4_scale_min(4, r)[1])))


def _q5k_code(r: int) -> Expr:
    high = bits(byte(lane(16)), r, 1)
    return i32(bor(_k4_nibble(48, r), shl(high, 4)))


def _q6_code(r: int) -> Expr:
    # weight 16 r + l = 128 n + 32 s + l': ql[64 n + 32 (s % 2) + l'] >> 4 (s // 2) and
    # qh[128 + 32 n + l'] >> 2 s, minus 32
    n, s, h = r // 8, (r % 8) // 2, r % 2
    lp = 16 * h
    low = bits(byte(lane(64 * n + 32 * (s % 2) + lp)), 4 * (s // 2), 15)
    high = bits(byte(lane(128 + 32 * n + lp)), 2 * s, 3)
    return minus(i32(bor(low, shl(high, 4))), 32)


def _q6_scale(r: int) -> Expr:
    sc = ex.Bitcast(byte(192 + r), ScalarType(dt.i8))
    return mul(half(208), f32(sc))


K_QUANTS = (
    BlockType("Q2_K", 10, 256, 84, 16,
              code=_q2_code,
              scale=lambda r: mul(half(80), f32(bits(byte(r), 0, 15))),
              offset=lambda r: neg(mul(half(82), f32(bits(byte(r), 4, 15)))),
              wide=lambda c: _q2_code(2 * c)),
    BlockType("Q3_K", 11, 256, 110, 16, code=_q3_code, scale=_q3_scale, offset=lambda r: None,
              wide=lambda c: _q3_code(2 * c)),
    BlockType("Q4_K", 12, 256, 144, 32,
              code=lambda r: i32(_k4_nibble(16, r)), scale=_k_scale, offset=_k_offset,
              wide=lambda c: i32(_k4_nibble(16, c))),
    BlockType("Q5_K", 13, 256, 176, 32, code=_q5k_code, scale=_k_scale, offset=_k_offset,
              wide=_q5k_code),
    BlockType("Q6_K", 14, 256, 210, 16, code=_q6_code, scale=_q6_scale, offset=lambda r: None,
              wide=lambda c: _q6_code(2 * c)),
)

#: Every block type, by name.
BLOCK_TYPES: dict[str, BlockType] = {t.name: t for t in LEGACY + K_QUANTS}


def block_type(name: str) -> BlockType:
    """The `BlockType` called `name`; ValueError naming the supported ones otherwise."""
    try:
        return BLOCK_TYPES[name]
    except KeyError:
        raise ValueError(f"unknown block type {name!r}; supported: {', '.join(BLOCK_TYPES)}") from None


def block_loads(e: Expr) -> list[ex.Load]:
    """The loads of `BLOCK` in `e`."""
    return [n for n in ex.walk(e) if isinstance(n, ex.Load) and n.buffer == BLOCK]


def f16_offsets(bt: BlockType) -> list[int]:
    """Byte offsets of the block's float16 fields (its scales `d`, `dmin`, `m`): where a writer
    of random test blocks must put finite values."""
    found: set[int] = set()
    for r in range(bt.runs):
        for e in (bt.scale(r), bt.offset(r)):
            for node in ex.walk(e) if e is not None else ():
                if isinstance(node, ex.Bitcast) and node.type.dtype == dt.f16:
                    found.add(min(int(ld.index[0].value) for ld in block_loads(node)))  # type: ignore[attr-defined]
    return sorted(found)
