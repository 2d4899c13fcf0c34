"""The GPU loop nest of an `attention` op: what `codegen/wgsl/attention.py` turns into one
flash-attention shader.

The WGSL emitter writes its own schedule (K/V tiles in workgroup memory, a workgroup per block
of query rows, or per row with the keys split across its invocations for decode); what it
needs from the IR is how to read each operand element, with whatever views, casts and
elementwise producers were fused into the op, and how to store one output element. The nest
below says exactly that, in loops the emitter finds by their `attn` annotation, and is at the
same time a correct (slow: one key at a time) definition of the op for any engine:

    for b.., h in 0..Hq, i in 0..Tq  attrs {gpu = "attention", attn_scale, attn_causal, attn_segments}
      for c in 0..D   attrs {attn = "q"}  { lets; %qr[c] = q(b, h, i, c) as f32 }
      m = -inf; l = 0; acc[:] = 0
      for j in 0..Tk_s  attrs {attn = "keys", attn_segment = s}          (each segment s)
        for c in 0..D   attrs {attn = "k<s>"} { lets; %kr[c] = k_s(b, h / G, j, c) }
        for u in 0..1   attrs {attn = "m<s>"} { lets; %mv[0] = 0 | -inf (bool) or the float mask }
        sc = scale * (qr . kr) + mv ; causal: -inf where j > i
        online softmax update of m, l ; acc = acc * corr + p * vr
        for c in 0..Dv  attrs {attn = "v<s>"} { lets; %vr[c] = v_s(b, h / G, j, c) }
      for c in 0..Dv  attrs {attn = "out"}  { %o[0] = acc[c] / l ; lets ; %out[b, h, i, c] = o }

Every accessor loop ends in one store whose value is the element (`out`: begins with the store
of the value to write, then stores it); its other statements are `let`s that read only the
enclosing loop variables, so the emitter can make each one a WGSL function.
"""
from __future__ import annotations

from typing import Callable, Optional, Sequence

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from ..loopgen.attention import _Nest as _CpuNest
from ..loopgen.kernel_builder import KernelBuilder, LoweringError
from ..loopgen.store_views import through

F32 = ScalarType(dt.f32)
NEG_INF = Const(float("-inf"), F32)
ZERO = Const(0.0, F32)
#: The annotation value of the row nest's outer loop (`gpu`), and the accessor loops' key.
GPU_ATTENTION = "attention"
ATTN = "attn"


class _Nest(_CpuNest):
    """The CPU kernel's statement helpers; a loop may carry the `attn` tag that tells the
    shader which operand element (or the output store) its body is."""

    def loop(self, prefix: str, extent: Expr, body: Callable[[Var], None], tag: Optional[str] = None,
             extra: tuple[tuple[str, str], ...] = ()) -> None:
        super().loop(prefix, extent, body, annotations=(((ATTN, tag),) if tag else ()) + extra)


