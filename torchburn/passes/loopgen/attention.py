"""The loop nest of an `attention` op: flash attention with an online softmax.

One kernel computes the whole op, and no `[Tq, Tk]` score matrix exists in memory: each query
row keeps a running maximum `m`, a running sum `l` and an accumulator `acc[Dv]` of the values
weighted by `exp(score - m)`; keys come in blocks of `BK`, whose scores sit in a local
`s[BK]`. Per block, the new maximum rescales what was accumulated (`corr = exp(m - m_new)`),
so the result is the exact softmax, whatever the order of the blocks:

    parallel for r in 0..B*Hk*ceil(Tq/R) {             # batch x kv head x query block
      (for each of the task's G*R rows, unrolled: its head h, its row i)
        m = -inf; l = 0; acc[:] = 0
        lead = ceil(E/BK)*BK - E                       # E = Tk, or min(Tk, the task's last row + 1) if causal
        for jb in 0..ceil(E/BK) {                      # blocks counted back from the end
          j0 = jb*BK - lead; s[:] = -inf
          for jj in max(0, -j0)..BK {                  # bounds-safe: only real keys
            s[jj] = scale * sum_d q[i, d] k[j0+jj, d]   (+ mask, or -inf where masked)
          }
          m_new = max(m, max(s)); corr = exp(m - m_new)
          s[:] = exp(s[:] - m_new); l = l * corr + sum(s); acc[:] *= corr
          for jj in 0..BK { acc[:] += s[jj] * v[max(j0+jj, 0), :] }   # s[jj] = 0 before the keys
          m = m_new
        }
        out[i, :] = acc[:] / l                         # rows past Tq store nothing
    }

A task takes the `G` query heads of one key/value head and `R` rows of each (`R = 1` for
decode), so each key and value row is loaded once for all of them. The GPU form
(`max_rows = 1`) is a perfect nest over `(*B, Hq, Tq)`, one row per iteration, which `gpu-map`
turns into a grid of one invocation per row.

The blocks end at the segment's end, not start at key 0, so that a row's keys fall into the
same blocks and lanes wherever the row starts in a shared cache (`block_origin`): a request's
result is then the same alone and beside others (the server's batch invariance).

The loops over `d` are unit-stride in every buffer, so `vectorize` gives them the target's
vector width (the dot product becomes a vector reduction); the outer loop is parallel. With a
causal mask, the blocks entirely above the diagonal are never visited. Grouped-query heads
read key/value head `h / (Hq / Hk)`; segments (a cache and the step's new keys) run one after
the other with the same running state. Sizes may be symbolic; head dims must be constants (the
accumulator is a local array).

This row form serves decode (one query row) and short steps. On a CPU target a step of many
query rows (prefill: `Tq` of 8 or more, or symbolic) takes the tile form of
`attention_tiles.py` instead: query rows along the vector lanes, the scores and P @ V as two
register-tiled products with vector FMAs, no horizontal sum per score.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from .kernel_builder import KernelBuilder, LoweringError
from .attention_tiles import TilePlan, block_origin, build_tiles, tiles_apply
from .store_views import through
from .views import Index

F32 = ScalarType(dt.f32)
NEG_INF = Const(float("-inf"), F32)
ZERO = Const(0.0, F32)
#: The annotation of the task loop: its iterations write disjoint elements (`gpu-map` reads it).
TASKS = "tasks"


def _ceil_div(a: Expr, b: int) -> Expr:
    return ex.floordiv(ex.add(a, b - 1), b)


class _Nest:
    """The statement helpers of one attention kernel (locals, loops, loads)."""

    def __init__(self, kb: KernelBuilder, out_index: Callable[[Index], Index] = lambda idx: idx) -> None:
        self.kb = kb
        #: Where output element `(b.., h, i, c)` is stored: its own index, or the index of the
        #: permutes and reshapes computed in the same kernel (`store_views.py`).
        self.out_index = out_index

    def local(self, name: str, n: int) -> lp.Buffer:
        buf = lp.Buffer(self.kb.fresh(name), dt.f32, (Const(n),), (Const(1),), "local")
        self.kb.emit(lp.Alloc(buf))
        return buf

    def get(self, buf: lp.Buffer, i: Expr = Const(0)) -> Expr:
        return ex.Load(buf.name, (i,), F32)

    def put(self, buf: lp.Buffer, value: Expr, i: Expr = Const(0)) -> None:
        self.kb.emit(lp.Store(buf.name, (i,), value))

    def loop(self, prefix: str, extent: Expr, body: Callable[[Var], None], kind: str = "serial",
             annotations: tuple[tuple[str, str], ...] = (), start: Expr = Const(0)) -> None:
        """`for v in start..extent { body(v) }`, the body built in a scope of its own."""
        v = Var(self.kb.fresh(prefix))
        self.kb.push((v,))
        body(v)
        stmts = self.kb.pop()
        count = extent if start == Const(0) else ex.sub(extent, start)
        self.kb.emit(lp.For(v, start, count, kind, stmts, annotations))

    def value(self, operand: Value, idx: tuple[Expr, ...]) -> Expr:
        """An operand element widened to f32."""
        return self.kb.bind(ex.cast(self.kb.value_at(operand, idx), dt.f32), "x")


def build_attention(kb: KernelBuilder, op: Op, out: lp.Buffer, block_q: int = 8, block_k: int = 32,
                    max_rows: int = 4, views: Sequence[Op] = (), tiles: Optional[TilePlan] = None) -> lp.Stmt:
    """The nest of the module docstring for `op`, storing into `out`, at the index of the
    permutes and reshapes `views` computed in the kernel (`store_views.py`; `out` is the last
    one's buffer). A task takes the query heads of one key/value head (`G` of them) and
    `max(1, max_rows // G)` query rows of each (one row for decode): those rows share every
    key and value load. `block_q` is the number of rows per task when the query heads do not
    group (a GPU wants one). With `tiles` (a CPU target), a step of many query rows takes the
    tile form instead (`attention_tiles.py`: rows along the vector lanes)."""
    q = op.operands[0]
    segments = int(op.attrs.get("segments", 1))
    masked = bool(op.attrs.get("masked", False))
    causal = bool(op.attrs.get("causal", False))
    scale = Const(float(op.attrs["scale"]), F32)
    keys = [op.operands[1 + 2 * s] for s in range(segments)]
    values = [op.operands[2 + 2 * s] for s in range(segments)]
    masks: list[Optional[Value]] = ([op.operands[1 + 2 * segments + s] for s in range(segments)]
                                   if masked else [None] * segments)
    batch, hq, tq, d = q.shape[:-3], q.shape[-3], q.shape[-2], q.shape[-1]
    hk = keys[0].shape[-3]
    dv_e = values[0].shape[-1]
    if not isinstance(d, Const) or not isinstance(dv_e, Const):
        raise LoweringError(f"attention: head dims must be constants, got {d} and {dv_e}")
    dv = int(dv_e.value)
    # Query heads per task: the group of a key/value head when it is known, else one head.
    group = 1
    if isinstance(hq, Const) and isinstance(hk, Const) and all(k.shape[-3] == hk for k in keys):
        group = int(hq.value) // int(hk.value)
        if group * 1 > max(max_rows, 1) * 2:
            group = 1
    rows_per_head = 1 if (isinstance(tq, Const) and int(tq.value) == 1) or max_rows <= 1 else max(1, max_rows // group)
    if max_rows <= 1:
        group, rows_per_head = 1, block_q
    if op.loc and op.loc not in kb.origins:
        kb.origins.append(op.loc)
    for view in views:
        if view.loc and view.loc not in kb.origins:
            kb.origins.append(view.loc)
    n = _Nest(kb, lambda idx: through(views, idx))
    kb.used_buffers[out.name] = out
    nqb = _ceil_div(tq, rows_per_head)
    head_tasks = ex.floordiv(hq, group)
    tasks: Expr = ex.mul(head_tasks, nqb)
    for b in batch:
        tasks = ex.mul(tasks, b)

    def per_task(r: Var) -> None:
        qb = kb.bind(ex.mod(r, nqb), "qb")
        rest = kb.bind(ex.floordiv(r, nqb), "t")
        hg = kb.bind(ex.mod(rest, head_tasks), "hg")
        rest = ex.floordiv(rest, head_tasks)
        bidx: list[Expr] = []
        for size in reversed(batch):
            bidx.insert(0, kb.bind(ex.mod(rest, size), "b"))
            rest = ex.floordiv(rest, size)
        rows: list[_Row] = []
        last = kb.bind(ex.sub(tq, 1), "tl")
        for g in range(group):
            h = kb.bind(ex.add(ex.mul(hg, group), g), "h") if group > 1 else hg
            for ii in range(rows_per_head):
                i = kb.bind(ex.add(ex.mul(qb, rows_per_head), ii), "i")
                # rows past the end compute row Tq - 1 again and store nothing
                ic = kb.bind(ex.minimum(i, last), "ic") if rows_per_head > 1 else i
                rows.append(_Row(h, i, ic))
        _task(kb, n, op, out, tuple(bidx), rows, keys, values, masks, causal, scale, dv, block_k,
              rows_per_head > 1)

    kb.push()
    if tiles is not None and max_rows > 1 and tiles_apply(op):
        build_tiles(kb, op, out, tiles, n.out_index, ((TASKS, "independent"),))
    elif max_rows <= 1:
        _row_grid(kb, n, op, out, keys, values, masks, causal, scale, dv, block_k)
    else:
        # The tasks write disjoint output rows through indices derived from `r` (not `r`
        # itself), which `gpu-map` cannot prove: the mark says so (it maps the loop onto the grid).
        n.loop("r", tasks, per_task, kind="parallel", annotations=((TASKS, "independent"),))
    return kb.pop()


def _row_grid(kb: KernelBuilder, n: _Nest, op: Op, out: lp.Buffer, keys: list[Value], values: list[Value],
              masks: list[Optional[Value]], causal: bool, scale: Expr, dv: int, block_k: int) -> None:
    """One row per iteration of a perfect nest over `(*B, Hq, Tq)`, every loop variable a
    whole index of the store: the form `gpu-map` turns into a grid of one invocation per row."""
    q = op.operands[0]
    extents = q.shape[:-1]
    vars_ = kb.loops(extents, "i")
    for v in vars_:
        kb.push((v,))
    *bidx, h, i = vars_
    _task(kb, n, op, out, tuple(bidx), [_Row(h, i, i)], keys, values, masks, causal, scale, dv, block_k, False)
    for k in range(len(vars_) - 1, -1, -1):
        body = kb.pop()
        kb.emit(lp.For(vars_[k], Const(0), extents[k], "serial", body))


class _Row:
    """One query row of a task: head `h`, row `i`, and the row it reads (`ic`, in range)."""

    def __init__(self, h: Expr, i: Expr, ic: Expr) -> None:
        self.h, self.i, self.ic = h, i, ic


def _task(kb: KernelBuilder, n: _Nest, op: Op, out: lp.Buffer, bidx: tuple[Expr, ...], rows: list[_Row],
          keys: list[Value], values: list[Value], masks: list[Optional[Value]], causal: bool, scale: Expr,
          dv: int, block_k: int, guard: bool) -> None:
    """The rows of one task: the online softmax over every segment, each key and value row
    loaded once for all of them, then the stores."""
    q = op.operands[0]
    d = q.shape[-1]
    hq = q.shape[-3]
    state = [(n.local("m", 1), n.local("l", 1), n.local("acc", dv), n.local("s", block_k)) for _ in rows]
    for m, l, acc, _ in state:
        n.put(m, NEG_INF)
        n.put(l, ZERO)
        n.loop("d", Const(dv), lambda c, acc=acc: n.put(acc, ZERO, c))
    for k, v, mask in zip(keys, values, masks):
        tk = k.shape[-2]
        hk = k.shape[-3]
        kvh = kb.bind(ex.floordiv(rows[0].h, ex.floordiv(hq, hk)), "hk") if hk != hq else rows[0].h
        if causal:
            top = rows[0].ic
            for row in rows[1:]:
                top = ex.maximum(top, row.ic)
            extent = kb.bind(ex.minimum(tk, ex.add(top, 1)), "e")
        else:
            extent = tk

        # Blocks end at the segment's end: the first one lacks `lead` keys (see `block_origin`).
        nblocks = kb.bind(_ceil_div(extent, block_k), "nb")
        lead = kb.bind(ex.sub(ex.mul(nblocks, block_k), extent), "lead")

        def per_block(jb: Var, k: Value = k, v: Value = v, mask: Optional[Value] = mask, kvh: Expr = kvh,
                      lead: Expr = lead) -> None:
            j0, first = block_origin(kb, jb, block_k, lead)
            for _, _, _, s in state:
                n.loop("jj", Const(block_k), lambda c, s=s: n.put(s, NEG_INF, c))

            def score(jj: Var) -> None:
                j = kb.bind(ex.add(j0, jj), "j")
                dots = [n.local("dot", 1) for _ in rows]
                for dot in dots:
                    n.put(dot, ZERO)

                def mac(c: Var) -> None:
                    b = n.value(k, (*bidx, kvh, j, c))
                    for row, dot in zip(rows, dots):
                        a = n.value(q, (*bidx, row.h, row.ic, c))
                        prod = kb.bind(ex.Binary("mul", a, b, F32))
                        n.put(dot, ex.Binary("add", n.get(dot), prod, F32))

                n.loop("d", d, mac)
                for row, dot, (_, _, _, s) in zip(rows, dots, state):
                    sc = kb.bind(ex.Binary("mul", n.get(dot), scale, F32))
                    if mask is not None:
                        mv = kb.value_at(mask, (*bidx, row.h, row.ic, j))
                        if mask.dtype == dt.bool_:
                            sc = kb.bind(ex.select(mv, sc, NEG_INF))
                        else:
                            sc = kb.bind(ex.Binary("add", sc, ex.cast(mv, dt.f32), F32))
                    if causal and len(rows) > 1:
                        sc = kb.bind(ex.select(ex.binary("le", j, row.ic), sc, NEG_INF))
                    n.put(s, sc, jj)

            n.loop("jj", Const(block_k), score, start=first)
            corrs = []
            for m, l, acc, s in state:
                bm = n.local("bm", 1)
                n.put(bm, NEG_INF)
                n.loop("jj", Const(block_k), lambda c, bm=bm, s=s: n.put(bm, ex.Binary("max", n.get(bm), n.get(s, c), F32)))
                m_old = kb.bind(n.get(m))
                m_new = kb.bind(ex.Binary("max", m_old, n.get(bm), F32))
                # All keys so far masked out: subtract 0 instead of -inf (no -inf - -inf = NaN).
                m_use = kb.bind(ex.select(ex.Binary("eq", m_new, NEG_INF, ex.BOOL), ZERO, m_new))
                corr = kb.bind(ex.call("exp", ex.Binary("sub", m_old, m_use, F32)))
                psum = n.local("ps", 1)
                n.put(psum, ZERO)

                def expo(c: Var, s: lp.Buffer = s, psum: lp.Buffer = psum, m_use: Expr = m_use) -> None:
                    p = kb.bind(ex.call("exp", ex.Binary("sub", n.get(s, c), m_use, F32)))
                    n.put(s, p, c)
                    n.put(psum, ex.Binary("add", n.get(psum), p, F32))

                n.loop("jj", Const(block_k), expo)
                n.put(l, ex.Binary("add", ex.Binary("mul", n.get(l), corr, F32), n.get(psum), F32))
                n.put(m, m_new)
                corrs.append(corr)

            def gather(jj: Var) -> None:
                # Every lane of the block, block 0's missing keys too (their weights are exact
                # zeros; the key read is the segment's first): a loop from `first` would give
                # `split-accumulators` a trip count that depends on where the row starts in
                # the cache, and so a different partial sum for each key (batch invariance).
                j = kb.bind(ex.maximum(ex.add(j0, jj), Const(0)), "j")
                ps = [kb.bind(n.get(s, jj)) for _, _, _, s in state]

                def axpy(c: Var) -> None:
                    x = n.value(v, (*bidx, kvh, j, c))
                    for p, (_, _, acc, _) in zip(ps, state):
                        t = kb.bind(ex.Binary("mul", p, x, F32))
                        n.put(acc, ex.Binary("add", n.get(acc, c), t, F32), c)

                n.loop("d", Const(dv), axpy)

            for corr, (_, _, acc, _) in zip(corrs, state):
                n.loop("d", Const(dv), lambda c, acc=acc, corr=corr: n.put(acc, ex.Binary("mul", n.get(acc, c), corr, F32), c))
            n.loop("jj", Const(block_k), gather)

        n.loop("jb", nblocks, per_block)
    for row, (m, l, acc, _) in zip(rows, state):
        inv = kb.bind(ex.Binary("div", Const(1.0, F32), n.get(l), F32))

        def store(c: Var, row: _Row = row, acc: lp.Buffer = acc, inv: Expr = inv) -> None:
            val = kb.bind(ex.cast(ex.Binary("mul", n.get(acc, c), inv, F32), out.dtype))
            kb.emit(lp.Store(out.name, n.out_index((*bidx, row.h, row.i, c)), val))

        if guard:
            kb.push()
            n.loop("d", Const(dv), store)
            kb.emit(lp.If(ex.binary("lt", row.i, q.shape[-2]), kb.pop()))
        else:
            n.loop("d", Const(dv), store)
