"""`qlinear` kernels for weights in ggml blocks (kind "blocks"), generated from the block table.

Nothing here knows a block type: `ir/qblocks.py` describes each one (block and run sizes, and
per run the IR expressions `code(r)` of the lane `l`, `scale(r)` and `offset(r)` over the
block's bytes `%blk[o]`), and `instantiate` turns those expressions into loop IR for one
weight row `n` and block `b` (`%blk[o]` -> `%q[n, b nbytes + o]`), scalar or, with `l` a
ramp of L lanes, vector. Two forms use it:

`build_blocks_plain` (GPUs, and operands the SIMD form cannot stream), one output element per
iteration, the definition of the weight followed literally:

    for i.., n:  acc = 0
      for b in 0..K / block
        (each run r, unrolled)  let d = scale(r); let m = offset(r)
        for l in 0..run:  acc = fma(x[.., b block + r run + l], f32(code(r)) * d + m, acc)

`BlocksBuilder` (CPUs): the tiles of `QLinearBuilder` (MR rows of x by NR weight rows, a
parallel loop over weight rows), and per block and run the scale taken out of the run's sum
(L = gcd(run, vector lanes); a run of 16 weights of Q6_K is one chunk with AVX-512):

    for b in 0..K / block
      (each run r)  d_c = broadcast(scale(r) at row n_c);  m_c = broadcast(offset(r) at n_c)
        (each chunk ch of L lanes)
          qf_c = f32(code(r) with l := ramp(ch L, 1, L), at row n_c)     vector loads of bytes
          p[r][c] = fma(qf_c, x_r[b block + r run + ch L ..], p[r][c]);   xs_r += x_r[..]
        acc[r][c] = fma(p[r][c], d_c, acc[r][c]);  acc[r][c] = fma(xs_r, m_c, acc[r][c])

`sum_l (d q_l + m) x_l = d sum_l q_l x_l + m sum_l x_l`, as in `qlinear.py`: one rounding more
per run than the element-wise definition, far below the quantization's own error. Byte
offsets of the table are constants plus `l`, so every access is a scalar load (scales,
Q5_0's high-bit word) or a unit-stride vector load (codes); shifts by `l` become vector shifts.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.qblocks import BLOCK, LANE, BlockType, block_type
from ...ir.tensor import Op
from ..loopgen.matmul import MIN_PARALLEL_FLOPS, CpuInfo, _lanes_index, _linear_coefficient, _ramp, static_int
from .qlinear import MR_ROWS, QLinear, QLinearBuilder, QPlan, _f32, _fma, _store_epilogue

if TYPE_CHECKING:
    from ..loopgen.kernel_builder import KernelBuilder

F32 = ScalarType(dt.f32)
#: Weight rows per step of the multi-row form.
NR_BLOCKS = 2

#: `byte_at(offset, lanes)`: the weight byte at `offset` of the current block (a scalar index
#: expression, or the first of `lanes` consecutive bytes when `lanes > 1`).
ByteAt = Callable[[Expr, int], Expr]


def _widen(e: Expr, lanes: int) -> Expr:
    if e.type.lanes == lanes:
        return e
    assert e.type.lanes == 1
    return ex.Broadcast(e, ScalarType(e.type.dtype, lanes))


def instantiate(e: Expr, byte_at: ByteAt, lane: Expr, lanes: int = 1) -> Expr:
    """The block-table expression `e` for one block: `%blk[o]` read through `byte_at`, the
    lane variable `l` replaced by `lane` (a scalar index, or the first of `lanes` lanes), and
    for `lanes > 1` every operation widened to vectors where an operand depends on `l`:

        (%blk[16 + l] >> 4:u8) & 15:u8,  l := ramp(0, 1, 8)
          ->  (%q[n, ramp(b 144 + 16, 1, 8)] >> broadcast(4:u8, 8)) & broadcast(15:u8, 8)
    """
    done: dict[int, Expr] = {}
    for node in ex.postorder(e):
        if id(node) in done:
            continue
        done[id(node)] = _rebuild(node, done, byte_at, lane, lanes)
    return done[id(e)]


def _rebuild(node: Expr, done: dict[int, Expr], byte_at: ByteAt, lane: Expr, lanes: int) -> Expr:
    if isinstance(node, Var) and node.name == LANE.name:
        return lane if lanes == 1 else _ramp(lane, lanes)
    if isinstance(node, (Const, Var)):
        return node
    if isinstance(node, ex.Load):
        if node.buffer != BLOCK:
            raise ValueError(f"block expression reads {node.buffer!r}")
        (offset,) = node.index
        at = ex.substitute(offset, {LANE.name: lane})
        if LANE.name not in ex.free_vars(offset) or lanes == 1:
            return byte_at(at, 1)
        if _linear_coefficient(offset, LANE.name) != Const(1):
            # a lane pattern (`o + l % 16`): the offsets as a vector, for readers taking them
            return byte_at(done[id(offset)], lanes)
        return byte_at(at, lanes)
    kids = [done[id(c)] for c in node.children()]
    width = max(k.type.lanes for k in kids)
    kids = [_widen(k, width) for k in kids]
    vt = ScalarType(node.type.dtype, width)
    if isinstance(node, ex.Binary):
        return ex.Binary(node.op, kids[0], kids[1], vt)
    if isinstance(node, ex.Cast):
        return ex.Cast(kids[0], vt)
    if isinstance(node, ex.Bitcast):
        return ex.Bitcast(kids[0], vt)
    if isinstance(node, ex.Call):
        return ex.Call(node.name, tuple(kids), vt)
    if isinstance(node, ex.Select):
        return ex.Select(kids[0], kids[1], kids[2], vt)
    raise ValueError(f"block expression node {node!r} is not supported")


def layout(ql: QLinear) -> BlockType:
    return block_type(ql.block_type)


def _weight_byte(kb: "KernelBuilder", ql: QLinear, n: Expr, block: Expr) -> ByteAt:
    """`byte_at` for weight row `n` and block `block` through the kernel's value of `q`
    (scalar reads only: the plain form)."""
    bt = layout(ql)
    base = ex.mul(block, Const(bt.nbytes))

    def byte_at(offset: Expr, lanes: int) -> Expr:
        assert lanes == 1
        return kb.value_at(ql.q, (n, ex.add(base, offset)))

    return byte_at


def build_blocks_plain(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer) -> lp.Stmt:
    """One output element per iteration, the weight computed as the table defines it
    (module docstring)."""
    ql = QLinear.of(qop)
    bt = layout(ql)
    shape = qop.result.shape
    vars_ = kb.loops(shape, "i")
    lead, n = vars_[:-1], vars_[-1]
    kb.push()
    acc = lp.Buffer(kb.fresh("acc"), dt.f32, (Const(1),), (Const(1),), "local")
    kb.emit(lp.Alloc(acc))
    kb.emit(lp.Store(acc.name, (Const(0),), Const(0.0, F32)))
    b = Var(kb.fresh("b"))
    kb.push()
    byte_at = _weight_byte(kb, ql, n, b)
    for r in range(bt.runs):
        d = kb.bind(instantiate(bt.scale(r), byte_at, Const(0)), "d")
        off = bt.offset(r)
        m = None if off is None else kb.bind(instantiate(off, byte_at, Const(0)), "m")
        lv = Var(kb.fresh("l"))
        kb.push()
        k = ex.add(ex.add(ex.mul(b, Const(bt.block)), Const(r * bt.run)), lv)
        code = kb.bind(instantiate(bt.code(r), byte_at, lv), "q")
        w = ex.Binary("mul", _f32(code), d, F32)
        if m is not None:
            w = ex.Binary("add", w, m, F32)
        xv = _f32(kb.value_at(ql.x, (*lead, k)))
        cur = ex.Load(acc.name, (Const(0),), F32)
        kb.emit(lp.Store(acc.name, (Const(0),), _fma(xv, kb.bind(w, "w"), cur)))
        kb.emit(lp.For(lv, Const(0), Const(bt.run), "serial", kb.pop()))
    kb.emit(lp.For(b, Const(0), ex.floordiv(ql.k, Const(bt.block)), "serial", kb.pop()))
    total = kb.bind(ex.Load(acc.name, (Const(0),), F32), "x")
    _store_epilogue(kb, root, qop, out, tuple(vars_), total)
    body = kb.pop()
    origin = (("origin", "; ".join(kb.origins)),) if kb.origins else ()
    return kb.nest(vars_, shape, body, origin)


@dataclass(frozen=True)
class BlocksPlan(QPlan):
    """A `QPlan` that names the block type in the kernel's `qlinear` attribute (what profiles
    read to name the weight)."""

    block_type: str = ""

    def describe(self) -> str:
        return f"block={self.block_type} " + super().describe()


def plan_blocks(ql: QLinear, m: Optional[int], cpu: CpuInfo) -> BlocksPlan:
    """MR x NR from the rows of x (`m`, None when known at run time only), L from the run."""
    lanes = math.gcd(layout(ql).run, cpu.lanes(dt.f32))
    mr = 1 if m is not None and m <= 1 else MR_ROWS if m is None else min(m, MR_ROWS)
    nr = 1 if mr == 1 else NR_BLOCKS
    k, n = static_int(ql.k) or 0, static_int(ql.n)
    flops = 2.0 * (m if m is not None else 1 << 10) * (n if n is not None else 1 << 20) * k
    return BlocksPlan(mr, nr, lanes, cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS, ql.block_type)


class BlocksBuilder(QLinearBuilder):
    """The SIMD nest of the module docstring for one plan (tiles, x loads and the epilogue
    are `QLinearBuilder`'s)."""

    def byte_at(self, n: Expr, block: Expr) -> ByteAt:
        bt = layout(self.ql)
        base = ex.mul(block, Const(bt.nbytes))

        def at(offset: Expr, lanes: int) -> Expr:
            if offset.type.lanes > 1:
                raise ValueError(f"the f32 block kernel reads no byte pattern ({offset})")
            col = ex.add(base, offset)
            if lanes == 1:
                index = tuple(ex.substitute(i, {self.n_var.name: n, self.k_var.name: col})
                              for i in self.q_load.index)
                return self.kb.bind(ex.Load(self.q_load.buffer, index, ScalarType(dt.u8)), "qb")
            return ex.Load(self.q_load.buffer, self._lanes(n, col, lanes), ScalarType(dt.u8, lanes))

        return at

    def _lanes(self, n: Expr, col: Expr, lanes: int) -> tuple[Expr, ...]:
        index = tuple(ex.substitute(i, {self.n_var.name: n}) for i in self.q_load.index)
        widened = _lanes_index(index, self.k_var.name, col, lanes)
        assert widened is not None
        return widened

    def build(self) -> lp.Stmt:
        kb, plan, ql = self.kb, self.plan, self.ql
        bt = layout(ql)
        item, n0, ns, tile, ib, i0, rows = self.open_tiles()
        L = plan.lanes
        lane = ex.Ramp(Const(0), Const(1), ScalarType(dt.index, L))
        accs = {(r, c): self.local("acc", (L,)) for r in range(plan.mr) for c in range(plan.nr)}
        for a in accs.values():
            kb.emit(lp.Store(a.name, (lane,), ex.const(0.0, dt.f32, L)))
        b = self.var("b")
        kb.push()
        readers = [self.byte_at(ns[c], b) for c in range(plan.nr)]
        for run in range(bt.runs):
            self.run(bt, run, b, rows, readers, accs, lane)
        kb.emit(lp.For(b, Const(0), ex.floordiv(ql.k, Const(bt.block)), "serial", kb.pop()))
        for r in range(plan.mr):
            for c in range(plan.nr):
                total = ex.VectorReduce("add", ex.Load(accs[(r, c)].name, (lane,), self.vt), F32)
                kb.emit(lp.Store(tile.name, (Const(r), Const(c)), total))
        return self.close_tiles(tile, item, ib, i0, n0)

    def run(self, bt: BlockType, run: int, b: Var, rows: list[Expr], readers: list[ByteAt],
            accs: dict[tuple[int, int], lp.Buffer], lane: Expr) -> None:
        """One run of every weight row of the tile: scale out of the sum (module docstring)."""
        kb, plan = self.kb, self.plan
        L = plan.lanes
        offset = bt.offset(run)
        scales, offsets = [], []
        for at in readers:
            d = kb.bind(instantiate(bt.scale(run), at, Const(0)), "d")
            scales.append(kb.bind(ex.Broadcast(d, self.vt), "dv"))
            if offset is not None:
                m = kb.bind(instantiate(offset, at, Const(0)), "m")
                offsets.append(kb.bind(ex.Broadcast(m, self.vt), "mv"))
        part: dict[tuple[int, int], Expr] = {}
        xsum: dict[int, Expr] = {}
        for ch in range(bt.run // L):
            k0 = ex.add(ex.mul(b, Const(bt.block)), Const(run * bt.run + ch * L))
            xs = [self.x_vector(rows[r], k0) for r in range(plan.mr)]
            if offset is not None:
                for r in range(plan.mr):
                    prev = xsum.get(r)
                    xsum[r] = xs[r] if prev is None else kb.bind(ex.Binary("add", prev, xs[r], self.vt), "xs")
            for c, at in enumerate(readers):
                qf = kb.bind(_f32(instantiate(bt.code(run), at, Const(ch * L), L)), "qf")
                for r in range(plan.mr):
                    prev = part.get((r, c))
                    value = ex.Binary("mul", qf, xs[r], self.vt) if prev is None else _fma(qf, xs[r], prev)
                    part[(r, c)] = kb.bind(value, "p")
        for r in range(plan.mr):
            for c in range(plan.nr):
                cur = ex.Load(accs[(r, c)].name, (lane,), self.vt)
                total = _fma(part[(r, c)], scales[c], cur)
                if offset is not None:
                    total = _fma(xsum[r], offsets[c], total)
                kb.emit(lp.Store(accs[(r, c)].name, (lane,), total))
