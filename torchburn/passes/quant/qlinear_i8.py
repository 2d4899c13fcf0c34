"""The `qlinear` kernel with int8 activations: x quantized per group, byte dot products.

The f32 kernel of `qlinear.py` spends about eight vector instructions on every sixteen weights
(widen, convert, scale, multiply-add) and, at batch 1, is bound by instructions rather than
by memory. Here x is quantized once per call to i8 with one f32 scale per group (symmetric,
round to nearest even, `d_x = amax / 127`), the way llama.cpp's Q8 activations work, and the
inner loop multiplies bytes by bytes with `dot4_u8i8_acc` (one `vpdpbusd` with AVX512-VNNI:
four products per i32 lane), so a vector of packed weights costs a mask, a shift and two dot
products. Scales are applied once per group (A = `ax` elements of x, B bytes per dot):

    for r, G: xq[r, G A + t] = round(x[r, G A + t] / d_x[r, G]);  xs[r, G] = d_x[r, G] sum_t xq
    parallel for w in 0..cdiv(N, NR)
      for ib in 0..cdiv(M, MR)
        for G in 0..K / A
          i[r][c] = 0                                              i32 x B/4
          for ch:                                                   (unrolled when short)
            int4: b = %q[n_c, G h + ch B + 0..B]   (u8)
                  i = dot4(dot4(i, b & 15, xq[r, G g + ch B ..]), b >> 4, xq[r, G g + h + ch B ..])
            int8: i = dot4_i8i8(i, %q[n_c, G A + ch B ..], max(xq[r, G A + ch B ..], -127))
          f[r][c] = fma(f32(i), d_w[c, G] d_x[r, G], f[r][c])       f32 x B/4
          o[r][c] += coef[c, G] * xs[r, G]                          scalar (int4)
        y[r, c] = vreduce_add(f[r][c]) + K_off * o[r][c]

Groups are taken GROUP_BLOCK at a time where the scales are unit-stride loads: the block's
weight scales (and mins), `d_x` and `xs` are each one vector load and conversion
(`dwv = f32(%scales[n_c, ramp(G0, 1, 8)])`), `d_w d_x` goes to a local vector `ds` whose lane
`j` group `G0 + j` broadcasts, and `coef * xs` accumulates lane-wise in `offv` (reduced into
`o` after the loop). The groups left over go in smaller power-of-two blocks the same way
(18 groups: 16 in blocks of 8, then one block of 2), only a last odd one takes the scalar form
above (`segments`): 2 groups of 18 taken one by one had cost ~35% of the product.

**Packs.** A (half) group shorter than a vector register (int4 g32: 16 bytes, on AVX2's 32)
would leave half of every dot product's lanes idle, so P = vector bytes / B groups are taken
by one dot product (`pack`): the P groups' packed bytes are one load, and x is quantized in an
order where the bytes they multiply are one load too (each pack of P groups holds the P low
halves, then the P high halves; int8 weights keep x's order, their groups are contiguous):

    P = 2, g = 32 (h = 16):  b = %q[n, ramp(G h, 1, 32)]          groups G, G + 1
      i = dot4(dot4(0, b & 15, xq[r, ramp(G g, 1, 32)]), b >> 4, xq[r, ramp(G g + 32, 1, 32)])
      f = fma(f32(i), [d_G x 4 lanes, d_G+1 x 4 lanes], f)        scales blended by lane

so a group costs half the instructions. A block of fewer groups than P takes them as one
narrower pack (P = 4, 2 groups left: one pack of 2, x in that pack's order, an accumulator of
8 lanes); without vector scale loads, groups after the last whole pack keep x's order and the
single-group form (its own, narrower accumulators).

NR = 1: each step reads one weight row, so the weight is one sequential stream (four rows
side by side were four streams, which the hardware prefetchers follow badly: a 576 x 1536
weight took 2.5 times as long as a 1536 x 576 one of the same bytes). With several rows of x
(MR = 4), two weight rows per step would share x's loads, but x's bytes are a memory operand
of the dot product anyway and the per-(row, weight row) work (dot products, conversion,
scales, an accumulator each) is the same: at 4-16 rows one weight row per step was 5-15%
faster (8 accumulators and their scale vectors spill on 32 registers).

The int4 weight's offsets become the scalar `o`: the nibbles are unsigned codes `q` of
`d (q - 8)` (coef = d, K_off = -8) or `d q + m` (coef = m, K_off = 1), exactly the u8 operand of
the dot. Int8 weights take the signed dot `dot4_i8i8_acc` with x clamped to [-127, 127] (which
it is by construction; the clamp tells codegen, which then multiplies `|w|` by `sign(x, w)`
with `pmaddubsw` where there is no VNNI); per-channel scales multiply the finished sum.
Where `vpdpbusd` is native for every width used (`Q8Plan.offset_codes`, grouped int8 with one
chunk per group), the codes are read as the unsigned bytes `q + 128` (`q ^ 0x80`, once per
weight vector for all rows of x) and each dot starts from `xc = -128 * (sum of x's four
bytes)` per lane (`quad_sums`, once per call): the same integer sum, where the signed form
costs a sign fix-up of x per row and dot on 512-bit vectors (no `psignb`):

    xc[r, j] = -128 * (xq[r, 4j] + .. + xq[r, 4j + 3])
    i = dot4_u8i8(xc[r, G A/4 + 0..L], %q[n, G A + 0..4L] ^ 0x80, xq[r, G A + 0..4L])
Integer sums are exact, so the only approximation is x's rounding, well below the int4
weight's own error (docs/quantization.md has the figures).

Chunks of B = gcd(bytes per half group, vector bytes) never cross a group, a pack's loads
span its P whole groups, and x is quantized into a local buffer of exactly R x K bytes (packs
reordered within themselves), so no load leaves its buffer. Used when
B >= 16 and M is known (or 1 in the GEMV branch, or any M with the form "rows");
`plan_qlinear_i8` says when.

**Rows of x in blocks.** R is M where M x K bytes fit `MAX_XQ_BYTES`, else a multiple of MR
(M unknown: at most ROW_BLOCK): the nest then runs once per block of R rows, each quantizing
its rows into the same buffers (`Q8Builder.build`). Every (row of x, weight row) pair has its
own accumulators and the same sequence of operations whatever MR, R, M or the row's place:
a row's result is the same bits alone and beside others, which the form "rows" at every M
(TORCHBURN_QLINEAR_INVARIANT) relies on (docs/quantization.md, "Batch invariance").

    for mb in 0..cdiv(M, R)                   (only where M may exceed R)
      xq[0..R, :], d_x, xs = quantize(x[mb R .. mb R + R, :])
      parallel for w in 0..N  { the nest above over rows 0..min(R, M - mb R) }
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from ..loopgen.matmul import MIN_PARALLEL_FLOPS, CpuInfo, _cdiv_expr, _lanes_index, _Probe, static_int
from .qlinear import MAX_UNROLLED_CHUNKS, MR_ROWS, QLinear, QLinearBuilder, x_lanes_index

if TYPE_CHECKING:
    from ..loopgen.kernel_builder import KernelBuilder

F32 = ScalarType(dt.f32)
#: x is quantized into a stack buffer of M x K bytes; larger inputs keep f32 activations.
MAX_XQ_BYTES = 256 * 1024
#: Elements of x per scale for int8 weights whose groups are longer (per-channel scales).
INT8_ACT_GROUP = 128
#: Bytes per dot product at least (4 i32 lanes); shorter groups keep f32 activations.
MIN_CHUNK = 16
#: Bytes of x summed by one dot product of `quad_sums` (i32 sums of four bytes, 8 lanes).
XC_BYTES = 32
#: Rows of x per block where M is known only at run time (form "rows": every M takes this
#: kernel, see `Q8Builder.build`).
ROW_BLOCK = 64
#: Groups whose scales (and mins, and x's scales and sums) are read as one vector per block:
#: a scalar f16 scale costs a load, an insert and a conversion per group and weight row.
GROUP_BLOCK = 8


@dataclass(frozen=True)
class Q8Plan:
    """Blocking of the int8-activation kernel: MR x NR, `rows` of x quantized (a static bound
    on M), `agroup` elements of x per scale, `chunk` bytes per (half) group and dot product,
    and `pack` groups taken by one dot product together (1, or the vector's bytes over
    `chunk` when a (half) group is shorter than a vector register: see the module docstring)."""

    mr: int
    nr: int
    rows: int
    agroup: int
    chunk: int
    parallel: bool
    pack: int = 1
    #: int8 codes read as unsigned bytes `q + 128` (`q ^ 0x80`), the unsigned operand of a
    #: native `vpdpbusd`, each dot product started from `-128 * (sum of x's four bytes)` per
    #: lane (`xc`): the plain u8 x i8 dot, no per-row sign fix-up (see the module docstring).
    offset_codes: bool = field(default=False, kw_only=True)

    @property
    def lanes(self) -> int:
        """i32 (and f32) lanes of the accumulators of whole packs."""
        return self.chunk * self.pack // 4

    def describe(self) -> str:
        pack = f" pack={self.pack}" if self.pack > 1 else ""
        pack += " codes=u8" if self.offset_codes else ""
        return (f"mr={self.mr} nr={self.nr} act=int8 chunk={self.chunk}{pack} "
                f"parallel={'yes' if self.parallel else 'no'}")


def activation_group(ql: QLinear) -> int:
    """Elements of x sharing one scale: the weight's group (int4, and int8 groups up to 256),
    else a divisor of it (per-channel int8)."""
    if ql.kind == "int4" or ql.group <= 2 * INT8_ACT_GROUP:
        return ql.group
    return math.gcd(ql.group, INT8_ACT_GROUP)


def _pack(ql: QLinear, agroup: int, span: int, chunk: int, groups: int, vector_bytes: int,
          fast: frozenset[int], choice: str) -> int:
    """Groups per dot product: as many (half) groups as fill a vector register when one is
    shorter (at most GROUP_BLOCK, at most the groups there are), where the dot product on
    that many lanes is fast (or asked for)."""
    if chunk != span or agroup != ql.group or ql.per_channel or vector_bytes % span:
        return 1
    pack = min(vector_bytes // span, GROUP_BLOCK)
    while pack > 1 and (pack > groups or (choice == "auto" and chunk * pack // 4 not in fast)):
        pack //= 2
    return pack


def plan_qlinear_i8(ql: QLinear, m: Optional[int], cpu: CpuInfo, choice: str) -> Optional[Q8Plan]:
    """The plan for int8 activations, or None to keep f32 ones: `choice` "f32", M unknown, a
    group too short for a dot product of 16 bytes, x too large for its stack buffer, or
    ("auto") no fast dot product on the target: native (`cpu.dot4_lanes`), or `pmaddubsw`
    (`cpu.small_dot4_lanes`: int4's nibbles, and int8 by `|w| * sign(x, w)`). At batch 1 each step takes one weight row
    (NR = 1): its bytes are one sequential stream (several rows side by side are several
    streams, which the prefetchers follow badly: half the bandwidth or less when rows are long)."""
    k = static_int(ql.k)
    if choice == "f32" or k is None or (m is None and ql.form != "rows"):
        return None
    agroup = activation_group(ql)
    span = ql.group // 2 if ql.kind == "int4" else agroup
    vector_bytes = max(cpu.vector_bits // 8, MIN_CHUNK)
    chunk = math.gcd(span, vector_bytes)
    rows = block_rows(m, k, MAX_XQ_BYTES)
    if chunk < MIN_CHUNK or rows is None:
        return None
    fast = cpu.dot4_lanes | cpu.small_dot4_lanes
    if choice == "auto" and chunk // 4 not in fast:
        return None
    pack = _pack(ql, agroup, span, chunk, k // agroup, vector_bytes, fast, choice)
    mr = MR_ROWS if m is None else 1 if m <= 1 else min(m, MR_ROWS)
    nr = 1  # a second weight row per step shares x's loads but not the per-row work (below)
    n = static_int(ql.n)
    flops = 2.0 * (m if m is not None else 1 << 10) * (n if n is not None else 1 << 20) * k
    # One chunk per dot product's group (or pack), and `vpdpbusd` itself on every width used:
    # a u8 operand above 127 would saturate `pmaddubsw`'s pair sums.
    offset = (ql.kind == "int8" and chunk == span and k % XC_BYTES == 0
              and {chunk // 4, chunk * pack // 4, XC_BYTES // 4} <= cpu.dot4_lanes)
    return Q8Plan(mr, nr, rows, agroup, chunk, cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS, pack,
                  offset_codes=offset)


def block_rows(m: Optional[int], k: int, limit: int) -> Optional[int]:
    """Rows of x quantized at a time into a buffer of at most `limit` bytes per K bytes of a
    row: all M where they fit, else a multiple of MR_ROWS (the nest then runs once per block
    of rows, `Q8Builder.build`; M unknown: blocks of at most ROW_BLOCK); None where not even
    MR_ROWS rows fit."""
    fit = limit // k
    if m is not None and max(m, 1) <= fit:
        return max(m, 1)
    rows = min(fit, ROW_BLOCK) // MR_ROWS * MR_ROWS
    return rows if rows >= MR_ROWS else None


def _dot4(acc: Expr, a: Expr, b: Expr) -> Expr:
    name = ex.DOT4_U8I8 if a.dtype == dt.u8 else ex.DOT4_I8I8
    return ex.Call(name, (acc, a, b), acc.type)


def lane_segments(values: list[Expr], lanes: int) -> Expr:
    """A vector of `lanes` f32 whose consecutive segments of `lanes / len(values)` lanes hold
    `values[0]`, `values[1]`, ... (the scales of a pack's groups): broadcasts blended by lane
    (`select` on a constant lane mask, one blend or permute per group after the first)."""
    vt = ScalarType(dt.f32, lanes)
    out: Expr = ex.Broadcast(values[0], vt)
    if len(values) == 1:
        return out
    seg = lanes // len(values)
    lane = ex.Ramp(Const(0, ScalarType(dt.i32)), Const(1, ScalarType(dt.i32)), ScalarType(dt.i32, lanes))
    for j, v in enumerate(values[1:], start=1):
        cond = ex.Binary("ge", lane, ex.const(j * seg, dt.i32, lanes), ScalarType(dt.bool_, lanes))
        out = ex.Select(cond, ex.Broadcast(v, vt), out, vt)
    return out


class Q8Builder(QLinearBuilder):
    """Builds the nest of the module docstring for one `Q8Plan`."""

    plan: Q8Plan  # type: ignore[assignment]
    #: `-128 * sum of four bytes of xq` per row and lane (`Q8Plan.offset_codes`), else None.
    xc: Optional[lp.Buffer] = None
    _segments: Optional[list[tuple[int, int, int, int]]] = None

    def x_lanes(self, row: Expr, k0: Expr, lanes: int) -> Expr:
        """`lanes` elements of x's row `row` from column `k0`, in f32."""
        index = tuple(ex.substitute(i, {self.row_var.name: row}) for i in self.x_load.index)
        widened = x_lanes_index(index, self.k_var.name, k0, lanes)
        assert widened is not None
        return ex.cast(ex.Load(self.x_load.buffer, widened, ScalarType(self.ql.x.dtype, lanes)), dt.f32)

    def q_bytes(self, n: Expr, col: Expr, width: int) -> Expr:
        """`width` bytes of weight row `n` from byte column `col`."""
        index = tuple(ex.substitute(i, {self.n_var.name: n}) for i in self.q_load.index)
        widened = _lanes_index(index, self.k_var.name, col, width)
        assert widened is not None
        return ex.Load(self.q_load.buffer, widened, ScalarType(self.ql.q.dtype, width))

    def loop(self, var: Var, extent: Expr, body: lp.Stmt) -> None:
        self.kb.emit(lp.For(var, Const(0), extent, "serial", body))

    @property
    def groups(self) -> int:
        k = static_int(self.ql.k)
        assert k is not None
        return k // self.plan.agroup

    @property
    def packed(self) -> int:
        """Groups inside whole packs (x's bytes reordered there for int4, see `x_position`)."""
        return self.groups // self.plan.pack * self.plan.pack

    def permuted(self) -> bool:
        return self.plan.pack > 1 and self.ql.kind == "int4"

    def x_position(self, g: Expr, offset: Expr, run: tuple[int, int] = (0, 0)) -> Expr:
        """Where element `offset` of group `g` sits in the quantized x: in x's order, except
        for int4 in whole packs of P groups, which hold the P groups' low halves, then their
        high halves, so that the P * h bytes one vector of packed weight bytes multiplies by
        (its low nibbles: the P groups' low halves) are one contiguous load:

            pack of groups 2p, 2p + 1 (g32, h = 16): [x[64p + 0..16], x[64p + 32..48],
                                                       x[64p + 16..32], x[64p + 48..64]]

        `run` (first group, P) is the run of packs `g` is in (`segments`; P = 0: the plan's
        pack from group 0)."""
        ag = self.plan.agroup
        if not self.permuted():
            return ex.add(ex.mul(g, Const(ag)), offset)
        first, p = run[0], run[1] or self.plan.pack
        local = ex.sub(g, Const(first)) if first else g
        h = ag // 2
        half, t = ex.floordiv(offset, Const(h)), ex.mod(offset, Const(h))
        start = ex.add(ex.mul(ex.floordiv(local, Const(p)), Const(p * ag)), Const(first * ag))
        return ex.add(ex.add(start, ex.mul(half, Const(p * h))), ex.add(ex.mul(ex.mod(local, Const(p)), Const(h)), t))

    def x_runs(self) -> list[tuple[int, int, bool, tuple[int, int]]]:
        """`(first group, end, permuted, run)` of `quantize_x`: int4 packs by `segments`."""
        if not self.permuted():
            return [(0, self.groups, False, (0, 0))]
        return [(g0, g0 + count, pack > 1, (g0, pack)) for g0, count, pack, _ in self.segments()]

    def segments(self) -> list[tuple[int, int, int, int]]:
        """Runs `(first group, groups, P, U)` covering the groups in order: P groups per dot
        product, and U groups per step with their scales read as U-lane vectors
        (`group_block`; 0: one pack per step, scales read one by one). Where the scales are
        unit-stride loads: blocks of GROUP_BLOCK, then the rest in power-of-two blocks (18
        groups, P = 4: 16 in blocks of 8 by packs of 4, then 2 as one pack of 2), the last odd
        group alone; else whole packs, then single groups. Tails of narrower packs keep the
        scales vector loads and the lanes filled (single groups with scalar scales cost several
        times a block's group: 576 = 18 groups of 32 took 1.5x the time of 512)."""
        if self._segments is None:
            self._segments = self._plan_segments()
        return self._segments

    def _plan_segments(self) -> list[tuple[int, int, int, int]]:
        groups, p = self.groups, self.plan.pack
        if self.scale_probes() is None:
            runs = [(0, self.packed, p, 0)] if self.packed else []
            return runs + ([(self.packed, groups - self.packed, 1, 0)] if groups > self.packed else [])
        blocks = groups // GROUP_BLOCK
        runs = [(0, blocks * GROUP_BLOCK, p, GROUP_BLOCK)] if blocks else []
        g = blocks * GROUP_BLOCK
        while g < groups:
            u = 1 << ((groups - g).bit_length() - 1)
            runs.append((g, u, min(p, u), u if u > 1 else 0))
            g += u
        return runs

    # ---- x -> (xq, d_x, xs) ------------------------------------------------------------------
    def quantize_x(self, xq: lp.Buffer, xd: lp.Buffer, xs: lp.Buffer) -> None:
        """`xq[r, :]` (`x_position`'s order), `xd[r, G]` (scale) and, for int4, `xs[r, G]`
        (scale * sum of xq) for every row."""
        kb, ql, plan = self.kb, self.ql, self.plan
        lanes = math.gcd(plan.agroup // 2 if self.permuted() else plan.agroup, 16)
        r = self.var("r")
        kb.push()
        for lo, hi, permuted, run in self.x_runs():
            if hi > lo:
                gv = self.var("g")
                kb.push()
                self.quantize_group(r, ex.add(gv, Const(lo)) if lo else gv, lanes, permuted, xq, xd, xs,
                                    src_row=ex.add(self.row_base, r), run=run)
                self.loop(gv, Const(hi - lo), kb.pop())
        # M may be below the static bound (the GEMV branch of a symbolic M, M = 0).
        self.loop(r, ex.minimum(Const(plan.rows), self.rows_m), kb.pop())

    def quantize_block(self, base: Expr, here: Expr, groups: int, xq: lp.Buffer, xd: lp.Buffer,
                       xs: lp.Buffer, sums: bool) -> None:
        """Rows `base .. base + here` of x into rows `0 .. here` of `xq`, `xd` and (with `sums`)
        `xs`, every group in x's own order (the many-row forms quantize x a block of rows at a
        time)."""
        kb = self.kb
        r, gv = self.var("r"), self.var("g")
        kb.push()
        kb.push()
        self.quantize_group(r, gv, math.gcd(self.plan.agroup, 16), False, xq, xd, xs,
                            src_row=ex.add(base, r), sums=sums)
        self.loop(gv, Const(groups), kb.pop())
        self.loop(r, here, kb.pop())

    def quantize_group(self, r: Expr, g: Expr, lanes: int, permuted: bool, xq: lp.Buffer, xd: lp.Buffer,
                       xs: lp.Buffer, src_row: Optional[Expr] = None, sums: Optional[bool] = None,
                       run: tuple[int, int] = (0, 0)) -> None:
        """Group `g` of x's row `src_row` (default `r`) into row `r` of `xq`, `xd` and (with
        `sums`, by default for int4 whose offsets they carry) `xs`; `permuted`: in
        `x_position`'s order for the pack `run`."""
        kb, plan = self.kb, self.plan
        vt = ScalarType(dt.f32, lanes)
        it = ScalarType(dt.i32, lanes)
        ramp = ex.Ramp(Const(0), Const(1), ScalarType(dt.index, lanes))
        sums = self.ql.kind == "int4" if sums is None else sums
        src = r if src_row is None else src_row
        amax = self.buffer("amax", dt.f32, (lanes,))
        kb.emit(lp.Store(amax.name, (ramp,), ex.const(0.0, dt.f32, lanes)))
        if sums:
            isum = self.buffer("isum", dt.i32, (lanes,))
            kb.emit(lp.Store(isum.name, (ramp,), ex.const(0, dt.i32, lanes)))
        steps = plan.agroup // lanes

        def col(ch: Var) -> Expr:
            return ex.add(ex.mul(g, Const(plan.agroup)), ex.mul(ch, Const(lanes)))

        ch = self.var("ch")
        kb.push()
        xa = ex.Call("abs", (self.x_lanes(src, col(ch), lanes),), vt)
        kb.emit(lp.Store(amax.name, (ramp,), ex.Binary("max", ex.Load(amax.name, (ramp,), vt), xa, vt)))
        self.loop(ch, Const(steps), kb.pop())
        a = kb.bind(ex.VectorReduce("max", ex.Load(amax.name, (ramp,), vt), F32), "amax")
        d = kb.bind(ex.Binary("div", a, Const(127.0, F32), F32), "dx")
        positive = ex.Binary("gt", a, Const(0.0, F32), ScalarType(dt.bool_))
        inv = kb.bind(ex.Select(positive, ex.Binary("div", Const(127.0, F32), a, F32), Const(0.0, F32), F32), "inv")
        kb.emit(lp.Store(xd.name, (r, g), d))
        ch = self.var("ch")
        kb.push()
        scaled = ex.Binary("mul", self.x_lanes(src, col(ch), lanes), ex.Broadcast(inv, vt), vt)
        qi = kb.bind(ex.cast(ex.Call("round", (scaled,), vt), dt.i32), "qi")
        offset = ex.mul(ch, Const(lanes))
        at = self.x_position(g, offset, run) if permuted else ex.add(ex.mul(g, Const(plan.agroup)), offset)
        kb.emit(lp.Store(xq.name, (r, ex.Ramp(at, Const(1), ScalarType(dt.index, lanes))), ex.cast(qi, dt.i8)))
        if sums:
            kb.emit(lp.Store(isum.name, (ramp,), ex.Binary("add", ex.Load(isum.name, (ramp,), it), qi, it)))
        self.loop(ch, Const(steps), kb.pop())
        if sums:
            total = ex.cast(ex.VectorReduce("add", ex.Load(isum.name, (ramp,), it), ScalarType(dt.i32)), dt.f32)
            kb.emit(lp.Store(xs.name, (r, g), ex.Binary("mul", d, total, F32)))

    def quad_sums(self, xq: lp.Buffer, k: int, factor: int = 1) -> lp.Buffer:
        """`factor * (xq[r, 4 j] + .. + xq[r, 4 j + 3])` for every row and j (one dot product
        of XC_BYTES bytes by a constant per XC_BYTES / 4 lanes; K a multiple of XC_BYTES)."""
        kb, plan = self.kb, self.plan
        lanes = XC_BYTES // 4
        out = self.buffer("qsum" if factor == 1 else "xc", dt.i32, (plan.rows, k // 4))
        r, j = self.var("r"), self.var("j")
        kb.push()
        kb.push()
        xb = ex.Load(xq.name, (r, ex.Ramp(ex.mul(j, Const(XC_BYTES)), Const(1), ScalarType(dt.index, XC_BYTES))),
                     ScalarType(dt.i8, XC_BYTES))
        sums = _dot4(ex.const(0, dt.i32, lanes), ex.const(1, dt.u8, XC_BYTES), xb)
        if factor != 1:
            sums = ex.Binary("mul", sums, ex.const(factor, dt.i32, lanes), ScalarType(dt.i32, lanes))
        kb.emit(lp.Store(out.name, (r, ex.Ramp(ex.mul(j, Const(lanes)), Const(1), ScalarType(dt.index, lanes))), sums))
        self.loop(j, Const(k // XC_BYTES), kb.pop())
        self.loop(r, ex.minimum(Const(plan.rows), self.rows_m), kb.pop())
        return out

    # ---- the nest ----------------------------------------------------------------------------
    def build(self) -> lp.Stmt:
        """The nest, once per block of `plan.rows` rows of x where M may exceed them (x is
        quantized a block at a time into buffers of `plan.rows` rows; each row's sums are
        the same in every block, so the results do not depend on M)."""
        m = static_int(self.ql.m)
        if m is not None and m <= self.plan.rows:
            return self.build_rows()
        kb, rows = self.kb, self.plan.rows
        kb.push()
        mb = self.var("mb")
        kb.push()
        self.row_base = self.let(ex.mul(mb, Const(rows)), "base")
        self.row_count = self.let(ex.minimum(Const(rows), ex.sub(self.ql.m, self.row_base)), "here")
        kb.emit(self.build_rows())
        self.row_base, self.row_count = Const(0), None
        kb.emit(lp.For(mb, Const(0), _cdiv_expr(self.ql.m, rows), "serial", kb.pop()))
        return kb.pop()

    def build_rows(self) -> lp.Stmt:
        """The nest of the module docstring for the rows `row_base ..` (`row_count` of them)."""
        kb, plan, ql = self.kb, self.plan, self.ql
        k = static_int(ql.k)
        assert k is not None
        kb.push()
        xq = self.buffer("xq", dt.i8, (plan.rows, k))
        xd = self.buffer("xd", dt.f32, (plan.rows, k // plan.agroup))
        xs = self.buffer("xs", dt.f32, (plan.rows, k // plan.agroup))
        self.quantize_x(xq, xd, xs)
        self.xc = self.quad_sums(xq, k, -128) if plan.offset_codes else None
        item, n0, ns, tile, ib, i0, rows = self.open_tiles()
        pairs = [(r, c) for r in range(plan.mr) for c in range(plan.nr)]
        widths = sorted({pack for _, _, pack, _ in self.segments()}, reverse=True)
        facc = {w: {p: self.local("acc", (plan.chunk * w // 4,)) for p in pairs} for w in widths}
        off = self.local("off", (plan.mr, plan.nr))
        for w, accs in facc.items():
            lanes = plan.chunk * w // 4
            for a in accs.values():
                kb.emit(lp.Store(a.name, (self.lane(lanes),), ex.const(0.0, dt.f32, lanes)))
        for r, c in pairs:
            kb.emit(lp.Store(off.name, (Const(r), Const(c)), Const(0.0, F32)))
        self.group_loop_i8(rows, ns, facc, off, xq, xd, xs)
        final = -8.0 if ql.symmetric else 1.0  # int4's offsets (int8 has none)
        for r, c in pairs:
            total: Optional[Expr] = None
            for w, accs in facc.items():
                lanes = plan.chunk * w // 4
                part = ex.VectorReduce("add", ex.Load(accs[(r, c)].name, (self.lane(lanes),),
                                                      ScalarType(dt.f32, lanes)), F32)
                total = part if total is None else ex.Binary("add", total, part, F32)
            assert total is not None
            value: Expr = total
            if ql.kind == "int4":
                value = ex.Call("fma", (ex.Load(off.name, (Const(r), Const(c)), F32), Const(final, F32), total), F32)
            if ql.per_channel:
                value = ex.Binary("mul", value, ex.cast(kb.value_at(ql.scales, (ns[c],)), dt.f32), F32)
            kb.emit(lp.Store(tile.name, (Const(r), Const(c)), value))
        kb.emit(self.close_tiles(tile, item, ib, i0, n0))
        return kb.pop()

    @staticmethod
    def lane(lanes: int) -> Expr:
        return ex.Ramp(Const(0), Const(1), ScalarType(dt.index, lanes))

    def group_loop_i8(self, rows: list[Expr], ns: list[Expr], facc: dict[int, dict[tuple[int, int], lp.Buffer]],
                      off: lp.Buffer, xq: lp.Buffer, xd: lp.Buffer, xs: lp.Buffer) -> None:
        """The loop over groups, run by run (`segments`): blocks of U groups with their scales
        read as vectors, or one pack (or group) at a time with scalar scales."""
        kb = self.kb
        probes = self.scale_probes()
        for g0, count, p, u in self.segments():
            if u:
                assert probes is not None
                offv = {key: self.local("offv", (u,)) for key in facc[p]} if self.ql.kind == "int4" else {}
                ulane = self.lane(u)
                for a in offv.values():
                    kb.emit(lp.Store(a.name, (ulane,), ex.const(0.0, dt.f32, u)))
                if count > u:
                    gb = self.var("gb")
                    kb.push()
                    self.group_block(ex.add(ex.mul(gb, Const(u)), Const(g0)), u, p, rows, ns, facc[p], offv,
                                     xq, xd, xs, probes)
                    self.loop(gb, Const(count // u), kb.pop())
                else:
                    self.group_block(Const(g0), u, p, rows, ns, facc[p], offv, xq, xd, xs, probes)
                ut = ScalarType(dt.f32, u)
                for (r, c), a in offv.items():
                    where = (Const(r), Const(c))
                    total = ex.VectorReduce("add", ex.Load(a.name, (ulane,), ut), F32)
                    kb.emit(lp.Store(off.name, where, ex.Binary("add", ex.Load(off.name, where, F32), total, F32)))
                continue
            gv = self.var("g")
            kb.push()
            g = ex.add(ex.mul(gv, Const(p)), Const(g0))
            iacc = self.group_dots(g, p, rows, ns, xq)
            self.group_scales(g, p, rows, ns, facc[p], off, iacc, xd, xs)
            self.loop(gv, Const(count // p), kb.pop())

    def scale_probes(self) -> Optional[tuple[ex.Load, Optional[ex.Load], Var, Var]]:
        """The scales (and mins) as loads unit-stride along the group, with the variables
        standing for the weight row and the group; None for per-channel scales, an activation
        group other than the weight's, or scales read otherwise."""
        ql, plan = self.ql, self.plan
        if ql.per_channel or plan.agroup != ql.group:
            return None
        n, g = Var(self.kb.fresh("n")), Var(self.kb.fresh("g"))

        def unit_load(v: Value) -> Optional[ex.Load]:
            probe = _Probe(self.kb, v, (n, g), g, n)  # the group in the probe's "k" position
            return probe.load if probe.load is not None and probe.unit("k") else None

        scales = unit_load(ql.scales)
        if scales is None:
            return None
        if ql.kind == "int4" and not ql.symmetric:
            assert ql.mins is not None
            mins = unit_load(ql.mins)
            return None if mins is None else (scales, mins, n, g)
        return scales, None, n, g

    def group_dots(self, g: Expr, width: int, rows: list[Expr], ns: list[Expr],
                   xq: lp.Buffer) -> dict[tuple[int, int], lp.Buffer]:
        """`iacc[r, c]`: byte products of the `width` groups from `g` (fresh i32 accumulators;
        with `width` > 1, one chunk per (half) group, lane segment j holding group g + j)."""
        kb, plan, ql = self.kb, self.plan, self.ql
        ag, b = plan.agroup, plan.chunk * width
        h = ql.group // 2
        span = h if ql.kind == "int4" else ag
        lanes = b // 4
        lane = self.lane(lanes)
        it = ScalarType(dt.i32, lanes)
        bytes_t = ScalarType(dt.i8, b)
        pairs = [(r, c) for r in range(plan.mr) for c in range(plan.nr)]
        iacc = {p: self.buffer("iacc", dt.i32, (lanes,)) for p in pairs}
        xc = self.xc
        for (r, _), a in iacc.items():
            init: Expr = ex.const(0, dt.i32, lanes)
            if xc is not None:  # -128 sum(x) per lane: the offset of the codes read as q + 128
                quad = ex.floordiv(ex.mul(g, Const(ag)), Const(4))
                init = ex.Load(xc.name, (rows[r], ex.Ramp(quad, Const(1), ScalarType(dt.index, lanes))), it)
            kb.emit(lp.Store(a.name, (lane,), init))

        def x_bytes(r: int, k0: Expr) -> Expr:
            return ex.Load(xq.name, (rows[r], ex.Ramp(k0, Const(1), ScalarType(dt.index, b))), bytes_t)

        def chunk(ch: Expr) -> None:
            start = ex.mul(g, Const(ag))
            base = ex.add(start, ex.mul(ch, Const(b)))
            for c in range(plan.nr):
                if ql.kind == "int4":
                    raw = kb.bind(self.q_bytes(ns[c], ex.add(ex.mul(g, Const(h)), ex.mul(ch, Const(b))), b), "b")
                    u8 = raw.type
                    codes = (kb.bind(ex.Binary("and", raw, ex.const(15, dt.u8, b), u8), "lo"),
                             kb.bind(ex.Binary("shr", raw, ex.const(4, dt.u8, b), u8), "hi"))
                    # A pack's x holds the groups' low halves, then their high halves (`x_position`).
                    highs = ex.add(start, Const(width * h)) if width > 1 else ex.add(base, Const(h))
                    parts = [(codes[0], base), (codes[1], highs)]
                else:
                    codes8 = self.q_bytes(ns[c], base, b)
                    if xc is not None:  # q + 128 as an unsigned byte
                        u8 = ScalarType(dt.u8, b)
                        codes8 = ex.Binary("xor", ex.Bitcast(codes8, u8), ex.const(128, dt.u8, b), u8)
                    parts = [(kb.bind(codes8, "w"), base)]
                for r in range(plan.mr):
                    cur: Expr = ex.Load(iacc[(r, c)].name, (lane,), it)
                    for codes_, at in parts:
                        xb = x_bytes(r, at)
                        if codes_.dtype == dt.i8:  # in [-127, 127] already: the bound is for codegen
                            xb = ex.Binary("max", xb, ex.const(-127, dt.i8, b), bytes_t)
                        cur = _dot4(cur, codes_, xb)
                    kb.emit(lp.Store(iacc[(r, c)].name, (lane,), cur))

        chunks = span // plan.chunk if width == 1 else 1
        self.repeat("ch", chunks, chunk, MAX_UNROLLED_CHUNKS)
        return iacc

    def group_scales(self, g: Expr, width: int, rows: list[Expr], ns: list[Expr],
                     facc: dict[tuple[int, int], lp.Buffer], off: lp.Buffer,
                     iacc: dict[tuple[int, int], lp.Buffer], xd: lp.Buffer, xs: lp.Buffer) -> None:
        """`f = fma(f32(i), d_w d_x, f); o += coef xs` (int4) for the `width` groups from `g`,
        scales read one by one (a pack's scales blended into its lane segments)."""
        kb, plan, ql = self.kb, self.plan, self.ql
        lanes = plan.chunk * width // 4
        lane = self.lane(lanes)
        it, vt = ScalarType(dt.i32, lanes), ScalarType(dt.f32, lanes)
        ag = plan.agroup
        scales: dict[tuple[int, int], list[Expr]] = {p: [] for p in facc}
        for j in range(width):
            gj = ex.add(g, Const(j)) if j else g
            wgroup = gj if ag == ql.group else ex.floordiv(ex.mul(gj, Const(ag)), Const(ql.group))
            dx = [kb.bind(ex.Load(xd.name, (rows[r], gj), F32), "dx") for r in range(plan.mr)]
            sx = [kb.bind(ex.Load(xs.name, (rows[r], gj), F32), "sx") for r in range(plan.mr)] \
                if ql.kind == "int4" else []
            for c in range(plan.nr):
                dw: Optional[Expr] = None
                if not ql.per_channel:
                    dw = kb.bind(ex.cast(kb.value_at(ql.scales, (ns[c], wgroup)), dt.f32), "dw")
                coef: Optional[Expr] = dw
                if ql.kind == "int4" and not ql.symmetric:
                    assert ql.mins is not None
                    coef = kb.bind(ex.cast(kb.value_at(ql.mins, (ns[c], gj)), dt.f32), "mw")
                for r in range(plan.mr):
                    scales[(r, c)].append(dx[r] if dw is None else kb.bind(ex.Binary("mul", dw, dx[r], F32), "ds"))
                    if ql.kind != "int4":
                        continue
                    where = (Const(r), Const(c))
                    o = ex.Load(off.name, where, F32)
                    grown = ex.Binary("add", o, sx[r], F32) if coef is None else ex.Call("fma", (coef, sx[r], o), F32)
                    kb.emit(lp.Store(off.name, where, grown))
        for p, a in facc.items():
            acc = ex.Load(a.name, (lane,), vt)
            prod = ex.cast(ex.Load(iacc[p].name, (lane,), it), dt.f32)
            kb.emit(lp.Store(a.name, (lane,), ex.Call("fma", (prod, lane_segments(scales[p], lanes), acc), vt)))

    def group_block(self, g0: Expr, u: int, p: int, rows: list[Expr], ns: list[Expr],
                    facc: dict[tuple[int, int], lp.Buffer], offv: dict[tuple[int, int], lp.Buffer],
                    xq: lp.Buffer, xd: lp.Buffer, xs: lp.Buffer,
                    probes: tuple[ex.Load, Optional[ex.Load], Var, Var]) -> None:
        """`u` groups from `g0` in packs of `p`: their weight scales (and mins), x's scales and sums read
        as vectors, `d_w d_x` kept in a local vector per (row, weight row) and broadcast from it
        per group (blended into lane segments per pack), int4's offset terms accumulated
        lane-wise (`offv`, summed after the loop)."""
        kb, plan = self.kb, self.plan
        ut = ScalarType(dt.f32, u)
        ulane = self.lane(u)
        glanes = ex.Ramp(g0, Const(1), ScalarType(dt.index, u))
        scale_load, min_load, n_var, g_var = probes

        def widened(load: ex.Load, n: Expr) -> Expr:
            index = tuple(ex.substitute(i, {n_var.name: n}) for i in load.index)
            wide = _lanes_index(index, g_var.name, g0, u)
            assert wide is not None
            return ex.cast(ex.Load(load.buffer, wide, ScalarType(load.type.dtype, u)), dt.f32)

        dwv = [kb.bind(widened(scale_load, ns[c]), "dwv") for c in range(plan.nr)]
        coefv = dwv if min_load is None else [kb.bind(widened(min_load, ns[c]), "mwv") for c in range(plan.nr)]
        dxv = [kb.bind(ex.Load(xd.name, (rows[r], glanes), ut), "dxv") for r in range(plan.mr)]
        sxv = [kb.bind(ex.Load(xs.name, (rows[r], glanes), ut), "sxv") for r in range(plan.mr)] if offv else []
        ds = {}
        for r, c in facc:
            ds[(r, c)] = self.local("ds", (u,))
            kb.emit(lp.Store(ds[(r, c)].name, (ulane,), ex.Binary("mul", dwv[c], dxv[r], ut)))
        for (r, c), a in offv.items():
            grown = ex.Call("fma", (coefv[c], sxv[r], ex.Load(a.name, (ulane,), ut)), ut)
            kb.emit(lp.Store(a.name, (ulane,), grown))
        lanes = plan.chunk * p // 4
        lane = self.lane(lanes)
        it, vt = ScalarType(dt.i32, lanes), ScalarType(dt.f32, lanes)
        for j in range(0, u, p):
            iacc = self.group_dots(ex.add(g0, Const(j)), p, rows, ns, xq)
            for key, a in facc.items():
                scale = lane_segments([ex.Load(ds[key].name, (Const(j + t),), F32) for t in range(p)], lanes)
                prod = ex.cast(ex.Load(iacc[key].name, (lane,), it), dt.f32)
                kb.emit(lp.Store(a.name, (lane,), ex.Call("fma", (prod, scale, ex.Load(a.name, (lane,), vt)), vt)))


def build_qlinear_i8(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer, plan: Q8Plan,
                     probes: tuple[ex.Load, ex.Load, Var, Var, Var]) -> lp.Stmt:
    """The int8-activation kernel computing `root` into `out` (`probes` as `qlinear._probes`)."""
    x_load, q_load, row, k, n = probes
    return Q8Builder(kb, root, qop, out, plan, x_load, q_load, row, k, n).build()  # type: ignore[arg-type]
