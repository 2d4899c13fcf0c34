"""The loop nest of an `attention` op: flash attention with an online softmax.

One kernel computes the whole op, and no `[Tq, Tk]` score matrix exists in memory: each query
row keeps a running maximum `m`, a running sum `l` and an accumulator `acc[Dv]` of the values
weighted by `exp(score - m)`; keys come in blocks of `BK`, whose scores sit in a local
`s[BK]`. Per block, the new maximum rescales what was accumulated (`corr = exp(m - m_new)`),
so the result is the exact softmax, whatever the order of the blocks:

    parallel for r in 0..B*Hq*ceil(Tq/BQ) {            # batch x head x query block
      for ii in 0..BQ { if i < Tq {                    # i = qb*BQ + ii
        m = -inf; l = 0; acc[:] = 0
        for jb in 0..ceil(E/BK) {                      # E = Tk, or min(Tk, i+1) when causal
          s[:] = -inf
          for jj in 0..min(BK, E - jb*BK) {            # bounds-safe: only real keys
            s[jj] = scale * sum_d q[i, d] k[jb*BK+jj, d]   (+ mask, or -inf where masked)
          }
          m_new = max(m, max(s)); corr = exp(m - m_new)
          s[:] = exp(s[:] - m_new); l = l * corr + sum(s); acc[:] *= corr
          for jj in 0..min(BK, E - jb*BK) { acc[:] += s[jj] * v[jb*BK+jj, :] }
          m = m_new
        }
        out[i, :] = acc[:] / l
      } }
    }

The loops over `d` are unit-stride in every buffer, so `vectorize` gives them the target's
vector width (the dot product becomes a vector reduction); the outer loop is parallel. With a
causal mask, the blocks entirely above the diagonal are never visited. Grouped-query heads
read key/value head `h / (Hq / Hk)`; segments (a cache and the step's new keys) run one after
the other with the same running state. Sizes may be symbolic; head dims must be constants (the
accumulator is a local array).
"""
from __future__ import annotations

from typing import Callable, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from .kernel_builder import KernelBuilder, LoweringError

F32 = ScalarType(dt.f32)
NEG_INF = Const(float("-inf"), F32)
ZERO = Const(0.0, F32)


def _ceil_div(a: Expr, b: int) -> Expr:
    return ex.floordiv(ex.add(a, b - 1), b)


class _Nest:
    """The statement helpers of one attention kernel (locals, loops, loads)."""

    def __init__(self, kb: KernelBuilder) -> None:
        self.kb = kb

    def local(self, name: str, n: int) -> lp.Buffer:
        buf = lp.Buffer(self.kb.fresh(name), dt.f32, (Const(n),), (Const(1),), "local")
        self.kb.emit(lp.Alloc(buf))
        return buf

    def get(self, buf: lp.Buffer, i: Expr = Const(0)) -> Expr:
        return ex.Load(buf.name, (i,), F32)

    def put(self, buf: lp.Buffer, value: Expr, i: Expr = Const(0)) -> None:
        self.kb.emit(lp.Store(buf.name, (i,), value))

    def loop(self, prefix: str, extent: Expr, body: Callable[[Var], None], kind: str = "serial") -> None:
        """`for v in 0..extent { body(v) }`, the body built in a scope of its own."""
        v = Var(self.kb.fresh(prefix))
        self.kb.push((v,))
        body(v)
        stmts = self.kb.pop()
        self.kb.emit(lp.For(v, Const(0), extent, kind, stmts))

    def value(self, operand: Value, idx: tuple[Expr, ...]) -> Expr:
        """An operand element widened to f32."""
        return self.kb.bind(ex.cast(self.kb.value_at(operand, idx), dt.f32), "x")


def build_attention(kb: KernelBuilder, op: Op, out: lp.Buffer, block_q: int = 8, block_k: int = 32) -> lp.Stmt:
    """The nest of the module docstring for `op`, storing into `out`."""
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
    dv_e = values[0].shape[-1]
    if not isinstance(d, Const) or not isinstance(dv_e, Const):
        raise LoweringError(f"attention: head dims must be constants, got {d} and {dv_e}")
    dv = int(dv_e.value)
    if op.loc and op.loc not in kb.origins:
        kb.origins.append(op.loc)
    n = _Nest(kb)
    kb.used_buffers[out.name] = out
    nqb = _ceil_div(tq, block_q)
    rows: Expr = ex.mul(hq, nqb)
    for b in batch:
        rows = ex.mul(rows, b)

    def per_block(r: Var) -> None:
        qb = kb.bind(ex.mod(r, nqb), "qb")
        rest = kb.bind(ex.floordiv(r, nqb), "t")
        h = kb.bind(ex.mod(rest, hq), "h")
        rest = ex.floordiv(rest, hq)
        bidx: list[Expr] = []
        for size in reversed(batch):
            bidx.insert(0, kb.bind(ex.mod(rest, size), "b"))
            rest = ex.floordiv(rest, size)

        def per_row(ii: Var) -> None:
            i = kb.bind(ex.add(ex.mul(qb, block_q), ii), "i")
            kb.push()
            _row(kb, n, op, out, tuple(bidx), h, i, keys, values, masks, causal, scale, dv, block_k)
            kb.emit(lp.If(ex.binary("lt", i, tq), kb.pop()))

        n.loop("ii", Const(block_q), per_row)

    kb.push()
    n.loop("r", rows, per_block, kind="parallel")
    return kb.pop()


