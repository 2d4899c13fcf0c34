"""The cooperative flash-attention schedule: a workgroup computes a block of query rows against
tiles of keys, each invocation a register micro-tile of the score block, as the GEMM template
(`gemm.py`) tiles a product.

The tile `BQxBK/TMxTN` (`FlashTile`): a workgroup takes `BQ` query rows of one (batch, head)
with `(BQ/TM) x (BK/TN)` invocations; invocation `(ty, tx)` owns the rows `ty*TM .. ty*TM+TM-1`
and the keys `tx, tx + TX, tx + 2 TX, ...` of each tile of `BK` keys (`TX = BK/TN`, keys
interleaved so that the lanes of a row read consecutive key rows), and the output columns
(vec4s) `tx, tx + TX, ...` of its rows. Per workgroup:

    Qs[BQ][D]  <- q rows, pre-scaled by scale * log2(e)      (once)
    for each tile of BK keys (causal: only tiles up to the block's last row)
      Ks[BK][D], Vs[BK][Dv] <- keys and values (zero past the last key)       barrier
      S = Qs Ks^T: TM x TN scores per invocation, f32 FMAs over D (vec4 reads)
      + mask; -inf past the last key or (causal) above the diagonal
      row max of the tile: over the invocation's TN keys, then over the TX lanes of the row
        (`subgroupShuffleXor` where the adapter has subgroups of at least TX lanes,
        else through workgroup memory)
      m_new = max(m, tile max); corr = exp2(m - m_new); l, O *= corr
      P = exp2(S - m_new) -> Ps[BK][BQ]                                      barrier
      O += P Vs: TM x (Dv/TX) outputs per invocation, vec4 FMAs
    l summed over the TX lanes of the row; out = O / l

All accumulation is f32; the base-2 exponent saves a multiply per score (the scale and mask are
multiplied by log2(e) once). Workgroup memory is read with static offsets plus the invocation's
own indices; `Ks` and `Ps` rows are XOR-swizzled in 16-byte units (`c ^ (row & 7)`) so that the
lanes of a quarter-warp hit different banks without padding. `Ps` shares `Ks`'s memory when both
would not fit (a barrier between the score and the probability phase). Under a causal mask the
last query blocks see the most keys: workgroups take them first, and from `PAIR_BLOCKS` blocks
on a workgroup takes two blocks, the i-th from each end, so that all walk the same number of
key tiles. With `/s2` tiles the next tile's keys and values are loaded into registers while the
current tile is used (stored to workgroup memory at the top of the next step). Where the
query rows and the keys are static and the tile divides them (and, under a causal mask, the
last key of every block is a tile boundary), the loads of q, k and v and the stores of the
output are unconditional: every row and key a workgroup touches is in range.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from ...ir import expr as ex
from ...ir.expr import Const, Expr
from .types import WgslUnsupported

if TYPE_CHECKING:  # pragma: no cover
    from .attention import AttentionEmitter

LOG2E = 1.4426950408889634
#: Tiles tried in order by `auto` (the first that fits the device and the row count).
#: (H200, causal B=4 H=12 T=1024 D=64: 64x64/4x4/s2 347 us, 64x32/4x4/s2 403 us, 64x64/4x4
#: 489 us, 64x64/4x8/s2 444 us; PyTorch CUDA eager 291 us.)
AUTO_TILES = ("64x64/4x4/s2", "64x32/4x4/s2", "32x32/4x4/s2", "16x32/4x4/s2", "16x16/4x4/s2")
#: Under a causal mask, a workgroup takes two query blocks (the i-th from each end) from this
#: many blocks on: every workgroup then has the same number of key tiles.
PAIR_BLOCKS = 4


@dataclass(frozen=True)
class FlashTile:
    """`BQxBK/TMxTN`: query rows and keys of a workgroup's tile, rows and keys per invocation."""

    bq: int
    bk: int
    tm: int
    tn: int
    #: 2: the next tile's keys and values are loaded into registers while this one is used.
    stages: int = 1

    @staticmethod
    def parse(text: str) -> "FlashTile":
        try:
            block, thread, *rest = text.split("/")
            bq, bk = (int(x) for x in block.split("x"))
            tm, tn = (int(x) for x in thread.split("x"))
            if len(rest) > 1 or (rest and rest[0] not in ("s1", "s2")):
                raise ValueError
            stages = int(rest[0][1:]) if rest else 1
        except ValueError:
            raise WgslUnsupported(f"attention tile {text!r}: expected BQxBK/TMxTN[/s2], e.g. 64x64/4x4") from None
        tile = FlashTile(bq, bk, tm, tn, stages)
        if min(bq, bk, tm, tn) < 1 or tm % 4 or bq % tm or bk % tn or bk % 4:
            raise WgslUnsupported(f"attention tile {text!r}: TM a multiple of 4 dividing BQ, TN dividing BK, "
                                  "BK a multiple of 4")
        return tile

    @property
    def tx(self) -> int:
        return self.bk // self.tn

    @property
    def threads(self) -> int:
        return (self.bq // self.tm) * self.tx

    def __str__(self) -> str:
        return f"{self.bq}x{self.bk}/{self.tm}x{self.tn}" + ("/s2" if self.stages == 2 else "")


def _pow2_factor(n: int, cap: int = 8) -> int:
    """The largest power of two dividing `n`, at most `cap` (the XOR swizzle's span)."""
    p = 1
    while p < cap and n % (2 * p) == 0:
        p *= 2
    return p


@dataclass(frozen=True)
class Layout:
    """Workgroup arrays of a tile for head dims `d4`, `v4` (in vec4s)."""

    tile: FlashTile
    d4: int
    v4: int
    #: `Ps` lives in `Ks`'s memory.
    alias: bool
    #: Where the row reductions go when not through subgroups: "own" (`fa_red`), "ks" (the
    #: start of `Ks`, behind a barrier), "none" (one lane per row: nothing to reduce).
    red: str

    @property
    def ks(self) -> int:
        t = self.tile
        n = max(t.bk * self.d4, t.bk * t.bq // 4) if self.alias else t.bk * self.d4
        return max(n, -(-t.bq * t.tx // 4)) if self.red == "ks" else n

    def nbytes(self) -> int:
        t = self.tile
        n = 16 * (t.bq * self.d4 + self.ks + t.bk * self.v4 + (0 if self.alias else t.bk * t.bq // 4))
        return n + (4 * t.bq * t.tx if self.red == "own" else 0)

    def red_ref(self, n: str) -> str:
        """The reduction slot `n` (an u32 expression)."""
        return f"fa_red[{n}]" if self.red == "own" else f"fa_Ks[({n}) / 4u][({n}) % 4u]"


def plan(tile: FlashTile, d4: int, v4: int, budget: int, max_threads: int) -> Optional[Layout]:
    """The tile's layout within `budget` bytes of workgroup memory (`Ps` and the reduction
    slots apart from `Ks` where they fit, else sharing it), or None when it does not fit."""
    if tile.threads > max_threads or tile.tx > 64:
        return None
    reds = ("none",) if tile.tx == 1 else ("own", "ks")
    for red in reds:
        for alias in (False, True):
            lay = Layout(tile, d4, v4, alias, red)
            if lay.nbytes() <= budget:
                return lay
    return None


def choose(annotation: Optional[str], d4: int, v4: int, tq: Optional[int], budget: int,
           max_threads: int) -> Optional[Layout]:
    """The layout of the annotated tile (`gpu_tile` on the attention nest) where it fits, else
    of the first `AUTO_TILES` entry that fits and does not exceed the row count much; None: use
    the per-row schedule."""
    if annotation == "rows":
        return None
    if annotation and annotation != "auto":
        lay = plan(FlashTile.parse(annotation), d4, v4, budget, max_threads)
        if lay is not None:
            return lay
    rows = None if tq is None else max(16, 1 << max(0, (tq - 1).bit_length()))
    for text in AUTO_TILES:
        tile = FlashTile.parse(text)
        if rows is not None and tile.bq > rows:
            continue
        lay = plan(tile, d4, v4, budget, max_threads)
        if lay is not None:
            return lay
    return None


def emit_tiled(em: "AttentionEmitter", lay: Layout) -> tuple[list[str], int, Expr, str]:
    """The shader body of the cooperative schedule (module docstring): lines, workgroup size,
    workgroup count, summary."""
    k, nest = em.k, em.nest
    r = k.r
    t = lay.tile
    d4, v4 = lay.d4, lay.v4
    bq, bk, tm, tn, tx_n = t.bq, t.bk, t.tm, t.tn, t.tx
    wg = t.threads
    bq4 = bq // 4
    cv = -(-v4 // tx_n)
    sub = k.caps.subgroups and tx_n > 1
    pk = _pow2_factor(d4)
    pp = _pow2_factor(bq4)
    if tx_n % pk or tx_n % pp:  # the swizzle keys off `tx` only when TX is a multiple of its span
        pk = pp = 1
    k.workgroup_arrays["fa_Qs"] = f"var<workgroup> fa_Qs: array<vec4<f32>, {bq * d4}>;"
    k.workgroup_arrays["fa_Ks"] = f"var<workgroup> fa_Ks: array<vec4<f32>, {lay.ks}>;"
    k.workgroup_arrays["fa_Vs"] = f"var<workgroup> fa_Vs: array<vec4<f32>, {bk * v4}>;"
    ps = "fa_Ks" if lay.alias else "fa_Ps"
    if not lay.alias:
        k.workgroup_arrays["fa_Ps"] = f"var<workgroup> fa_Ps: array<vec4<f32>, {bk * bq4}>;"
    if lay.red == "own":
        k.workgroup_arrays["fa_red"] = f"var<workgroup> fa_red: array<f32, {bq * tx_n}>;"
    em.uses_subgroups = sub
    tq = nest.grid[-1].extent
    heads: Expr = Const(1)
    for f in nest.grid[:-1]:
        heads = ex.mul(heads, f.extent)
    nqb = ex.floordiv(ex.add(tq, Const(bq - 1)), Const(bq))
    if nest.causal:  # pairs of blocks from PAIR_BLOCKS blocks on: ceil(nqb / 2) workgroups per head
        nqb = ex.sub(nqb, ex.mul(ex.floordiv(nqb, Const(2)),
                                 ex.minimum(Const(1), ex.floordiv(nqb, Const(PAIR_BLOCKS)))))
    groups = ex.mul(heads, nqb)
    scale = f"f32({nest.scale * LOG2E!r})"
    # static extents the tile divides: the checks they make always true are left out
    tq_static = tq.value if isinstance(tq, Const) else None
    rows_whole = tq_static is not None and tq_static > 0 and tq_static % bq == 0
    keys_whole = [isinstance(keys.extent, Const) and 0 < int(keys.extent.value) and int(keys.extent.value) % bk == 0
                  and (not nest.causal or (tq_static is not None and tq_static > 0 and tq_static % bk == 0
                                           and bq % bk == 0))
                  for keys in nest.keys]
    L: list[str] = []
    a = L.append
    a("  let fa_g = wid.y * nwg.x + wid.x;")
    a(f"  let fa_tq = {r.scalar(tq)};")
    a(f"  let fa_nqb = u32((fa_tq + {bq - 1}) / {bq});")
    a(f"  let fa_heads = u32({r.scalar(heads)});")
    # under a causal mask, block i sees i + 1 key tiles: a workgroup takes the blocks nqb-1-p
    # and p (every pair the same work) once there are enough blocks to fill the device
    a(f"  let fa_pair = {'fa_nqb >= ' + str(PAIR_BLOCKS) + 'u' if nest.causal else 'false'};")
    a("  let fa_nw = select(fa_nqb, (fa_nqb + 1u) / 2u, fa_pair);")
    a("  if (fa_g >= fa_nw * fa_heads) { return; }")
    a("  let fa_pi = fa_g / fa_heads;")
    a("  let fa_rest = fa_g % fa_heads;")
    saved, k.lines, k.indent = k.lines, [], 1
    k.unflatten("fa_rest", nest.grid[:-1], [f.extent for f in nest.grid[:-1]])
    L += k.lines
    k.lines = saved
    a(f"  let fa_tx = lid % {tx_n}u;")
    a(f"  let fa_ty = lid / {tx_n}u;")
    a(f"  let fa_kx = fa_tx & {pk - 1}u;")
    a(f"  let fa_px = fa_tx & {pp - 1}u;")
    if t.stages == 2:
        for which, w in (("k", d4), ("v", v4)):
            for n in range(-(-bk * w // wg)):
                a(f"  var fa_r{which}{n}: vec4<f32>;")
    a("  for (var fa_half: u32 = 0u; fa_half < select(1u, 2u, fa_pair); fa_half = fa_half + 1u) {")
    # the last block (the longest under a causal mask) first
    a("  let fa_qb = select(fa_nqb - 1u - fa_pi, fa_pi, fa_half == 1u);")
    a("  if (fa_half == 1u && fa_qb == fa_nqb - 1u - fa_pi) { break; }")
    a("  workgroupBarrier();")
    a(f"  let fa_q0 = i32(fa_qb) * {bq};")
    a("  let fa_any = min(fa_q0, fa_tq - 1);")  # a row for the k/v accessors' (unused) row argument
    for rr in range(tm):
        a(f"  let fa_r{rr} = fa_q0 + i32(fa_ty) * {tm} + {rr};")
    # q rows, pre-scaled
    a(f"  for (var t: u32 = lid; t < {bq * d4}u; t = t + {wg}u) {{")
    a(f"    let row = fa_q0 + i32(t / {d4}u);")
    a("    var x = vec4<f32>(0.0);")
    q = f"{em._vec('fa_q', em._args('row'), f'i32(t % {d4}u) * 4')} * {scale}"
    a(f"    x = {q};" if rows_whole else f"    if (row < fa_tq) {{ x = {q}; }}")
    a("    fa_Qs[t] = x;")
    a("  }")
    for rr in range(tm):
        a(f"  var fa_rm{rr} = -tb_inf();")
        a(f"  var fa_l{rr} = 0.0;")
        for ci in range(cv):
            a(f"  var fa_o{rr}_{ci} = vec4<f32>(0.0);")
    for s, keys in enumerate(nest.keys):
        a("  {")
        a(f"  let fa_T = {r.scalar(keys.extent)};")
        a(f"  let fa_E = {f'min(fa_T, min(fa_tq, fa_q0 + {bq}))' if nest.causal else 'fa_T'};")
        if t.stages == 2:
            _fetch(L, em, s, "k", d4, bk, wg, "0", keys_whole[s])
            _fetch(L, em, s, "v", v4, bk, wg, "0", keys_whole[s])
        a(f"  for (var fa_j0: i32 = 0; fa_j0 < fa_E; fa_j0 = fa_j0 + {bk}) {{")
        a("    workgroupBarrier();")
        if t.stages == 2:
            _stash(L, "k", d4, bk, wg, pk)
            _stash(L, "v", v4, bk, wg, 1)
            a("    workgroupBarrier();")
            a(f"    if (fa_j0 + {bk} < fa_E) {{")
            _fetch(L, em, s, "k", d4, bk, wg, f"fa_j0 + {bk}", keys_whole[s])
            _fetch(L, em, s, "v", v4, bk, wg, f"fa_j0 + {bk}", keys_whole[s])
            a("    }")
        else:
            _stage(L, em, s, "k", d4, bk, wg, pk, keys_whole[s])
            _stage(L, em, s, "v", v4, bk, wg, 1, keys_whole[s])
            a("    workgroupBarrier();")
        _scores(L, d4, tm, tn, tx_n, pk)
        _mask(L, em, s, tm, tn, tx_n, bk, nest.m[s] is not None, nest.causal)
        # the tile's row maxima, over the invocation's keys then the row's lanes
        for rr in range(tm):
            terms = [f"fa_s{rr}_{i}" for i in range(tn)]
            a(f"    var fa_x{rr} = {_fold('max', terms)};")
        _row_reduce(L, "max", tm, tx_n, sub, lay)
        for rr in range(tm):
            a(f"    let fa_mn{rr} = max(fa_rm{rr}, fa_x{rr});")
            a(f"    let fa_mu{rr} = select(fa_mn{rr}, 0.0, fa_mn{rr} == -tb_inf());")
            a(f"    let fa_c{rr} = exp2(fa_rm{rr} - fa_mu{rr});")
            a(f"    fa_rm{rr} = fa_mn{rr};")
            for i in range(tn):
                a(f"    let fa_p{rr}_{i} = exp2(fa_s{rr}_{i} - fa_mu{rr});")
            a(f"    fa_l{rr} = fa_l{rr} * fa_c{rr} + {_fold('+', [f'fa_p{rr}_{i}' for i in range(tn)])};")
            for ci in range(cv):
                a(f"    fa_o{rr}_{ci} = fa_o{rr}_{ci} * fa_c{rr};")
        if lay.alias:
            # every read of Ks (scores, reduction slots) is done before P overwrites it
            a("    workgroupBarrier();")
        for i in range(tn):
            for h in range(tm // 4):
                quad = ", ".join(f"fa_p{4 * h + e}_{i}" for e in range(4))
                a(f"    {ps}[(fa_tx + {tx_n * i}u) * {bq4}u + ((fa_ty * {tm // 4}u + {h}u) ^ fa_px)] = vec4<f32>({quad});")
        a("    workgroupBarrier();")
        _pv(L, ps, bk, bq4, v4, tm, cv, tx_n, pp)
        a("  }")
        a("  }")
    # the row sums over the row's lanes, then the output
    for rr in range(tm):
        a(f"  var fa_x{rr} = fa_l{rr};")
    _row_reduce(L, "+", tm, tx_n, sub, lay, ind="  ")
    for rr in range(tm):
        a("  {" if rows_whole else f"  if (fa_r{rr} < fa_tq) {{")
        a(f"    let fa_inv = 1.0 / fa_x{rr};")
        for ci in range(cv):
            a(f"    {{ let c4 = fa_tx + {tx_n * ci}u;")
            for e in range(4):
                a(f"      if (c4 * 4u + {e}u < {nest.dv}u) {{ "
                  f"fa_out({em._args(f'fa_r{rr}')}, i32(c4) * 4 + {e}, fa_o{rr}_{ci}.{'xyzw'[e]} * fa_inv); }}")
            a("    }")
        a("  }")
    a("  }")  # the half loop
    summary = (f"attention/flash {t}" + (" subgroups" if sub else "") + (" alias" if lay.alias else "")
               + (" red-in-ks" if lay.red == "ks" else ""))
    return L, wg, groups, summary


def _fold(op: str, terms: list[str]) -> str:
    """A balanced tree of `op` over `terms` (short dependency chains)."""
    while len(terms) > 1:
        nxt = []
        for i in range(0, len(terms) - 1, 2):
            x, y = terms[i], terms[i + 1]
            nxt.append(f"max({x}, {y})" if op == "max" else f"({x} + {y})")
        if len(terms) % 2:
            nxt.append(terms[-1])
        terms = nxt
    return terms[0]


def _stage(L: list[str], em: "AttentionEmitter", s: int, which: str, w: int, bk: int, wg: int, pk: int,
           whole: bool) -> None:
    """Keys (`which` = "k", XOR-swizzled rows) or values of the tile into workgroup memory;
    zero past the last key (`fa_E`; unchecked when `whole`: every tile ends at or before it);
    consecutive invocations read consecutive vec4s of a row."""
    arr = "fa_Ks" if which == "k" else "fa_Vs"
    fn = f"fa_{which}{s}"
    slot = f"j * {w}u + (c ^ (j & {pk - 1}u))" if pk > 1 else "t"
    L.append(f"    for (var t: u32 = lid; t < {bk * w}u; t = t + {wg}u) {{")
    L.append(f"      let j = t / {w}u;")
    L.append(f"      let c = t % {w}u;")
    L.append("      let jj = fa_j0 + i32(j);")
    L.append("      var x = vec4<f32>(0.0);")
    load = em._vec(fn, em._args('fa_any', 'jj'), 'i32(c) * 4')
    L.append(f"      x = {load};" if whole else f"      if (jj < fa_E) {{ x = {load}; }}")
    L.append(f"      {arr}[{slot}] = x;")
    L.append("    }")


def _fetch(L: list[str], em: "AttentionEmitter", s: int, which: str, w: int, bk: int, wg: int, j0: str,
           whole: bool) -> None:
    """The invocation's share of the tile from key `j0` into registers `fa_r<which><n>` (zero
    past the last key; unchecked when `whole`): the loads are in flight while the current tile
    is used."""
    fn = f"fa_{which}{s}"
    for n in range(-(-bk * w // wg)):
        reg = f"fa_r{which}{n}"
        L.append(f"    {{ let t = lid + {n * wg}u;")
        L.append(f"      let jj = {j0} + i32(t / {w}u);")
        L.append(f"      {reg} = vec4<f32>(0.0);")
        conds = ([] if bk * w % wg == 0 else [f"t < {bk * w}u"]) + ([] if whole else ["jj < fa_E"])
        load = em._vec(fn, em._args('fa_any', 'jj'), f'i32(t % {w}u) * 4')
        L.append(f"      if ({' && '.join(conds)}) {{ {reg} = {load}; }}" if conds else f"      {reg} = {load};")
        L.append("    }")


def _stash(L: list[str], which: str, w: int, bk: int, wg: int, pk: int) -> None:
    """Registers `fa_r<which><n>` (`_fetch`) into the workgroup tile (keys XOR-swizzled)."""
    arr = "fa_Ks" if which == "k" else "fa_Vs"
    for n in range(-(-bk * w // wg)):
        guard = "" if bk * w % wg == 0 else f"if (t < {bk * w}u) "
        slot = f"(t / {w}u) * {w}u + ((t % {w}u) ^ ((t / {w}u) & {pk - 1}u))" if pk > 1 else "t"
        L.append(f"    {{ let t = lid + {n * wg}u; {guard}{{ {arr}[{slot}] = fa_r{which}{n}; }} }}")


def _scores(L: list[str], d4: int, tm: int, tn: int, tx_n: int, pk: int) -> None:
    """`fa_s<r>_<i>` = the scaled dot product of row r and key i of the invocation (vec4 reads of
    Qs and Ks, one FMA chain per score)."""
    a = L.append
    for rr in range(tm):
        for i in range(tn):
            a(f"    var fa_s{rr}_{i} = 0.0;")
    unrolled = d4 <= 16
    if not unrolled:
        a(f"    for (var dd: u32 = 0u; dd < {d4}u; dd = dd + 1u) {{")
    steps = range(d4) if unrolled else [None]
    for dd in steps:
        c = f"{dd}u" if dd is not None else "dd"
        col = f"({c} ^ fa_kx)" if pk > 1 else c
        a("    {")
        for rr in range(tm):
            a(f"      let q{rr} = fa_Qs[(fa_ty * {tm}u + {rr}u) * {d4}u + {c}];")
        for i in range(tn):
            a(f"      let k{i} = fa_Ks[(fa_tx + {tx_n * i}u) * {d4}u + {col}];")
        for rr in range(tm):
            for i in range(tn):
                acc = f"fa_s{rr}_{i}"
                a(f"      {acc} = fma(q{rr}.w, k{i}.w, fma(q{rr}.z, k{i}.z, fma(q{rr}.y, k{i}.y, "
                  f"fma(q{rr}.x, k{i}.x, {acc}))));")
        a("    }")
    if not unrolled:
        a("    }")


def _mask(L: list[str], em: "AttentionEmitter", s: int, tm: int, tn: int, tx_n: int, bk: int, masked: bool,
          causal: bool) -> None:
    """Add the mask (times log2(e)) to the scores of real rows and keys; -inf past the last key
    and, under a causal mask, above the diagonal. Without a mask tensor only a tile that ends
    past the last key or crosses the diagonal has scores to set to -inf (under a causal mask,
    the diagonal tile of each block: the others are skipped by a branch the whole workgroup
    takes alike)."""
    a = L.append
    for i in range(tn):
        a(f"    let fa_key{i} = fa_j0 + i32(fa_tx) + {tx_n * i};")
    ind = "    "
    if not masked:
        edge = f"fa_j0 + {bk} > fa_E" + (f" || fa_j0 + {bk - 1} > fa_q0" if causal else "")
        a(f"    if ({edge}) {{")
        ind = "      "
    for rr in range(tm):
        for i in range(tn):
            ok = f"fa_key{i} < fa_E" + (f" && fa_key{i} <= fa_r{rr}" if causal else "")
            sc = f"fa_s{rr}_{i}"
            if masked:
                a(f"    if ({ok} && fa_r{rr} < fa_tq) {{ {sc} = {sc} + f32({LOG2E!r}) * "
                  f"fa_m{s}({em._args(f'fa_r{rr}', f'fa_key{i}')}, 0); }}")
            a(f"{ind}{sc} = select(-tb_inf(), {sc}, {ok});")
    if not masked:
        a("    }")


def _row_reduce(L: list[str], op: str, tm: int, tx_n: int, sub: bool, lay: Layout, ind: str = "    ") -> None:
    """`fa_x<r>` = the `op` ("max" or "+") of `fa_x<r>` over the TX lanes of each row: subgroup
    shuffles where subgroups have at least TX lanes (lanes `tx` of a row are consecutive
    invocations), else through reduction slots in workgroup memory (`Layout.red_ref`)."""
    a = L.append
    if tx_n == 1:
        return

    def comb(x: str, y: str) -> str:
        return f"max({x}, {y})" if op == "max" else f"({x} + {y})"

    if sub:
        a(f"{ind}if (tb_sg_n >= {tx_n}u) {{")
        off = 1
        while off < tx_n:
            for rr in range(tm):
                a(f"{ind}  fa_x{rr} = {comb(f'fa_x{rr}', f'subgroupShuffleXor(fa_x{rr}, {off}u)')};")
            off *= 2
        a(f"{ind}}} else {{")
        inner = ind + "  "
    else:
        inner = ind
    if lay.red == "ks":
        a(f"{inner}workgroupBarrier();")  # every read of Ks is done
    for rr in range(tm):
        a(f"{inner}{lay.red_ref(f'(fa_ty * {tm}u + {rr}u) * {tx_n}u + fa_tx')} = fa_x{rr};")
    a(f"{inner}workgroupBarrier();")
    for rr in range(tm):
        base = f"(fa_ty * {tm}u + {rr}u) * {tx_n}u"
        terms = [lay.red_ref(f"{base} + {x}u") for x in range(tx_n)]
        a(f"{inner}fa_x{rr} = {_fold(op, terms)};")
    if sub:
        a(f"{ind}}}")


def _pv(L: list[str], ps: str, bk: int, bq4: int, v4: int, tm: int, cv: int, tx_n: int, pp: int) -> None:
    """O += P V over the tile's keys: per key, the invocation's TM probabilities (vec4 reads of
    Ps) times its value vec4s."""
    a = L.append
    a(f"    for (var j: u32 = 0u; j < {bk}u; j = j + 4u) {{")
    for e in range(4):
        a("      {")
        a(f"        let jj = j + {e}u;")
        for h in range(tm // 4):
            a(f"        let p{h} = {ps}[jj * {bq4}u + ((fa_ty * {tm // 4}u + {h}u) ^ (jj & {pp - 1}u))];")
        for ci in range(cv):
            col = f"fa_tx + {tx_n * ci}u"
            if (ci + 1) * tx_n > v4:
                col = f"min({col}, {v4 - 1}u)"  # lanes past Dv compute a copy, never stored
            a(f"        let v{ci} = fa_Vs[jj * {v4}u + {col}];")
        for rr in range(tm):
            for ci in range(cv):
                acc = f"fa_o{rr}_{ci}"
                a(f"        {acc} = fma(vec4<f32>(p{rr // 4}.{'xyzw'[rr % 4]}), v{ci}, {acc});")
        a("      }")
    a("    }")
