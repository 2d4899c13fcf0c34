"""The decode `qlinear` kernel for weights in ggml blocks with int8 activations: the file's
blocks read as they are, 32 codes at a time, byte dot products, scales applied as integers.

`qlinear_blocks`' f32 form converts every code to float and spends a scalar scale (and
offset) per run of 16 weights: bound by instructions at 2.5-5 GB/s where the int4 kernel
streams at memory speed. Here x is quantized once per call to i8 per block (`qlinear_i8`'s
`quantize_x`: symmetric, round half to even, `d_x` per block of 32 or 256, llama.cpp's
Q8_0 / Q8_K), and per block of the weight, from the block table (`ir/qblocks.py`):

- `wide(c)`: the 32 codes of weights `32 c .. 32 c + 31` as one byte vector, `u(c) - bias`
  (`u` unsigned, below 64: the `dot4_u8i8_acc` operand, `pmaddubsw` without saturation too);
- `scale(r) = F * s_r` split into the block's float `F` (`d`) and the run's integer `s_r`
  (K-quants' 4-, 6- or 8-bit sub-block scales; 1 for the legacy blocks);
- `offset(r) = -F2 * m_r` (K-quant mins) or `F2` (Q4_1 / Q5_1's min), or none.

    xq[r, :], d_x[r, B] = quantize(x[r, :]) per block B;  qs[r, k / 4] = sum xq[r, k .. k + 3]
    parallel for n in 0..N                                   one weight row per step
      f[r] = 0                                               f32 x 8
      for B in 0..K / block
        i[r] = 0;  o[r] = 0                                  i32 x 8
        for c in 0..block / 32                               (unrolled)
          u = wide(c)                                        u8 x 32, from the row's bytes
          t = dot4_u8i8_acc(-bias * qs[r, B block / 4 + 8 c ..], u, xq[r, B block + 32 c ..])
          i[r] += t * [s_2c x 4 lanes, s_2c+1 x 4 lanes]     (runs of 32: one scale)
          o[r] += qs[r, ..] * [m_2c x 4, m_2c+1 x 4]         (offsets; Q4_1/Q5_1: qs alone)
        f[r] = fma(f32(i[r]), F d_x[r, B], f[r]);  f[r] = fma(f32(o[r]), -+F2 d_x[r, B], f[r])
      y[r, n] = epilogue(vreduce_add(f[r]))

`sum_k (F s (u_k - bias)) x_k` with `x_k = d_x xq_k` is `F d_x s (sum u xq - bias sum xq)`:
integer sums and products are exact (a lane of `i` is at most 8 x 4 x 32 x 127 x 128, below
2^24, so its conversion too), so against the dequantized weight the only error is x's
rounding to 8 bits and the f32 products `F d_x` -- the same as `qlinear_i8`'s int4 kernel.
The bias enters as the dot product's initial value (`-bias qs`, four elements of x summed per
lane in the same order as the dot's), costing a load instead of a zero.

The code vector is the table's expression vectorized over 32 lanes (`instantiate`): unit
stride byte loads (`%q[n, B nbytes + o + ramp(0, 1, 32)]`), except the legacy blocks'
nibble halves and fifth bits (`%blk[o + l % 16]`, `%blk[o + l // 8]`), which codegen reads
as one load of the few bytes and a byte shuffle (`codegen/llvm/memory.py`, `lane_pattern`).
The run scales of a chunk are one such pattern where the runs' expressions differ only by
byte offsets (`lane_runs`: Q6_K's `i8(%blk[192 + 2 c + l // 4])`), else blended by lane.

**512-bit dot products** (where `vpdpbusd` on 16 lanes is one instruction), two ways, both
read from the table: the legacy blocks go two to a dot product (`pack`: block `b + j`'s
codes in lanes `32 j ..`, its byte offsets moved by `j nbytes`: `packed_code`), their float
scales blended into lane segments; a K-quant's chunks c and c + 4 go together where
`wide(c + 4)` is `wide(c)` with byte offsets moved (`pair`: Q2_K, Q4_K, Q6_K, whose two
halves of 128 weights read the same shifts of other bytes: `paired_codes`), x quantized in
the matching order (chunks [0, 4, 1, 5, 2, 6, 3, 7] of each block: `x_position`). Q6_K then
costs per block four code vectors (two loads of `ql` halves, one of `qh`, a shift, two
masks merged by `vpternlogq`), four dot products, four scale patterns (a load, a shuffle, a
sign extension) and integer multiply-adds, and one conversion and fma: 57 instructions per
210 bytes (95 with 256-bit chunks; the f32 form spent about 600); Q5_0 25 per two blocks.

Used for kind "blocks" at M below the panel kernel's rows (decode, small batches), and at
any M with the form "rows" (batch invariance), where the table gives `wide` and the integer
split, MR rows of x fit its stack buffers (`MAX_XQ_BYTES` for xq, qs and xc together; more
rows run a block at a time, as `qlinear_i8`'s) and the target has a byte dot product on 8
i32 lanes (or activations "int8" is asked for); else `qlinear_blocks`' f32 form. Before (tensor IR) and after (loop IR, abridged):

    %0 = qlinear(%x, %q) {kind = "blocks", block_type = "Q6_K", group_size = 256, ...} : f32[1, 2048]

    parallel for w in 0..2048 { for B in 0..32 {
      let u0 = cast<i32>((%q[w, B 210 + ramp(0, 1, 32)] & 15) | ((%q[w, B 210 + 128 + ramp(0, 1, 32)] & 3) << 4))
      let t0 = dot4_u8i8_acc(%xc[0, ramp(B 64, 1, 8)], u0, %xq[0, ramp(B 256, 1, 32)]) ... }}
    (kernel attribute `qlinear = "blocks-i8 block=Q6_K mr=1 ..."`)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType
from ...ir.qblocks import BLOCK, LANE, WIDE, BlockType, block_type
from ..loopgen.matmul import MIN_PARALLEL_FLOPS, CpuInfo, static_int
from .qlinear import MR_ROWS, QLinear
from .qlinear_blocks import ByteAt, instantiate
from .qlinear_i8 import MAX_XQ_BYTES, Q8Builder, Q8Plan, _dot4, block_rows, lane_segments

if TYPE_CHECKING:
    from ...ir.tensor import Op
    from ..loopgen.kernel_builder import KernelBuilder

F32 = ScalarType(dt.f32)
I32 = ScalarType(dt.i32)
#: i32 lanes of one dot product of WIDE bytes.
LANES = WIDE // 4
#: Codes below this: `pmaddubsw`'s pair sums stay below 2^15 with x in [-127, 127].
MAX_CODE = 64


@dataclass(frozen=True)
class Split:
    """The int8 kernel's reading of one block type: `code(c) = u(c) - bias` per chunk of WIDE
    weights, `scale(r) = F s_r`, `offset(r) = sign F2 m_r` (module docstring). `s(r)`, `m(r)`
    are i32 expressions or None (1: one float per block); `offset_factor` None: no offsets."""

    bt: BlockType
    bias: int
    factor: Expr
    offset_factor: Optional[Expr]
    offset_sign: float

    def code(self, c: int) -> Expr:
        return _split_code(self.bt.wide(c))[0]  # type: ignore[misc]

    def s(self, r: int) -> Optional[Expr]:
        return _split_product(self.bt.scale(r))[1]

    def m(self, r: int) -> Optional[Expr]:
        off = self.bt.offset(r)
        return None if off is None else _split_product(_unneg(off)[0])[1]


def _split_code(e: Expr) -> tuple[Expr, int]:
    """`i32(u) - c` or `i32(u)` -> (u, c) with u an unsigned byte expression."""
    bias = 0
    if isinstance(e, ex.Binary) and e.op == "sub" and isinstance(e.b, Const):
        e, bias = e.a, int(e.b.value)
    if not (isinstance(e, ex.Cast) and e.dtype == dt.i32 and e.value.dtype == dt.u8):
        raise ValueError(f"code {e} is not an unsigned byte expression minus a constant")
    return e.value, bias


def _split_product(e: Expr) -> tuple[Expr, Optional[Expr]]:
    """`F * f32(s)` -> (F, i32(s)); a float alone -> (F, None)."""
    if isinstance(e, ex.Binary) and e.op == "mul" and isinstance(e.b, ex.Cast) and e.b.value.dtype.is_int:
        return e.a, ex.cast(e.b.value, dt.i32)
    return e, None


def _unneg(e: Expr) -> tuple[Expr, float]:
    if isinstance(e, ex.Call) and e.name == "neg":
        return e.args[0], -1.0
    return e, 1.0


def split(bt: BlockType) -> Optional[Split]:
    """The block type's `Split`, or None where its expressions do not have the forms above
    (no `wide`, signed codes as Q8_0's, floats that differ by run)."""
    if bt.wide is None or bt.block % WIDE:
        return None
    try:
        biases = {_split_code(bt.wide(c))[1] for c in range(bt.block // WIDE)}
        factors = [_split_product(bt.scale(r)) for r in range(bt.runs)]
        offsets = [bt.offset(r) for r in range(bt.runs)]
    except ValueError:
        return None
    if len(biases) != 1 or any(f[0] != factors[0][0] for f in factors):
        return None
    if any(f[1] is None for f in factors) and any(f[1] is not None for f in factors):
        return None
    offset_factor, sign = None, 1.0
    if offsets[0] is not None:
        parts = [_unneg(o) for o in offsets if o is not None]
        if len(parts) != len(offsets) or len({p[1] for p in parts}) != 1:
            return None
        heads = [_split_product(p[0]) for p in parts]
        if any(h[0] != heads[0][0] for h in heads):
            return None
        offset_factor, sign = heads[0][0], parts[0][1]
    return Split(bt, biases.pop(), factors[0][0], offset_factor, sign)


@dataclass(frozen=True)
class BlocksI8Plan(Q8Plan):
    """`Q8Plan` (MR rows of x, one weight row, x quantized per block) naming the block type."""

    block_type: str = ""
    #: K-quants: chunks c and c + chunks / 2 of a block taken by one 512-bit dot product (x
    #: reordered to match, see `BlocksI8Builder.x_position`).
    pair: bool = False

    def describe(self) -> str:
        pack = f" pack={self.pack}" if self.pack > 1 else " pair=yes" if self.pair else ""
        return (f"blocks-i8 block={self.block_type} mr={self.mr} nr={self.nr} act=int8 chunk={self.chunk}{pack} "
                f"parallel={'yes' if self.parallel else 'no'}")


def plain_columns(q_load: ex.Load, k_var: ex.Var) -> bool:
    """Whether the weight's byte column is an index of its own (`%q[n, k]`): the byte patterns
    of the legacy blocks are built on it."""
    return any(isinstance(i, ex.Var) and i.name == k_var.name for i in q_load.index)


def plan_blocks_i8(ql: QLinear, m: Optional[int], cpu: CpuInfo, choice: str) -> Optional[BlocksI8Plan]:
    """The plan, or None to keep the f32 form: activations "f32", M unknown, x too large for
    its stack buffers, a block type without a `Split`, or ("auto") no byte dot product on 8
    lanes on the target (native, or `pmaddubsw`: the codes are below 64)."""
    k = static_int(ql.k)
    if ql.kind != "blocks" or choice == "f32" or k is None or (m is None and ql.form != "rows"):
        return None
    # x's bytes and its two i32 sums of four (xq, qs, xc: 3 rows x K bytes) are stack buffers
    rows = block_rows(m, k, MAX_XQ_BYTES // 3)
    if rows is None:
        return None
    bt = block_type(ql.block_type)
    if k % bt.block or split(bt) is None:
        return None
    if choice == "auto" and LANES not in (cpu.dot4_lanes | cpu.small_dot4_lanes):
        return None
    mr = MR_ROWS if m is None else 1 if m <= 1 else min(m, MR_ROWS)
    n = static_int(ql.n)
    flops = 2.0 * (max(m, 1) if m is not None else 1 << 10) * (n if n is not None else 1 << 20) * k
    # legacy blocks (one chunk, one scale): two to a 512-bit dot product where it is one instruction
    wide = 2 * LANES in cpu.dot4_lanes
    pack = 2 if bt.block == WIDE and wide and k // bt.block >= 2 else 1
    pair = wide and bt.block > WIDE and paired_codes(bt) is not None
    return BlocksI8Plan(mr, 1, rows, bt.block, WIDE, cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS, pack,
                        bt.name, pair)


class BlocksI8Builder(Q8Builder):
    """Builds the nest of the module docstring for one `BlocksI8Plan`."""

    plan: BlocksI8Plan  # type: ignore[assignment]

    @property
    def packed(self) -> int:
        return self.groups

    def permuted(self) -> bool:
        return self.plan.pair

    def x_runs(self) -> list[tuple[int, int, bool, tuple[int, int]]]:
        """Every block in one run, reordered (`x_position`) when the plan pairs chunks."""
        return [(0, self.groups, self.plan.pair, (0, 0))]

    def x_position(self, g: Expr, offset: Expr, run: tuple[int, int] = (0, 0)) -> Expr:
        """Where element `offset` of block `g` sits in the quantized x: in x's order, or for a
        paired plan with chunk t of 32 (of 2h) at position `2 (t % h) + t // h`, so that the
        chunks c and c + h one dot product takes are contiguous (the order is the plan's
        alone: `run`, the pack runs of `Q8Builder`, is always the whole row here):

            Q6_K (h = 4): chunks [0, 4, 1, 5, 2, 6, 3, 7]"""
        bt = block_type(self.plan.block_type)
        base = ex.mul(g, Const(bt.block))
        if not self.plan.pair:
            return ex.add(base, offset)
        h = bt.block // WIDE // 2
        t = ex.floordiv(offset, Const(WIDE))
        slot = ex.add(ex.mul(ex.mod(t, Const(h)), Const(2)), ex.floordiv(t, Const(h)))
        return ex.add(base, ex.add(ex.mul(slot, Const(WIDE)), ex.mod(offset, Const(WIDE))))

    def row_bytes(self, n: Expr, block: Expr) -> ByteAt:
        """`byte_at` for weight row `n` and block `block`: a scalar byte, WIDE consecutive
        bytes, or (a vector offset) the bytes at those offsets."""
        bt = block_type(self.plan.block_type)
        base = ex.mul(block, Const(bt.nbytes))

        def at(offset: Expr, lanes: int) -> Expr:
            if offset.type.lanes > 1:
                it = ScalarType(dt.index, offset.type.lanes)
                col = ex.Binary("add", ex.Broadcast(base, it), offset, it)
                index = tuple(col if (isinstance(i, ex.Var) and i.name == self.k_var.name)
                              else ex.substitute(i, {self.n_var.name: n}) for i in self.q_load.index)
                return ex.Load(self.q_load.buffer, index, ScalarType(dt.u8, offset.type.lanes))
            col = ex.add(base, offset)
            if lanes == 1:
                index = tuple(ex.substitute(i, {self.n_var.name: n, self.k_var.name: col})
                              for i in self.q_load.index)
                return self.kb.bind(ex.Load(self.q_load.buffer, index, ScalarType(dt.u8)), "qb")
            return self.q_bytes(n, col, lanes)

        return at

    def build_rows(self) -> lp.Stmt:
        kb, plan, ql = self.kb, self.plan, self.ql
        bt = block_type(plan.block_type)
        sp = split(bt)
        assert sp is not None
        k = static_int(ql.k)
        assert k is not None
        kb.push()
        xq = self.buffer("xq", dt.i8, (plan.rows, k))
        xd = self.buffer("xd", dt.f32, (plan.rows, k // plan.agroup))
        xs = self.buffer("xs", dt.f32, (plan.rows, k // plan.agroup))
        self.quantize_x(xq, xd, xs)
        qs = self.quad_sums(xq, k)
        xc = self.quad_sums(xq, k, -sp.bias) if sp.bias else None
        item, n0, ns, tile, ib, i0, rows = self.open_tiles()
        blocks = k // bt.block
        p = plan.pack
        widths = [p] + ([1] if p > 1 and blocks % p else [])
        widths = [2] if plan.pair else widths
        facc = {w: [self.local("acc", (LANES * w,)) for _ in range(plan.mr)] for w in widths}
        for w, accs in facc.items():
            for a in accs:
                kb.emit(lp.Store(a.name, (self.lane(LANES * w),), ex.const(0.0, dt.f32, LANES * w)))
        if p > 1:
            b = self.var("b")
            kb.push()
            self.packed_step(sp, ex.mul(b, Const(p)), rows, ns, facc[p], xq, xd, qs, xc)
            self.loop(b, Const(blocks // p), kb.pop())
        first = blocks // p * p if p > 1 else 0
        if blocks > first and plan.pair:
            b = self.var("b")
            kb.push()
            self.paired_step(sp, b, rows, ns, facc[2], xq, xd, qs, xc)
            self.loop(b, Const(blocks), kb.pop())
        elif blocks > first:
            b = self.var("b")
            kb.push()
            self.block_step(sp, ex.add(b, Const(first)) if first else b, rows, ns, facc[1], xq, xd, qs, xc)
            self.loop(b, Const(blocks - first), kb.pop())
        for r in range(plan.mr):
            total: Optional[Expr] = None
            for w, accs in facc.items():
                vt = ScalarType(dt.f32, LANES * w)
                part = ex.VectorReduce("add", ex.Load(accs[r].name, (self.lane(LANES * w),), vt), F32)
                total = part if total is None else ex.Binary("add", total, part, F32)
            assert total is not None
            kb.emit(lp.Store(tile.name, (Const(r), Const(0)), total))
        kb.emit(self.close_tiles(tile, item, ib, i0, n0))
        return kb.pop()

    def block_step(self, sp: Split, b: Expr, rows: list[Expr], ns: list[Expr], facc: list[lp.Buffer],
                   xq: lp.Buffer, xd: lp.Buffer, qs: lp.Buffer, xc: Optional[lp.Buffer]) -> None:
        """Block `b` of weight row `ns[0]` into `facc` (the nest of the module docstring): one
        dot product of 32 bytes per chunk, i32 and f32 accumulators of 8 lanes."""
        bt = sp.bt
        chunks = [(sp.code(c), [(c * WIDE + j) // bt.run for j in range(0, WIDE, bt.run)], c * WIDE)
                  for c in range(bt.block // WIDE)]
        self.chunk_dots(sp, b, rows, ns[0], facc, xq, xd, qs, xc, LANES, chunks)

    def paired_step(self, sp: Split, b: Expr, rows: list[Expr], ns: list[Expr], facc: list[lp.Buffer],
                    xq: lp.Buffer, xd: lp.Buffer, qs: lp.Buffer, xc: Optional[lp.Buffer]) -> None:
        """`block_step` with chunks c and c + h (h = chunks / 2) in one dot product of 64
        bytes (`paired_codes`; x reordered by `x_position`), i32 and f32 accumulators of 16
        lanes."""
        bt = sp.bt
        codes = paired_codes(bt)
        assert codes is not None
        h = bt.block // WIDE // 2
        chunks = [(_split_code(codes[c])[0], [(cc * WIDE + j) // bt.run for cc in (c, c + h)
                                              for j in range(0, WIDE, bt.run)], c * 2 * WIDE)
                  for c in range(h)]
        self.chunk_dots(sp, b, rows, ns[0], facc, xq, xd, qs, xc, 2 * LANES, chunks)

    def chunk_dots(self, sp: Split, b: Expr, rows: list[Expr], n: Expr, facc: list[lp.Buffer],
                   xq: lp.Buffer, xd: lp.Buffer, qs: lp.Buffer, xc: Optional[lp.Buffer], lanes: int,
                   chunks: list[tuple[Expr, list[int], int]]) -> None:
        """Block `b` of weight row `n` into `facc`, one dot product of `4 lanes` bytes per
        chunk `(code, runs of its lanes, first k in the block)`: integer sums per block (scaled
        by the runs' integer scales, the mins' sums beside them), then one `fma` per row by the
        block's float factor times x's scale."""
        kb, plan = self.kb, self.plan
        lane = self.lane(lanes)
        vt, it = ScalarType(dt.f32, lanes), ScalarType(dt.i32, lanes)
        at = self.row_bytes(n, b)
        iacc = [self.buffer("iacc", dt.i32, (lanes,)) for _ in range(plan.mr)]
        oacc = [self.buffer("oacc", dt.i32, (lanes,)) for _ in range(plan.mr)] \
            if sp.offset_factor is not None else []
        for a in iacc + oacc:
            kb.emit(lp.Store(a.name, (lane,), ex.const(0, dt.i32, lanes)))
        per_run = sp.bt.run // 4  # i32 lanes of one run
        for code_at, runs, first in chunks:
            code = kb.bind(instantiate(code_at, at, Const(0), 4 * lanes), "u")
            scale = self.lane_ints([sp.s(r) for r in runs], at, per_run, lanes)
            mins = self.lane_ints([sp.m(r) for r in runs], at, per_run, lanes) if oacc else None
            k0 = ex.add(ex.mul(b, Const(sp.bt.block)), Const(first))
            for r in range(plan.mr):
                q4 = ex.Ramp(ex.floordiv(k0, Const(4)), Const(1), ScalarType(dt.index, lanes))
                init = ex.const(0, dt.i32, lanes) if xc is None else ex.Load(xc.name, (rows[r], q4), it)
                t = _dot4(init, code, self.x_bytes(xq, rows[r], k0, 4 * lanes))
                if scale is not None:
                    t = ex.Binary("mul", t, scale, it)
                cur = ex.Load(iacc[r].name, (lane,), it)
                kb.emit(lp.Store(iacc[r].name, (lane,), ex.Binary("add", cur, t, it)))
                if oacc:
                    o: Expr = ex.Load(qs.name, (rows[r], q4), it)
                    if mins is not None:
                        o = ex.Binary("mul", o, mins, it)
                    cur = ex.Load(oacc[r].name, (lane,), it)
                    kb.emit(lp.Store(oacc[r].name, (lane,), ex.Binary("add", cur, o, it)))
        f = kb.bind(instantiate(sp.factor, at, Const(0)), "d")
        f2 = None if sp.offset_factor is None else kb.bind(
            ex.Binary("mul", instantiate(sp.offset_factor, at, Const(0)), Const(sp.offset_sign, F32), F32), "dm")
        for r in range(plan.mr):
            dx = kb.bind(ex.Load(xd.name, (rows[r], b), F32), "dx")
            cur = ex.Load(facc[r].name, (lane,), vt)
            total = ex.Call("fma", (ex.cast(ex.Load(iacc[r].name, (lane,), it), dt.f32),
                                    ex.Broadcast(ex.Binary("mul", f, dx, F32), vt), cur), vt)
            if f2 is not None:
                total = ex.Call("fma", (ex.cast(ex.Load(oacc[r].name, (lane,), it), dt.f32),
                                        ex.Broadcast(ex.Binary("mul", f2, dx, F32), vt), total), vt)
            kb.emit(lp.Store(facc[r].name, (lane,), total))

    def packed_step(self, sp: Split, b: Expr, rows: list[Expr], ns: list[Expr], facc: list[lp.Buffer],
                    xq: lp.Buffer, xd: lp.Buffer, qs: lp.Buffer, xc: Optional[lp.Buffer]) -> None:
        """Blocks `b .. b + P - 1` (one chunk each, one float scale each: the legacy blocks) by
        one dot product of P x 32 bytes: the codes of block `b + j` in lanes `32 j ..` (the
        table's `wide(0)` with its byte offsets moved by `j nbytes`, one lane pattern), the
        blocks' scales blended into lane segments."""
        kb, plan, bt = self.kb, self.plan, sp.bt
        p = plan.pack
        lanes = LANES * p
        lane = self.lane(lanes)
        vt, it = ScalarType(dt.f32, lanes), ScalarType(dt.i32, lanes)
        at = self.row_bytes(ns[0], b)
        code = kb.bind(instantiate(packed_code(sp.code(0), bt.nbytes), at, Const(0), WIDE * p), "u")
        k0 = ex.mul(b, Const(bt.block))
        q4 = ex.Ramp(ex.floordiv(k0, Const(4)), Const(1), ScalarType(dt.index, lanes))
        blocks = [self.row_bytes(ns[0], ex.add(b, Const(j)) if j else b) for j in range(p)]
        fs = [kb.bind(instantiate(sp.factor, a, Const(0)), "d") for a in blocks]
        f2s = [] if sp.offset_factor is None else [kb.bind(
            ex.Binary("mul", instantiate(sp.offset_factor, a, Const(0)), Const(sp.offset_sign, F32), F32), "dm")
            for a in blocks]
        for r in range(plan.mr):
            init = ex.const(0, dt.i32, lanes) if xc is None else ex.Load(xc.name, (rows[r], q4), it)
            t = _dot4(init, code, self.x_bytes(xq, rows[r], k0, WIDE * p))
            dxs = [kb.bind(ex.Load(xd.name, (rows[r], ex.add(b, Const(j)) if j else b), F32), "dx") for j in range(p)]
            cur = ex.Load(facc[r].name, (lane,), vt)
            scale = lane_segments([ex.Binary("mul", f, dx, F32) for f, dx in zip(fs, dxs)], lanes)
            total = ex.Call("fma", (ex.cast(t, dt.f32), scale, cur), vt)
            if f2s:
                offs = lane_segments([ex.Binary("mul", f, dx, F32) for f, dx in zip(f2s, dxs)], lanes)
                total = ex.Call("fma", (ex.cast(ex.Load(qs.name, (rows[r], q4), it), dt.f32), offs, total), vt)
            kb.emit(lp.Store(facc[r].name, (lane,), total))

    def x_bytes(self, xq: lp.Buffer, row: Expr, k0: Expr, width: int) -> Expr:
        return ex.Load(xq.name, (row, ex.Ramp(k0, Const(1), ScalarType(dt.index, width))), ScalarType(dt.i8, width))

    def lane_ints(self, values: list[Optional[Expr]], at: ByteAt, per_run: int,
                  lanes: int = LANES) -> Optional[Expr]:
        """The runs' integers (scales or mins) of one chunk (or chunk pair), run j's in lanes
        `j per_run ..` (one broadcast for a chunk of one run); None where they are all 1."""
        if all(v is None for v in values):
            return None
        if len(values) > 1 and all(v is not None for v in values):
            vector = lane_runs(values, per_run)  # type: ignore[arg-type]
            if vector is not None:
                return self.kb.bind(instantiate(vector, at, Const(0), lanes), "sv")
        got = [self.kb.bind(instantiate(v if v is not None else Const(1, I32), at, Const(0)), "s")
               for v in values]
        if len(got) == 1:
            return ex.Broadcast(got[0], ScalarType(dt.i32, lanes))
        assert lanes % len(got) == 0
        return self.kb.bind(_int_segments(got, lanes), "sv")


def _offset_deltas(a: Expr, b: Expr, out: list[int]) -> bool:
    """Whether `b` is `a` with the block byte offsets moved (constant offsets; the moves of
    `a`'s loads in `ex.walk` order appended to `out`)."""
    if type(a) is not type(b) or a.type != b.type:
        return False
    if isinstance(a, ex.Load):
        assert isinstance(b, ex.Load)
        (ca, ra), (cb, rb) = _constant_part(a.index[0]), _constant_part(b.index[0])
        if a.buffer != BLOCK or ra != rb:
            return False
        out.append(cb - ca)
        return True
    if isinstance(a, Const):
        return a == b
    if isinstance(a, ex.Binary) and a.op != b.op:  # type: ignore[attr-defined]
        return False
    if isinstance(a, ex.Call) and a.name != b.name:  # type: ignore[attr-defined]
        return False
    ka, kb_ = a.children(), b.children()
    return len(ka) == len(kb_) and all(_offset_deltas(x, y, out) for x, y in zip(ka, kb_))


def _constant_part(e: Expr) -> tuple[int, Optional[Expr]]:
    """An offset `c + rest` (or `c`) as (c, rest)."""
    if isinstance(e, Const):
        return int(e.value), None
    if isinstance(e, ex.Binary) and e.op == "add":
        if isinstance(e.a, Const):
            return int(e.a.value), e.b
        if isinstance(e.b, Const):
            return int(e.b.value), e.a
    return 0, e


def lane_runs(values: list[Expr], per_run: int) -> Optional[Expr]:
    """One expression of the lane for the runs' integers `values` (run j in lanes
    `j per_run ..`), where they differ only by byte offsets moving by the same step from run
    to run: Q6_K's scales `i8(%blk[192 + r])` for runs 2c, 2c + 1 ->
    `i8(%blk[192 + 2 c + l // 4])`, one load of two bytes and a shuffle after codegen. None
    otherwise."""
    moves: list[list[int]] = []
    for v in values:
        moved: list[int] = []
        if not _offset_deltas(values[0], v, moved):
            return None
        moves.append(moved)
    # segment j's move: linear in j, or (chunk pairs) linear within each half plus a jump
    half = len(values) // 2 if len(values) % 2 == 0 else len(values)
    step = [m for m in moves[1]] if len(values) > 1 else []
    jump = moves[half] if half < len(values) else [0] * len(step)
    for j, moved in enumerate(moves):
        if moved != [(j % half) * a + (j // half) * c for a, c in zip(step, jump)]:
            return None
    loads = iter(zip(step, jump))
    seg = ex.Binary("floordiv", LANE, Const(per_run), LANE.type)
    inner = ex.Binary("mod", seg, Const(half), LANE.type)
    outer = ex.Binary("floordiv", seg, Const(half), LANE.type)

    def move(e: Expr) -> Expr:
        if isinstance(e, ex.Load):
            a, c = next(loads)
            d = ex.Binary("add", ex.Binary("mul", inner, Const(a), LANE.type),
                          ex.Binary("mul", outer, Const(c), LANE.type), LANE.type)
            return ex.Load(BLOCK, (ex.Binary("add", e.index[0], d, LANE.type),), e.type)
        kids = tuple(move(c) for c in e.children())
        return _with_children(e, kids)

    return move(values[0])


def paired_codes(bt: BlockType) -> Optional[list[Expr]]:
    """For a block of 2h chunks, the codes of chunks c and c + h (c < h) as one expression of
    64 lanes, where `wide(c + h)` is `wide(c)` with its byte offsets moved (K-quants' two
    halves of 128 weights: Q6_K's `ql[l] & 15 | (qh[128 + l] & 3) << 4` and
    `ql[64 + l] & 15 | (qh[160 + l] & 3) << 4` -> offsets `+ (l // 32) 64`, `+ (l // 32) 32`
    with the lane taken modulo 32); None where a pair differs otherwise."""
    if bt.wide is None or bt.block % (2 * WIDE):
        return None
    h = bt.block // WIDE // 2
    out = []
    for c in range(h):
        a, b = bt.wide(c), bt.wide(c + h)
        moved: list[int] = []
        if not _offset_deltas(a, b, moved):
            return None
        out.append(_moved_by_half(a, moved))
    return out


def _moved_by_half(code: Expr, moves: list[int]) -> Expr:
    """`code` over 64 lanes: lane l reads as lane l % 32, each load `ex.walk`-th moved by
    `(l // 32) moves[i]`."""
    inner = ex.Binary("mod", LANE, Const(WIDE), LANE.type)
    half = ex.Binary("floordiv", LANE, Const(WIDE), LANE.type)
    it = iter(moves)

    def move(e: Expr) -> Expr:
        if isinstance(e, ex.Var) and e.name == LANE.name:
            return inner
        if isinstance(e, ex.Load):
            d = next(it)
            return ex.Load(BLOCK, (ex.Binary("add", move(e.index[0]),
                                             ex.Binary("mul", half, Const(d), LANE.type), LANE.type),), e.type)
        return _with_children(e, tuple(move(c) for c in e.children()))

    return move(code)


def packed_code(code: Expr, nbytes: int) -> Expr:
    """A block's code expression (lanes 0..WIDE) for lanes 0..P WIDE of P consecutive blocks:
    the lane taken modulo WIDE, every byte offset moved by `(l // WIDE) nbytes`:

        %blk[6 + l % 16]  ->  %blk[6 + (l % 32) % 16 + (l // 32) 22]       (Q5_0, P = 2)"""
    inner = ex.Binary("mod", LANE, Const(WIDE), LANE.type)
    step = ex.Binary("mul", ex.Binary("floordiv", LANE, Const(WIDE), LANE.type), Const(nbytes), LANE.type)

    def move(e: Expr) -> Expr:
        if isinstance(e, ex.Var) and e.name == LANE.name:
            return inner
        if isinstance(e, ex.Load):
            return ex.Load(BLOCK, (ex.Binary("add", move(e.index[0]), step, LANE.type),), e.type)
        return _with_children(e, tuple(move(c) for c in e.children()))

    return move(code)


def _with_children(e: Expr, kids: tuple[Expr, ...]) -> Expr:
    if not kids:
        return e
    if isinstance(e, ex.Binary):
        return ex.Binary(e.op, kids[0], kids[1], e.type)
    if isinstance(e, ex.Cast):
        return ex.Cast(kids[0], e.type)
    if isinstance(e, ex.Bitcast):
        return ex.Bitcast(kids[0], e.type)
    if isinstance(e, ex.Call):
        return ex.Call(e.name, kids, e.type)
    if isinstance(e, ex.Select):
        return ex.Select(kids[0], kids[1], kids[2], e.type)
    raise ValueError(f"block expression node {e!r} is not supported")


def _int_segments(values: list[Expr], lanes: int = LANES) -> Expr:
    """`lane_segments` for i32 values."""
    vt = ScalarType(dt.i32, lanes)
    out: Expr = ex.Broadcast(values[0], vt)
    seg = lanes // len(values)
    lane = ex.Ramp(Const(0, I32), Const(1, I32), vt)
    for j, v in enumerate(values[1:], start=1):
        cond = ex.Binary("ge", lane, ex.const(j * seg, dt.i32, lanes), ScalarType(dt.bool_, lanes))
        out = ex.Select(cond, ex.Broadcast(v, vt), out, vt)
    return out


def build_blocks_i8(kb: "KernelBuilder", root: "Op", qop: "Op", out: lp.Buffer, plan: BlocksI8Plan,
                    probes: tuple[ex.Load, ex.Load, ex.Var, ex.Var, ex.Var]) -> lp.Stmt:
    """The kernel computing `root` into `out` (`probes` as `qlinear._probes`)."""
    x_load, q_load, row, k, n = probes
    return BlocksI8Builder(kb, root, qop, out, plan, x_load, q_load, row, k, n).build()  # type: ignore[arg-type]
