"""Pointwise convolutions as packed matrix products (`ConvPlan.form == "gemm"`).

A 1x1 convolution without padding, in one group, is a product per image:
`out[n, co, p] = sum_ci w[co, ci] * x[n, ci, s * p]` over the flattened positions `p` of the
output (`out[n] = W[Cout, Cin] @ X[n].view(Cin, P)` with stride 1; a strided one reads every
`s`-th input element along each dim as it packs). The direct kernels of `conv.py` read the
input in place: each tile of output channels reads `Cin` rows of the input `P` elements apart
(12.5 KB for ResNet-50's 56x56 layers), whose lines fall into a few L1 sets and are evicted
before the next tile of channels reads them again, one stream per row (more than a prefetcher
follows). This kernel runs it the way `matmul.py`'s GEMM does (BLIS style): the weight is
read in place in micro-panels of MR output channels (rows clamped into bounds, as the GEMM
reads A; a computed weight is packed once per call into `%wa[Cout / MR, Cin, MR]`, zero past
`Cout`, and read from there), and each work item, a block of NC positions of one image, first copies its input
into NR-wide panels of consecutive positions (`%pb[NC / NR, Cin, NR]`, zero past `P`), so the
micro-kernel streams both operands from contiguous memory:

    for ti in 0..N * cdiv(P, NC) (parallel)        (n, jc) ; p0 = jc * NC
      pack: for jp { for row segment s of the panel { for ci { for c < len_s:
              %pb[jp, ci, lo_s + c] = x[n, ci, *row_s, w_s + c] }}}   (zeros past P)
      for jr in 0..cdiv(nc, NR)                     (or ir outer: see `plan_pointwise`)
        for ir in 0..cdiv(Cout, MR)
          acc[r][v] = 0                                          MR x NR/W accumulators
          for ci in 0..Cin
            bv_v = %pb[jr, ci, ramp(v*W, 1, W)] ; ab_r = broadcast(w[min(co0 + r, Cout - 1), ci])
            acc[r][v] = fma(ab_r, bv_v, acc[r][v])
          %ct[r, ramp(v*W, 1, W)] = acc[r][v]
          for row segment s of the tile: for r < rows: for c < len_s:
            out[n, co0 + r, *row_s, w_s + c] = epilogue(%ct[r, lo_s + c])

A panel of NR consecutive positions may cross rows of the output (a 56-wide row holds 3.5
panels of 16): it is copied and stored by *row segments*, at most `cdiv(NR - 1, W) + 1` of
them, each a contiguous run of one row (so the copies and the epilogue's stores vectorize
along the row, no division per element). The epilogue is the convolution's (bias, folded batch
norm, activation, residual add; `ConvBuilder.epilogue`), run on the finished tile before the
only store.

One thread, CPU time, f32, AVX2 (lanes 8, MR x NR 6 x 16), before (the direct kernels) and
after: ResNet-50's 256-to-64 1x1 at 56x56 2.75-3.19 -> 1.46-1.99 ms (eager, oneDNN, 1.36-1.75),
its 64-to-256 3.22-3.41 -> 1.28-1.67 ms (eager 1.23-1.60), its 512-to-2048 at 7x7 4.30-4.83 ->
2.10-2.25 ms (eager 1.72-2.02); the training step of ResNet-50 with the tuner off 1.20x ->
1.02x eager's time (docs/benchmarks.md, issue 35, session 32).
"""
from __future__ import annotations

from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType
from .conv import ConvBuilder, _ramp, _cdiv
from .matmul import static_int
from .views import VIEW_INDEX


