"""The prefill form of the CPU attention kernel: query rows along the vector lanes.

`attention.py`'s row form computes each score as a dot product along the head dim, one
horizontal sum per score. With many query rows (prefill) this form puts `TR = RV * W` rows of
one head in the lanes of `RV` vectors (`W` f32 lanes), so every step is a lane-wise FMA and
the online softmax never sums across lanes:

    parallel for r in 0..B*Hq*ceil(Tq/TR) {          # batch x head x tile of TR query rows
      %qt[d, rr] = scale * q[i0 + rr, d]              # the tile transposed once (rows past Tq: row Tq-1)
      m[:] = -inf; l[:] = 0; %acc[c, :] = 0           # per row (lane): max, sum, output^T
      for each segment, the last one first:
        for jb in 0..ceil(E/BK) {                     # E = Tk, or min(Tk, last row + 1) when causal
          j0 = jb*BK - (ceil(E/BK)*BK - E)             # blocks end at E (`block_origin`)
          (masked: %mk[jj, :] = mask[rows, j0 + jj]; a block whose mask is dead for every row
           of a tile already holding a live maximum is skipped, see below)
          s[jj][v] = sum_d broadcast(k[j0+jj, d]) * %qt[d, v*W..]     # BK x RV accumulators, fma
          s = s (+ %mk) (-inf before key 0, past the diagonal)
          m_new = max(m, max_jj s[jj]); corr = exp(m - m_new); %p[jj] = exp(s[jj] - m_new)
          l = l * corr + sum_jj %p[jj]
          for c-chunks of CC: a[cc][v] = %acc[c0+cc, v*W..] * corr
                              for jj >= -j0: a[cc][v] += broadcast(v[j0+jj, c0+cc]) * %p[jj][v]
                              %acc[c0+cc, v*W..] = a[cc][v]
        }
      out[i0 + rr, c] = %acc[c, rr] / l[rr]           # rows past Tq store nothing
    }

The scores of a tile are a small GEMM (`BK` keys x `TR` rows x `D`) whose operand `k` is
broadcast from memory as it is read: no key block is packed, and `q` is transposed once per
tile. P @ V is a second small GEMM (`Dv` x `TR` x `BK`) with `v` broadcast likewise; its
accumulator `%acc [Dv, TR]` stays in L1 between key blocks and is loaded in chunks of `CC`
columns. The softmax is lane-wise: the running max, sum and correction are vectors of rows.

**Dead blocks.** Masked segments are visited last-first (the online softmax gives the same
result in any order, up to rounding): the LLM engine's step attends over the cache, then its
own keys with a causal mask, so the own keys give every row a live maximum first, and key
blocks masked out for the whole tile (above the diagonal, or the cache slots the step will
fill) are then skipped after reading their mask. A block is dead when every mask value in it
is at most `DEAD_MASK` (-1e30; a boolean mask's false is -inf), and it is skipped only when
every row's running max is at least `LIVE_MAX` (-1e29): each skipped weight
`exp(score + mask - max)` then has an exponent below `score - 9e29`, which is 0 in f32 for any
score of magnitude below 8e29, so skipping changes nothing.

**Registers.** On AVX-512 (W = 16) with `RV = 1` and `BK = 16`, the score loop holds 16
accumulators, the query vector and a broadcast; the P @ V loop 16 accumulators (`CC = 16`),
a probability vector and a broadcast. Loads stay at one per FMA (broadcasts fold into it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from .kernel_builder import KernelBuilder
from .views import Index

F32 = ScalarType(dt.f32)
#: A mask value at or below this is dead (masked out); the LLM engine masks with f32's lowest.
DEAD_MASK = -1e30
#: A row whose running max is at least this has seen a live key (see the module docstring).
LIVE_MAX = -1e29
#: Query tiles shorter than this use the row form (decode, a few speculative rows).
MIN_ROWS = 8


@dataclass(frozen=True)
class TilePlan:
    """The tile: `lanes` rows per vector, `row_vectors` vectors of rows, `block_k` keys per
    score block, `chunk` output columns per P @ V pass."""

    lanes: int
    row_vectors: int = 1
    block_k: int = 16
    chunk: int = 16
    #: Keys per register tile of scores (`block_k` is a multiple of it).
    score_keys: int = 16

    @property
    def rows(self) -> int:
        return self.lanes * self.row_vectors


def tile_plan(lanes: int, registers: int, block_k: int) -> Optional[TilePlan]:
    """Accumulators for `registers` SIMD registers, three kept free (the query or probability
    vectors, a broadcast): `BK x RV` scores and `CC x RV` output columns. None without
    vectors of at least 4 f32 lanes (the row form serves such targets)."""
    if lanes < 4:
        return None
    budget = max(registers - 3, 4)
    sk = max(1, min(block_k, budget))
    return TilePlan(lanes, 1, block_k // sk * sk, min(16, budget), sk)


def tiles_apply(op: Op) -> bool:
    """Whether `op` has enough query rows for the tile form: `Tq` unknown or at least
    `MIN_ROWS` (decode and short steps keep the row form)."""
    tq = op.operands[0].shape[-2]
    return not (isinstance(tq, Const) and int(tq.value) < MIN_ROWS)


def block_origin(kb: KernelBuilder, jb: Expr, block_k: int, lead: Expr) -> tuple[Expr, Expr]:
    """`(j0, first)`: key block `jb` covers keys `j0 + first .. j0 + BK` of its segment, where
    the blocks are counted back from the segment's end (`lead` = ceil(E/BK)*BK - E keys
    missing from block 0, `first` = lead there and 0 after).

    Why from the end: a row's keys end where the segment does (a decode or prefill step's
    cache view ends at the step's own slots), wherever the row starts in the cache (a request
    beside others, left-padded, or moved by a compaction: the slots before its start are
    masked). Blocks counted from slot 0 would group its keys differently in each case, and
    the online softmax rounds per block; from the end each key keeps its block and its lane,
    the masked slots add exact zeros, and a row's result does not depend on its company."""
    j0 = kb.bind(ex.sub(ex.mul(jb, block_k), lead), "j")
    first = kb.bind(ex.maximum(Const(0), ex.sub(lead, ex.mul(jb, block_k))), "j")
    return j0, first