def _row(kb: KernelBuilder, n: _Nest, op: Op, out: lp.Buffer, bidx: tuple[Expr, ...], h: Expr, i: Expr,
         keys: list[Value], values: list[Value], masks: list[Optional[Value]], causal: bool, scale: Expr, dv: int,
         block_k: int) -> None:
    """One query row: the online softmax over every segment, then the store."""
    q = op.operands[0]
    d = q.shape[-1]
    hq = q.shape[-3]
    m, l, acc, s = n.local("m", 1), n.local("l", 1), n.local("acc", dv), n.local("s", block_k)
    n.put(m, NEG_INF)
    n.put(l, ZERO)
    n.loop("d", Const(dv), lambda c: n.put(acc, ZERO, c))
    for k, v, mask in zip(keys, values, masks):
        tk = k.shape[-2]
        hk = k.shape[-3]
        kvh = kb.bind(ex.floordiv(h, ex.floordiv(hq, hk)), "hk") if hk != hq else h
        extent = ex.minimum(tk, ex.add(i, 1)) if causal else tk
        extent = kb.bind(extent, "e") if causal else extent

        def per_block(jb: Var, k: Value = k, v: Value = v, mask: Optional[Value] = mask, kvh: Expr = kvh, extent: Expr = extent) -> None:
            j0 = kb.bind(ex.mul(jb, block_k), "j")
            live = kb.bind(ex.minimum(Const(block_k), ex.sub(extent, j0)), "n")
            n.loop("jj", Const(block_k), lambda c: n.put(s, NEG_INF, c))

            def score(jj: Var) -> None:
                j = kb.bind(ex.add(j0, jj), "j")
                dot = n.local("dot", 1)
                n.put(dot, ZERO)

                def mac(c: Var) -> None:
                    a = n.value(q, (*bidx, h, i, c))
                    b = n.value(k, (*bidx, kvh, j, c))
                    prod = kb.bind(ex.Binary("mul", a, b, F32))
                    n.put(dot, ex.Binary("add", n.get(dot), prod, F32))

                n.loop("d", d, mac)
                sc = kb.bind(ex.Binary("mul", n.get(dot), scale, F32))
                if mask is not None:
                    mv = kb.value_at(mask, (*bidx, h, i, j))
                    if mask.dtype == dt.bool_:
                        sc = kb.bind(ex.select(mv, sc, NEG_INF))
                    else:
                        sc = kb.bind(ex.Binary("add", sc, ex.cast(mv, dt.f32), F32))
                n.put(s, sc, jj)

            n.loop("jj", live, score)
            bm = n.local("bm", 1)
            n.put(bm, NEG_INF)
            n.loop("jj", Const(block_k), lambda c: n.put(bm, ex.Binary("max", n.get(bm), n.get(s, c), F32)))
            m_old = kb.bind(n.get(m))
            m_new = kb.bind(ex.Binary("max", m_old, n.get(bm), F32))
            # All keys so far masked out: subtract 0 instead of -inf (no -inf - -inf = NaN).
            m_use = kb.bind(ex.select(ex.Binary("eq", m_new, NEG_INF, ex.BOOL), ZERO, m_new))
            corr = kb.bind(ex.call("exp", ex.Binary("sub", m_old, m_use, F32)))
            psum = n.local("ps", 1)
            n.put(psum, ZERO)

            def expo(c: Var) -> None:
                p = kb.bind(ex.call("exp", ex.Binary("sub", n.get(s, c), m_use, F32)))
                n.put(s, p, c)
                n.put(psum, ex.Binary("add", n.get(psum), p, F32))

            n.loop("jj", Const(block_k), expo)
            n.put(l, ex.Binary("add", ex.Binary("mul", n.get(l), corr, F32), n.get(psum), F32))
            n.loop("d", Const(dv), lambda c: n.put(acc, ex.Binary("mul", n.get(acc, c), corr, F32), c))

            def gather(jj: Var) -> None:
                j = kb.bind(ex.add(j0, jj), "j")
                p = kb.bind(n.get(s, jj))

                def axpy(c: Var) -> None:
                    x = n.value(v, (*bidx, kvh, j, c))
                    t = kb.bind(ex.Binary("mul", p, x, F32))
                    n.put(acc, ex.Binary("add", n.get(acc, c), t, F32), c)

                n.loop("d", Const(dv), axpy)

            n.loop("jj", live, gather)
            n.put(m, m_new)

        n.loop("jb", _ceil_div(extent, block_k), per_block)
    inv = kb.bind(ex.Binary("div", Const(1.0, F32), n.get(l), F32))

    def store(c: Var) -> None:
        val = kb.bind(ex.cast(ex.Binary("mul", n.get(acc, c), inv, F32), out.dtype))
        kb.emit(lp.Store(out.name, (*bidx, h, i, c), val))

    n.loop("d", Const(dv), store)
