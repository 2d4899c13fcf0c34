"""The `qlinear` kernel's tile form: 16 weight rows by 16 rows of x per AMX tile product.

At a few to a few dozen rows of x (a server's batched decode step) `qlinear_i8`'s rows form
runs every byte dot product once per row of x: each `vpdpbusd` multiplies 64 bytes of one
weight row by 64 bytes of one row of x, and every dot product is followed by its scales. The
byte tile product `tile_dot_u8i8` (`ex.Call`; AMX's `tdpbusd`, 16 x 16 x 64 byte products in
one instruction) multiplies a group of 16 weight rows by 16 rows of x at once. The weight stays
in its own layout (rows of packed codes): the tile's 16 x K "A" operand is 16 weight rows, one
group of K codes each (int4's nibbles unpacked into a small buffer, low half then high half,
which is the group's own element order), and x, quantized per group as in `qlinear_i8`, is laid
out once per call as the "B" operand (`xv[k / 4, r]`: the four bytes of k .. k + 3 of row r in
one i32). The product is `c[n][r]`, transposed: the scales of weight row n are a scalar per
(n, group) and those of x a vector over the rows r, so one group costs, for 16 x 16 outputs,
one tile product and 16 conversions and multiply-adds (int4: 16 more for the offsets):

    for rb in 0..cdiv(M, 16)                                  16 rows of x at a time
      xq[r, :], d_x[G, r], s_x[G, r] = quantize(x[16 rb + r, :])      (rows past M: zeros)
      xv[k4, r] = i32(xq[r, 4 k4 .. 4 k4 + 3])
      parallel for w in 0..cdiv(N, 16)
        d[c, G] = f32(scale(16 w + c, G));  o[c, G] = offset(16 w + c, G)    (w = d q + o)
        f[c] = 0                                                f32 x 16 (lanes: rows of x)
        for G in 0..K / A
          a[c, :] = codes(16 w + c, G)                          int4: [b & 15, b >> 4]
          t = tile_dot(0, a[0..16 A], bitcast<i8>(xv[G A / 4 .., 0..16]))      i32 16 x 16
          f[c] = fma(f32(t[16 c .. 16 c + 16]), d_x[G, :] * d[c, G], f[c])
          f[c] = fma(broadcast(o[c, G]), s_x[G, :], f[c])       (int4)
        out[16 rb + r, 16 w + c] = epilogue(f[c][r])

The offsets are `qgemm_i8`'s algebra (`sum (d q + o) x = d sum q x + o sum x`: o = -8 d for
symmetric int4, the min for asymmetric); int8 codes are signed (`tile_dot_i8i8`), x is
quantized exactly as in `qlinear_i8` (per group, symmetric, round half to even), so the
integer sums, and therefore the results up to float summation order, equal the rows form's.
Groups longer than 64 bytes take several products into the same accumulator tile.

Where the target has no AMX-INT8 (`Target.tile_dot`) the plan is None and the rows form
(`qlinear_i8`) or the panel form (`qgemm_i8`) is built instead; `tile_dot` itself also has
a portable lowering (`codegen/llvm/tiles.py`), so a program built for AMX still compiles
for another CPU. Weight rows past N are clamped on read and skipped on store, rows of x past
M are zeros and skipped on store.

Before (tensor IR; M = 16 static and the target has AMX, so `lower-to-loops` builds this
kernel):

    %0 = qlinear(%x, %q, %s, %mn) {kind = "int4", group_size = 32, symmetric = false} : f32[16, 576]

After (loop IR, abridged): the nest above, its plan in the kernel's attributes
(`qlinear = "tiles rows=16 act=int8 chunk=32 parallel=no"`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ..loopgen.matmul import MIN_PARALLEL_FLOPS, CpuInfo, _cdiv_expr, static_int
from .qgemm_i8 import QGEMM_MIN_ROWS
from .qlinear import QLinear, _store_epilogue
from .qlinear_i8 import Q8Builder, activation_group

if TYPE_CHECKING:
    from ...ir.tensor import Op
    from ..loopgen.kernel_builder import KernelBuilder

F32 = ScalarType(dt.f32)
#: Rows and columns of one tile product (`ex.TILE_ROWS`): rows of x per block, weight rows per item.
TILE = ex.TILE_ROWS
#: Bytes of K one tile product takes at most (a tile row is 64 bytes).
MAX_TILE_K = 64
# (The rows of x from which a static-M `qlinear` takes this form on an AMX CPU are the option
# `lower-to-loops{qlinear_tile_rows=N}`, `QLINEAR_TILE_ROWS` by default; 0: never.)
#: Groups whose codes, tile products and scaling run as three loops one after the other
#: (`TileBuilder.batch`): 8 KiB of products, within L1.
GROUP_BATCH = 8
#: Bytes of quantized x (xq and its tile layout, 16 rows each) on the caller's stack.
MAX_X_BYTES = 1024 * 1024


@dataclass(frozen=True)
class TilePlan:
    """16 x 16 tiles: `agroup` elements of x per scale (the weight's group), `chunk` bytes of K
    per tile product, and whether the work items (16 weight rows each) run in parallel."""

    agroup: int
    chunk: int
    parallel: bool
    #: What `Q8Builder.quantize_group` reads: 16 rows of x, in x's own order.
    mr: int = TILE
    nr: int = TILE
    rows: int = TILE
    pack: int = 1
    offset_codes: bool = False

    @property
    def lanes(self) -> int:
        return TILE

    def describe(self) -> str:
        return f"tiles rows={TILE} act=int8 chunk={self.chunk} parallel={'yes' if self.parallel else 'no'}"


def plan_qlinear_tiles(ql: QLinear, m: Optional[int], cpu: CpuInfo, choice: str, min_rows: int) -> Optional[TilePlan]:
    """The plan, or None where this form does not apply: no AMX-INT8 on the target
    (`cpu.tile_dot`), a `form` other than "auto" and "tiles", activations "f32", M unknown or
    ("auto") below `min_rows` (0: never) or from QGEMM_MIN_ROWS on (the panel form: at 128
    rows it was 1.2x faster), kinds other than int4 and grouped int8, an
    activation group other than the weight's, K not static, a group that is not a multiple of
    4 bytes (int4: 8 elements) or longer than a tile row without being a multiple of it, x
    too large for the stack."""
    k = static_int(ql.k)
    if not cpu.tile_dot or ql.form not in ("auto", "tiles") or choice == "f32" or m is None or k is None:
        return None
    if ql.form == "auto" and (min_rows <= 0 or not min_rows <= m < QGEMM_MIN_ROWS):
        return None
    if ql.kind not in ("int4", "int8") or ql.per_channel or activation_group(ql) != ql.group:
        return None
    group = ql.group
    chunk = group if group <= MAX_TILE_K else MAX_TILE_K
    if group % 4 or group % chunk or (ql.kind == "int4" and (group % 8 or (group > MAX_TILE_K and (group // 2) % chunk))):
        return None
    if 2 * TILE * k > MAX_X_BYTES:
        return None
    n = static_int(ql.n)
    flops = 2.0 * m * (n if n is not None else 1 << 20) * k
    return TilePlan(group, chunk, cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS)


def _ramp(base: Expr, lanes: int) -> Expr:
    return ex.Ramp(base, Const(1), ScalarType(dt.index, lanes))


class TileBuilder(Q8Builder):
    """Builds the nest of the module docstring for one `TilePlan`."""

    plan: TilePlan  # type: ignore[assignment]

    @property
    def offsets(self) -> bool:
        return self.ql.kind == "int4"

    def strided(self, prefix: str, dtype: dt.DType, groups: int) -> lp.Buffer:
        """A local `[16 rows, groups]` buffer stored group-major (`[g][r]`: a group's scales of
        the 16 rows are one vector) that `quantize_group` writes as `buf[r, g]`."""
        buf = lp.Buffer(self.kb.fresh(prefix), dtype, (Const(TILE), Const(groups)), (Const(1), Const(TILE)), "local")
        self.kb.emit(lp.Alloc(buf))
        return buf

    def build(self) -> lp.Stmt:
        kb, plan, ql = self.kb, self.plan, self.ql
        k, m = static_int(ql.k), static_int(ql.m)
        assert k is not None and m is not None
        groups = k // plan.agroup
        kb.push()
        xq = self.buffer("xq", dt.i8, (TILE, k))
        xv = self.buffer("xv", dt.i32, (k // 4 * TILE,))
        xd = self.strided("xd", dt.f32, groups)
        xs = self.strided("xs", dt.f32, groups)
        rb = self.var("rb")
        kb.push()
        base = self.let(ex.mul(rb, Const(TILE)), "base")
        here = self.let(ex.minimum(Const(TILE), ex.sub(Const(m), base)), "here")
        self.quantize_block(base, here, groups, xq, xd, xs, self.offsets)
        if m % TILE:
            self.zero_rows(here, xq, xd, xs, k, groups)
        self.tile_layout(xq, xv, k)
        kb.emit(self.items(base, here, xv, xd, xs, k, groups))
        self.loop(rb, Const(-(-m // TILE)), kb.pop())
        return kb.pop()

    def zero_rows(self, here: Expr, xq: lp.Buffer, xd: lp.Buffer, xs: lp.Buffer, k: int, groups: int) -> None:
        """Rows `here` .. 15 of the block (past M) as zeros: their products are zeros."""
        kb = self.kb
        r, j = self.var("r"), self.var("j")
        kb.push()
        kb.push()
        kb.emit(lp.Store(xq.name, (r, _ramp(ex.mul(j, Const(4)), 4)), ex.const(0, dt.i8, 4)))
        self.loop(j, Const(k // 4), kb.pop())
        kb.push()
        for buf in (xd, xs):
            kb.emit(lp.Store(buf.name, (r, j), Const(0.0, F32)))
        self.loop(j, Const(groups), kb.pop())
        kb.emit(lp.For(r, here, ex.sub(Const(TILE), here), "serial", kb.pop()))

    def tile_layout(self, xq: lp.Buffer, xv: lp.Buffer, k: int) -> None:
        """`xv[16 k4 + r] = i32(xq[r, 4 k4 .. 4 k4 + 3])`: x as the tile product's B operand."""
        kb = self.kb
        j = self.var("k4")
        kb.push()
        for r in range(TILE):
            four = ex.Load(xq.name, (Const(r), _ramp(ex.mul(j, Const(4)), 4)), ScalarType(dt.i8, 4))
            kb.emit(lp.Store(xv.name, (ex.add(ex.mul(j, Const(TILE)), Const(r)),), ex.Bitcast(four, ScalarType(dt.i32))))
        self.loop(j, Const(k // 4), kb.pop())

    # ---- one work item: 16 weight rows ---------------------------------------------------------
    def items(self, base: Expr, here: Expr, xv: lp.Buffer, xd: lp.Buffer, xs: lp.Buffer, k: int,
              groups: int) -> lp.For:
        kb, plan, ql = self.kb, self.plan, self.ql
        item = self.var("w")
        kb.push()
        n0 = self.let(ex.mul(item, Const(TILE)), "n")
        ns = [self.let(ex.minimum(ex.add(n0, Const(c)), ex.sub(ql.n, Const(1))), "nc") for c in range(TILE)]
        dw = self.local("dw", (TILE, groups))
        ow = self.local("ow", (TILE, groups)) if self.offsets else None
        self.scales(ns, dw, ow, groups)
        acc = self.local("acc", (TILE, TILE))
        for c in range(TILE):
            kb.emit(lp.Store(acc.name, (Const(c), _ramp(Const(0), TILE)), ex.const(0.0, dt.f32, TILE)))
        batch = min(GROUP_BATCH, groups)
        a = self.buffer("wt", dt.i8 if ql.kind == "int8" else dt.u8, (batch, plan.agroup // plan.chunk * TILE * plan.chunk))
        prod = self.buffer("tp", dt.i32, (batch, TILE * TILE))
        full = groups // batch * batch
        if full:
            bv = self.var("gb")
            kb.push()
            self.batch(ex.mul(bv, Const(batch)), batch, ns, a, prod, xv, xd, xs, dw, ow, acc)
            self.loop(bv, Const(groups // batch), kb.pop())
        if groups > full:
            self.batch(Const(full), groups - full, ns, a, prod, xv, xd, xs, dw, ow, acc)
        self.store_tile(acc, base, here, n0)
        described = plan.describe()
        previous = kb.attrs.get("qlinear")
        kb.attrs["qlinear"] = described if previous is None else f"{previous} | {described}"
        # A work item reads 16 rows side by side, 16 streams the hardware prefetchers follow
        # badly: each load of the weight prefetches the same bytes of the next item's rows.
        kb.attrs["prefetch"] = f"{self.q_load.buffer}:{TILE * (k // 2 if ql.kind == 'int4' else k)}"
        notes = ((("origin", "; ".join(kb.origins)),) if kb.origins else ()) + (("qlinear", described),)
        kind = "parallel" if plan.parallel else "serial"
        return lp.For(item, Const(0), _cdiv_expr(ql.n, TILE), kind, kb.pop(), notes)

    def scales(self, ns: list[Expr], dw: lp.Buffer, ow: Optional[lp.Buffer], groups: int) -> None:
        """`dw[c, G]` = the scale of weight row `ns[c]`, group G, in f32; `ow[c, G]` its offset
        coefficient (the min, or -8 d for symmetric int4)."""
        kb, ql = self.kb, self.ql
        gv = self.var("g")
        kb.push()
        for c in range(TILE):
            d = kb.bind(ex.cast(kb.value_at(ql.scales, (ns[c], gv)), dt.f32), "dw")
            kb.emit(lp.Store(dw.name, (Const(c), gv), d))
            if ow is None:
                continue
            if ql.symmetric:
                o: Expr = ex.Binary("mul", d, Const(-8.0, F32), F32)
            else:
                assert ql.mins is not None
                o = ex.cast(kb.value_at(ql.mins, (ns[c], gv)), dt.f32)
            kb.emit(lp.Store(ow.name, (Const(c), gv), o))
        self.loop(gv, Const(groups), kb.pop())

    def batch(self, g0: Expr, size: int, ns: list[Expr], a: lp.Buffer, prod: lp.Buffer, xv: lp.Buffer,
              xd: lp.Buffer, xs: lp.Buffer, dw: lp.Buffer, ow: Optional[lp.Buffer], acc: lp.Buffer) -> None:
        """Groups `g0 .. g0 + size` of the 16 weight rows in three loops: their codes into the A
        operands (`a[j]`), the tile products into `prod[j]`, then the scaled sums into
        `acc[c, :]` (rows of x in the lanes). Apart, no loop waits on the one before: a tile
        load after the vector stores of its operand, the vector loads after the tile store of
        a product, each wait for memory, and a group at a time every group waited twice."""
        kb, plan, ql = self.kb, self.plan, self.ql
        ag, chunk = plan.agroup, plan.chunk
        chunks = ag // chunk
        signed = ql.kind == "int8"
        code_t = dt.i8 if signed else dt.u8
        j = self.var("j")
        kb.push()
        g = ex.add(g0, j)
        for c in range(TILE):
            for part, codes in self.codes(ns[c], g):
                ch, off = divmod(part, chunk)
                kb.emit(lp.Store(a.name, (j, _ramp(Const((ch * TILE + c) * chunk + off), codes.type.lanes)), codes))
        self.loop(j, Const(size), kb.pop())
        it = ScalarType(dt.i32, TILE * TILE)
        name = ex.TILE_DOT_I8I8 if signed else ex.TILE_DOT_U8I8
        j = self.var("j")
        kb.push()
        g = ex.add(g0, j)
        total: Expr = ex.const(0, dt.i32, TILE * TILE)
        for ch in range(chunks):
            wa = ex.Load(a.name, (j, _ramp(Const(ch * TILE * chunk), TILE * chunk)), ScalarType(code_t, TILE * chunk))
            q0 = ex.add(ex.mul(g, Const(ag // 4 * TILE)), Const(ch * chunk // 4 * TILE))
            xb = ex.Bitcast(ex.Load(xv.name, (_ramp(q0, chunk // 4 * TILE),), ScalarType(dt.i32, chunk // 4 * TILE)),
                            ScalarType(dt.i8, TILE * chunk))
            total = kb.bind(ex.Call(name, (total, wa, xb), it), "tp")
        kb.emit(lp.Store(prod.name, (j, _ramp(Const(0), TILE * TILE)), total))
        self.loop(j, Const(size), kb.pop())
        j = self.var("j")
        kb.push()
        g = ex.add(g0, j)
        vt = ScalarType(dt.f32, TILE)
        lanes = _ramp(Const(0), TILE)
        dxv = kb.bind(ex.Load(xd.name, (lanes, g), vt), "dxv")
        sxv = kb.bind(ex.Load(xs.name, (lanes, g), vt), "sxv") if ow is not None else None
        for c in range(TILE):
            sums = ex.cast(ex.Load(prod.name, (j, _ramp(Const(c * TILE), TILE)), ScalarType(dt.i32, TILE)), dt.f32)
            scale = ex.Binary("mul", dxv, ex.Broadcast(ex.Load(dw.name, (Const(c), g), F32), vt), vt)
            cur = ex.Call("fma", (sums, scale, ex.Load(acc.name, (Const(c), lanes), vt)), vt)
            if ow is not None and sxv is not None:
                cur = ex.Call("fma", (ex.Broadcast(ex.Load(ow.name, (Const(c), g), F32), vt), sxv, cur), vt)
            kb.emit(lp.Store(acc.name, (Const(c), lanes), cur))
        self.loop(j, Const(size), kb.pop())

    def codes(self, n: Expr, g: Expr) -> list[tuple[int, Expr]]:
        """The codes of group `g` of weight row `n` in the group's element order, as (offset in
        the group, byte vector) parts: int4's packed bytes split into low and high nibbles
        (element t and h + t of byte t), int8's codes as they are."""
        ag, ql = self.plan.agroup, self.ql
        if ql.kind == "int8":
            step = min(ag, MAX_TILE_K)
            return [(s, self.q_bytes(n, ex.add(ex.mul(g, Const(ag)), Const(s)), step)) for s in range(0, ag, step)]
        h = ag // 2
        step = min(h, MAX_TILE_K)
        out: list[tuple[int, Expr]] = []
        for s in range(0, h, step):
            raw = self.kb.bind(self.q_bytes(n, ex.add(ex.mul(g, Const(h)), Const(s)), step), "b")
            u8 = raw.type
            out.append((s, ex.Binary("and", raw, ex.const(15, dt.u8, step), u8)))
            out.append((h + s, ex.Binary("shr", raw, ex.const(4, dt.u8, step), u8)))
        return out

    def store_tile(self, acc: lp.Buffer, base: Expr, here: Expr, n0: Expr) -> None:
        """`out[base + r, n0 + c] = epilogue(acc[c, r])` for the rows of x and weight rows that exist."""
        kb, ql = self.kb, self.ql
        tile = self.local("ct", (TILE, TILE))
        lanes = _ramp(Const(0), TILE)
        for col in range(TILE):  # acc is read at constant indices only: it stays in registers
            kb.emit(lp.Store(tile.name, (Const(col), lanes), ex.Load(acc.name, (Const(col), lanes), ScalarType(dt.f32, TILE))))
        r, c = self.var("r"), self.var("c")
        kb.push()
        kb.push()
        value = kb.bind(ex.Load(tile.name, (c, r), F32), "x")
        idx = (*ql.row_index(ex.add(base, r)), ex.add(n0, c))
        _store_epilogue(kb, self.root, self.qop, self.out, idx, value)
        self.loop(r, here, kb.pop())
        self.loop(c, ex.minimum(Const(TILE), ex.sub(ql.n, n0)), kb.pop())


def build_qlinear_tiles(kb: "KernelBuilder", root: "Op", qop: "Op", out: lp.Buffer, plan: TilePlan,
                        probes: tuple[ex.Load, ex.Load, Var, Var, Var]) -> lp.Stmt:
    """The tile kernel computing `root` into `out` (`probes` as `qlinear._probes`)."""
    x_load, q_load, row, k, n = probes
    return TileBuilder(kb, root, qop, out, plan, x_load, q_load, row, k, n).build()  # type: ignore[arg-type]