def _clamp(j: Expr, last: Expr) -> Expr:
    """Key index `j` clamped into `0..last` (the block's keys outside the segment are loaded
    from its edge and given -inf scores)."""
    return ex.minimum(ex.maximum(j, Const(0)), last)


class _Tiles:
    """Builds the nest of the module docstring into `kb`."""

    def __init__(self, kb: KernelBuilder, op: Op, out: lp.Buffer, plan: TilePlan,
                 out_index: Callable[[Index], Index]) -> None:
        self.kb, self.out, self.plan = kb, out, plan
        self.out_index = out_index
        self.w = plan.lanes
        self.vt = ScalarType(dt.f32, self.w)
        self.it = ScalarType(dt.index, self.w)
        q = op.operands[0]
        self.q = q
        self.segments = int(op.attrs.get("segments", 1))
        self.masked = bool(op.attrs.get("masked", False))
        self.causal = bool(op.attrs.get("causal", False))
        self.scale = float(op.attrs["scale"])
        s = self.segments
        self.keys = [op.operands[1 + 2 * i] for i in range(s)]
        self.values = [op.operands[2 + 2 * i] for i in range(s)]
        self.masks: list[Optional[Value]] = ([op.operands[1 + 2 * s + i] for i in range(s)]
                                             if self.masked else [None] * s)
        self.batch = q.shape[:-3]
        self.hq, self.tq = q.shape[-3], q.shape[-2]
        self.d = int(q.shape[-1].value)  # type: ignore[attr-defined]
        self.dv = int(self.values[0].shape[-1].value)  # type: ignore[attr-defined]

    # -- helpers --
    def local(self, prefix: str, shape: Sequence[int]) -> lp.Buffer:
        dims = tuple(Const(n) for n in shape)
        buf = lp.Buffer(self.kb.fresh(prefix), dt.f32, dims, lp.contiguous_strides(dims), "local")
        self.kb.emit(lp.Alloc(buf))
        return buf

    def vload(self, buf: lp.Buffer, *index: Expr) -> Expr:
        """`buf[index.., ramp(last, 1, W)]`: a vector of lanes along the last dim."""
        *head, last = index
        return ex.Load(buf.name, (*head, ex.Ramp(last, Const(1), self.it)), self.vt)

    def vstore(self, buf: lp.Buffer, value: Expr, *index: Expr) -> None:
        *head, last = index
        self.kb.emit(lp.Store(buf.name, (*head, ex.Ramp(last, Const(1), self.it)), value))

    def splat(self, x: Expr) -> Expr:
        return ex.Broadcast(x, ScalarType(x.type.dtype, self.w))

    def fconst(self, x: float) -> Expr:
        return ex.Broadcast(Const(x, F32), self.vt)

    def loop(self, prefix: str, extent: Expr, body: Callable[[Var], object], kind: str = "serial",
             annotations: tuple[tuple[str, str], ...] = (), start: Expr = Const(0)) -> None:
        """`for v in start..extent { body(v) }`, the body built in a scope of its own."""
        v = Var(self.kb.fresh(prefix))
        self.kb.push((v,))
        body(v)
        stmts = self.kb.pop()
        count = extent if start == Const(0) else ex.sub(extent, start)
        self.kb.emit(lp.For(v, start, count, kind, stmts, annotations))

    def scalar(self, operand: Value, idx: tuple[Expr, ...]) -> Expr:
        return self.kb.bind(ex.cast(self.kb.value_at(operand, idx), dt.f32), "x")

    def fma(self, a: Expr, b: Expr, c: Expr) -> Expr:
        return ex.Call("fma", (a, b, c), self.vt)

    # -- the nest --
    def build(self, annotations: tuple[tuple[str, str], ...]) -> None:
        kb, plan = self.kb, self.plan
        nt = ex.floordiv(ex.add(self.tq, plan.rows - 1), plan.rows)
        tasks: Expr = ex.mul(self.hq, nt)
        for b in self.batch:
            tasks = ex.mul(tasks, b)

        def per_task(r: Var) -> None:
            qt = kb.bind(ex.mod(r, nt), "qt")
            rest = kb.bind(ex.floordiv(r, nt), "t")
            h = kb.bind(ex.mod(rest, self.hq), "h")
            rest = ex.floordiv(rest, self.hq)
            bidx: list[Expr] = []
            for size in reversed(self.batch):
                bidx.insert(0, kb.bind(ex.mod(rest, size), "b"))
                rest = ex.floordiv(rest, size)
            self.task(tuple(bidx), h, kb.bind(ex.mul(qt, plan.rows), "i"))

        self.loop("r", tasks, per_task, "parallel", annotations)

    def task(self, bidx: tuple[Expr, ...], h: Expr, i0: Expr) -> None:
        """One tile: rows `i0..i0+TR` of head `h`, every segment, then the stores."""
        kb, plan, w = self.kb, self.plan, self.w
        last = kb.bind(ex.sub(self.tq, 1), "tl")
        # each lane's row, clamped into range (rows past Tq compute row Tq - 1 and store nothing)
        rows = [kb.bind(ex.minimum(ex.Ramp(ex.add(i0, v * w), Const(1), self.it), self.splat(last)), "rows")
                for v in range(plan.row_vectors)]
        qt = self.local("qt", (self.d, plan.rows))

        def pack(rr: Var) -> None:
            i = kb.bind(ex.minimum(ex.add(i0, rr), last), "i")
            self.loop("d", Const(self.d), lambda c: kb.emit(lp.Store(qt.name, (c, rr), ex.Binary(
                "mul", self.scalar(self.q, (*bidx, h, i, c)), Const(self.scale, F32), F32))))

        self.loop("rr", Const(plan.rows), pack)
        t = _Task(bidx, h, h, i0, last, rows, kb.bind(ex.minimum(ex.add(i0, plan.rows - 1), last), "top"), qt,
                  self.local("m", (plan.rows,)), self.local("l", (plan.rows,)), self.local("acc", (self.dv, plan.rows)))
        for v in range(plan.row_vectors):
            self.vstore(t.m, self.fconst(float("-inf")), Const(v * w))
            self.vstore(t.l, self.fconst(0.0), Const(v * w))

        def zero_acc(c: Var) -> None:
            for v in range(plan.row_vectors):
                self.vstore(t.acc, self.fconst(0.0), c, Const(v * w))

        self.loop("c", Const(self.dv), zero_acc)
        hk = self.keys[0].shape[-3]
        if hk != self.hq:
            t.kvh = kb.bind(ex.floordiv(h, ex.floordiv(self.hq, hk)), "hk")
        for s in reversed(range(self.segments)):
            self.segment(t, s)
        self.store(t)

    def segment(self, t: "_Task", s: int) -> None:
        """The key blocks of segment `s` (a masked block is skipped when dead)."""
        kb, plan = self.kb, self.plan
        k, v, mask = self.keys[s], self.values[s], self.masks[s]
        tk = k.shape[-2]
        extent = kb.bind(ex.minimum(tk, ex.add(t.top, 1)), "e") if self.causal else tk
        klast = kb.bind(ex.sub(tk, 1), "kl")
        bk = plan.block_k
        # blocks counted back from the segment's end, as the row form's (`block_origin`)
        nblocks = kb.bind(ex.floordiv(ex.add(extent, bk - 1), bk), "nb")
        lead = kb.bind(ex.sub(ex.mul(nblocks, bk), extent), "lead")

        def per_block(jb: Var) -> None:
            j0, first = block_origin(kb, jb, bk, lead)
            if mask is None:
                self.block(t, k, v, None, j0, first, klast)
                return
            mk = self.local("mk", (bk, plan.rows))
            self.gather_mask(t, mask, mk, j0, klast)
            dead = self.dead(t, mk)
            kb.push()
            self.block(t, k, v, mk, j0, first, klast)
            kb.emit(lp.If(ex.binary("eq", dead, Const(False, ex.BOOL)), kb.pop()))

        self.loop("jb", nblocks, per_block)

    def gather_mask(self, t: "_Task", mask: Value, mk: lp.Buffer, j0: Expr, klast: Expr) -> None:
        """`%mk[jj, rr] = mask[row rr, key j0 + jj]` as an additive f32 (a boolean false is
        -inf); keys before the segment (block 0's missing ones) read its first key (their
        scores become -inf anyway)."""
        kb = self.kb

        def per_key(jj: Var) -> None:
            j = kb.bind(_clamp(ex.add(j0, jj), klast), "j")

            def per_lane(rr: Var) -> None:
                i = kb.bind(ex.minimum(ex.add(t.i0, rr), t.last), "i")
                mv = kb.value_at(mask, (*t.bidx, t.h, i, j))
                if mask.dtype == dt.bool_:
                    val = ex.select(mv, Const(0.0, F32), Const(float("-inf"), F32))
                else:
                    val = ex.cast(mv, dt.f32)
                kb.emit(lp.Store(mk.name, (jj, rr), kb.bind(val, "mv")))

            self.loop("rr", Const(self.plan.rows), per_lane)

        self.loop("jj", Const(self.plan.block_k), per_key)

    def dead(self, t: "_Task", mk: lp.Buffer) -> Expr:
        """Whether the block can be skipped: every mask value dead and every row live."""
        kb, plan, w = self.kb, self.plan, self.w
        top: Optional[Expr] = None
        low: Optional[Expr] = None
        for v in range(plan.row_vectors):
            mv = kb.bind(self.vload(t.m, Const(v * w)), "mm")
            low = mv if low is None else kb.bind(ex.Binary("min", low, mv, self.vt), "mm")
            for jj in range(plan.block_k):
                x = kb.bind(self.vload(mk, Const(jj), Const(v * w)), "mx")
                top = x if top is None else kb.bind(ex.Binary("max", top, x, self.vt), "mx")
        assert top is not None and low is not None
        hi = ex.VectorReduce("max", top, F32)
        lo = ex.VectorReduce("min", low, F32)
        return kb.bind(ex.Binary("and", ex.Binary("le", hi, Const(DEAD_MASK, F32), ex.BOOL),
                                 ex.Binary("ge", lo, Const(LIVE_MAX, F32), ex.BOOL), ex.BOOL), "dead")

    def scores(self, t: "_Task", k: Value, keys: list[Expr]) -> list[list[lp.Buffer]]:
        """`s[jj][r] = sum_d broadcast(k[keys[jj], d]) * %qt[d, r*W..]`: one register tile of
        `len(keys) x RV` accumulators over the head dim."""
        kb, w, rv = self.kb, self.w, self.plan.row_vectors
        sacc = [[self.local("s", (w,)) for _ in range(rv)] for _ in keys]
        for row in sacc:
            for buf in row:
                self.vstore(buf, self.fconst(0.0), Const(0))

        def mac(d: Var) -> None:
            qv = [kb.bind(self.vload(t.qt, d, Const(r * w)), "qv") for r in range(rv)]
            for jj, key in enumerate(keys):
                kv = kb.bind(self.splat(self.scalar(k, (*t.bidx, t.kvh, key, d))), "kv")
                for r in range(rv):
                    cur = self.vload(sacc[jj][r], Const(0))
                    self.vstore(sacc[jj][r], self.fma(kv, qv[r], cur), Const(0))

        self.loop("d", Const(self.d), mac)
        return sacc

    def block(self, t: "_Task", k: Value, v: Value, mk: Optional[lp.Buffer], j0: Expr, first: Expr,
              klast: Expr) -> None:
        """Scores, online softmax and P @ V of one block of `BK` keys (those from `first` on
        real: keys `j0 + first .. j0 + BK`)."""
        kb, plan, w = self.kb, self.plan, self.w
        bk, rv = plan.block_k, plan.row_vectors
        keys = [kb.bind(_clamp(ex.add(j0, jj), klast), "j") for jj in range(bk)]
        scores: list[list[lp.Buffer]] = []
        for k0 in range(0, bk, plan.score_keys):
            scores += self.scores(t, k, keys[k0:k0 + plan.score_keys])
        p = self.local("p", (bk, plan.rows))
        neg = self.fconst(float("-inf"))
        zero = self.fconst(0.0)
        first_v = self.splat(first)
        for jj in range(bk):
            jv = self.splat(ex.add(j0, jj))
            for r in range(rv):
                sc: Expr = self.vload(scores[jj][r], Const(0))
                if mk is not None:
                    sc = ex.Binary("add", sc, self.vload(mk, Const(jj), Const(r * w)), self.vt)
                keep = ex.binary("ge", self.splat(Const(jj)), first_v)
                if self.causal:
                    keep = ex.binary("and", keep, ex.binary("le", jv, t.rows[r]))
                self.vstore(p, kb.bind(ex.select(keep, sc, neg), "sc"), Const(jj), Const(r * w))
        corrs = []
        for r in range(rv):
            bm: Expr = self.vload(p, Const(0), Const(r * w))
            for jj in range(1, bk):
                bm = kb.bind(ex.Binary("max", bm, self.vload(p, Const(jj), Const(r * w)), self.vt), "bm")
            m_old = kb.bind(self.vload(t.m, Const(r * w)), "mo")
            m_new = kb.bind(ex.Binary("max", m_old, bm, self.vt), "mn")
            # all keys so far masked out: subtract 0 instead of -inf (no -inf - -inf = NaN)
            m_use = kb.bind(ex.select(ex.binary("eq", m_new, neg), zero, m_new), "mu")
            corrs.append(kb.bind(ex.call("exp", ex.Binary("sub", m_old, m_use, self.vt)), "corr"))
            total: Expr = zero
            for jj in range(bk):
                e = kb.bind(ex.call("exp", ex.Binary("sub", self.vload(p, Const(jj), Const(r * w)), m_use,
                                                      self.vt)), "p")
                self.vstore(p, e, Const(jj), Const(r * w))
                total = kb.bind(ex.Binary("add", total, e, self.vt), "ps")
            self.vstore(t.l, ex.Binary("add", ex.Binary("mul", self.vload(t.l, Const(r * w)), corrs[r], self.vt),
                                       total, self.vt), Const(r * w))
            self.vstore(t.m, m_new, Const(r * w))
        c0 = 0
        while c0 < self.dv:
            cc = min(plan.chunk, self.dv - c0)
            self.pv_chunk(t, v, p, corrs, j0, first, c0, cc)
            c0 += cc

    def pv_chunk(self, t: "_Task", v: Value, p: lp.Buffer, corrs: list[Expr], j0: Expr, first: Expr,
                 c0: int, cc: int) -> None:
        """`%acc[c0..c0+cc, :]` rescaled by the correction, plus the block's P @ V."""
        kb, plan, w = self.kb, self.plan, self.w
        rv = plan.row_vectors
        a = [[self.local("a", (w,)) for _ in range(rv)] for _ in range(cc)]
        for c in range(cc):
            for r in range(rv):
                self.vstore(a[c][r], ex.Binary("mul", self.vload(t.acc, Const(c0 + c), Const(r * w)), corrs[r],
                                               self.vt), Const(0))

        def axpy(jj: Var) -> None:
            j = kb.bind(ex.add(j0, jj), "j")
            pv = [kb.bind(self.vload(p, jj, Const(r * w)), "pv") for r in range(rv)]
            for c in range(cc):
                x = kb.bind(self.splat(self.scalar(v, (*t.bidx, t.kvh, j, Const(c0 + c)))), "vv")
                for r in range(rv):
                    self.vstore(a[c][r], self.fma(x, pv[r], self.vload(a[c][r], Const(0))), Const(0))

        self.loop("jj", Const(plan.block_k), axpy, start=first)
        for c in range(cc):
            for r in range(rv):
                self.vstore(t.acc, self.vload(a[c][r], Const(0)), Const(c0 + c), Const(r * w))

    def store(self, t: "_Task") -> None:
        """`out[i0 + rr, c] = %acc[c, rr] / l[rr]` for the rows below Tq."""
        kb, plan = self.kb, self.plan
        n = kb.bind(ex.minimum(Const(plan.rows), ex.sub(self.tq, t.i0)), "nr")

        def per_row(rr: Var) -> None:
            i = kb.bind(ex.add(t.i0, rr), "i")
            inv = kb.bind(ex.Binary("div", Const(1.0, F32), ex.Load(t.l.name, (rr,), F32), F32), "inv")

            def per_col(c: Var) -> None:
                val = ex.Binary("mul", ex.Load(t.acc.name, (c, rr), F32), inv, F32)
                kb.emit(lp.Store(self.out.name, self.out_index((*t.bidx, t.h, i, c)),
                                 kb.bind(ex.cast(val, self.out.dtype), "o")))

            self.loop("c", Const(self.dv), per_col)

        self.loop("rr", n, per_row)


@dataclass
class _Task:
    """What one task's statements share: its batch index, head, key/value head, first row,
    last row of the query (`Tq - 1`), the lanes' rows, its last row, and its locals."""

    bidx: tuple[Expr, ...]
    h: Expr
    kvh: Expr
    i0: Expr
    last: Expr
    rows: list[Expr]
    top: Expr
    qt: lp.Buffer
    m: lp.Buffer
    l: lp.Buffer
    acc: lp.Buffer


def build_tiles(kb: KernelBuilder, op: Op, out: lp.Buffer, plan: TilePlan, out_index: Callable[[Index], Index],
                annotations: tuple[tuple[str, str], ...]) -> None:
    """Emit the tile form of `op` (module docstring) into `kb`'s current scope, storing into
    `out` at `out_index(b.., h, i, c)`."""
    kb.used_buffers[out.name] = out
    _Tiles(kb, op, out, plan, out_index).build(annotations)
