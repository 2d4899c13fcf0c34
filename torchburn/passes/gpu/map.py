"""`gpu-map`: decide how each kernel's loops map onto a GPU dispatch, as loop annotations.

WGSL codegen (`codegen/wgsl/`) follows the annotations; the loops themselves do not change.
Five mappings:

- **rows** (row kernels, as row fusion leaves softmax, LayerNorm, RMSNorm and row reductions:
  loops over the row inside the parallel row loops, reductions into scalar accumulators and
  the elementwise loops that use them; and matrix-vector products, a row per output
  element): a workgroup, or a fraction of one, per row, every loop over the row shared by the
  row's invocations (`gpu = "rows"` / `gpu = "lanes"`, see `rows.py`; `row_lanes` the
  invocations per row); tried first. A product over ggml blocks (a serial loop over blocks of
  short element loops) takes the `blocks` form (`block_rows.py`).

- **grid** (elementwise kernels, and reductions too short to share): the outer perfect nest
  of parallel loops becomes the invocation grid, one invocation per element (a loop of one
  iteration counts as parallel whatever the stores name: a scatter at a position read from a
  tensor, `for p in 0..1 { let t = checked_index(%pos[p], s0); for c in 0..64 { %cache[.., t, c] = .. } }`,
  gets `c` in the grid too) (`gpu = "grid"`, the outermost loop also carries `gpu_wg`, the workgroup size). When the
  innermost extent is a multiple of 4 and the body is straight-line, `gpu_vec = "4"` asks for
  four elements per invocation with vec4 loads and stores (codegen checks contiguity and
  alignment and falls back to scalars where they fail).
- **block** (reductions of at least `reduce_threshold` elements, or of symbolic length): the
  output loops map to workgroups (`gpu = "block"`), the reduction nest is shared by the
  workgroup's invocations (`gpu = "threads"`), combined by a tree reduction in workgroup
  memory (`gpu_reduce` the operator, `gpu_acc` the accumulator, `gpu_wg` the size).
- **tasks** (a loop marked `tasks = "independent"`, the query rows of an attention kernel,
  `loopgen/attention.py`, whose stores index through `let`s the parallel-prefix test cannot
  follow): `gpu = "grid"` on that loop, one invocation per task running the task's whole
  body (the online softmax over all keys) in private memory.
- **gemm** (matrix products): the whole nest becomes a tiled GEMM (`gpu = "gemm"`,
  `gpu_tile = "BMxBNxBK/TMxTN"`), the tile chosen so that the grid fills the device. A
  product of at most `gemv_rows` static output rows (a decode step's matrix-vector products)
  is mapped as a row kernel instead (**rows** above: a fraction of a workgroup per output
  element, several outputs a workgroup).

Before:

    kernel @k0(%x: f32[s0, 1024] strides [1024, 1], %out0: f32[s0] strides [1]) symbols(s0) {
      for i0 in 0..s0 {
        alloc %acc1: f32[1] strides [1] local
        %acc1[0] = 0.0:f32
        for r2 in 0..1024 {
          let x3 = %x[i0, r2]
          %acc1[0] = %acc1[0] + x3
        }
        let t4 = %acc1[0]
        %out0[i0] = t4
      }
    }

After `gpu-map`:

    kernel @k0(%x: f32[s0, 1024] strides [1024, 1], %out0: f32[s0] strides [1]) symbols(s0) {
      for i0 in 0..s0 attrs {gpu = "block"} {
        alloc %acc1: f32[1] strides [1] local
        %acc1[0] = 0.0:f32
        for r2 in 0..1024 attrs {gpu = "threads", gpu_reduce = "add", gpu_acc = "acc1", gpu_wg = "256"} {
          let x3 = %x[i0, r2]
          %acc1[0] = %acc1[0] + x3
        }
        let t4 = %acc1[0]
        %out0[i0] = t4
      }
    }

An elementwise kernel `for i0 in 0..64 { for i1 in 0..256 { %out0[i0, i1] = ... } }` becomes
`for i0 ... attrs {gpu = "grid", gpu_wg = "256", gpu_vec = "4"} { for i1 ... attrs {gpu = "grid"} {...} }`.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import AbstractSet, Callable, ClassVar, Mapping, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr
from ..base import LoopPass, PassError, register_pass
from ..loop.loop_utils import vars_through_lets
from .regroup import regrouped_loops
from .block_rows import block_rows_annotate
from .rows import rows_annotate
from ..loopgen.attention import TASKS

#: Reduction combiners a workgroup can tree-reduce.
COMBINERS = ("add", "mul", "min", "max", "and", "or")
#: GEMM tiles from largest to smallest (`gemm_tile=auto` takes the first that fills the device;
#: 32x32 only for products smaller than 64 in a dimension). On the H200 (docs/benchmarks.md,
#: sixth round): `/sw/w` 44.3 TFLOP/s at 4096^3 against 41.7 without; the GPT block's
#: 512x2304x768 product 102.6 us with `/s2/sw/w` on 64x64 against 134.4 us plain.
GEMM_TILES = ("128x128x16/8x8/sw/w", "64x64x16/4x4/s2/sw/w", "32x32x16/4x4")
#: The spelling of a GEMM tile (`BMxBNxBK/TMxTN`, optionally `/s2`: two workgroup-memory
#: stages, `/ar`: the A tile kept as rows of k, `/sw`: k-major tiles XOR-swizzled, `/w`: invocations in
#: 8 x 4 blocks, `/gG`: output tiles launched in groups of G tile rows; `codegen/wgsl/gemm.py`'s `Tile`) and of a flash-attention tile (`BQxBK/TMxTN`, optionally `/s2`: the next keys and values
#: loaded into registers during the current tile; or "rows").
_GEMM_TILE = r"\d+x\d+x\d+/\d+x\d+(/s[12])?(/ar)?(/sw)?(/w)?(/g[1-9]\d*)?"
_ATTENTION_TILE = r"\d+x\d+/\d+x\d+(/s[12])?|rows"
#: Workgroups a GEMM grid should have to keep a large GPU busy (about two per multiprocessor of
#: a 132-SM H200: 128x128 tiles only for large products; there the GPT block's 512x3072x768
#: product took 110 us on 384 tiles of 64x64 against 120 us on 96 of 128x128).
GEMM_MIN_GROUPS = 256

Annotations = tuple[tuple[str, str], ...]


def _static(e: Expr) -> Optional[int]:
    return int(e.value) if isinstance(e, Const) else None


def _stmts(s: lp.Stmt) -> tuple[lp.Stmt, ...]:
    return s.stmts if isinstance(s, lp.Block) else (s,)


def _annotate(s: lp.Stmt, depth: int, extra: Callable[[int], Annotations]) -> lp.Stmt:
    """Add `extra(level)` to the annotations of the first `depth` loops of a perfect nest."""
    if depth == 0:
        return s
    assert isinstance(s, lp.For)
    body = _annotate(s.body, depth - 1, lambda level: extra(level + 1))
    return replace(s, body=body, annotations=s.annotations + extra(0))


def _perfect_nest(s: lp.Stmt) -> tuple[list[lp.For], lp.Stmt]:
    loops: list[lp.For] = []
    while isinstance(s, lp.For):
        loops.append(s)
        s = s.body
    return loops, s


def _global_accesses(s: lp.Stmt, params: AbstractSet[str] | Mapping[str, lp.Buffer]) -> tuple[list[lp.Store], list[ex.Load]]:
    stores = [x for x in lp.walk_stmts(s) if isinstance(x, lp.Store) and x.buffer in params]
    loads = [n for x in lp.walk_stmts(s) for e in lp.stmt_exprs(x) for n in ex.walk(e)
             if isinstance(n, ex.Load) and n.buffer in params]
    return stores, loads


def _parallel_prefix(loops: list[lp.For], params: Mapping[str, lp.Buffer]) -> int:
    """How many outer loops of the nest are parallel: each global store names every such
    loop variable as a whole index (or, through a row regroup, the loops of the rows and the
    column: a product's epilogue stored through a reshape, `gpu_regroup.py`), and written
    buffers are read only where they are written."""
    if not loops:
        return 0
    stores, loads = _global_accesses(loops[0], params)
    written = {st.buffer: st.index for st in stores}
    for ld in loads:
        if ld.buffer in written and ld.index not in {st.index for st in stores if st.buffer == ld.buffer}:
            return 0
    regrouped = [regrouped_loops(st.index, loops, params[st.buffer].shape) for st in stores]
    n = 0
    for f in loops:
        # a loop of one iteration runs nothing concurrently (the scatter of a decode step's
        # keys into the cache, `index_copy` at a position read from a tensor: the loops
        # inside it, which the store does name, join the grid)
        single = f.start == Const(0) and f.extent == Const(1)
        if not stores or not (single or all(f.var in st.index or n < r for st, r in zip(stores, regrouped))):
            break
        n += 1
    return n


@dataclass(frozen=True)
class _Reduction:
    loops: list[lp.For]
    op: str
    acc: str
    extent: Optional[int]


def _reduction(s: lp.Stmt, locals_: set[str]) -> Optional[_Reduction]:
    """A reduction nest `for r.. { lets; %acc[0] = %acc[0] <op> x }` over a scalar local."""
    if not isinstance(s, lp.For):
        return None
    loops, body = _perfect_nest(s)
    stores = [x for x in lp.walk_stmts(body) if isinstance(x, lp.Store)]
    if len(stores) != 1 or any(not isinstance(x, (lp.Let, lp.Store)) for x in _stmts(body)):
        return None
    st = stores[0]
    if st.buffer not in locals_ or st.index != (Const(0),):
        return None
    cur = ex.Load(st.buffer, st.index, st.value.type)
    v = st.value
    if isinstance(v, ex.Call) and v.name == "fma" and len(v.args) == 3 and v.args[2] == cur:
        # `acc = fma(x, w, acc)` (the quantized kernels' update) is an add reduction of x * w
        op, own, others = "add", (v.args[2],), v.args[:2]
    elif isinstance(v, ex.Binary) and v.op in COMBINERS and cur in (v.a, v.b):
        op, own, others = v.op, (v.a, v.b), (v.b if v.a == cur else v.a,)
    else:
        return None
    reads_acc = [n for x in _stmts(body) for e in lp.stmt_exprs(x) for n in ex.walk(e)
                 if isinstance(n, ex.Load) and n.buffer == st.buffer]
    if any(all(n is not o for o in own) for n in reads_acc) or any(
            isinstance(n, ex.Load) and n.buffer == st.buffer for o in others for n in ex.walk(o)):
        return None
    total: Optional[int] = 1
    for f in loops:
        e = _static(f.extent)
        total = None if e is None or total is None else total * e
    return _Reduction(loops, op, st.buffer, total)


def _gemm_depth(s: lp.Stmt, params: Mapping[str, lp.Buffer], symbols: AbstractSet[str] = frozenset()) -> int:
    """Loops of the nest a matrix product (as `lower-to-loops-gpu` writes it) maps onto, or 0:
    parallel output loops (batch.., i, j) around `alloc %acc; %acc[0] = 0; for k { %acc[0] =
    %acc[0] + A * B }; epilogue`, where A does not read j and B does not read i."""
    loops, inner = _perfect_nest(s)
    if len(loops) < 2 or _parallel_prefix(loops, params) != len(loops) or not isinstance(inner, lp.Block):
        return 0
    stmts = inner.stmts
    if len(stmts) < 4 or not isinstance(stmts[0], lp.Alloc) or stmts[0].buffer.dtype != dt.f32:
        return 0
    red = _reduction(stmts[2], {stmts[0].buffer.name})
    if red is None or red.op != "add" or len(red.loops) != 1:
        return 0
    body = _stmts(red.loops[0].body)
    lets = {x.var.name: x.value for x in body if isinstance(x, lp.Let)}
    upd = body[-1]
    assert isinstance(upd, lp.Store)
    if not isinstance(upd.value, ex.Binary):
        return 0  # an `fma` update: the quantized kernels, a reduction per output
    prod = upd.value.b if isinstance(upd.value.a, ex.Load) and upd.value.a.buffer == upd.buffer else upd.value.a
    prod_let = prod.name if isinstance(prod, ex.Var) else None
    if isinstance(prod, ex.Var):
        prod = lets.get(prod.name, prod)
    if not (isinstance(prod, ex.Binary) and prod.op == "mul"):
        return 0
    i, j = loops[-2].var.name, loops[-1].var.name
    if not _factors_split(body[:-1], prod, prod_let, {f.var.name for f in loops[:-2]} | set(symbols), i, j,
                          red.loops[0].var.name):
        return 0
    ca, cb = vars_through_lets(prod.a, lets), vars_through_lets(prod.b, lets)
    if (j not in ca and i not in cb) or (i not in ca and j not in cb):
        return len(loops)
    return 0


def _factors_split(body: tuple[lp.Stmt, ...], prod: ex.Binary, prod_let: Optional[str], outer: set[str],
                   i: str, j: str, k: str) -> bool:
    """The k loop's lets fall into those of A (reading i, k, batch loops and symbols) and those
    of B (j instead of i), in order, and each factor reads only its side: the condition WGSL's
    GEMM codegen (`codegen/wgsl/gemm.py`, `match_matmul`) tiles on. A let both factors read (a
    shared index `let t = k3 + 16`) is not: such a nest gets the reduction mapping instead of
    the GEMM claim that codegen would refuse (which sent the whole graph to the CPU engine)."""
    if any(not isinstance(x, lp.Let) for x in body):
        return False
    a_names, b_names = outer | {i, k}, outer | {j, k}
    for x in body:
        assert isinstance(x, lp.Let)
        if x.var.name == prod_let:
            continue
        fv = ex.free_vars(x.value)
        if fv <= a_names:
            a_names.add(x.var.name)
        elif fv <= b_names:
            b_names.add(x.var.name)
        else:
            return False
    fa, fb = ex.free_vars(prod.a), ex.free_vars(prod.b)
    return (fa <= a_names and fb <= b_names) or (fb <= a_names and fa <= b_names)


def _split_prelude(body: lp.Stmt) -> tuple[tuple[lp.Stmt, ...], lp.Stmt]:
    """Leading `let`s before the loops (row fusion hoists `1 / n` and loads of row-invariant
    elements there), when they read only buffers the kernel does not write; and the rest."""
    stmts = _stmts(body)
    written = {s.buffer for s in lp.walk_stmts(body) if isinstance(s, lp.Store)}
    k = 0
    while k < len(stmts) - 1 and isinstance(stmts[k], lp.Let) and not any(
            isinstance(n, ex.Load) and n.buffer in written for n in ex.walk(stmts[k].value)):
        k += 1
    rest = stmts[k:]
    return stmts[:k], rest[0] if len(rest) == 1 else lp.block(*rest)


def _sink(prelude: tuple[lp.Stmt, ...], nest: lp.Stmt) -> lp.Stmt:
    """`nest` with the `let`s of `prelude` at the start of its innermost perfectly nested
    loop body (recomputed per iteration: they are loads and arithmetic of invariants)."""
    if isinstance(nest, lp.For):
        inner = _sink(prelude, nest.body) if isinstance(nest.body, lp.For) else lp.block(*prelude, nest.body)
        return replace(nest, body=inner)
    return lp.block(*prelude, nest)


def _sink_between(s: lp.Stmt) -> lp.Stmt:
    """The loop nest with invariant `let`s found between its outer loops (`lower-to-loops`
    hoists a load that depends only on the outer indices there, as a broadcast mask's
    element) moved inward, so that the parallel loops form one perfect nest again."""
    if not isinstance(s, lp.For):
        return s
    stmts = _stmts(s.body)
    if len(stmts) > 1 and isinstance(stmts[-1], lp.For) and all(isinstance(x, lp.Let) for x in stmts[:-1]):
        written = {x.buffer for x in lp.walk_stmts(s) if isinstance(x, lp.Store)}
        if not any(isinstance(n, ex.Load) and n.buffer in written
                   for x in stmts[:-1] for n in ex.walk(x.value)):  # type: ignore[attr-defined]
            inner = stmts[-1]
            assert isinstance(inner, lp.For)
            moved = replace(inner, body=lp.block(*stmts[:-1], inner.body))
            return replace(s, body=_sink_between(moved))
    return replace(s, body=_sink_between(s.body)) if isinstance(s.body, lp.For) else s


def _pow2_at_least(n: int, lo: int, hi: int) -> int:
    p = lo
    while p < n and p < hi:
        p *= 2
    return p


@register_pass
@dataclass(frozen=True)
class GpuMap(LoopPass):
    """Annotate each kernel's loops with its GPU mapping (module docstring)."""

    name: ClassVar[str] = "gpu-map"
    #: Invocations per workgroup for elementwise kernels and shared reductions.
    workgroup: int = 256
    #: Reductions at least this long get a workgroup per output element.
    reduce_threshold: int = 64
    #: GEMM tile `BMxBNxBK/TMxTN`, or "auto".
    gemm_tile: str = "auto"
    #: Ask for vec4 elementwise code where the innermost extent allows it.
    vectorize: bool = True
    #: Map row kernels (row reductions and their elementwise users) to a workgroup per row.
    rows: bool = True
    #: Matrix products with at most this many output rows (batch x M, static) are mapped as
    #: reductions, not GEMM tiles (matrix-vector products: decode steps).
    gemv_rows: int = 4
    #: Invocations per row of a row kernel (a power of two up to `workgroup`), or 0: chosen by
    #: the row length and count (`rows.py`, `row_lanes`).
    row_lanes: int = 0
    #: Elements each invocation of a row takes where a kernel has many rows (0 lanes: auto).
    row_lane_elements: int = 16
    #: Flash-attention prefill tile `BQxBK/TMxTN` (`codegen/wgsl/attention_tiled.py`), "rows"
    #: (an invocation per query row) or "auto" (the first tile that fits the device).
    attention_tile: str = "auto"

    def __post_init__(self) -> None:
        if self.row_lanes and (self.row_lanes & (self.row_lanes - 1) or self.row_lanes > self.workgroup):
            raise PassError(f"pass {self.name}: row_lanes={self.row_lanes}; expected 0 (auto) or a power of two "
                            f"up to workgroup={self.workgroup}")
        if self.row_lane_elements < 1:
            raise PassError(f"pass {self.name}: row_lane_elements={self.row_lane_elements}; expected at least 1")
        for knob, pattern in (("gemm_tile", _GEMM_TILE), ("attention_tile", _ATTENTION_TILE)):
            value = getattr(self, knob)
            if value != "auto" and not (isinstance(value, str) and re.fullmatch(pattern, value)):
                raise PassError(f"pass {self.name}: {knob}={value!r}; expected 'auto' or a tile such as "
                                f"{GEMM_TILES[0] if knob == 'gemm_tile' else '64x64/4x4 (or rows)'}")

    def run(self, program: lp.Program) -> lp.Program:
        return program.with_kernels(tuple(self.map_kernel(k) for k in program.kernels))

    def map_kernel(self, k: lp.Kernel) -> lp.Kernel:
        body = k.body
        params = {b.name: b for b in k.params}
        if _gemm_depth(body, params, {v.name for v in k.symbols}) and not self._few_rows(body):
            return replace(k, body=self._gemm(body))
        if isinstance(body, lp.For) and body.annotation("gpu") == "attention":
            # mapped by its lowering (`loopgen/attention_gpu.py`); the shader reads the tile
            if self.attention_tile == "auto":
                return k
            return replace(k, body=replace(body, annotations=body.annotations + (("gpu_tile", self.attention_tile),)))
        if isinstance(body, lp.For) and body.annotation(TASKS) == "independent":
            return replace(k, body=self._tasks(body))
        prelude, nest = _split_prelude(body)
        nest = _sink_between(nest)
        loops, _ = _perfect_nest(nest)
        n = _parallel_prefix(loops, params)
        if self.rows and loops:
            rows = rows_annotate(loops, n, set(params), self.workgroup, self.vectorize, self.row_lanes,
                                 self.row_lane_elements)
            if rows is None:
                rows = block_rows_annotate(loops, n, self.workgroup, self.row_lanes, self.vectorize)
            if rows is not None:
                return replace(k, body=lp.block(*prelude, rows) if prelude else rows)
        # Grid and block kernels are one nest: leading invariant `let`s move into its body.
        mapped = self._map_nest(_sink(prelude, nest) if prelude else body, params)
        return k if mapped is None else replace(k, body=mapped)

    def _map_nest(self, body: lp.Stmt, params: Mapping[str, lp.Buffer]) -> Optional[lp.Stmt]:
        """The block or grid mapping of a loop nest, None when it has no parallel loop."""
        loops, _ = _perfect_nest(body)
        n = _parallel_prefix(loops, params)
        inner = loops[n - 1].body if n else body
        locals_ = {x.buffer.name for x in _stmts(inner) if isinstance(x, lp.Alloc)
                   and all(d == Const(1) for d in x.buffer.shape)}
        reductions = [r for r in (_reduction(x, locals_) for x in _stmts(inner)) if r is not None]
        long = [r for r in reductions if r.extent is None or r.extent >= self.reduce_threshold]
        if long:
            return self._block(body, n, inner, reductions)
        if n == 0:
            return None
        straight = all(isinstance(x, (lp.Let, lp.Store)) for x in _stmts(inner))
        last = _static(loops[n - 1].extent)
        vec = self.vectorize and straight and last is not None and last % 4 == 0

        def grid(level: int) -> Annotations:
            if level > 0:
                return (("gpu", "grid"),)
            return (("gpu", "grid"), ("gpu_wg", str(self.workgroup))) + ((("gpu_vec", "4"),) if vec else ())

        return _annotate(body, n, grid)

    def _block(self, body: lp.Stmt, n: int, inner: lp.Stmt, reductions: list[_Reduction]) -> lp.Stmt:
        longest = max((r.extent or 1 << 30) for r in reductions)
        wg = _pow2_at_least(longest, 32, self.workgroup)
        by_loop = {id(r.loops[0]): r for r in reductions}

        def mark(s: lp.Stmt) -> lp.Stmt:
            r = by_loop.get(id(s))
            if r is None:
                return s

            def threads(level: int) -> Annotations:
                if level > 0:
                    return (("gpu", "threads"),)
                return (("gpu", "threads"), ("gpu_reduce", r.op), ("gpu_acc", r.acc), ("gpu_wg", str(wg)))

            return _annotate(s, len(r.loops), threads)

        new_inner = lp.block(*(mark(x) for x in _stmts(inner)))
        if n == 0:
            return new_inner

        def rebuild(s: lp.Stmt, depth: int) -> lp.Stmt:
            assert isinstance(s, lp.For)
            b = new_inner if depth == 1 else rebuild(s.body, depth - 1)
            return replace(s, body=b, annotations=s.annotations + (("gpu", "block"),))

        return rebuild(body, n)

    def _few_rows(self, body: lp.Stmt) -> bool:
        """A product of at most `gemv_rows` output rows (an LLM's decode step): a GEMM tile
        would compute mostly padding on few workgroups; the rows mapping gives each output
        element a row of invocations instead, the k loop shared by them."""
        loops, _ = _perfect_nest(body)
        rows = 1
        for f in loops[:-1]:
            e = _static(f.extent)
            if e is None:
                return False
            rows *= e
        return rows <= self.gemv_rows

    def _tasks(self, body: lp.For) -> lp.Stmt:
        """A loop of independent tasks (an attention kernel's query rows): one invocation per
        task, in workgroups no larger than the task count needs (decode has a few heads)."""
        tasks = _static(body.extent)
        wg = _pow2_at_least(tasks, 32, self.workgroup) if tasks is not None else 64
        return replace(body, annotations=body.annotations + (("gpu", "grid"), ("gpu_wg", str(wg))))

    def _gemm(self, body: lp.Stmt) -> lp.Stmt:
        tile = self.gemm_tile if self.gemm_tile != "auto" else self._auto_tile(body)
        assert isinstance(body, lp.For)
        return replace(body, annotations=body.annotations + (("gpu", "gemm"), ("gpu_tile", tile)))

    @staticmethod
    def _auto_tile(body: lp.Stmt) -> str:
        loops, _ = _perfect_nest(body)
        *batch_loops, iloop, jloop = loops
        batch = 1
        for f in batch_loops:
            batch *= _static(f.extent) or 64
        m, n = _static(iloop.extent), _static(jloop.extent)
        for tile in GEMM_TILES[:-1]:
            bm, bn = (int(x) for x in tile.split("/")[0].split("x")[:2])
            if m is None or n is None or batch * -(-m // bm) * -(-n // bn) >= GEMM_MIN_GROUPS:
                return tile
        # a smaller tile only where the product is small: 4x4 micro-tiles of 64 invocations
        # compute less per workgroup memory read than the 64x64 tile (`gpu-split-k` adds
        # workgroups to products with a long reduction instead)
        assert m is not None and n is not None
        return GEMM_TILES[-1] if min(m, n) < 64 else GEMM_TILES[-2]
