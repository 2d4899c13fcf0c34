"""Element rules of the neural-network ops: convolutions (forward and both gradients) and
pooling (forward and gradient).

Every rule computes one output element with an accumulation loop over the taps that reach
it. A tap that falls into padding, or between the strides of a transposed convolution, is
masked with a select, and its load index is clamped into the buffer first, so no load ever
leaves its buffer (both sides of a select are evaluated).

A 2-d convolution with padding 1, for one output element `out[i0, i1, i2, i3]`:

    alloc %acc4: f32[1] strides [1] local
    %acc4[0] = 0.0:f32
    for r5 in 0..3 {                      # input channels of the group
      for r6 in 0..3 {                    # kernel rows
        for r7 in 0..3 {                  # kernel columns
          let t8 = i2 - 1 + r6
          let t9 = i3 - 1 + r7
          let x10 = %x[i0, r5, min(max(t8, 0), 7), min(max(t9, 0), 7)]
          let x11 = %w[i1, r5, r6, r7]
          let t12 = x10 * x11
          let t13 = t8 >= 0 & t8 < 8 & (t9 >= 0 & t9 < 8)
          let t14 = select(t13, t12, 0.0:f32)
          %acc4[0] = %acc4[0] + t14
        }
      }
    }
    let t15 = %acc4[0]
"""
from __future__ import annotations

from typing import Optional, Sequence

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from . import scalar_ops
from .kernel_builder import REDUCE_INIT, Index, KernelBuilder, element_rule

BOOL = ex.BOOL


# ---- small helpers ----------------------------------------------------------------------------

def clamp(e: Expr, size: Expr) -> Expr:
    """`e` clamped into `[0, size - 1]`."""
    return ex.minimum(ex.maximum(e, Const(0)), ex.sub(size, Const(1)))


def is_true(e: Optional[Expr]) -> bool:
    return isinstance(e, Const) and bool(e.value)


def conj(a: Optional[Expr], b: Optional[Expr]) -> Optional[Expr]:
    """`a & b` where None means true."""
    if a is None or is_true(a):
        return b
    if b is None or is_true(b):
        return a
    return ex.Binary("and", a, b, BOOL)


def in_range(e: Expr, size: Expr) -> Expr:
    """`0 <= e < size`."""
    return ex.Binary("and", ex.binary("ge", e, Const(0)), ex.binary("lt", e, size), BOOL)


def zero(d: dt.DType) -> Expr:
    return Const(0, ScalarType(d))


def ceil_div(a: Expr, b: Expr) -> Expr:
    return ex.floordiv(ex.add(a, ex.sub(b, Const(1))), b)


def flat_index(pos: Sequence[Expr], shape: Sequence[Expr]) -> Expr:
    """Row-major linear position of `pos` in `shape`."""
    lin: Expr = Const(0)
    for p, d in zip(pos, shape):
        lin = ex.add(ex.mul(lin, d), p)
    return lin


class Accumulator:
    """A one-element local buffer: `init`, `update(value)` with a combining op, `result()`."""

    def __init__(self, kb: KernelBuilder, dtype: dt.DType, init: Expr, prefix: str = "acc") -> None:
        self.kb = kb
        self.buf = lp.Buffer(kb.fresh(prefix), dtype, (Const(1),), (Const(1),), "local")
        kb.emit(lp.Alloc(self.buf))
        kb.emit(lp.Store(self.buf.name, (Const(0),), init))

    @property
    def current(self) -> Expr:
        return ex.Load(self.buf.name, (Const(0),), ScalarType(self.buf.dtype))

    def combine(self, op: str, value: Expr) -> None:
        self.kb.emit(lp.Store(self.buf.name, (Const(0),), scalar_ops.binary(op, self.current, value)))

    def set(self, value: Expr) -> None:
        self.kb.emit(lp.Store(self.buf.name, (Const(0),), value))

    def result(self) -> Expr:
        return self.kb.bind(self.current)


def accumulate_loops(kb: KernelBuilder, extents: tuple[Expr, ...], prefix: str = "r") -> tuple[Var, ...]:
    """Loop variables for an accumulation nest; the caller pushes a scope, emits the body,
    and closes it with `close_loops`."""
    vars_ = kb.loops(extents, prefix)
    kb.push()
    return vars_


