"""The weight gradient of a convolution as a kernel: `conv_grad_weight` in dot-product form.

See `GradWeightBuilder`; the helpers (ramps, clamps, the work-item grid) are `conv.py`'s. A
weight gradient whose weight or channels are not static, or whose output is narrower than 2,
keeps the per-element nest of `nn_rules.py`. The batch and the spatial sizes are only bounds
of the reduction's loops (and of the padded rows' copies; a symbolic width takes whole
vectors, its last one masked at run time), so symbolic ones (Dynamo's dynamic shapes) keep
the kernel.
"""
from __future__ import annotations

from typing import Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from .conv import ACCUMULATORS, _clamp, _in_range, _ramp, _vec, unflatten
from .nest_helpers import NestHelpers
from .kernel_builder import KernelBuilder
from .matmul import MIN_PARALLEL_FLOPS, CpuInfo, static_int


#: The batch a symbolic one is taken to be when deciding whether the kernel runs in parallel,
#: and a symbolic spatial size (a dynamic length is rarely a short one).
SYMBOLIC_BATCH_HINT = 8
SYMBOLIC_SIZE_HINT = 64


def _pow2_ceil(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


class GradWeightBuilder(NestHelpers):
    """The weight gradient `gw[co, ci, *k] = sum_{n, o} g[n, co, o] * x[n, cin(co) + ci, o*s - p + k*d]`
    in dot-product form: the reduction runs in vectors along the output width (both `g` and,
    for stride 1, `x` are contiguous there), R output channels x T taps of the last dim per
    tile (as many as the vector registers hold with a vector of `g` per row and of `x` per
    tap), the lanes summed at the end. Where OW is a multiple of W and the row is neither
    padded nor strided along the last dim, `x` is read in place:

        parallel for ti in 0..items                  co block, ci, outer taps, tap block
          acc[r][t] = 0 (W lanes)
          for n { for oh { ih = oh*s - p + kh*d; if 0 <= ih < H {
            for ov in lo..hi {                  (every tap inside the row: plain loads)
              gv_r = g[n, co_r, oh, ramp(ov*W, 1, W)]
              xv_t = x[n, cin_r + ci, ih, ramp(ov*W*s - p + kw_t*d, s, W)]
              acc[r][t] = fma(gv_r, xv_t, acc[r][t]) }
            for ov in 0..lo and hi..OW / W { the same, x clamped and masked } }}}
          gw[co_r, ci, kh, kw_t] = vreduce_add(acc[r][t])      (valid r, t only)

    With padding or a stride along the last dim, the input's rows are first copied,
    zero-padded and split by phase of the stride, into a workspace (`padded_rows`, once per
    call): tap `kw` of the positions `ov*W..` then reads phase `kw*d % s` at `ov*W + kw*d // s
    ..`, a plain vector for every position (no clamped, masked or strided loads: each of those
    was a gather) and one vector loop per row:

        for n, c, *rows, ph < s, q < Q { i = q*s + ph - p; xp[.., ph, q] = select(0 <= i < W, x[.., clamp(i)], 0) }
        ... for ov in 0..OW / W { xv_t = xp[n, cin_r + ci, ih, (kw_t*d) % s, ramp(ov*W + (kw_t*d) // s, 1, W)] ... }

    **Whole vectors.** Where OW is not a multiple of W (or not static), `g`'s rows are copied
    too, zero-padded to `OWp = ceil(OW / W) * W` (`padded_gradient`), and `x`'s padded rows
    are as wide: every position is in a plain vector and there is no scalar tail (a scalar
    loop for the last OW % W positions had cost twice the vectors at 56 wide on AVX-512). In
    the last vector, the lanes past OW select zero for `x` (they read input values no output
    reads: a strided row's last element, which may be inf where eager's gradient is finite,
    and `0 * inf` is NaN). `W` is at most the power of two at or above OW (a 7-wide row: one
    vector of 8, not 4 lanes and 3 scalar positions).

        for n, co, *rows, j < OWp { gp[.., j] = j < OW ? g[.., j] : 0 }
        ... for ov in 0..OW / W { gv_r = gp[n, co_r, oh, ramp(ov*W, 1, W)]; xv_t = xp[...] ... }
        ... for ov in OW / W..OWp / W { the same, xv_t = select(ramp(ov*W, 1, W) < OW, xp[...], 0) }
    """

    def __init__(self, kb: KernelBuilder, op: Op, out: lp.Buffer, lanes: int, rows: int, taps: int,
                 parallel: bool) -> None:
        self.kb, self.op, self.out = kb, op, out
        self.g, self.x = op.operands
        self.stride = tuple(int(v) for v in op.attrs["stride"])
        self.padding = tuple(int(v) for v in op.attrs["padding"])
        self.dilation = tuple(int(v) for v in op.attrs["dilation"])
        self.groups = int(op.attrs["groups"])
        self.lanes, self.rows, self.tw, self.parallel = lanes, rows, taps, parallel
        # A row that is not a whole number of vectors is padded to one (`padded_gradient`): its
        # last OW % W positions in a scalar loop cost twice the vectors before them at 56 wide
        # (3 vectors of 16 and 8 scalar positions of 12 products each; ResNet's 64-channel 3x3
        # weight gradient at 56x56 took 2.5x oneDNN's time).
        ow = static_int(self.g.shape[-1])
        self.whole_vectors = ow is None or ow % lanes != 0
        self.res_t = op.result.dtype
        self.acc_t = dt.compute_dtype(self.res_t)
        self.cout = op.result.shape[0]
        self.cin_g = op.result.shape[1]
        self.k_size = op.result.shape[2:]
        self.cout_g = ex.floordiv(self.cout, Const(self.groups))

    def buffer(self, v: Value) -> str:
        buf = self.kb.buffers[v]
        self.kb.used_buffers[buf.name] = buf
        return buf.name

    def padded_rows(self, ow_n: Expr) -> lp.Buffer:
        """`%xp[n, c, *rows, ph, q] = x[n, c, *rows, q*s + ph - p]`, zero outside the row, for
        every `q` the output's first `ow_n` positions read (`ow_n + (KW - 1)*d // s`): a
        workspace filled once per call, before the tiles (see the class docstring)."""
        kb = self.kb
        e = len(self.stride) - 1
        s_e, p_e, d_e = self.stride[e], self.padding[e], self.dilation[e]
        in_w = self.x.shape[2 + e]
        width = ex.add(ow_n, Const((int(static_int(self.k_size[e]) or 1) - 1) * d_e // s_e))
        outer = tuple(self.x.shape[:-1])
        xt = ScalarType(self.x.dtype)
        xp = kb.scratch(self.x.dtype, (*outer, Const(s_e), width))
        vars_ = kb.loops(outer, "x")
        zero = Const(0, xt)
        if s_e == 1:
            # zeros, the row, zeros: plain vectors (a clamped index would be a gather)
            left = ex.minimum(Const(p_e), width)
            mid = ex.maximum(Const(0), ex.minimum(in_w, ex.sub(width, Const(p_e))))
            self.pack = self._padded_copy(self.x, xp.name, vars_, (Const(0),), left, mid, width)
            return xp
        ph, q = self.var("ph"), self.var("q")
        kb.push((*vars_, ph, q))
        i = kb.bind(ex.sub(ex.add(ex.mul(q, Const(s_e)), ph), Const(p_e)), "i")
        load = kb.bind(ex.Load(self.buffer(self.x), (*vars_, _clamp(i, in_w)), xt), "x")
        kb.emit(lp.Store(xp.name, (*vars_, ph, q), ex.select(kb.bind(_in_range(i, in_w)), load, zero)))
        self.pack = kb.nest((*vars_, ph, q), (*outer, Const(s_e), width), kb.pop())
        return xp

    def padded_gradient(self, width: Expr) -> lp.Buffer:
        """`%gp[n, co, *rows, j] = g[n, co, *rows, j]` for `j < OW`, zero up to `width` (a
        whole number of vectors): with `padded_rows` as wide, every position of a row is
        in a plain vector and no scalar tail is left (`whole_vectors`)."""
        outer = tuple(self.g.shape[:-1])
        gp = self.kb.scratch(self.g.dtype, (*outer, width))
        vars_ = self.kb.loops(outer, "g")
        self.gpack = self._padded_copy(self.g, gp.name, vars_, (), Const(0), self.g.shape[-1], width)
        return gp

    def _padded_copy(self, src: Value, dst: str, vars_: tuple[Var, ...], mid_index: tuple[Expr, ...],
                     left: Expr, mid: Expr, width: Expr) -> lp.Stmt:
        """For every row `vars_` of `src`: `dst[*vars_, *mid_index, j]` = zero for `j < left`,
        `src[*vars_, j - left]` for the next `mid`, zero up to `width`; three loops of plain
        stores (the padded copies of `x` and `g`)."""
        kb, t = self.kb, ScalarType(src.dtype)
        zero = Const(0, t)
        j, iw, k = self.var("j"), self.var("iw"), self.var("j")
        kb.push(vars_)
        kb.emit(self.loop(j, left, lp.Store(dst, (*vars_, *mid_index, j), zero)))
        load = ex.Load(self.buffer(src), (*vars_, iw), t)
        kb.emit(self.loop(iw, mid, lp.Store(dst, (*vars_, *mid_index, ex.add(iw, left)), load)))
        right = ex.sub(ex.sub(width, left), mid)
        kb.emit(self.loop(k, right, lp.Store(dst, (*vars_, *mid_index, ex.add(ex.add(left, mid), k)), zero)))
        return kb.nest(vars_, tuple(src.shape[:-1]), kb.pop())

    def build(self) -> lp.Stmt:
        kb, w, nsp = self.kb, self.lanes, len(self.stride)
        e = nsp - 1
        ow_full = self.g.shape[2 + e]
        self.pack: Optional[lp.Stmt] = None
        self.gpack: Optional[lp.Stmt] = None
        gp: Optional[lp.Buffer] = None
        if self.whole_vectors:
            ow_vec = ex.mul(ex.floordiv(ex.add(ow_full, Const(w - 1)), Const(w)), Const(w))
            xp: Optional[lp.Buffer] = self.padded_rows(ow_vec)
            gp = self.padded_gradient(ow_vec)
        else:
            padded = self.padding[e] > 0 or self.stride[e] > 1
            xp = self.padded_rows(ow_full) if padded else None
        vt = ScalarType(self.acc_t, w)
        st = ScalarType(self.acc_t)
        lane = _ramp(Const(0), w)
        kw_n = self.k_size[e]
        tiles_co = ex.floordiv(ex.add(self.cout, Const(self.rows - 1)), Const(self.rows))
        tiles_k = ex.floordiv(ex.add(kw_n, Const(self.tw - 1)), Const(self.tw))
        extents = [tiles_co, self.cin_g, *self.k_size[:-1], tiles_k]
        item = self.var("ti")
        kb.push((item,))
        coords = unflatten(self.let, item, extents)
        tc, ci, ktaps, tk = coords[0], coords[1], coords[2:-1], coords[-1]
        co0 = self.let(ex.mul(tc, Const(self.rows)), "co")
        k0 = self.let(ex.mul(tk, Const(self.tw)), "kw")
        cos = [self.let(ex.minimum(ex.add(co0, Const(r)), ex.sub(self.cout, Const(1))), "cr") for r in range(self.rows)]
        kws = [self.let(ex.minimum(ex.add(k0, Const(t)), ex.sub(kw_n, Const(1))), "kt") for t in range(self.tw)]
        cabs = [self.let(ex.add(ex.mul(ex.floordiv(c, self.cout_g), self.cin_g), ci), "cx") for c in cos]
        e_s, e_d = self.stride[e], self.dilation[e]
        # the padded copy's phase and offset of each tap (`padded_rows`)
        phase = [self.let(ex.mod(ex.mul(k, Const(e_d)), Const(e_s)), "ph") for k in kws] if xp is not None else []
        qoff = [self.let(ex.floordiv(ex.mul(k, Const(e_d)), Const(e_s)), "qo") for k in kws] if xp is not None else []
        tiles = [(r, t) for r in range(self.rows) for t in range(self.tw)]
        accs = {rt: self.local("acc", (w,)) for rt in tiles}
        for rt in tiles:
            kb.emit(lp.Store(accs[rt].name, (lane,), ex.const(0, self.acc_t, w)))
        gname, xname = (self.buffer(self.g) if gp is None else gp.name), self.buffer(self.x)
        in_w = self.x.shape[2 + e]
        ow_n = ow_full if gp is None else gp.shape[-1]
        s_e, p_e, d_e = self.stride[e], self.padding[e], self.dilation[e]
        n = self.var("n")
        outs = [self.var("o") for _ in range(nsp - 1)]
        kb.push((n, *outs))
        rows_in = [kb.bind(ex.add(ex.sub(ex.mul(o, Const(self.stride[s])), Const(self.padding[s])),
                                  ex.mul(ktaps[s], Const(self.dilation[s]))), "ih") for s, o in enumerate(outs)]
        # vector part

        def vector_body(base: Expr, masked: bool, past_end: bool = False) -> lp.Stmt:
            kb.push()
            # the last vector of a padded row: lanes past OW read x values no output reads (a
            # strided row's last input, a transposed convolution's output padding), which
            # must not meet the zeros of `gp` (0 * inf is NaN where eager's gradient is finite)
            live = (kb.bind(ex.Binary("lt", _ramp(base, w), _vec(ow_full, w), ScalarType(dt.bool_, w)), "lv")
                    if past_end else None)
            gv = [kb.bind(ex.cast(ex.Load(gname, (n, c, *outs, _ramp(base, w)), ScalarType(self.g.dtype, w)),
                                  self.acc_t), "gv") for c in cos]
            for t in range(self.tw):
                start = kb.bind(ex.add(ex.sub(ex.mul(base, Const(s_e)), Const(p_e)), ex.mul(kws[t], Const(d_e))), "iw")
                iv = _ramp(start, w, Const(s_e))
                for r in range(self.rows):
                    if xp is not None:
                        q0 = kb.bind(ex.add(base, qoff[t]), "iw")
                        xv = ex.cast(ex.Load(xp.name, (n, cabs[r], *rows_in, phase[t], _ramp(q0, w)),
                                             ScalarType(self.x.dtype, w)), self.acc_t)
                        if live is not None:
                            xv = ex.select(live, kb.bind(xv, "xv"), ex.const(0, self.acc_t, w))
                    elif masked:
                        ivl = kb.bind(iv, "iv")
                        xv: Expr = ex.cast(ex.Load(xname, (n, cabs[r], *rows_in, _clamp(ivl, in_w)),
                                                   ScalarType(self.x.dtype, w)), self.acc_t)
                        xv = ex.select(kb.bind(_in_range(ivl, in_w)), kb.bind(xv, "xv"), ex.const(0, self.acc_t, w))
                    else:
                        xv = ex.cast(ex.Load(xname, (n, cabs[r], *rows_in, iv), ScalarType(self.x.dtype, w)), self.acc_t)
                    xv = kb.bind(xv, "xv")
                    a = accs[(r, t)]
                    kb.emit(lp.Store(a.name, (lane,), ex.Call("fma", (gv[r], xv, ex.Load(a.name, (lane,), vt)), vt)
                                     if self.acc_t.is_float else
                                     ex.Binary("add", ex.Binary("mul", gv[r], xv, vt), ex.Load(a.name, (lane,), vt), vt)))
            return kb.pop()

        # The vectors of positions whose every tap lies inside the row (`lo <= ov < hi`) take
        # plain loads, in a loop of their own; the rest, at both ends, clamp and mask. (An `if`
        # per vector inside one loop left LLVM 16 registers for the plain path and the masked
        # one's gathers together: 8 of the 12 accumulators lived on the stack, a load and a
        # store per fma; see `GradWeightBuilder`.)
        span = Const(w * s_e)
        ov_n = ex.floordiv(ow_n, Const(w))
        lo = ex.minimum(ex.floordiv(ex.add(ex.maximum(ex.sub(Const(p_e), ex.mul(k0, Const(d_e))), Const(0)),
                                           Const(w * s_e - 1)), span), ov_n)
        reach = ex.sub(ex.sub(ex.add(ex.sub(in_w, Const(1)), Const(p_e)), Const((w - 1) * s_e)),
                       ex.mul(ex.add(k0, Const(self.tw - 1)), Const(d_e)))
        hi = ex.maximum(ex.minimum(ex.floordiv(ex.maximum(ex.add(reach, span), Const(0)), span), ov_n), lo)
        whole = ex.binary("le", ex.add(k0, Const(self.tw)), kw_n)
        lo = self.let(lo, "lo")
        hi = self.let(ex.select(whole, hi, lo), "hi")

        def vector_loop(start: Expr, end: Expr, masked: bool, past_end: bool = False) -> lp.Stmt:
            ov = self.var("ov")
            kb.push((ov,))
            base = self.let(ex.mul(ov, Const(w)), "ob")
            kb.emit(vector_body(base, masked, past_end))
            return lp.For(ov, start, ex.sub(end, start), "serial", kb.pop())

        if gp is not None:  # whole vectors: the last one (where OW % W > 0) masks x past OW
            full = ex.floordiv(ow_full, Const(w))
            vec_loop = lp.block(vector_loop(Const(0), full, False), vector_loop(full, ov_n, False, True))
        elif xp is not None:
            vec_loop = vector_loop(Const(0), ov_n, False)
        else:
            vec_loop = lp.block(vector_loop(Const(0), lo, True), vector_loop(lo, hi, False),
                                vector_loop(hi, ov_n, True))
        row_body: lp.Stmt = vec_loop
        conds = [_in_range(ih, self.x.shape[2 + s]) for s, ih in enumerate(rows_in) if self.padding[s] > 0]
        for cond in conds:
            row_body = lp.If(cond, row_body)
        kb.emit(row_body)
        body = kb.pop()
        for s in range(nsp - 2, -1, -1):
            body = lp.For(outs[s], Const(0), self.g.shape[2 + s], "serial", body)
        kb.emit(lp.For(n, Const(0), self.g.shape[0], "serial", body))
        # finish: lanes summed, valid entries stored
        kb.used_buffers[self.out.name] = self.out
        for r, t in tiles:
            total = ex.VectorReduce("add", ex.Load(accs[(r, t)].name, (lane,), vt), st)
            store = lp.Store(self.out.name, (cos[r], ci, *ktaps, kws[t]), ex.cast(total, self.res_t))
            ok = ex.Binary("and", ex.binary("lt", ex.add(co0, Const(r)), self.cout),
                           ex.binary("lt", ex.add(k0, Const(t)), kw_n), ex.BOOL)
            kb.emit(lp.If(ok, store))
        described = (f"grad-weight lanes={w} rows={self.rows} taps={self.tw} parallel={'yes' if self.parallel else 'no'}"
                     + (" whole-vectors" if gp is not None else ""))
        kb.attrs["conv"] = described
        notes = ((("origin", "; ".join(kb.origins)),) if kb.origins else ()) + (("conv", described),)
        total_items: Expr = Const(1)
        for x in extents:
            total_items = ex.mul(total_items, x)
        tiles_loop = lp.For(item, Const(0), total_items, "parallel" if self.parallel else "serial", kb.pop(), notes)
        packs = [p for p in (self.pack, self.gpack) if p is not None]
        return lp.block(*packs, tiles_loop) if packs else tiles_loop


def grad_weight_root(kb: KernelBuilder, op: Op, out: lp.Buffer, cpu: CpuInfo) -> Optional[lp.Stmt]:
    """A `conv_grad_weight` kernel in dot-product form (`GradWeightBuilder`), or None (the
    per-element nest) when sizes other than the batch are not static or the output width is
    below 2."""
    g, x = op.operands
    if g not in kb.buffers or x not in kb.buffers:
        return None
    dims = [static_int(d) for d in (*op.result.shape, g.shape[1])]
    if any(d is None or d == 0 for d in dims):
        return None
    ow = static_int(g.shape[-1])
    if ow is not None and ow < 2:
        return None
    lanes = cpu.lanes(dt.compute_dtype(op.result.dtype))
    if ow is not None:
        lanes = min(lanes, _pow2_ceil(ow))
    kw = int(static_int(op.result.shape[-1]) or 1)
    taps = min(kw, 4)
    # (6 rows of 3 taps on AVX-512's 32 registers measured no faster: 64-to-64 3x3 at 56x56
    # 2.52 / 2.51 ms, 32-to-64 at 128x128 6.44 / 5.69 with its last tile of 4 rows)
    rows = max(1, min(int(static_int(op.result.shape[0]) or 1), ACCUMULATORS // taps, 4))
    # The registers hold the accumulators, a vector of `g` per row and of `x` per tap: 4 rows
    # of 3 taps needed 19 of AVX2's 16, and LLVM kept accumulators on the stack.
    while rows > 1 and rows * taps + rows + taps > cpu.vector_registers():
        rows -= 1
    batch = static_int(g.shape[0])
    flops = 2.0 * (SYMBOLIC_BATCH_HINT if batch is None else batch)
    for d in (*op.result.shape, *g.shape[2:]):
        size = static_int(d)
        flops *= SYMBOLIC_SIZE_HINT if size is None else size
    if op.loc and op.loc not in kb.origins:
        kb.origins.append(op.loc)
    return GradWeightBuilder(kb, op, out, lanes, rows, taps, cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS).build()