class PointwiseConvBuilder(ConvBuilder):
    """The GEMM form of a pointwise convolution (see the module docstring)."""

    def build(self) -> lp.Stmt:
        kb, plan, c = self.kb, self.plan, self.c
        w = plan.lanes
        mr, nr, nc = plan.cv, plan.pos * w, plan.nc
        vt = ScalarType(self.acc_t, w)
        lane = _ramp(Const(0), w)
        out_w = static_int(self.out_size[-1])
        positions = self._product(self.out_size)
        cout, cin = self.cout, self.cin_g
        wa = None if self.weight_in_place() else self.pack_weight_panels(mr)
        item = self.var("ti")
        kb.push((item,))
        blocks = ex.floordiv(ex.add(positions, Const(nc - 1)), Const(nc))
        n, jc = self.unflatten(item, [c.x.shape[0], blocks])
        p0 = self.let(ex.mul(jc, Const(nc)), "p")
        ncv = self.let(ex.minimum(Const(nc), ex.sub(positions, p0)), "nc")
        panels = ex.floordiv(ex.add(ncv, Const(nr - 1)), Const(nr))
        pb = self.local("pb", (nc // nr, static_int(cin) or 0, nr))
        self.pack_input(pb, n, p0, panels, positions, nr, out_w)
        ir, jr = self.var("ir"), self.var("jr")
        # Panels outer (each stays in L1 while every micro-panel of channels reads it) or
        # micro-panels of channels outer (each stays in L1 over the block's panels).
        order = (jr, ir) if plan.channels_inner else (ir, jr)
        kb.push()
        tile = self.local("ct", (mr, nr))
        kb.push()
        co0 = self.let(ex.mul(ir, Const(mr)), "co")
        ps = self.let(ex.add(p0, ex.mul(jr, Const(nr))), "ps")
        accs = [[self.local("acc", (w,)) for _ in range(plan.pos)] for _ in range(mr)]
        for row in accs:
            for a in row:
                kb.emit(lp.Store(a.name, (lane,), ex.const(0, self.acc_t, w)))
        chans = [] if wa is not None else [self.let(ex.minimum(ex.add(co0, Const(r)), ex.sub(cout, Const(1))), "cr")
                                           for r in range(mr)]
        ci = self.var("ci")
        kb.push((ci,))
        bv = [kb.bind(ex.Load(pb.name, (jr, ci, _ramp(Const(v * w), w)), vt), "bv") for v in range(plan.pos)]
        taps = tuple(Const(0) for _ in c.k_size)
        for r in range(mr):
            if wa is not None:
                weight = ex.Load(wa.name, (ir, ci, Const(r)), ScalarType(self.acc_t))
            else:
                weight = self.scalar_at(c.w, (chans[r], ci, *taps))
            ab = kb.bind(ex.Broadcast(kb.bind(weight, "ws"), vt), "ab")
            for v in range(plan.pos):
                a = accs[r][v]
                kb.emit(lp.Store(a.name, (lane,), self.fma(ab, bv[v], ex.Load(a.name, (lane,), vt))))
        kb.emit(self.loop(ci, cin, kb.pop()))
        for r in range(mr):
            for v in range(plan.pos):
                kb.emit(lp.Store(tile.name, (Const(r), _ramp(Const(v * w), w)), ex.Load(accs[r][v].name, (lane,), vt)))
        rows = ex.minimum(Const(mr), ex.sub(cout, co0))
        count = ex.minimum(Const(nr), ex.sub(positions, ps))
        if self.flat_output():  # one run of positions: the epilogue vectorizes across rows
            kb.emit(self.epilogue(n, co0, None, ps, rows, count,
                                  lambda r, q: ex.Load(tile.name, (r, q), ScalarType(self.acc_t))))
        for seg in [] if self.flat_output() else self.segments(ps, count, nr, out_w):
            lo, length, outer, w0 = seg
            kb.emit(self.epilogue(n, co0, outer, w0, rows, length,
                                  lambda r, q, lo=lo: ex.Load(tile.name, (r, ex.add(lo, q)), ScalarType(self.acc_t))))
        extents = {jr.name: panels, ir.name: ex.floordiv(ex.add(cout, Const(mr - 1)), Const(mr))}
        kb.emit(self.loop(order[1], extents[order[1].name], kb.pop()))
        kb.emit(self.loop(order[0], extents[order[0].name], kb.pop()))
        return lp.block(*self.pack_stmts, self.outer_loop(item, ex.mul(c.x.shape[0], blocks), kb.pop()))

    def flat_output(self) -> bool:
        """Whether the output's spatial dims are one contiguous run (NCHW as allocated): then
        the tile's positions are stored as one run, each at its delinearized row and column,
        and the epilogue is one vector loop over the NR positions. By row segments, a 14-wide
        map had left every position to the scalar tail of its segment's loop (len <= 14 < 16
        lanes): EfficientNet's 80-to-480 1x1 with SiLU at 14x14 took 0.38 ms, eager 0.17."""
        nsp = self.c.nsp
        if nsp != 2:  # 1-D is one row already; 3-D keeps its segments (`vectorize` cannot
            return False  # merge `p // 30, p % 30 // 6, p % 6` back into `p`)
        sizes = [static_int(d) for d in self.out.shape[2:]]
        strides = [static_int(d) for d in self.out.strides[2:]]
        if any(v is None for v in (*sizes, *strides)) or strides[-1] != 1:
            return False
        return all(strides[d] == strides[d + 1] * sizes[d + 1] for d in range(nsp - 1))  # type: ignore[operator]

    def segments(self, start: Expr, count: Expr, nr: int, out_w: Optional[int]
                 ) -> list[tuple[Expr, Expr, list[Expr], Expr]]:
        """The row segments of the `count` (at most `nr`) flattened positions from `start`:
        for each, its first position relative to `start`, its length (0 where the positions
        end before it), the outer coordinates of its row and its first column. Bound here
        (lets in the current scope)."""
        nsp = self.c.nsp
        if nsp == 1:
            return [(Const(0), count, [], start)]
        assert out_w is not None
        width = Const(out_w)
        out: list[tuple[Expr, Expr, list[Expr], Expr]] = []
        first_row = self.let(ex.floordiv(start, width), "q")
        end = ex.add(start, count)
        for s in range(_cdiv(nr - 1, out_w) + 1):
            row = first_row if s == 0 else self.let(ex.add(first_row, Const(s)), "q")
            row_start = ex.mul(row, width)
            lo = self.let(ex.maximum(start, row_start), "lo")
            hi = ex.minimum(end, ex.add(row_start, width))
            length = self.let(ex.maximum(ex.sub(hi, lo), Const(0)), "len")
            outer = self.unflatten(row, list(self.out_size[:-1])) if nsp > 2 else [row]
            out.append((self.let(ex.sub(lo, start), "lo"), length, outer, self.let(ex.sub(lo, row_start), "w")))
        return out

    def pack_input(self, pb: lp.Buffer, n: Expr, p0: Expr, panels: Expr, positions: Expr, nr: int,
                   out_w: Optional[int]) -> None:
        """`%pb[jp, ci, c] = x[n, ci, stride * position p0 + jp * NR + c]`, by row segments
        (strided loads for a strided convolution), and zero for the positions past the end
        (the last panel)."""
        kb, c = self.kb, self.c
        xt = ScalarType(c.x.dtype)
        jp = self.var("jp")
        kb.push((jp,))
        ps = self.let(ex.add(p0, ex.mul(jp, Const(nr))), "ps")
        count = self.let(ex.minimum(Const(nr), ex.sub(positions, ps)), "cnt")
        strides = [Const(st) for st in c.stride]
        for lo, length, outer, w0 in self.segments(ps, count, nr, out_w):
            ci, q = self.var("ci"), self.var("q")
            at = [ex.mul(o, st) for o, st in zip((*outer, ex.add(w0, q)), strides)]
            load = ex.cast(ex.Load(self._x_buffer(), (n, ci, *at), xt), self.acc_t)
            store = lp.Store(pb.name, (jp, ci, ex.add(lo, q)), load)
            kb.emit(self.loop(ci, self.cin_g, self.loop(q, length, store)))
        ci, q = self.var("ci"), self.var("q")
        zero = lp.Store(pb.name, (jp, ci, ex.add(count, q)), ex.const(0, self.acc_t))
        kb.emit(self.loop(ci, self.cin_g, self.loop(q, ex.sub(Const(nr), count), zero)))
        kb.emit(self.loop(jp, panels, kb.pop()))

    def weight_in_place(self) -> bool:
        """Whether the micro-kernel reads the weight where it is (a buffer, or views of one:
        the input gradient's transposed weight), its MR rows clamped into bounds, as the
        GEMM reads A; a computed weight is packed once per call instead (`pack_weight_panels`),
        not computed again for every panel of positions."""
        v = self.c.w
        while v not in self.kb.buffers:
            p = v.producer
            if p is None or p.name not in VIEW_INDEX:
                return False
            v = p.operands[0]
        return True

    def pack_weight_panels(self, mr: int) -> lp.Buffer:
        """`%wa[ir, ci, r] = w[ir * MR + r, ci, 0, ...]`, zero past the output channels: a
        workspace filled once per call, before the tiles (`self.pack_stmts`)."""
        kb, c = self.kb, self.c
        shape = (ex.floordiv(ex.add(self.cout, Const(mr - 1)), Const(mr)), self.cin_g, Const(mr))
        wa = kb.scratch(self.acc_t, shape)
        vars_ = kb.loops(shape, "p")
        kb.push(vars_)
        ib, ci, r = vars_
        co = kb.bind(ex.add(ex.mul(ib, Const(mr)), r), "co")
        value = self.scalar_at(c.w, (ex.minimum(co, ex.sub(self.cout, Const(1))), ci, *(Const(0) for _ in c.k_size)))
        ok = kb.bind(ex.binary("lt", co, self.cout))
        kb.emit(lp.Store(wa.name, vars_, ex.select(ok, kb.bind(value, "wx"), Const(0, ScalarType(self.acc_t)))))
        self.pack_stmts.append(kb.nest(vars_, shape, kb.pop()))
        return wa