def close_loops(kb: KernelBuilder, vars_: tuple[Var, ...], extents: tuple[Expr, ...]) -> None:
    body = kb.pop()
    kb.emit(kb.nest(vars_, extents, body))


def spatial(op: Op, key: str) -> tuple[int, ...]:
    return tuple(int(v) for v in op.attrs[key])


# ---- convolutions -----------------------------------------------------------------------------

def _input_positions(kb: KernelBuilder, x: Value, outs: Sequence[Expr], taps: Sequence[Expr],
                     stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int]
                     ) -> tuple[list[Expr], Optional[Expr]]:
    """Where output position `outs` and kernel tap `taps` read `x`, per spatial dim (clamped
    into range where padding can take it outside), and the condition that every read is
    inside `x` (None without padding): the convolution and its weight gradient share it."""
    pos: list[Expr] = []
    valid: Optional[Expr] = None
    for s, (o, k) in enumerate(zip(outs, taps)):
        p = ex.add(ex.sub(ex.mul(o, Const(stride[s])), Const(padding[s])), ex.mul(k, Const(dilation[s])))
        size = x.shape[2 + s]
        if padding[s] > 0:
            p = kb.bind(p, "t")
            valid = conj(valid, in_range(p, size))
            p = clamp(p, size)
        pos.append(p)
    return pos, valid


