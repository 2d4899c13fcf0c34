"""The many-row `qlinear` kernel: int8 activations by a weight panel packed per work item.

`qlinear_i8`'s kernel puts K in the lanes of its dot products: each `vpdpbusd` ends a (pair
of) group(s), so every dot product is followed by a conversion and a multiply-add that apply
the group's scales, and the products of a row are summed across lanes at the end. That is
right for a GEMV (one stream over the weight), but with many rows of x (prefill) the scale
work is as large as the dot products. Here the lanes hold *output columns*, as in a
library GEMM: each work item packs the codes of its NR = NV x L weight rows into a panel
(`panel[k / 4, c]`: the four codes of k .. k + 3 of column c in one i32 lane, int4's nibbles
unpacked to bytes, int8's codes offset by 128 where the dot product wants an unsigned
operand), and one dot product multiplies four codes of L columns by four bytes of x
broadcast to every lane. A group of A = 32 elements is then A / 4 dot products per
accumulator before its scales are applied once (per row r, column vector c):

    for mb in 0..cdiv(M, MB)                                 row blocks (xq: MB x K bytes)
      xq[r, :], d_x[r, G], s_x[r, G] = quantize(x[mb MB + r, :])      s_x = d_x sum(xq)
      parallel for w in 0..cdiv(N, NR)
        panel[k4, c] = codes(n0 + c, 4 k4 .. 4 k4 + 3)       (one strided store per chunk)
        d[G, c] = scale(n0 + c, G);  o[G, c] = offset(n0 + c, G)      w = d q + o
        for ib in 0..cdiv(MB, MR)
          f[r][c] = 0                                         f32 x L
          for G in 0..K / A
            i[r][c] = 0                                       i32 x L
            for s in 0..A / 4                                 (unrolled)
              wv[c] = bitcast<u8, 4L>(panel[G A/4 + s, ramp(c L, 1, L)])
              xb[r] = bitcast<i8, 4L>(broadcast(bitcast<i32, 1>(xq[r, ramp(G A + 4 s, 1, 4)]), L))
              i[r][c] = dot4_u8i8_acc(i[r][c], wv[c], xb[r])
            f[r][c] = fma(f32(i[r][c]), d[G, c..] * d_x[r, G], f[r][c])
            f[r][c] = fma(o[G, c..], s_x[r, G], f[r][c])      (int4, and int8 offset by 128)
          out[i0 + r, n0 + c L + lane] = epilogue(f[r][c][lane])

The offset term is exact algebra: `sum_k (d q_k + o) x_k = d sum_k q_k x_k + o sum_k x_k`, with
`o` = -8 d (symmetric int4), the min (asymmetric int4) or -128 d (int8 codes offset by 128,
so that the weight is the unsigned operand of `vpdpbusd`; on targets whose byte dot product
is `pmaddubsw`, which saturates above 127, int8 stays signed and x is clamped to -127, see
`ex.DOT4_I8I8`). x is quantized exactly as in `qlinear_i8` (per group of A, symmetric,
round half to even), so both kernels give the same sums.

**Cost.** Packing reads the work item's weight rows once per row block: N K bytes and N K / A
scales per block against 2 MB N K multiply-adds; with MB of 64 rows or more it is a few
percent. The panel (K x NR bytes, i32 lanes) and the scales (2 x 4 K / A x NR bytes) are the
work item's stack memory (allocated once per thread); xq is the caller's, MB x K bytes.

**Bounds.** Every panel store writes rows `k4` below K / 4 and columns below NR; weight rows
past N are clamped on read and skipped on store; rows of x past M likewise. K must be a
multiple of 4 and A a multiple of 4 (int4: its half group too), which `plan_qgemm_i8` checks.

Before (tensor IR; M = 64 is static, so `lower-to-loops` builds this kernel on a CPU with
byte dot products):

    %0 = qlinear(%x, %q, %s, %mn) {kind = "int4", group_size = 32, symmetric = false} : f32[64, 2048]

After (loop IR, abridged): the nest above, its plan in the kernel's attributes
(`qlinear = "qgemm mr=4 nr=32 act=int8 panel=u8 rows=64 parallel=yes"`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.qblocks import block_type
from ..loopgen.matmul import MIN_PARALLEL_FLOPS, CpuInfo, _cdiv_expr, static_int
from .qlinear import QLinear
from .qlinear_blocks import BlocksBuilder, instantiate, layout
from .qlinear_i8 import Q8Builder, _dot4, activation_group

if TYPE_CHECKING:
    from ...ir.tensor import Op
    from ..loopgen.kernel_builder import KernelBuilder

F32 = ScalarType(dt.f32)
#: Rows of x from which a static-M `qlinear` takes this kernel (fewer: `qlinear_i8`'s, whose
#: weights need no packing: at 16 rows the pack of a 2048 x 2048 int4 weight costs more than it saves).
QGEMM_MIN_ROWS = 32
#: Bytes of quantized x per row block (the caller's stack).
MAX_BLOCK_BYTES = 512 * 1024
#: Bytes of one work item's panel and scales (a worker thread's stack).
MAX_PANEL_BYTES = 768 * 1024
#: Dot products per group unrolled in the IR; longer groups keep a loop.
MAX_UNROLLED_STEPS = 8


@dataclass(frozen=True)
class QGemmPlan:
    """MR rows of x by NV vectors of L columns per register tile, `rows` rows of x quantized
    per block, `agroup` elements of x per scale, whether int8 codes are offset by 128 into
    unsigned bytes (`shift`), and whether the work items run in parallel."""

    mr: int
    nv: int
    lanes: int
    rows: int
    agroup: int
    shift: bool
    parallel: bool
    #: Whether the byte dot product is one instruction on the target (VNNI).
    native: bool = True
    #: `Q8Builder` reads these: x in its own order (no packs), one chunk per group.
    pack: int = 1

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    @property
    def chunk(self) -> int:
        return 4 * self.lanes

    def describe(self) -> str:
        return (f"qgemm mr={self.mr} nr={self.nr} act=int8 panel={'u8' if self.shift else 'codes'} "
                f"rows={self.rows} parallel={'yes' if self.parallel else 'no'}")


def _tile(cpu: CpuInfo) -> tuple[int, int]:
    """MR x NV from the register file: MR NV f32 and MR NV i32 accumulators, NV panel vectors
    and one broadcast of x must fit (32 registers: 4 x 2 and 27 live; 16: 2 x 2 and 11)."""
    return (4, 2) if cpu.vector_registers() >= 32 else (2, 2)


def plan_qgemm_i8(ql: QLinear, m: Optional[int], cpu: CpuInfo, choice: str) -> Optional[QGemmPlan]:
    """The plan, or None where this kernel does not apply: a `form` other than "auto" and
    "panel", activations "f32", M unknown or (form "auto") below QGEMM_MIN_ROWS, kinds other than int4 and int8, K or a group not a multiple of 4
    (int4: of 8), no byte dot product on the target ("auto"), a panel too large."""
    k, n = static_int(ql.k), static_int(ql.n)
    least = 1 if ql.form == "panel" else QGEMM_MIN_ROWS
    if ql.form in ("rows", "gemm") or choice == "f32" or m is None or m < least or k is None \
            or ql.kind not in ("int4", "int8", "blocks"):
        return None
    agroup = block_type(ql.block_type).run if ql.kind == "blocks" else activation_group(ql)
    if k % 4 or agroup % 4 or (ql.kind == "int4" and ql.group % 8):
        return None
    native = sorted(cpu.dot4_lanes, reverse=True)
    if ql.kind == "blocks" and not native:
        return None  # codes offset by 128 need the unsigned operand of `vpdpbusd` (see `pack_blocks`)
    short = sorted(cpu.small_dot4_lanes, reverse=True)
    widest = max(4, cpu.vector_bits // 32)
    if native:
        lanes, shift = min(native[0], widest), ql.kind in ("int8", "blocks")
    elif short and (ql.kind == "int4" or choice == "int8"):  # "auto": int8 weights want VNNI (as `qlinear_i8`)
        lanes, shift = min(short[0], widest), False
    elif choice == "int8":
        lanes, shift = widest, False
    else:
        return None
    mr, nv = _tile(cpu)
    panel = lambda v: k * v * lanes + 2 * 4 * (k // agroup) * v * lanes  # noqa: E731
    while nv > 1 and panel(nv) > MAX_PANEL_BYTES:
        nv -= 1
    if panel(nv) > MAX_PANEL_BYTES:
        return None
    rows = m if m * k <= MAX_BLOCK_BYTES else max(mr, MAX_BLOCK_BYTES // k // mr * mr)
    flops = 2.0 * m * (n if n is not None else 1 << 20) * k
    return QGemmPlan(mr, nv, lanes, rows, agroup, shift, cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS,
                     bool(native))


def _ramp(base: Expr, lanes: int) -> Expr:
    return ex.Ramp(base, Const(1), ScalarType(dt.index, lanes))


class QGemmBuilder(Q8Builder):
    """Builds the nest of the module docstring for one `QGemmPlan`."""

    plan: QGemmPlan  # type: ignore[assignment]
    #: ggml blocks read through the block table as `BlocksBuilder` reads them.
    byte_at = BlocksBuilder.byte_at
    _lanes = BlocksBuilder._lanes

    @property
    def offsets(self) -> bool:
        """Whether weights carry an offset per group (`o`): int4, and codes offset by 128."""
        return self.ql.kind == "int4" or self.plan.shift

    def build(self) -> lp.Stmt:
        kb, plan, ql = self.kb, self.plan, self.ql
        k, m = static_int(ql.k), static_int(ql.m)
        assert k is not None and m is not None
        groups = k // plan.agroup
        kb.push()
        xq = self.buffer("xq", dt.i8, (plan.rows, k))
        xd = self.buffer("xd", dt.f32, (plan.rows, groups))
        xs = self.buffer("xs", dt.f32, (plan.rows, groups))
        mb = self.var("mb")
        kb.push()
        base = self.let(ex.mul(mb, Const(plan.rows)), "base")
        here = self.let(ex.minimum(Const(plan.rows), ex.sub(Const(m), base)), "here")
        self.quantize_block(base, here, groups, xq, xd, xs, self.offsets)
        kb.emit(self.tiles(base, here, xq, xd, xs, k, groups))
        self.loop(mb, Const(-(-m // plan.rows)), kb.pop())
        return kb.pop()

    # ---- one work item: NR weight rows ---------------------------------------------------------
    def tiles(self, base: Expr, here: Expr, xq: lp.Buffer, xd: lp.Buffer, xs: lp.Buffer, k: int,
              groups: int) -> lp.For:
        kb, plan, ql = self.kb, self.plan, self.ql
        item = self.var("w")
        kb.push()
        n0 = self.let(ex.mul(item, Const(plan.nr)), "n")
        panel = self.buffer("panel", dt.i32, (k // 4, plan.nr))
        pd = self.buffer("pd", dt.f32, (groups, plan.nr))
        po = self.buffer("po", dt.f32, (groups, plan.nr)) if self.offsets else None
        self.pack(n0, panel, pd, po, k, groups)
        tile = self.local("ct", (plan.mr, plan.nr))
        ib = self.var("ib")
        kb.push()
        i0 = self.let(ex.mul(ib, Const(plan.mr)), "i")
        rows = [self.let(ex.minimum(ex.add(i0, Const(r)), ex.sub(here, Const(1))), "ia") for r in range(plan.mr)]
        self.micro_kernel(rows, panel, pd, po, xq, xd, xs, tile, groups)
        rows_left = ex.minimum(Const(plan.mr), ex.sub(here, i0))
        cols_left = ex.minimum(Const(plan.nr), ex.sub(ql.n, n0))
        kb.emit(self.epilogue(tile, ex.add(base, i0), n0, rows_left, cols_left))
        kb.emit(lp.For(ib, Const(0), _cdiv_expr(here, plan.mr), "serial", kb.pop()))
        described = plan.describe()
        previous = kb.attrs.get("qlinear")
        kb.attrs["qlinear"] = described if previous is None else f"{previous} | {described}"
        notes = ((("origin", "; ".join(kb.origins)),) if kb.origins else ()) + (("qlinear", described),)
        kind = "parallel" if plan.parallel else "serial"
        return lp.For(item, Const(0), _cdiv_expr(ql.n, plan.nr), kind, kb.pop(), notes)

    def pack(self, n0: Expr, panel: lp.Buffer, pd: lp.Buffer, po: Optional[lp.Buffer], k: int, groups: int) -> None:
        """The work item's codes into `panel` (four per i32 lane, column-interleaved) and its
        scales and offsets into `pd`, `po`. The loop over the NR weight rows (columns `c`) is
        innermost, so each chunk of K fills a few contiguous rows of the panel before the next:
        column by column, every store would touch a line of its own across the whole panel,
        which leaves L1 from K of about 1000 on (7 cycles a word at K = 2048)."""
        kb, plan, ql = self.kb, self.plan, self.ql

        def column(c: Var) -> Expr:
            return self.let(ex.minimum(ex.add(n0, c), ex.sub(ql.n, Const(1))), "nc")

        def put(k4: Expr, c: Var, codes: Expr) -> None:
            lanes = codes.lanes // 4
            word = ex.Bitcast(codes, ScalarType(dt.i32, lanes))
            kb.emit(lp.Store(panel.name, (_ramp(k4, lanes), c), word))

        c = self.var("c")
        if ql.kind == "blocks":
            assert po is not None
            self.pack_blocks(n0, panel, pd, po, k)
            return
        if ql.kind == "int4":
            h = ql.group // 2
            chunk = math.gcd(h, plan.chunk)
            wg, j = self.var("wg"), self.var("j")
            kb.push()
            kb.push()
            kb.push()
            raw = kb.bind(self.q_bytes(column(c), ex.add(ex.mul(wg, Const(h)), ex.mul(j, Const(chunk))), chunk), "b")
            u8 = raw.type
            k4 = ex.add(ex.mul(wg, Const(ql.group // 4)), ex.mul(j, Const(chunk // 4)))
            put(k4, c, ex.Binary("and", raw, ex.const(15, dt.u8, chunk), u8))
            put(ex.add(k4, Const(h // 4)), c, ex.Binary("shr", raw, ex.const(4, dt.u8, chunk), u8))
            self.loop(c, Const(plan.nr), kb.pop())
            self.loop(j, Const(h // chunk), kb.pop())
            self.loop(wg, Const(k // ql.group), kb.pop())
        else:
            chunk = math.gcd(k, plan.chunk)
            kc = self.var("kc")
            kb.push()
            kb.push()
            raw = kb.bind(self.q_bytes(column(c), ex.mul(kc, Const(chunk)), chunk), "b")
            if plan.shift:  # the code + 128 as an unsigned byte: the unsigned operand of vpdpbusd
                u8 = ScalarType(dt.u8, chunk)
                raw = ex.Binary("xor", ex.Bitcast(raw, u8), ex.const(128, dt.u8, chunk), u8)
            put(ex.mul(kc, Const(chunk // 4)), c, raw)
            self.loop(c, Const(plan.nr), kb.pop())
            self.loop(kc, Const(k // chunk), kb.pop())
        g, c = self.var("g"), self.var("c")
        kb.push()
        kb.push()
        n = column(c)
        if ql.per_channel:
            d = kb.bind(ex.cast(kb.value_at(ql.scales, (n,)), dt.f32), "d")
        else:
            wgroup = ex.floordiv(ex.mul(g, Const(plan.agroup)), Const(ql.group)) if plan.agroup != ql.group else g
            d = kb.bind(ex.cast(kb.value_at(ql.scales, (n, wgroup)), dt.f32), "d")
        kb.emit(lp.Store(pd.name, (g, c), d))
        if po is not None:
            if ql.kind == "int4" and not ql.symmetric:
                assert ql.mins is not None
                offset: Expr = ex.cast(kb.value_at(ql.mins, (n, g)), dt.f32)
            else:
                offset = ex.Binary("mul", d, Const(-8.0 if ql.kind == "int4" else -128.0, F32), F32)
            kb.emit(lp.Store(po.name, (g, c), offset))
        self.loop(c, Const(plan.nr), kb.pop())
        self.loop(g, Const(groups), kb.pop())

    def pack_blocks(self, n0: Expr, panel: lp.Buffer, pd: lp.Buffer, po: lp.Buffer, k: int) -> None:
        """ggml blocks through the block table (`ir/qblocks.py`): per block and run, each chunk
        of codes as `code(r)` of lanes `ch L ..`, plus 128 as an unsigned byte (every table's
        codes lie in [-128, 127]: Q6_K's in [-32, 31]), and the run's scale `d` and offset
        `offset(r) - 128 d`, so `w = d (u - 128) + offset = d u + o`."""
        kb, plan, ql = self.kb, self.plan, self.ql
        bt = layout(ql)
        chunk = math.gcd(bt.run, plan.chunk)
        b = self.var("b")
        kb.push()
        for run in range(bt.runs):
            for ch in range(bt.run // chunk):
                c = self.var("c")
                kb.push()
                n = self.let(ex.minimum(ex.add(n0, c), ex.sub(ql.n, Const(1))), "nc")
                at = self.byte_at(n, b)
                code = instantiate(bt.code(run), at, Const(ch * chunk), chunk)
                lanes_t = ScalarType(code.type.dtype, chunk)
                biased = ex.Binary("add", code, ex.const(128, code.type.dtype, chunk), lanes_t)
                word = ex.Bitcast(ex.cast(biased, dt.u8), ScalarType(dt.i32, chunk // 4))
                k4 = ex.add(ex.mul(b, Const(bt.block // 4)), Const((run * bt.run + ch * chunk) // 4))
                kb.emit(lp.Store(panel.name, (_ramp(k4, chunk // 4), c), word))
                self.loop(c, Const(plan.nr), kb.pop())
            c = self.var("c")
            kb.push()
            n = self.let(ex.minimum(ex.add(n0, c), ex.sub(ql.n, Const(1))), "nc")
            at = self.byte_at(n, b)
            d = kb.bind(instantiate(bt.scale(run), at, Const(0)), "d")
            g = ex.add(ex.mul(b, Const(bt.runs)), Const(run))
            kb.emit(lp.Store(pd.name, (g, c), d))
            offset = bt.offset(run)
            shifted: Expr = ex.Binary("mul", d, Const(-128.0, F32), F32)
            if offset is not None:
                shifted = ex.Binary("add", kb.bind(instantiate(offset, at, Const(0)), "m"), shifted, F32)
            kb.emit(lp.Store(po.name, (g, c), shifted))
            self.loop(c, Const(plan.nr), kb.pop())
        self.loop(b, Const(k // bt.block), kb.pop())

    def micro_kernel(self, rows: list[Expr], panel: lp.Buffer, pd: lp.Buffer, po: Optional[lp.Buffer],
                     xq: lp.Buffer, xd: lp.Buffer, xs: lp.Buffer, tile: lp.Buffer, groups: int) -> None:
        """MR x NR sums of one row tile over all of K into `tile` (module docstring)."""
        kb, plan = self.kb, self.plan
        L = plan.lanes
        it, vt = ScalarType(dt.i32, L), ScalarType(dt.f32, L)
        lane = _ramp(Const(0), L)
        code_t = ScalarType(dt.u8 if plan.shift or self.ql.kind == "int4" else dt.i8, 4 * L)
        bytes_t = ScalarType(dt.i8, 4 * L)
        pairs = [(r, c) for r in range(plan.mr) for c in range(plan.nv)]
        facc = {p: self.local("acc", (L,)) for p in pairs}
        for a in facc.values():
            kb.emit(lp.Store(a.name, (lane,), ex.const(0.0, dt.f32, L)))
        g = self.var("g")
        kb.push()
        iacc = {p: self.buffer("iacc", dt.i32, (L,)) for p in pairs}
        for a in iacc.values():
            kb.emit(lp.Store(a.name, (lane,), ex.const(0, dt.i32, L)))
        steps = plan.agroup // 4

        def step(s: Expr) -> None:
            k4 = ex.add(ex.mul(g, Const(steps)), s)
            wv = [ex.Bitcast(ex.Load(panel.name, (k4, _ramp(Const(c * L), L)), it), code_t) for c in range(plan.nv)]
            if self.ql.kind == "int4" and not plan.native:
                # nibbles are below 16 already; the mask shows codegen the operand below 128, so
                # `pmaddubsw` cannot saturate and takes the short sequence (`ex.DOT4_U8I8`)
                wv = [ex.Binary("and", w, ex.const(15, dt.u8, 4 * L), code_t) for w in wv]
            wv = [kb.bind(w, "wv") for w in wv]
            for r in range(plan.mr):
                four = ex.Load(xq.name, (rows[r], _ramp(ex.mul(k4, Const(4)), 4)), ScalarType(dt.i8, 4))
                word = ex.Bitcast(four, ScalarType(dt.i32, 1))
                xb: Expr = ex.Bitcast(ex.Broadcast(word, it), bytes_t)
                if code_t.dtype == dt.i8:  # in [-127, 127] already: the bound is for codegen
                    xb = ex.Binary("max", xb, ex.const(-127, dt.i8, 4 * L), bytes_t)
                xb = kb.bind(xb, "xb")
                for c in range(plan.nv):
                    cur = ex.Load(iacc[(r, c)].name, (lane,), it)
                    kb.emit(lp.Store(iacc[(r, c)].name, (lane,), _dot4(cur, wv[c], xb)))

        self.repeat("s", steps, step, MAX_UNROLLED_STEPS)
        for r in range(plan.mr):
            dx = ex.Broadcast(kb.bind(ex.Load(xd.name, (rows[r], g), F32), "dx"), vt)
            sx = ex.Broadcast(kb.bind(ex.Load(xs.name, (rows[r], g), F32), "sx"), vt) if po is not None else None
            for c in range(plan.nv):
                cols = _ramp(Const(c * L), L)
                a = facc[(r, c)]
                ds = ex.Binary("mul", ex.Load(pd.name, (g, cols), vt), dx, vt)
                prod = ex.cast(ex.Load(iacc[(r, c)].name, (lane,), it), dt.f32)
                grown: Expr = ex.Call("fma", (prod, ds, ex.Load(a.name, (lane,), vt)), vt)
                if po is not None and sx is not None:
                    grown = ex.Call("fma", (ex.Load(po.name, (g, cols), vt), sx, grown), vt)
                kb.emit(lp.Store(a.name, (lane,), grown))
        self.loop(g, Const(groups), kb.pop())
        for (r, c), a in facc.items():
            kb.emit(lp.Store(tile.name, (Const(r), _ramp(Const(c * L), L)), ex.Load(a.name, (lane,), vt)))


def build_qgemm_i8(kb: "KernelBuilder", root: "Op", qop: "Op", out: lp.Buffer, plan: QGemmPlan,
                   probes: tuple[ex.Load, ex.Load, Var, Var, Var]) -> lp.Stmt:
    """The panel kernel computing `root` into `out` (`probes` as `qlinear._probes`)."""
    x_load, q_load, row, k, n = probes
    return QGemmBuilder(kb, root, qop, out, plan, x_load, q_load, row, k, n).build()  # type: ignore[arg-type]
