"""Neural-network layers: convolution (forward, transposed, backward), pooling (max, average,
adaptive; forward and backward), variance for the norms, and embedding.

Batch norm and group norm reach us decomposed (see `decompositions.py`) into reductions and
elementwise ops, plus `var_mean`, lowered here; layer norm and RMS norm decompose in PyTorch's
core table. Convolutions and pools compute in f32 for half-precision inputs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import torch

from ...ir import dtypes as dt
from ...ir.expr import Const, Expr, as_expr
from ...ir.tensor import Value
from ..builder import PROMOTE, Builder, normalize_dim, numel
from ..registry import Unsupported, lowering
from ..symbols import shape_to_exprs

aten = torch.ops.aten


def _spatial(v: Any, n: int, name: str, default: Optional[int] = None) -> tuple[int, ...]:
    """An int or list attribute repeated to `n` spatial dims."""
    if v is None or (isinstance(v, (list, tuple)) and len(v) == 0):
        if default is None:
            raise Unsupported(f"missing {name}")
        return (default,) * n
    vals = [v] if isinstance(v, int) else list(v)
    if len(vals) == 1:
        vals = vals * n
    if len(vals) != n or not all(isinstance(x, int) for x in vals):
        raise Unsupported(f"{name} {v} for {n} spatial dims")
    return tuple(int(x) for x in vals)


def _float_compute(b: Builder, *vals: Value) -> list[Value]:
    for v in vals:
        if not v.dtype.is_float:
            raise Unsupported(f"{b.node.target if b.node else 'op'} of a {v.dtype} tensor")
    return [b.to_compute(v) for v in vals]


def _out_spatial(b: Builder, nsp: int, i: Optional[int] = None) -> tuple[Expr, ...]:
    meta = b.out_meta(i)
    return shape_to_exprs(meta.shape)[meta.dim() - nsp:]


# ---- convolution ----------------------------------------------------------------------------------

def _conv_attrs(stride: Any, padding: Any, dilation: Any, nsp: int, groups: int) -> dict[str, Any]:
    return dict(stride=_spatial(stride, nsp, "stride"), padding=_spatial(padding, nsp, "padding"),
                dilation=_spatial(dilation, nsp, "dilation"), groups=int(groups))


def _static(e: Expr) -> Optional[int]:
    return int(e.value) if isinstance(e, Const) and e.type.dtype.is_int else None


def _grad_input(b: Builder, g: Value, w: Value, in_size: Sequence[Expr], attrs: dict[str, Any],
                output_padding: Sequence[int] = ()) -> Value:
    """The gradient of a convolution with respect to its input (a transposed convolution).

    With stride 1 it is itself a convolution with stride 1: of `g` with the weight transposed
    within each group and flipped along its taps, padded by `dilation * (k - 1) - padding`.
    That form gets the blocked convolution kernels (`passes/loopgen/conv.py`). With strides
    larger than 1 (and dilation 1 along those dims) it is one such convolution per phase
    (`_grad_input_phases`); with a dilation there too, a convolution of `g` with `stride - 1`
    zeros inserted between its elements (and up to `stride - 1` after the last, the output
    padding). Symbolic batch and spatial sizes (Dynamo's dynamic shapes) keep these forms,
    whose sizes are then expressions; a symbolic weight, padding beyond `dilation * (k - 1)`,
    and a transposed convolution's `output_padding` of a stride or more (which PyTorch allows
    below the dilation), keep `conv_grad_input` (a per-element nest). The phases need dilation
    1 along every dim (their convolutions run undilated); with a dilation anywhere a strided
    gradient takes the zero-inserted form."""
    stride, padding, dilation, groups = attrs["stride"], attrs["padding"], attrs["dilation"], attrs["groups"]
    nsp = len(stride)
    ks = [_static(k) for k in w.shape[2:]]
    gs = [_static(d) for d in g.shape[2:]]
    want = [_static(d) for d in in_size]
    cout, cin_g = _static(w.shape[0]), _static(w.shape[1])
    strided = any(s > 1 for s in stride)
    phases = strided and all(d == 1 for d in dilation)
    usable = None not in ks and cout is not None and cin_g is not None
    if usable:
        pads = tuple(d * (k - 1) - p for d, k, p in zip(dilation, ks, padding))  # type: ignore[operator]
        usable = all(q >= 0 for q in pads)
    if usable and None not in gs + want:
        # Length of g with the zeros inserted, so that the stride-1 convolution gives `in_size`.
        ups = [i - 2 * q + d * (k - 1) for i, q, d, k in zip(want, pads, dilation, ks)]  # type: ignore[operator]
        usable = all((o - 1) * s + 1 <= u <= o * s for o, s, u in zip(gs, stride, ups))  # type: ignore[operator]
    elif usable:
        # Symbolic sizes: the same condition holds for every size when `in_size` is a forward
        # convolution's input (`u = I + 2p - d(k-1)`, `O = (u - 1) // s + 1`), or a transposed
        # convolution's output whose output padding is below the stride (`u = (O - 1) s + op + 1`).
        usable = all(op < s for op, s in zip(output_padding or (0,) * nsp, stride))
    if not usable:
        return b.op("conv_grad_input", g, w, in_size=tuple(in_size), **attrs)
    rank = nsp + 2
    spatial = tuple(range(2, rank))
    if groups == 1:
        wt = b.op("permute", w, dims=(1, 0, *spatial))
    else:
        per = b.reshape(w, (Const(groups), Const(cout // groups), w.shape[1], *w.shape[2:]))  # type: ignore[operator]
        per = b.op("permute", per, dims=(0, 2, 1, *range(3, rank + 1)))
        wt = b.reshape(per, (Const(groups * cin_g), Const(cout // groups), *w.shape[2:]))  # type: ignore[operator]
    if phases:
        return _grad_input_phases(b, g, wt, list(in_size), list(g.shape[2:]), [int(k) for k in ks],  # type: ignore[arg-type]
                                  attrs)
    if strided:
        # g[n, c, o] -> up[n, c, o * s] (zeros between): [.., O, 1] padded to [.., O, s], flattened, cut.
        split: list[Expr] = [g.shape[0], g.shape[1]]
        for o in g.shape[2:]:
            split += [o, Const(1)]
        up = b.op("pad", b.reshape(g, split), low=(0,) * (2 + 2 * nsp),
                  high=(0, 0, *[x for s in stride for x in (0, s - 1)]), value=0.0)
        up = b.reshape(up, (g.shape[0], g.shape[1], *[o * s for o, s in zip(g.shape[2:], stride)]))
        for dim, (i, o, s, q, d, k) in enumerate(zip(in_size, g.shape[2:], stride, pads, dilation, ks)):
            u = as_expr(i) + (d * (k - 1) - 2 * q)  # type: ignore[operator]
            if u != o * s:
                up = b.op("slice", up, dim=2 + dim, start=0, end=u, step=1)
        g = up
    wt = b.op("flip", wt, dims=spatial)
    return b.op("conv", g, wt, stride=(1,) * nsp, padding=pads, dilation=tuple(dilation), groups=groups)


def _grad_input_phases(b: Builder, g: Value, wt: Value, in_size: Sequence[Expr], out_size: Sequence[Expr],
                       ks: Sequence[int], attrs: dict[str, Any]) -> Value:
    """The input gradient of a strided convolution, one stride-1 convolution per phase.

    Along a dim of stride `s` (dilation 1), input position `i = s*m + r - p` takes the taps
    `k = r + s*j` only: `gi[s*m + r - p] = sum_j g[m - j] * w[r + s*j]`. So phase `r` is a
    stride-1 convolution of `g` with the flipped sub-kernel `w[r::s]` (a fraction `1/s` of the
    taps), and the phases interleave into the gradient: no multiplication by inserted zeros
    (the zero-inserted form does `s` times the work per strided dim). `wt` is the weight already
    transposed per group (`[Cin, Cout / groups, *k]`), not flipped. Phases without taps (a
    kernel narrower than the stride) are zeros.

    Sizes may be symbolic (`in_size`, `out_size` expressions): a phase's rows `M` are then an
    expression, and its convolution is padded at the end by the most `M` can exceed `g` over
    every residue of the input size modulo the stride (`_phase_overhang`; a convolution's
    padding is static), its result cut to `M` rows."""
    stride, padding, groups = attrs["stride"], attrs["padding"], attrs["groups"]
    nsp = len(stride)
    n, cin = g.shape[0], wt.shape[0]
    # Per dim: first phase row m_a = p // s, offset of input 0 in the interleaving, rows M.
    m_a = [p // s for p, s in zip(padding, stride)]
    off = [p - s * m for p, s, m in zip(padding, stride, m_a)]
    rows: list[Expr] = [(as_expr(i) + (o + s - 1)) // s for o, i, s in zip(off, in_size, stride)]
    # Per dim: the most M - O can be (exact where the sizes are static).
    over = [_static(m) - _static(o) if _static(m) is not None and _static(o) is not None  # type: ignore[operator]
            else _phase_overhang(k, s, p, f) for m, o, k, s, p, f in zip(rows, out_size, ks, stride, padding, off)]

    def phase(r: tuple[int, ...]) -> Value:
        taps = [len(range(rd, k, s)) for rd, k, s in zip(r, ks, stride)]
        shape = (n, cin, *rows)
        if 0 in taps:
            return b.full(0.0, shape, g.dtype)
        sub = wt
        for d, (rd, k, s) in enumerate(zip(r, ks, stride)):
            if s > 1:
                sub = b.op("slice", sub, dim=2 + d, start=rd, end=k, step=s)
        sub = b.op("flip", sub, dims=tuple(range(2, 2 + nsp)))
        low = [kr - 1 - m for kr, m in zip(taps, m_a)]
        high = [ov + kr - 1 - lo for ov, kr, lo in zip(over, taps, low)]
        pads = [max(lo, hi, 0) for lo, hi in zip(low, high)]
        res = b.op("conv", g, sub, stride=(1,) * nsp, padding=tuple(pads), dilation=(1,) * nsp, groups=groups)
        for d, (pd, lo, mr) in enumerate(zip(pads, low, rows)):
            start = pd - lo
            if start != 0 or res.shape[2 + d] != mr:
                res = b.op("slice", res, dim=2 + d, start=start, end=mr + start, step=1)
        return res

    def interleave(prefix: tuple[int, ...]) -> Value:
        """Phases with the leading `prefix`, as `[N, C, M_0, s_0, ..., M_d, s_d, M_(d+1), ...]`."""
        d = len(prefix)
        if d == nsp:
            v = phase(prefix)
            split: list[Expr] = [n, cin]
            for m in rows:
                split += [m, Const(1)]
            return b.reshape(v, split)
        parts = [interleave(prefix + (r,)) for r in range(stride[d])]
        return parts[0] if len(parts) == 1 else b.op("concat", *parts, dim=3 + 2 * d)

    full = b.reshape(interleave(()), (n, cin, *[m * s for m, s in zip(rows, stride)]))
    for d, (o, i, m, s) in enumerate(zip(off, in_size, rows, stride)):
        if o != 0 or as_expr(i) != m * s:
            full = b.op("slice", full, dim=2 + d, start=o, end=as_expr(i) + o, step=1)
    return full


def _phase_overhang(k: int, s: int, p: int, off: int) -> int:
    """The most a phase's rows `M = ceil((I + off) / s)` exceed the forward's output `O =
    floor((I + 2p - k) / s) + 1` along a dim of stride `s` (dilation 1), over every input size
    `I`: both grow by one as `I` grows by `s`, so the difference depends on `I mod s` alone."""
    base = s * (k + p + 1)  # an input size past every edge case (O >= 1)
    return max(-(-(base + u + off) // s) - ((base + u + 2 * p - k) // s + 1) for u in range(s))


#: `node.meta[CONV_FORM]`: the form the tuner chose for a convolution (`backend/library_calls.py`):
#: "direct" (the blocked direct kernel, the default) or "gemm" (`_conv_gemm`).
CONV_FORM = "torchburn_conv_form"


@lowering(aten.convolution.default)
def convolution(b: Builder, x: Value, w: Value, bias: Optional[Value], stride: Any, padding: Any,
                dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Value:
    nsp = w.type.rank - 2
    if nsp < 1 or x.type.rank != nsp + 2:
        raise Unsupported(f"convolution of a rank-{x.type.rank} input (batched input expected)")
    out = b.out_dtype
    xc, wc = _float_compute(b, x, w)
    attrs = _conv_attrs(stride, padding, dilation, nsp, groups)
    gemm = None
    if not transposed and b.node is not None and b.node.meta.get(CONV_FORM) == "gemm":
        gemm = _conv_gemm(b, xc, wc, _out_spatial(b, nsp), attrs)
    if gemm is not None:
        res = gemm
        if bias is not None:
            bc = b.reshape(b.to_compute(bias), (bias.shape[0],) + (Const(1),) * nsp)
            res = b.op("add", res, b.expand(bc, res.shape))
    elif transposed:
        res = _grad_input(b, xc, wc, _out_spatial(b, nsp), attrs, _spatial(output_padding, nsp, "output_padding", 0))
        if bias is not None:
            bc = b.reshape(b.to_compute(bias), (bias.shape[0],) + (Const(1),) * nsp)
            res = b.op("add", res, b.expand(bc, res.shape))
    elif bias is not None:
        res = b.op("conv", xc, wc, b.to_compute(bias), **attrs)
    else:
        res = b.op("conv", xc, wc, **attrs)
    return b.cast(res, out)


def _columns(b: Builder, x: Value, window: Sequence[int], out_sp: Sequence[int],
             attrs: dict[str, Any]) -> Value:
    """im2col of `x: [N, C, *in]` as `[N, C, T, P]`: for each tap `k` of the window (the
    weight's order), the input at positions `o*s - p + k*d` of every output position `o`
    (zero in the padding), by one pad and strided slices. The taps are concatenated as `[N,
    C, T, *O]` and flattened after (a view), so the columns' kernel runs along output rows:
    flattened first, it vectorized along `P` with a div/mod and a gather per element (one
    thread, VGG's 512 channels at 28x28 4.9 -> 2.7 ms, 64 at 112x112 13.2 -> 4.4 ms)."""
    stride, padding, dilation = attrs["stride"], attrs["padding"], attrs["dilation"]
    n, c = x.shape[0], x.shape[1]
    positions = math.prod(out_sp)
    xp = x
    if any(padding):
        xp = b.op("pad", x, low=[0, 0, *padding], high=[0, 0, *padding], value=0.0)
    columns = []
    for tap in _taps(window):
        v = xp
        for d, (k, o) in enumerate(zip(tap, out_sp)):
            start = k * dilation[d]
            v = b.op("slice", v, dim=2 + d, start=start, end=start + stride[d] * (o - 1) + 1, step=stride[d])
        columns.append(b.reshape(v, (n, c, Const(1), *(Const(o) for o in out_sp))))
    cols = columns[0] if len(columns) == 1 else b.op("concat", *columns, dim=2)
    return b.reshape(cols, (n, c, Const(len(columns)), Const(positions)))


def _conv_gemm(b: Builder, x: Value, w: Value, out_size: Sequence[Expr], attrs: dict[str, Any]) -> Optional[Value]:
    """An ungrouped convolution as one batched matrix product of the weight and the input's
    columns (im2col), or None where sizes are symbolic or the convolution is grouped; a
    candidate the tuner measures against the direct kernel (deep layers with small images,
    where the direct kernel's tiles along the width are short):

        cols = im2col(x) : [N, C*T, P];  out = matmul(expand(w : [Cout, C*T]), cols) : [N, Cout, P]
    """
    sz = _gemm_sizes(x, w.shape[0], w.shape[2:], out_size, attrs["groups"])
    if sz is None:
        return None
    n, c, cout, taps, positions = int(sz.n), sz.c, sz.cout, sz.taps, sz.positions  # type: ignore[arg-type]
    cols = b.reshape(_columns(b, x, sz.ks, sz.out_sp, attrs), (Const(n), Const(c * taps), Const(positions)))
    w2 = b.expand(b.reshape(w, (Const(1), Const(cout), Const(c * taps))), (Const(n), Const(cout), Const(c * taps)))
    res = b.op("matmul", w2, cols)
    return b.reshape(res, (Const(n), Const(cout), *(Const(o) for o in sz.out_sp)))


@dataclass(frozen=True)
class _GemmSizes:
    """The static sizes of an ungrouped convolution that its GEMM forms use (the batch `n` is
    None where it is symbolic and the form allows it; `batch` is its size either way)."""

    n: Optional[int]
    batch: Expr
    c: int
    cout: int
    ks: tuple[int, ...]
    out_sp: tuple[int, ...]

    @property
    def taps(self) -> int:
        return math.prod(self.ks)

    @property
    def positions(self) -> int:
        return math.prod(self.out_sp)


def _gemm_sizes(x: Value, cout: Expr, ks: Sequence[Expr], out_sp: Sequence[Expr], groups: int,
                any_batch: bool = False) -> Optional[_GemmSizes]:
    """`x`'s batch and channels, the output channels, window and output sizes, or None where
    one is symbolic (the batch may be with `any_batch`) or the convolution is grouped."""
    vals = [_static(e) for e in (x.shape[1], cout, *ks, *out_sp)]
    n = _static(x.shape[0])
    if groups != 1 or any(v is None for v in vals) or (n is None and not any_batch):
        return None
    ints = [int(v) for v in vals]  # type: ignore[arg-type]
    return _GemmSizes(n, x.shape[0], ints[0], ints[1], tuple(ints[2:2 + len(ks)]), tuple(ints[2 + len(ks):]))


#: Weight gradients with at least this many multiply-adds per output element (the reduction
#: over batch and output positions) take the GEMM form (`_grad_weight_gemm`)... ResNet's last
#: stage at batch 1 (7x7: 49) kept the dot-product kernel at 64: one thread, CPU time, the
#: 512-to-512 3x3's weight gradient 17.9 ms there against 2.2 ms for the GEMM (eager 10.3), a
#: training step of the one convolution 30.9 -> 15.3 ms; at 4x4 (16) the two forms are even.
GEMM_GRAD_WEIGHT_MIN_REDUCTION = 32
#: ...and at least this many in all: below it the dot-product kernel is about as fast, and a
#: GEMM kernel per layer costs more compile time than it saves (the 32x32 model suite).
GEMM_GRAD_WEIGHT_MIN_MACS = 1 << 21
#: ...and, for a window of more than one tap, at least this many output channels: each element
#: of the materialized im2col (taps x the input) feeds `Cout` multiply-adds of the product, and
#: with fewer the columns cost about what the product saves. One thread, CPU time, a training
#: step of the one convolution (forward, both gradients), GEMM form against the dot-product
#: kernel: 64-to-32 3x3 at 128x128 28.9 / 22.3 ms (eager 22.6), 32-to-32 at 128x128 12.9 / 9.4,
#: 3-to-32 s2 at 224x224 4.1 / 3.9; with 64 output channels (32-to-64 at 128x128) 20.6 / 21.2,
#: with 256 (128-to-256 at 56x56) 50.6 / 80.8. A 1x1's columns are the input itself (no copy).
GEMM_GRAD_WEIGHT_MIN_COUT = 64
#: ...and, for a window of more than one tap, an output width that is not a multiple of
#: `DOT_GRAD_WEIGHT_WIDTH_STEP` of at least `DOT_GRAD_WEIGHT_MIN_WIDTH`: over such rows the
#: dot-product kernel (`conv_grad_weight`, reading zero-padded rows in whole vectors of 8
#: lanes, no tail) is faster than the columns and the product at any number of channels.
#: The weight gradient alone, one thread, CPU time, AVX2 (Zen 3), GEMM form against the
#: dot-product kernel: 64-to-64 3x3 at 128x128 30.7 / 16.0 ms (eager 26-35), 128-to-64 at
#: 64x64 10.6 / 8.4 (eager 9.5-9.9), 64-to-64 at 56x56 5.0 / 3.9 (eager 4.1-4.4), 128-to-128
#: at 32x32 4.95 / 3.73 (eager 5.1-5.2), 64-to-128 2.24 / 1.85; ResNet's 7x7 s2 stem (112
#: wide) 6.0 / 5.2. Rows of 28 or 14 (a tail in every row) took the dot-product kernel 3-5x
#: the product's time (128 channels at 28x28 3.6 / 10.8 ms); rows of 16 were about even
#: (256 at 16x16 6.4 / 5.4, 128-to-256 2.1 / 2.2): both keep the product. Since the kernel
#: pads every row to whole vectors (no tail, `whole-vectors`), rows of 28, 14 and 7 run it
#: about as fast as the product on one thread, but not on two (AVX-512, 2 threads, batch 1,
#: ms, dot-product / GEMM form: 128 at 28x28 1.31 / 1.27, 256 at 14x14 1.88 / 1.67, 512 at
#: 7x7 3.63 / 2.95; 64 at 56x56 1.26 / 1.23): they keep the product.
DOT_GRAD_WEIGHT_MIN_WIDTH = 32
DOT_GRAD_WEIGHT_WIDTH_STEP = 8
#: The batch the thresholds above assume where it is symbolic (Dynamo's dynamic batch, after a
#: second batch size): the product's reduction is then `batch x positions`, a loop bound.
#: Without the GEMM form such a gradient took the per-element nest (the dot-product kernel
#: needed a static batch too): ResNet's 256-channel 3x3 at 14x14, batch 4, 465 ms against
#: eager's ~50 for the whole training step of the layer.
SYMBOLIC_BATCH_HINT = 8


def _grad_weight_gemm(b: Builder, g: Value, x: Value, window: Sequence[Expr],
                      attrs: dict[str, Any]) -> Optional[Value]:
    """The weight gradient of an ungrouped convolution as one matrix product, or None where
    sizes other than the batch are symbolic, the convolution is grouped, the reduction or the whole product is
    small (`GEMM_GRAD_WEIGHT_MIN_REDUCTION`, `GEMM_GRAD_WEIGHT_MIN_MACS`), or a window of several
    taps has few output channels (`GEMM_GRAD_WEIGHT_MIN_COUT`) or long rows of whole vectors
    (`DOT_GRAD_WEIGHT_MIN_WIDTH`).

    `gw[co, (ci, k)] = sum_{n, o} g[n, co, o] * cols[(ci, k), (n, o)]`, where `cols` holds, for
    each tap `k`, the input positions `o*s - p + k*d` (an im2col of the padded input by strided
    slices). Both operands are contiguous along the reduction, so the product is our GEMM
    kernel's (register-blocked, packed panels) instead of a dot product per weight element:

        g: [N, Cout, *O] -> permute, reshape -> [Cout, N*P]
        cols: pad(x) -> slice per tap -> concat -> [N, C*T, P] -> permute, reshape -> [C*T, N*P]
        gw = matmul([Cout, N*P], permute(cols)) -> [Cout, C*T] -> reshape [Cout, C, *k]
    """
    nsp = len(attrs["stride"])
    sz = _gemm_sizes(x, g.shape[1], window, g.shape[2:], attrs["groups"], any_batch=True)
    if sz is None:
        return None
    c, cout, ks, taps, positions = sz.c, sz.cout, sz.ks, sz.taps, sz.positions
    n = sz.n if sz.n is not None else SYMBOLIC_BATCH_HINT
    if n * positions < GEMM_GRAD_WEIGHT_MIN_REDUCTION or n * positions * cout * c * taps < GEMM_GRAD_WEIGHT_MIN_MACS:
        return None
    if taps > 1 and cout < GEMM_GRAD_WEIGHT_MIN_COUT:
        return None
    ow = sz.out_sp[-1]
    if taps > 1 and ow >= DOT_GRAD_WEIGHT_MIN_WIDTH and ow % DOT_GRAD_WEIGHT_WIDTH_STEP == 0:
        return None
    cols = _columns(b, x, ks, sz.out_sp, attrs)  # [N, C, T, P]
    reduction = Const(sz.n * positions) if sz.n is not None else sz.batch * positions
    cols = b.reshape(b.op("permute", cols, dims=[1, 2, 0, 3]), (Const(c * taps), reduction))
    g2 = b.reshape(b.op("permute", g, dims=[1, 0, *range(2, nsp + 2)]), (Const(cout), reduction))
    gw = b.op("matmul", g2, b.op("permute", cols, dims=[1, 0]))
    return b.reshape(gw, (Const(cout), Const(c), *(Const(k) for k in ks)))


def _taps(ks: Sequence[int]) -> list[tuple[int, ...]]:
    """Every tap of a window, the last dim fastest (the weight's own order)."""
    out: list[tuple[int, ...]] = [()]
    for k in ks:
        out = [t + (i,) for t in out for i in range(k)]
    return out


@lowering(aten.convolution_backward.default)
def convolution_backward(b: Builder, grad: Value, x: Value, w: Value, bias_sizes: Any, stride: Any,
                         padding: Any, dilation: Any, transposed: bool, output_padding: Any, groups: int,
                         output_mask: Sequence[bool]) -> tuple[Optional[Value], ...]:
    nsp = w.type.rank - 2
    if nsp < 1 or x.type.rank != nsp + 2:
        raise Unsupported("convolution_backward of an unbatched input")
    gc, xc, wc = _float_compute(b, grad, x, w)
    attrs = _conv_attrs(stride, padding, dilation, nsp, groups)
    gi = gw = gb = None
    if output_mask[0]:
        if transposed:
            # a convolution of g; an output padding of a stride or more (allowed below the
            # dilation) makes it longer than the input: its first positions are the gradient
            gi = b.op("conv", gc, wc, **attrs)
            for d in range(nsp):
                if gi.shape[2 + d] != x.shape[2 + d]:
                    gi = b.op("slice", gi, dim=2 + d, start=0, end=x.shape[2 + d], step=1)
        else:
            gi = _grad_input(b, gc, wc, x.shape[2:], attrs)
        gi = b.cast(gi, x.dtype)
    if output_mask[1]:
        if transposed:
            # The weight gradient of a transposed convolution is a convolution's with the
            # roles of grad and input swapped: the input's channels are the rows (`gw[ci, co,
            # *k]`), the grad the strided columns. The same GEMM form where it pays: the
            # dot-product kernel read strided lanes of the grad, a gather each (the weight
            # gradient alone, one thread, CPU time: the U-Net's 128-to-64 2x2/2 at 32x32 4.2
            # -> 1.15 ms, eager 1.2-1.4; 256-to-128 at 16x16 3.9 -> 1.0, eager 1.3).
            gw = _grad_weight_gemm(b, xc, gc, w.shape[2:], attrs)
            if gw is None:
                gw = b.op("conv_grad_weight", xc, gc, window=w.shape[2:], **attrs)
        else:
            gw = _grad_weight_gemm(b, gc, xc, w.shape[2:], attrs)
            if gw is None:
                gw = b.op("conv_grad_weight", gc, xc, window=w.shape[2:], **attrs)
        gw = b.cast(gw, w.dtype)
    if output_mask[2]:
        dims = (0, *range(2, grad.type.rank))
        gb = b.cast(b.op("reduce_sum", gc, dims=dims, keepdim=False), grad.dtype)
    return gi, gw, gb


# ---- pooling --------------------------------------------------------------------------------------

def _pool(b: Builder, x: Value, kind: str, out_size: tuple[Expr, ...], **attrs: Any) -> Value:
    attrs.setdefault("window", ())
    attrs.setdefault("stride", ())
    attrs.setdefault("padding", ())
    attrs.setdefault("dilation", ())
    attrs.setdefault("adaptive", False)
    attrs.setdefault("count_include_pad", True)
    attrs.setdefault("divisor_override", None)
    return b.op("pool", x, kind=kind, out_size=out_size, **attrs)


def _pool_grad(b: Builder, operands: Sequence[Value], kind: str, in_size: tuple[Expr, ...], **attrs: Any) -> Value:
    attrs.setdefault("window", ())
    attrs.setdefault("stride", ())
    attrs.setdefault("padding", ())
    attrs.setdefault("dilation", ())
    attrs.setdefault("adaptive", False)
    attrs.setdefault("count_include_pad", True)
    attrs.setdefault("divisor_override", None)
    return b.op("pool_grad", *operands, kind=kind, in_size=in_size, **attrs)


def _window(kernel: Any, stride: Any, padding: Any, dilation: Any, nsp: int) -> dict[str, tuple[int, ...]]:
    k = _spatial(kernel, nsp, "kernel_size")
    s = _spatial(stride, nsp, "stride") if stride not in (None, [], ()) else k
    return dict(window=k, stride=s, padding=_spatial(padding, nsp, "padding", 0),
                dilation=_spatial(dilation, nsp, "dilation", 1))


def _max_pool(nsp: int) -> Any:
    def fn(b: Builder, x: Value, kernel: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
           ceil_mode: bool = False) -> tuple[Value, Value]:
        if x.dtype.is_bool:
            raise Unsupported("max pooling of a bool tensor")
        xc = b.to_compute(x)
        win = _window(kernel, stride, padding, dilation, nsp)
        out_size = _out_spatial(b, nsp, 0)
        values = b.cast(_pool(b, xc, "max", out_size, **win), x.dtype)
        return values, _pool(b, xc, "argmax", out_size, **win)
    return fn


lowering(aten.max_pool2d_with_indices.default)(_max_pool(2))
lowering(aten.max_pool3d_with_indices.default)(_max_pool(3))


def _max_pool_backward(nsp: int) -> Any:
    def fn(b: Builder, grad: Value, x: Value, kernel: Any, stride: Any, padding: Any, dilation: Any,
           ceil_mode: bool, indices: Value) -> Value:
        (gc,) = _float_compute(b, grad)
        win = _window(kernel, stride, padding, dilation, nsp)
        res = _pool_grad(b, (gc, indices), "max", x.shape[x.type.rank - nsp:], **win)
        return b.cast(res, grad.dtype)
    return fn


lowering(aten.max_pool2d_with_indices_backward.default)(_max_pool_backward(2))
lowering(aten.max_pool3d_with_indices_backward.default)(_max_pool_backward(3))


def _avg_pool(nsp: int) -> Any:
    def fn(b: Builder, x: Value, kernel: Any, stride: Any = None, padding: Any = 0, ceil_mode: bool = False,
           count_include_pad: bool = True, divisor_override: Optional[int] = None) -> Value:
        (xc,) = _float_compute(b, x)
        win = _window(kernel, stride, padding, 1, nsp)
        res = _pool(b, xc, "avg", _out_spatial(b, nsp), count_include_pad=bool(count_include_pad),
                    divisor_override=divisor_override, **win)
        return b.cast(res, x.dtype)
    return fn


lowering(aten.avg_pool2d.default)(_avg_pool(2))
lowering(aten.avg_pool3d.default)(_avg_pool(3))


def _avg_pool_backward(nsp: int) -> Any:
    def fn(b: Builder, grad: Value, x: Value, kernel: Any, stride: Any, padding: Any, ceil_mode: bool,
           count_include_pad: bool, divisor_override: Optional[int]) -> Value:
        (gc,) = _float_compute(b, grad)
        win = _window(kernel, stride, padding, 1, nsp)
        res = _pool_grad(b, (gc,), "avg", x.shape[x.type.rank - nsp:], count_include_pad=bool(count_include_pad),
                         divisor_override=divisor_override, **win)
        return b.cast(res, grad.dtype)
    return fn


lowering(aten.avg_pool2d_backward.default)(_avg_pool_backward(2))
lowering(aten.avg_pool3d_backward.default)(_avg_pool_backward(3))


def _adaptive_avg(nsp: int) -> Any:
    def fn(b: Builder, x: Value, output_size: Any) -> Value:
        (xc,) = _float_compute(b, x)
        return b.cast(_pool(b, xc, "avg", _out_spatial(b, nsp), adaptive=True), x.dtype)
    return fn


lowering(aten._adaptive_avg_pool2d.default)(_adaptive_avg(2))
lowering(aten._adaptive_avg_pool3d.default)(_adaptive_avg(3))


def _adaptive_avg_backward(nsp: int) -> Any:
    def fn(b: Builder, grad: Value, x: Value) -> Value:
        (gc,) = _float_compute(b, grad)
        res = _pool_grad(b, (gc,), "avg", x.shape[x.type.rank - nsp:], adaptive=True)
        return b.cast(res, grad.dtype)
    return fn


lowering(aten._adaptive_avg_pool2d_backward.default)(_adaptive_avg_backward(2))
lowering(aten._adaptive_avg_pool3d_backward.default)(_adaptive_avg_backward(3))


def _adaptive_max(nsp: int) -> Any:
    def fn(b: Builder, x: Value, output_size: Any) -> tuple[Value, Value]:
        if x.dtype.is_bool:
            raise Unsupported("max pooling of a bool tensor")
        xc = b.to_compute(x)
        out_size = _out_spatial(b, nsp, 0)
        values = b.cast(_pool(b, xc, "max", out_size, adaptive=True), x.dtype)
        return values, _pool(b, xc, "argmax", out_size, adaptive=True)
    return fn


lowering(aten.adaptive_max_pool2d.default)(_adaptive_max(2))
lowering(aten.adaptive_max_pool3d.default)(_adaptive_max(3))


def _adaptive_max_backward(nsp: int) -> Any:
    def fn(b: Builder, grad: Value, x: Value, indices: Value) -> Value:
        (gc,) = _float_compute(b, grad)
        res = _pool_grad(b, (gc, indices), "max", x.shape[x.type.rank - nsp:], adaptive=True)
        return b.cast(res, grad.dtype)
    return fn


lowering(aten.adaptive_max_pool2d_backward.default)(_adaptive_max_backward(2))
lowering(aten.adaptive_max_pool3d_backward.default)(_adaptive_max_backward(3))


# ---- variance (batch norm, group norm, layer norm, var/std) ---------------------------------------

def _reduce_dims(x: Value, dims: Any) -> tuple[int, ...]:
    rank = x.type.rank
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return tuple(sorted({normalize_dim(d, rank) for d in dims}))


def var_and_mean(b: Builder, x: Value, dims: Any, correction: Any, keepdim: bool,
                 wide: bool = False) -> tuple[Value, Value]:
    """The mean and the mean squared deviation, in the compute dtype, with `N - correction`
    in the denominator (clamped at 0, as PyTorch does). ``wide``: the deviations' sums and
    the variance in f64 for an f32 input (the variance is returned in f64), as eager's
    standard deviation accumulates: values near 1e20 have squares past f32's range, but a
    standard deviation that fits f32 (`std_of_variance`).

    When the reduced size is a known positive constant, the sums need one pass over the data:
    `sum(x)`, `sum(x - c)` and `sum((x - c)^2)` are sibling reductions of one input, which
    `fuse-sibling-loops` runs in one loop, and `var = (sum((x-c)^2) - sum(x-c)^2 / N) / denom`.
    The shift `c`, the first reduced element, keeps that difference accurate when the mean is
    large next to the spread (`1000 + randn`), the case where the unshifted form cancels. An
    empty or symbolic size keeps the two-pass form (the mean, then the deviations), which
    reads no element it does not reduce."""
    (xc,) = _float_compute(b, x)
    if xc.type.rank == 0:
        zero = b.full(0.0, (), xc.dtype)
        return b.op("div", zero, b.full(0.0 if (correction or 0) else 1.0, (), xc.dtype)), xc
    d = _reduce_dims(xc, dims)
    count = numel([xc.shape[i] for i in d])
    nf = b.cast(b.full(count, (), dt.i64), xc.dtype)
    total = b.op("reduce_sum", xc, dims=d, keepdim=True)
    mean_k = b.op("div", total, b.expand(nf, total.shape))
    acc = dt.f64 if wide and xc.dtype == dt.f32 else xc.dtype
    if isinstance(count, Const) and int(count.value) > 0:
        sq = _shifted_square_sum(b, xc, d, b.cast(nf, acc), keepdim, acc)
    elif acc != xc.dtype:  # two passes in f64: the mean, then the deviations from it
        x64 = b.cast(xc, acc)
        mean64 = b.op("div", b.op("reduce_sum", x64, dims=d, keepdim=True), b.expand(b.cast(nf, acc), total.shape))
        dev = b.op("sub", x64, b.expand(mean64, xc.shape))
        sq = b.op("reduce_sum", b.op("mul", dev, dev), dims=d, keepdim=bool(keepdim))
    else:
        dev = b.op("sub", xc, b.expand(mean_k, xc.shape))
        sq = b.op("reduce_sum", b.op("mul", dev, dev), dims=d, keepdim=bool(keepdim))
    c = 1.0 if correction is None else float(correction)
    denom = b.op("max", b.op("sub", b.cast(nf, acc), b.full(c, (), acc)), b.full(0.0, (), acc))
    var = b.op("div", sq, b.expand(denom, sq.shape))
    mean = mean_k if keepdim else b.reshape(mean_k, sq.shape)
    return var, mean


def _shifted_square_sum(b: Builder, xc: Value, dims: tuple[int, ...], nf: Value, keepdim: bool,
                        acc: Any) -> Value:
    """`sum((x - mean)^2)` over `dims` as `sum(s^2) - sum(s)^2 / N` with `s = x - c`, `c` the
    first element of the reduced dims (which must not be empty), summed in `acc`; see
    `var_and_mean`. Where `sum(s^2)` overflows, the result is that infinity (eager's variance
    there), not `inf - inf`."""
    first = xc
    for i in dims:
        first = b.op("slice", first, dim=i, start=Const(0), end=Const(1), step=1)
    s = b.cast(b.op("sub", xc, b.expand(first, xc.shape)), acc)
    s1 = b.op("reduce_sum", s, dims=dims, keepdim=bool(keepdim))
    s2 = b.op("reduce_sum", b.op("mul", s, s), dims=dims, keepdim=bool(keepdim))
    correction = b.op("div", b.op("mul", s1, s1), b.expand(nf, s1.shape))
    sq = b.op("max", b.op("sub", s2, correction), b.full(0.0, s1.shape, acc))
    return b.op("where", b.op("isinf", s2), s2, sq)


def _correction(b: Builder, unbiased: Any, kw: dict[str, Any]) -> Any:
    """The correction of `var.correction` (keyword) or `var.dim` (`unbiased`)."""
    assert b.node is not None
    if b.node.target in (aten.var_mean.correction, aten.var.correction):
        c = kw.get("correction")
        return 1 if c is None else c
    return 1 if unbiased is None or unbiased else 0


@lowering(aten.var_mean.correction, aten.var_mean.dim)
def var_mean(b: Builder, x: Value, dims: Any = None, unbiased: Any = None, keepdim: bool = False,
             **kw: Any) -> tuple[Value, Value]:
    var, mean = var_and_mean(b, x, dims, _correction(b, unbiased, kw), kw.get("keepdim", keepdim),
                             wide=_wide(b))
    out = b.out_dtype
    return b.cast(var, out), b.cast(mean, out)


@lowering(aten.var.correction, aten.var.dim)
def var(b: Builder, x: Value, dims: Any = None, unbiased: Any = None, keepdim: bool = False, **kw: Any) -> Value:
    v, _ = var_and_mean(b, x, dims, _correction(b, unbiased, kw), kw.get("keepdim", keepdim),
                        wide=_wide(b))
    return b.cast(v, b.out_dtype)


#: The ops that AOTAutograd decomposes into a variance and its `sqrt`.
_STD_OPS = tuple(str(getattr(op, o)) for op in (aten.std, aten.std_mean) for o in op.overloads())
#: Variances a program asks for itself (not a norm's, whose kernels stay in f32).
_VAR_OPS = _STD_OPS + tuple(str(getattr(op, o)) for op in (aten.var, aten.var_mean) for o in op.overloads())


def _origin(b: Builder) -> str:
    return str(b.node.meta.get("original_aten")) if b.node is not None else ""


def _of_std(b: Builder) -> bool:
    """Whether the node being lowered is part of a decomposed `std`/`std_mean` (its meta's
    ``original_aten``): its `sqrt` is taken of the f64 variance."""
    return _origin(b) in _STD_OPS


def _wide(b: Builder) -> bool:
    """Whether a variance is accumulated in f64 (an f32 input): where the program asked for
    `var`, `var_mean`, `std` or `std_mean` itself, as eager's kernels accumulate; a norm's
    variance (layer, batch, group norm decomposed) stays in f32."""
    return _origin(b) in _VAR_OPS


@lowering(aten.sqrt.default)
def sqrt(b: Builder, x: Value) -> Value:
    """`sqrt`; in a decomposed `std`, of the variance in f64 before it is rounded to f32 (as
    eager's std: the variance of values near 1e20 overflows f32, their deviation does not)."""
    producer = x.producer
    if (_of_std(b) and producer is not None and producer.name == "cast"
            and producer.operands[0].dtype == dt.f64 and x.dtype == dt.f32):
        return b.cast(b.op("sqrt", producer.operands[0]), dt.f32)
    return b.elementwise("sqrt", x, kind=PROMOTE.INT_TO_FLOAT)


# ---- embedding --------------------------------------------------------------------------------------

@lowering(aten.embedding.default)
def embedding(b: Builder, weight: Value, indices: Value, padding_idx: int = -1, scale_grad_by_freq: bool = False,
              sparse: bool = False) -> Value:
    if indices.dtype.is_float or indices.dtype.is_bool:
        raise Unsupported("embedding indices must be integers")
    if indices.type.rank == 0:
        row = b.op("index", weight, b.reshape(indices, (Const(1),)), dims=(0,), pos=0, wrap=False)
        return b.reshape(row, weight.shape[1:])
    return b.op("index", weight, indices, dims=(0,), pos=0, wrap=False)  # eager refuses negative ids