@element_rule("conv")
def conv(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    x, w = op.operands[0], op.operands[1]
    bias = op.operands[2] if len(op.operands) == 3 else None
    stride, padding, dilation = spatial(op, "stride"), spatial(op, "padding"), spatial(op, "dilation")
    groups = int(op.attrs["groups"])
    n, co, outs = idx[0], idx[1], idx[2:]
    cin_g = w.shape[1]
    chan0: Expr = Const(0)
    if groups > 1:
        chan0 = ex.mul(ex.floordiv(co, ex.floordiv(w.shape[0], Const(groups))), cin_g)
    dtype = op.result.dtype
    acc = Accumulator(kb, dtype, zero(dtype))
    extents = (cin_g, *w.shape[2:])
    red = accumulate_loops(kb, extents)
    ci, taps = red[0], red[1:]
    pos, valid = _input_positions(kb, x, outs, taps, stride, padding, dilation)
    xv = kb.value_at(x, (n, ex.add(chan0, ci), *pos))
    wv = kb.value_at(w, (co, ci, *taps))
    prod: Expr = kb.bind(scalar_ops.binary("mul", xv, wv))
    if valid is not None:
        prod = kb.bind(ex.select(kb.bind(valid), prod, zero(dtype)))
    acc.combine("add", prod)
    close_loops(kb, red, extents)
    out = acc.result()
    if bias is not None:
        out = kb.bind(scalar_ops.binary("add", out, kb.value_at(bias, (co,))))
    return out


def _transposed_tap(kb: KernelBuilder, i: Expr, k: Expr, stride: int, padding: int, dilation: int,
                    out_size: Expr) -> tuple[Expr, Expr]:
    """The output position a tap `k` of input position `i` came from, clamped, and whether it
    exists: `o = (i + padding - k * dilation) / stride` when that divides and is in range."""
    t = kb.bind(ex.sub(ex.add(i, Const(padding)), ex.mul(k, Const(dilation))), "t")
    o = t if stride == 1 else kb.bind(ex.floordiv(t, Const(stride)), "t")
    valid = in_range(o, out_size)
    if stride > 1:
        valid = ex.Binary("and", valid, ex.binary("eq", ex.mod(t, Const(stride)), Const(0)), BOOL)
    return clamp(o, out_size), valid


def _covering_windows(kernel: int, stride: int, dilation: int) -> int:
    """How many windows of a strided pooling can cover one input position: the window's span
    over the stride, rounded up (2 for a 3-wide window of stride 2, where its taps are 3)."""
    return -(-((kernel - 1) * dilation + 1) // stride)


def _covering_window(kb: KernelBuilder, i: Expr, j: Expr, kernel: int, stride: int, padding: int,
                     dilation: int, out_size: Expr) -> tuple[Expr, Expr]:
    """The `j`-th window that may cover input position `i`, counting down from the last one
    starting at or before it (`o = (i + padding) // stride - j`), clamped, and whether it
    exists and covers `i` (its tap `t = i + padding - o * stride` is within the window and on
    the dilation's grid). The windows a tap loop reaches, without its stride's divisibility
    test: `_covering_windows` of them instead of `kernel`."""
    shifted = ex.add(i, Const(padding))
    o = kb.bind(ex.sub(ex.floordiv(shifted, Const(stride)), j), "t")
    t = ex.sub(shifted, ex.mul(o, Const(stride)))
    valid: Expr = ex.Binary("and", in_range(o, out_size), ex.binary("le", t, Const((kernel - 1) * dilation)), BOOL)
    if dilation > 1:
        valid = ex.Binary("and", valid, ex.binary("eq", ex.mod(t, Const(dilation)), Const(0)), BOOL)
    return clamp(o, out_size), valid


@element_rule("conv_grad_input")
def conv_grad_input(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    g, w = op.operands
    stride, padding, dilation = spatial(op, "stride"), spatial(op, "padding"), spatial(op, "dilation")
    groups = int(op.attrs["groups"])
    n, c, ins = idx[0], idx[1], idx[2:]
    cin_g = w.shape[1]
    cout_g = ex.floordiv(w.shape[0], Const(groups))
    if groups > 1:
        chan0 = ex.mul(ex.floordiv(c, cin_g), cout_g)
        ci = ex.mod(c, cin_g)
    else:
        chan0, ci = Const(0), c
    dtype = op.result.dtype
    acc = Accumulator(kb, dtype, zero(dtype))
    extents = (cout_g, *w.shape[2:])
    red = accumulate_loops(kb, extents)
    co, taps = red[0], red[1:]
    outs: list[Expr] = []
    valid: Optional[Expr] = None
    for s, (i, k) in enumerate(zip(ins, taps)):
        o, ok = _transposed_tap(kb, i, k, stride[s], padding[s], dilation[s], g.shape[2 + s])
        outs.append(o)
        valid = conj(valid, ok)
    chan = ex.add(chan0, co)
    gv = kb.value_at(g, (n, chan, *outs))
    wv = kb.value_at(w, (chan, ci, *taps))
    prod: Expr = kb.bind(scalar_ops.binary("mul", gv, wv))
    assert valid is not None
    prod = kb.bind(ex.select(kb.bind(valid), prod, zero(dtype)))
    acc.combine("add", prod)
    close_loops(kb, red, extents)
    return acc.result()


@element_rule("conv_grad_weight")
def conv_grad_weight(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    g, x = op.operands
    stride, padding, dilation = spatial(op, "stride"), spatial(op, "padding"), spatial(op, "dilation")
    groups = int(op.attrs["groups"])
    co, ci, taps = idx[0], idx[1], idx[2:]
    cin_g = op.result.shape[1]
    chan0: Expr = Const(0)
    if groups > 1:
        chan0 = ex.mul(ex.floordiv(co, ex.floordiv(g.shape[1], Const(groups))), cin_g)
    dtype = op.result.dtype
    acc = Accumulator(kb, dtype, zero(dtype))
    extents = (g.shape[0], *g.shape[2:])
    red = accumulate_loops(kb, extents)
    n, outs = red[0], red[1:]
    pos, valid = _input_positions(kb, x, outs, taps, stride, padding, dilation)
    gv = kb.value_at(g, (n, co, *outs))
    xv = kb.value_at(x, (n, ex.add(chan0, ci), *pos))
    prod: Expr = kb.bind(scalar_ops.binary("mul", gv, xv))
    if valid is not None:
        prod = kb.bind(ex.select(kb.bind(valid), prod, zero(dtype)))
    acc.combine("add", prod)
    close_loops(kb, red, extents)
    return acc.result()


# ---- pooling ----------------------------------------------------------------------------------

class _Windows:
    """The pooling windows of one op along each spatial dim: fixed (kernel, stride, padding,
    dilation) or adaptive."""

    def __init__(self, op: Op, in_size: Sequence[Expr], out_size: Sequence[Expr]) -> None:
        self.adaptive = bool(op.attrs["adaptive"])
        self.in_size = tuple(in_size)
        self.out_size = tuple(out_size)
        self.nsp = len(self.in_size)
        if not self.adaptive:
            self.kernel = spatial(op, "window")
            self.stride = spatial(op, "stride")
            self.padding = spatial(op, "padding")
            self.dilation = spatial(op, "dilation") if op.attrs.get("dilation") else (1,) * self.nsp
        self.count_include_pad = bool(op.attrs.get("count_include_pad", True))
        self.divisor_override = op.attrs.get("divisor_override")

    # adaptive windows: [floor(o * in / out), ceil((o + 1) * in / out))
    def start(self, s: int, o: Expr) -> Expr:
        if self.adaptive:
            return ex.floordiv(ex.mul(o, self.in_size[s]), self.out_size[s])
        return ex.sub(ex.mul(o, Const(self.stride[s])), Const(self.padding[s]))

    def end(self, s: int, o: Expr) -> Expr:
        """Adaptive windows only: one past the last input position."""
        return ceil_div(ex.mul(ex.add(o, Const(1)), self.in_size[s]), self.out_size[s])

    def taps(self, s: int) -> Expr:
        """Taps per window (an upper bound for adaptive windows)."""
        if self.adaptive:
            return ex.add(ceil_div(self.in_size[s], self.out_size[s]), Const(1))
        return Const(self.kernel[s])

    def tap(self, kb: KernelBuilder, s: int, o: Expr, k: Expr) -> tuple[Expr, Expr]:
        """Input position of tap `k` of window `o` (clamped) and whether it is real."""
        if self.adaptive:
            start = kb.bind(self.start(s, o), "t")
            p = kb.bind(ex.add(start, k), "t")
            valid = ex.binary("lt", p, self.end(s, o))
            return clamp(p, self.in_size[s]), valid
        p = kb.bind(ex.add(self.start(s, o), ex.mul(k, Const(self.dilation[s]))), "t")
        if self.always_inside(s):
            return p, ex.Const(True, BOOL)
        return clamp(p, self.in_size[s]), in_range(p, self.in_size[s])

    def always_inside(self, s: int) -> bool:
        """Whether every tap of every fixed window is inside the input (no padding, and the
        last window ends inside: not so with `ceil_mode`)."""
        size, out = self.in_size[s], self.out_size[s]
        if self.padding[s] != 0 or not (isinstance(size, Const) and isinstance(out, Const)):
            return False
        last = (int(out.value) - 1) * self.stride[s] + (self.kernel[s] - 1) * self.dilation[s]
        return last <= int(size.value) - 1

    def first_tap(self, s: int, o: Expr) -> Expr:
        """The first real input position of window `o` (where PyTorch's argmax starts)."""
        start = self.start(s, o)
        if self.adaptive or self.padding[s] == 0:
            return start
        k0 = ex.maximum(ex.sub(Const(0), ex.floordiv(start, Const(self.dilation[s]))), Const(0))
        return ex.add(start, ex.mul(k0, Const(self.dilation[s])))

    def divisor(self, outs: Sequence[Expr]) -> Expr:
        """The element count an average divides by, for the window at `outs`."""
        if self.divisor_override:
            return Const(int(self.divisor_override))
        count: Expr = Const(1)
        for s, o in enumerate(outs):
            start = self.start(s, o)
            if self.adaptive:
                n = ex.sub(self.end(s, o), start)
            else:
                end = ex.minimum(ex.add(start, Const(self.kernel[s])),
                                 ex.add(self.in_size[s], Const(self.padding[s])))
                if not self.count_include_pad:
                    start = ex.maximum(start, Const(0))
                    end = ex.minimum(end, self.in_size[s])
                n = ex.sub(end, start)
            count = ex.mul(count, n)
        return count


def _better(v: Expr, cur: Expr) -> Expr:
    """PyTorch's max-pool test: `v > cur || isnan(v)`."""
    gt = scalar_ops.binary("gt", v, cur)
    if v.dtype.is_float:
        return ex.Binary("or", gt, ex.call("isnan", v), BOOL)
    return gt


@element_rule("pool")
def pool(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    x = op.operands[0]
    kind = op.attrs["kind"]
    nsp = len(op.attrs["out_size"])
    lead, outs = idx[:len(idx) - nsp], idx[len(idx) - nsp:]
    in_size = x.shape[x.type.rank - nsp:]
    win = _Windows(op, in_size, op.result.shape[op.result.type.rank - nsp:])
    vt = x.dtype
    extents = tuple(win.taps(s) for s in range(nsp))
    if kind == "avg":
        total = Accumulator(kb, vt, zero(vt))
    else:
        best = Accumulator(kb, vt, REDUCE_INIT["reduce_max"](vt))
    if kind == "argmax":
        where = Accumulator(kb, dt.i64, flat_index([win.first_tap(s, o) for s, o in enumerate(outs)], in_size))
    taps = accumulate_loops(kb, extents)
    pos: list[Expr] = []
    valid: Optional[Expr] = None
    for s, (o, k) in enumerate(zip(outs, taps)):
        p, ok = win.tap(kb, s, o, k)
        pos.append(p)
        valid = conj(valid, ok)
    assert valid is not None
    v = kb.value_at(x, (*lead, *pos))
    if kind == "avg":
        total.combine("add", v if is_true(valid) else kb.bind(ex.select(kb.bind(valid), v, zero(vt))))
    else:
        cur = kb.bind(best.current)
        better = _better(v, cur)
        take = kb.bind(better if is_true(valid) else ex.Binary("and", valid, better, BOOL))
        best.set(ex.select(take, v, cur))
        if kind == "argmax":
            where.set(ex.select(take, kb.bind(flat_index(pos, in_size)), where.current))
    close_loops(kb, taps, extents)
    if kind == "avg":
        count = kb.bind(ex.cast(win.divisor(outs), vt))
        return kb.bind(scalar_ops.binary("div", total.result(), count))
    return where.result() if kind == "argmax" else best.result()


@element_rule("pool_grad")
def pool_grad(kb: KernelBuilder, op: Op, idx: Index) -> Expr:
    g = op.operands[0]
    kind = op.attrs["kind"]
    nsp = len(op.attrs["in_size"])
    lead, ins = idx[:len(idx) - nsp], idx[len(idx) - nsp:]
    in_size = op.result.shape[op.result.type.rank - nsp:]
    out_size = g.shape[g.type.rank - nsp:]
    win = _Windows(op, in_size, out_size)
    vt = g.dtype
    total = Accumulator(kb, vt, zero(vt))
    windows = [not win.adaptive and _covering_windows(win.kernel[s], win.stride[s], win.dilation[s]) < win.kernel[s]
               for s in range(nsp)]
    if win.adaptive:
        # Windows covering i: o from floor(i * out / in), at most ceil(out / in) + 1 of them.
        extents = tuple(ex.add(ceil_div(out_size[s], in_size[s]), Const(1)) for s in range(nsp))
    else:
        extents = tuple(Const(_covering_windows(win.kernel[s], win.stride[s], win.dilation[s]) if windows[s]
                              else win.kernel[s]) for s in range(nsp))
    taps = accumulate_loops(kb, extents)
    outs: list[Expr] = []
    valid: Optional[Expr] = None
    for s, (i, k) in enumerate(zip(ins, taps)):
        if windows[s]:
            o, ok = _covering_window(kb, i, k, win.kernel[s], win.stride[s], win.padding[s], win.dilation[s],
                                     out_size[s])
        elif win.adaptive:
            o = kb.bind(ex.add(ex.floordiv(ex.mul(i, out_size[s]), in_size[s]), k), "t")
            oc = clamp(o, out_size[s])
            ok: Expr = ex.Binary("and", ex.binary("lt", o, out_size[s]),
                           ex.Binary("and", ex.binary("le", win.start(s, oc), i),
                                     ex.binary("lt", i, win.end(s, oc)), BOOL), BOOL)
            o = oc
        else:
            o, ok = _transposed_tap(kb, i, k, win.stride[s], win.padding[s], win.dilation[s], out_size[s])
        outs.append(o)
        valid = conj(valid, ok)
    assert valid is not None
    gv = kb.value_at(g, (*lead, *outs))
    if kind == "max":
        chosen = kb.value_at(op.operands[1], (*lead, *outs))
        here = ex.binary("eq", chosen, ex.cast(flat_index(ins, in_size), chosen.dtype))
        contrib = ex.select(kb.bind(ex.Binary("and", valid, here, BOOL)), gv, zero(vt))
    else:
        count = kb.bind(ex.cast(win.divisor(outs), vt))
        contrib = ex.select(kb.bind(valid), scalar_ops.binary("div", gv, count), zero(vt))
    total.combine("add", kb.bind(contrib))
    close_loops(kb, taps, extents)
    return total.result()