def build_attention_gpu(kb: KernelBuilder, op: Op, out: lp.Buffer, views: Sequence[Op] = ()) -> lp.Stmt:
    """The nest of the module docstring for `op`, storing into `out` at the index of the
    permutes and reshapes `views` computed in the kernel (`store_views.py`: the `out`
    accessor's store then names the view's index, `%out[i, b, h, c]`)."""
    q = op.operands[0]
    segments = int(op.attrs.get("segments", 1))
    masked = bool(op.attrs.get("masked", False))
    causal = bool(op.attrs.get("causal", False))
    scale = float(op.attrs["scale"])
    keys = [op.operands[1 + 2 * s] for s in range(segments)]
    values = [op.operands[2 + 2 * s] for s in range(segments)]
    masks: list[Optional[Value]] = ([op.operands[1 + 2 * segments + s] for s in range(segments)]
                                   if masked else [None] * segments)
    d, dv_e, hq = q.shape[-1], values[0].shape[-1], q.shape[-3]
    if not isinstance(d, Const) or not isinstance(dv_e, Const):
        raise LoweringError(f"attention: head dims must be constants, got {d} and {dv_e}")
    dv = int(dv_e.value)
    if op.loc and op.loc not in kb.origins:
        kb.origins.append(op.loc)
    for view in views:
        if view.loc and view.loc not in kb.origins:
            kb.origins.append(view.loc)
    kb.used_buffers[out.name] = out
    n = _Nest(kb, lambda idx: through(views, idx))
    kb.push()
    extents = q.shape[:-1]
    vars_ = kb.loops(extents, "i")
    for v in vars_:
        kb.push((v,))
    *bidx, h, i = vars_
    qr = n.local("qr", int(d.value))
    n.loop("c", d, lambda c: n.put(qr, n.value(q, (*bidx, h, i, c)), c), "q")
    m, l, acc = n.local("m", 1), n.local("l", 1), n.local("acc", dv)
    n.put(m, NEG_INF)
    n.put(l, ZERO)
    n.loop("c", Const(dv), lambda c: n.put(acc, ZERO, c))
    for s, (k, v, mask) in enumerate(zip(keys, values, masks)):
        hk = k.shape[-3]
        kvh = h if hk == hq else ex.floordiv(h, ex.floordiv(hq, hk))

        def per_key(j: Var, s: int = s, k: Value = k, v: Value = v, mask: Optional[Value] = mask,
                    kvh: Expr = kvh) -> None:
            kr = n.local("kr", int(d.value))
            n.loop("c", d, lambda c: n.put(kr, n.value(k, (*bidx, kvh, j, c)), c), f"k{s}")
            dot = n.local("dot", 1)
            n.put(dot, ZERO)
            n.loop("c", d, lambda c: n.put(dot, ex.Binary("add", n.get(dot), ex.Binary(
                "mul", n.get(qr, c), n.get(kr, c), F32), F32)))
            sc = kb.bind(ex.Binary("mul", n.get(dot), Const(scale, F32), F32))
            if mask is not None:
                mv = n.local("mv", 1)

                def bias(u: Var, mask: Value = mask) -> None:
                    x = kb.value_at(mask, (*bidx, h, i, j))
                    b = ex.select(x, ZERO, NEG_INF) if mask.dtype == dt.bool_ else ex.cast(x, dt.f32)
                    n.put(mv, kb.bind(b, "x"))

                n.loop("u", Const(1), bias, f"m{s}")
                sc = kb.bind(ex.Binary("add", sc, n.get(mv), F32))
            if causal:
                sc = kb.bind(ex.select(ex.binary("le", j, i), sc, NEG_INF))
            m_old = kb.bind(n.get(m))
            m_new = kb.bind(ex.Binary("max", m_old, sc, F32))
            # every key so far masked out: subtract 0, not -inf (no -inf - -inf = NaN)
            m_use = kb.bind(ex.select(ex.Binary("eq", m_new, NEG_INF, ex.BOOL), ZERO, m_new))
            corr = kb.bind(ex.call("exp", ex.Binary("sub", m_old, m_use, F32)))
            p = kb.bind(ex.call("exp", ex.Binary("sub", sc, m_use, F32)))
            n.put(l, ex.Binary("add", ex.Binary("mul", n.get(l), corr, F32), p, F32))
            n.put(m, m_new)
            vr = n.local("vr", dv)
            n.loop("c", Const(dv), lambda c: n.put(vr, n.value(v, (*bidx, kvh, j, c)), c), f"v{s}")
            n.loop("c", Const(dv), lambda c: n.put(acc, ex.Binary("add", ex.Binary(
                "mul", n.get(acc, c), corr, F32), ex.Binary("mul", p, n.get(vr, c), F32), F32), c))

        n.loop("j", k.shape[-2], per_key, "keys", (("attn_segment", str(s)),))
    inv = kb.bind(ex.Binary("div", Const(1.0, F32), n.get(l), F32))
    o = n.local("o", 1)

    def store(c: Var) -> None:
        n.put(o, ex.Binary("mul", n.get(acc, c), inv, F32))
        val = kb.bind(ex.cast(n.get(o), out.dtype))
        kb.emit(lp.Store(out.name, n.out_index((*bidx, h, i, c)), val))

    n.loop("c", Const(dv), store, "out")
    notes = (("gpu", GPU_ATTENTION), ("attn_scale", repr(scale)), ("attn_causal", str(causal).lower()),
             ("attn_segments", str(segments)), ("attn_masked", str(masked).lower()))
    for k in range(len(vars_) - 1, -1, -1):
        body = kb.pop()
        kb.emit(lp.For(vars_[k], Const(0), extents[k], "serial", body, notes if k == 0 else ()))
    return kb.pop()
