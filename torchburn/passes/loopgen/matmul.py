"""GEMM kernels: cache-blocked, packed, register-blocked matrix products with fused epilogues.

`build_gemm` lowers one `matmul`, with the elementwise ops fused after it (see `fuse`), to a
loop nest in the style of BLIS / GotoBLAS, written out in the loop IR so every level stays
visible to later passes (`C = A B`, A: M x K, B: K x N, W lanes per vector):

    parallel for w in 0..batch * cdiv(N, NC)        one block of NC columns per work item
      alloc %pb: f32[NC / NR, KC, NR] local           packed block of B (fills half of L2)
      pack B[0..K, j0..j0+NC] -> %pb                  NR-wide panels, zeros past N
      for ir in 0..cdiv(M, MR)                        micro-panels of MR rows of A
        for jr in 0..cdiv(nc, NR)                     micro-panels of NR columns of %pb
          alloc %acc..: f32[W] local (MR x NR/W)      the micro-kernel, fully unrolled in the IR:
          for k in 0..K                               NR/W vector loads of %pb, MR broadcasts
            %acc_r_c = fma(broadcast(A[i0 + r, k]), %pb[jr, k, c*W..], %acc_r_c)       of A
          if the tile is whole: store the accumulators (vector stores)
          else: accumulators -> %ct, `for r < rows: for c < cols: C[..] = epilogue(%ct[r, c])`

For example (256 x 256 x 256 f32 on AVX-512, two threads, after `simplify`; B packed here
for the illustration):

    kernel @k0(%b: f32[256, 256], %a: f32[256, 256], %out0: f32[256, 256])
        attrs {gemm = "mr=8 nr=32 kc=K nc=128 mc=0 parallel=columns"} {
      parallel for w4 in 0..2 {
        let j5 = w4 * 128
        alloc %pb7: f32[4, 256, 32] strides [8192, 32, 1] local
        for jp8 in 0..4 {
          for k10 in 0..256 {
            %pb7[jp8, k10, ramp(0, 1, 16)] = %b[k10, ramp(j5 + jp8 * 32, 1, 16)]
            %pb7[jp8, k10, ramp(16, 1, 16)] = %b[k10, ramp(j5 + jp8 * 32 + 16, 1, 16)]
          }
        }
        for ir17 in 0..32 {
          for jr18 in 0..4 {
            ... 16 accumulators set to zero
            for k46 in 0..256 {
              let bv47 = %pb7[jr18, k46, ramp(0, 1, 16)]
              let bv48 = %pb7[jr18, k46, ramp(16, 1, 16)]
              let av50 = broadcast(%a[ir17 * 8, k46], 16)
              %acc30[ramp(0, 1, 16)] = fma(av50, bv47, %acc30[ramp(0, 1, 16)])
              ... 15 more fmas
            }
            %out0[ir17 * 8, ramp(j5 + jr18 * 32, 1, 16)] = %acc30[ramp(0, 1, 16)]
            ... 15 more vector stores
          }
        }
      }
    }

**Bounds.** A is read in place with its rows clamped into bounds (`min(i0 + r, M - 1)`): an
edge micro-panel computes duplicate rows that are never stored. Packed panels hold zeros past
N. Stores of edge tiles go through the local tile `%ct`, element by element. No load or store
leaves its buffer, whatever M, N and K (0 included).

**Packing** copies whole panels with vector loads when B is unit-stride along its rows, and
transposes (a weight used as `x @ W^T` reads `W[j, k]`) with short scalar loops along k, 8 x 8
at a time; anything else (a computed operand) is packed element by element. Edge panels clamp
and select. A small row-major B (a quarter of L2, N a multiple of NR) is not packed at all:
the micro-kernel loads its rows in place.

**Long K.** When K is longer than one k block (or not known), the k-block loop sits inside a
loop over MC-row blocks, and partial sums of the MC x NC block stay in a local `%cpart`
between k blocks; the epilogue runs after the last one:

    for ic in 0..cdiv(M, MC)
      for pc in 0..cdiv(K, KC)
        pack B[pc block, j0..] ; for ir { for jr {
          acc = pc == 0 ? 0 : %cpart[..] ; k loop ; pc == last ? epilogue and store : %cpart[..] = acc }}

**Swapped roles.** Packing B costs K x N element moves per call; packing A costs M x K. For a
small M (a batch of activations times a weight) the kernel computes `C^T = B^T A^T` instead
(`GemmPlan.swap`): the weight is read in place and broadcast, the activations are packed, and
tiles of C^T are stored through `%ct`, transposed. `build_gemm` compares both plans with
`gemm_cost`; when M is symbolic it builds both, chosen at run time by M.

**Few rows.** A vector (or up to `DOT_MAX_ROWS` rows) times a weight `W[j, k]` is a stream
over the weight: `dot_plan` runs vectors along k instead, MR x NR accumulators of A-row times
W-row products, a scalar loop for the last K % W, and the lanes summed (`vreduce_add`) into
the tile the epilogue reads; every weight element is loaded once and used MR times.

**Epilogue.** The kernel's root may be an elementwise op computed from the matmul's result at
the same index (bias add, GELU, residual add, cast). It runs on the finished tile, before the
only store of C, as scalar loops along the tile's vectors (`for c in 0..NR`), which the
`vectorize` pass widens (and `expand-math` turns transcendentals into polynomials); LLVM
scalarizes what is left. Half-precision products accumulate in f32 and round once.

**Blocking.** `plan_gemm` takes MR x NR from the target's register file (`micro_tile`: the
most accumulators that fit next to the B vectors and the broadcast; 8 x 32 f32 on AVX-512: 16
zmm accumulators, two B vectors, broadcasts folded into the fmas; 6 x 16 on AVX2: 12 of the 16
ymm, two B vectors, one broadcast; a target without FMA multiplies, then adds), KC and NC so a packed
B block fills about half of L2 (K in one block up to 1024), and the parallel split: blocks of
columns (and batch) across threads, evenly, or the row loop when there are too few columns.
Products below `MIN_PARALLEL_FLOPS` stay serial.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.target import DOT4_FEATURES, Target
from ...ir.tensor import Op, Value

from .nest_helpers import NestHelpers
from .kernel_builder import KernelBuilder, LoweringError
from .views import regroup_rows

Index = tuple[Expr, ...]

#: Products with fewer flops than this run on one thread (a fork/join costs microseconds).
MIN_PARALLEL_FLOPS = 1 << 21
#: A transposing pack reads PACK_BLOCK elements along k per column, PACK_GROUP columns at a time.
PACK_BLOCK, PACK_GROUP = 8, 8


# ---- the machine ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class CpuInfo:
    """What the blocking depends on: vector width, data cache sizes, threads, the i32 lane
    counts at which `dot4_u8i8_acc` is one instruction (see `qlinear_i8`), and what sizes the
    micro-tile: SIMD registers, whether fma is one instruction, whether an fma can broadcast
    its scalar operand from memory. Registers and broadcast operand default to what the vector
    width implies on x86-64 (512 bits: 32 registers with embedded broadcasts; else 16)."""

    vector_bits: int = 256
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    threads: int = 1
    dot4_lanes: frozenset[int] = frozenset()
    #: Lane counts at which it is short when the u8 operand is below 128 (int4 nibbles).
    small_dot4_lanes: frozenset[int] = frozenset()
    #: SIMD registers (0: by the vector width, see above).
    registers: int = 0
    fma: bool = True
    #: None: by the vector width, see above.
    broadcast_operand: Optional[bool] = None
    #: Whether byte tile products (`tile_dot_u8i8`) are AMX instructions (`Target.tile_dot`).
    tile_dot: bool = False

    @staticmethod
    def of(target: Target) -> "CpuInfo":
        """The part of a target description the blocking reads."""
        return CpuInfo(target.vector_bits, target.l1_bytes, target.l2_bytes, target.threads,
                       frozenset(n for n in DOT4_FEATURES if target.native_dot4(n)),
                       frozenset(n for n in DOT4_FEATURES if target.small_dot4(n)),
                       target.vector_registers(), target.has_fma(), target.fma_broadcast_operand(),
                       target.tile_dot())

    def lanes(self, dtype: dt.DType) -> int:
        return max(1, self.vector_bits // max(dtype.bits, 8))

    def vector_registers(self) -> int:
        return self.registers or (32 if self.vector_bits >= 512 else 16)

    def folds_broadcast(self) -> bool:
        return self.vector_bits >= 512 if self.broadcast_operand is None else self.broadcast_operand


@dataclass(frozen=True)
class GemmOptions:
    """Choices `lower-to-loops` passes on as its options (`lower-to-loops{gemm_swap=always}`)."""

    #: None: compare the plain and the swapped plan by cost; True/False: always/never swap
    #: (tests and experiments).
    swap: Optional[bool] = None
    #: Let the micro-kernel read a small row-major B in place instead of packing it.
    direct_b: bool = True
    #: Use the dot-product form for products of a few rows (see `dot_plan`).
    dot: bool = True


# ---- the plan -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class GemmPlan:
    """Blocking of one GEMM. `kc == 0` means one k block holding all of K (K is static).

    With `swap`, the kernel computes `C^T = B^T A^T`: the micro-kernel broadcasts elements of
    B (read in place, which suits a weight `W[j, k]`) and streams packed panels of A^T; the
    plan's sizes then refer to the swapped product (its rows are the columns of C).
    """

    lanes: int
    mr: int
    nr: int
    kc: int
    nc: int
    mc: int
    #: "columns": the batch x column-block loop is parallel; "rows": the micro-panel row loop
    #: is; "": serial.
    parallel: str
    swap: bool = False
    #: Dot-product form for a few rows (`dot_plan`): vectors run along k, MR x NR is the tile
    #: of C each step accumulates, the lanes are summed at the end.
    dot: bool = False
    #: Accumulate with `fma` (one instruction on the target), else multiply, then add.
    fma: bool = True

    def describe(self) -> str:
        muladd = "" if self.fma else " mul-add"
        if self.dot:
            return f"dot mr={self.mr} nr={self.nr} parallel={self.parallel or 'no'}{muladd}"
        kc = "K" if self.kc == 0 else str(self.kc)
        return (f"mr={self.mr} nr={self.nr} kc={kc} nc={self.nc} mc={self.mc} "
                f"parallel={self.parallel or 'no'}" + (" swap" if self.swap else "") + muladd)


def static_int(e: Expr) -> Optional[int]:
    return int(e.value) if isinstance(e, Const) and e.type.dtype.is_int else None


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _round_up(a: int, b: int) -> int:
    return _cdiv(a, b) * b


#: The largest micro-tile: MR rows (broadcasts of A) by MAX_B_VECTORS vectors of B. Taller
#: tiles load B less often per fma but leave the edge panels emptier; past 8 x 2 nothing is
#: gained where loads are not the limit.
MAX_ROWS, MAX_B_VECTORS = 8, 2


def micro_tile(cpu: CpuInfo, max_vectors: int = MAX_B_VECTORS, per_vector: int = 1) -> tuple[int, int]:
    """MR and NR / W of the micro-kernel: the most accumulators (MR x NR/W vector registers)
    that fit the register file next to the NR/W vectors of B, the broadcast of A (unless the
    fma takes it from memory) and, without fma, the product before its add. Ties go to more
    B vectors (fewer broadcasts per fma). A spilled accumulator is a load and a store per fma:
    the tile must fit. `per_vector`: registers one of its vectors takes (2 when W half-precision
    lanes accumulate in f32).

        AVX2 (16 ymm):                            6 x 2   (12 accumulators + 2 B + 1 broadcast)
        AVX-512 (32 zmm, embedded broadcast):     8 x 2   (16 + 2)
        NEON (32 v):                              8 x 2   (16 + 2 + 1)
        SSE without FMA (16 xmm):                 6 x 2   (12 + 2 + 1 + 1)
    """
    spare = (0 if cpu.folds_broadcast() else 1) + (0 if cpu.fma else 1)
    registers = cpu.vector_registers() // max(per_vector, 1)
    best = (1, 1)
    for nvec in range(1, max(max_vectors, 1) + 1):
        rows = min(MAX_ROWS, (registers - nvec - spare) // nvec)
        if rows >= 1 and rows * nvec >= best[0] * best[1]:
            best = (rows, nvec)
    return best


def plan_gemm(m: Optional[int], n: Optional[int], k: Optional[int], batch: Optional[int],
              dtype: dt.DType, cpu: CpuInfo, swap: bool = False, n_max: Optional[int] = None) -> GemmPlan:
    """Choose the blocking for `batch` products `m x k @ k x n` (None: not known statically;
    `n_max` bounds an unknown `n`)."""
    if n is None and n_max is not None:
        plan = plan_gemm(m, n_max, k, batch, dtype, cpu, swap)
        # All columns fit one block: the rows are what the threads share.
        rows = plan.parallel and (m is None or m >= 2 * cpu.threads * plan.mr)
        return replace(plan, parallel="rows" if rows else plan.parallel)
    lanes = cpu.lanes(dtype)
    item = max(dtype.itemsize, 1)
    per_vector = max(1, lanes * dt.compute_dtype(dtype).bits // cpu.vector_bits)
    mr, nvec = micro_tile(cpu, 1 if n is not None and n <= lanes else MAX_B_VECTORS, per_vector)
    nr = nvec * lanes
    if m is not None and 0 < m < mr:
        mr = m
    # A packed B block (KC x NC) takes about half of L2, with NC at least 4 micro-panels so
    # each micro-panel of A is reused from L1; within that, K is one block when it fits.
    budget = cpu.l2_bytes // 2
    kc_max = max(256, min(1024, budget // (4 * nr * item)))
    single = k is not None and k <= kc_max
    kc = max(k or 0, 1) if single else kc_max // 2
    nc_cap = min(512, max(nr, budget // (kc * item) // nr * nr))
    nc = nc_cap if n is None else min(nc_cap, _round_up(max(n, 1), nr))
    threads = max(cpu.threads, 1)
    big = 1 << 20
    flops = 2.0 * (m if m is not None else big) * (n if n is not None else big) \
        * (k if k is not None else big) * (batch if batch is not None else big)
    parallel = ""
    if threads > 1 and flops >= MIN_PARALLEL_FLOPS:
        parallel = "columns"
        if n is not None and batch is not None and batch < threads:
            if batch * _cdiv(max(n, 1), nr) >= threads:
                # Column blocks in a multiple of the threads, so each thread gets as many.
                t = 1
                while True:
                    nc = _round_up(_cdiv(max(n, 1), threads * t), nr)
                    if nc <= nc_cap:
                        break
                    t += 1
            elif m is None or m >= 2 * threads * mr:
                parallel = "rows"
    mc = 0 if single else max(mr, (128 * 1024 // (nc * item)) // mr * mr)
    return GemmPlan(lanes, mr, nr, 0 if single else kc, nc, mc, parallel, swap, fma=cpu.fma)


#: Columns of the dot-product form by its rows, where registers allow (see `dot_plan`).
DOT_COLUMNS = {1: 8, 2: 6, 3: 5, 4: 4}
#: Products with at most this many rows use the dot-product form when both operands run
#: along k (a vector, or a few, times a weight `W[j, k]`).
DOT_MAX_ROWS = 4


def dot_plan(m: int, n: Optional[int], k: Optional[int], batch: Optional[int], dtype: dt.DType,
             cpu: CpuInfo) -> GemmPlan:
    """The dot-product form for `m <= DOT_MAX_ROWS` rows: each step loads MR vectors of A and NR
    of B^T along k and does MR x NR fmas (loads stay below two per fma). The MR x NR
    accumulators, the MR vectors of A and the B vector in use fit the registers (with 16, as on
    AVX2: 1 x 8, 2 x 6, 3 x 4, 4 x 2; with 32: 1 x 8, 2 x 6, 3 x 5, 4 x 4)."""
    lanes = cpu.lanes(dtype)
    mr = max(1, min(m, DOT_MAX_ROWS))
    spare = 1 + (0 if cpu.fma else 1)
    nr = max(1, min(DOT_COLUMNS.get(mr, 4), (cpu.vector_registers() - mr - spare) // mr))
    big = 1 << 20
    flops = 2.0 * m * (n if n is not None else big) * (k if k is not None else big) * (batch if batch is not None else big)
    parallel = "columns" if cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS else ""
    return GemmPlan(lanes, mr, nr, 0, nr, 0, parallel, dot=True, fma=cpu.fma)


def gemm_cost(m: int, n: int, k: int, plan: GemmPlan, pack_cost: float, store_cost: float) -> float:
    """Rough cycles of one product under `plan` (m, n, k of the product as planned): vector
    fmas over padded tiles, packing `k x n` at `pack_cost` per element, and storing `m x n` at
    `store_cost` per element."""
    fmas = _round_up(max(m, 1), plan.mr) * _round_up(max(n, 1), plan.nr) * k / plan.lanes
    return fmas + pack_cost * k * n + store_cost * m * n


# ---- small IR helpers ---------------------------------------------------------------------------

def _ramp(base: Expr, lanes: int, stride: Expr = Const(1)) -> Expr:
    return ex.Ramp(base, stride, ScalarType(dt.index, lanes))


def _cdiv_expr(a: Expr, b: int) -> Expr:
    return ex.floordiv(ex.add(a, Const(b - 1)), Const(b))


def _linear_coefficient(e: Expr, name: str) -> Optional[Expr]:
    """`c` when `e` is `f + c * name` with `c` and `f` free of `name`; None when not affine."""
    if name not in ex.free_vars(e):
        return Const(0)
    if isinstance(e, Var):
        return Const(1)
    if isinstance(e, ex.Binary) and e.op in ("add", "sub"):
        a, b = _linear_coefficient(e.a, name), _linear_coefficient(e.b, name)
        if a is None or b is None:
            return None
        return ex.add(a, b) if e.op == "add" else ex.sub(a, b)
    if isinstance(e, ex.Binary) and e.op == "mul":
        if name not in ex.free_vars(e.b):
            a = _linear_coefficient(e.a, name)
            return None if a is None else ex.mul(a, e.b)
        if name not in ex.free_vars(e.a):
            b = _linear_coefficient(e.b, name)
            return None if b is None else ex.mul(e.a, b)
    return None


def _lanes_index(index: Index, name: str, base: Expr, lanes: int) -> Optional[Index]:
    """`index` with `name := base + lane` for `lanes` lanes: components affine in `name` become
    ramps; None when some component is not affine in it."""
    out: list[Expr] = []
    for i in index:
        c = _linear_coefficient(i, name)
        if c is None:
            return None
        start = ex.substitute(i, {name: base})
        out.append(start if c == Const(0) else _ramp(start, lanes, c))
    return tuple(out)


# ---- operand access ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Operands:
    """The product as the micro-kernel sees it: `C'[row, col] = sum_k A'[row, k] * B'[k, col]`.

    Normally A' = A, B' = B, C' = C. Swapped, A' = B^T, B' = A^T and C' = C^T, so the operand
    read in place (broadcast) is B and the packed one is A.
    """

    a: Value
    b: Value
    swap: bool

    def a_index(self, bvars: Index, row: Expr, k: Expr) -> tuple[Value, Index]:
        return (self.b, (*bvars, k, row)) if self.swap else (self.a, (*bvars, row, k))

    def b_index(self, bvars: Index, k: Expr, col: Expr) -> tuple[Value, Index]:
        return (self.a, (*bvars, col, k)) if self.swap else (self.b, (*bvars, k, col))

    def c_index(self, bvars: Index, row: Expr, col: Expr) -> Index:
        return (*bvars, col, row) if self.swap else (*bvars, row, col)


def _flat_stride(load: ex.Load, buf: lp.Buffer, name: str) -> Optional[Expr]:
    """How far the address of `load` moves when `name` grows by one (None: not affine)."""
    total: Expr = Const(0)
    for i, st in zip(load.index, buf.strides):
        c = _linear_coefficient(i, name)
        if c is None:
            return None
        total = ex.add(total, ex.mul(c, st))
    return total


class _Probe:
    """An operand element as a single load from a buffer (or None), and that load's strides."""

    def __init__(self, kb: "KernelBuilder", v: Value, index: Index, var_k: Var, var_x: Var) -> None:
        kb.push()
        e = kb.value_at(v, index)
        stmts = kb.pending()
        kb.pop()
        self.load: Optional[ex.Load] = None
        self.stride_k: Optional[Expr] = None
        self.stride_x: Optional[Expr] = None
        if (len(stmts) == 1 and isinstance(stmts[0], lp.Let) and stmts[0].var == e
                and isinstance(stmts[0].value, ex.Load)):
            load = stmts[0].value
            buf = kb.used_buffers.get(load.buffer)
            if buf is not None:
                self.load = load
                self.stride_k = _flat_stride(load, buf, var_k.name)
                self.stride_x = _flat_stride(load, buf, var_x.name)

    def unit(self, which: str) -> bool:
        return (self.stride_k if which == "k" else self.stride_x) == Const(1)


# ---- the builder --------------------------------------------------------------------------------

class GemmBuilder(NestHelpers):
    """Builds the loop nest of one GEMM kernel (see the module docstring)."""

    def __init__(self, kb: "KernelBuilder", root: Op, mm: Op, out: lp.Buffer, plan: GemmPlan,
                 cpu_l2: int = 1 << 20, options: GemmOptions = GemmOptions()) -> None:
        self.kb = kb
        self.cpu_l2 = cpu_l2
        self.options = options
        self.root = root
        self.mm = mm
        self.out = out
        self.plan = plan
        a, b = mm.operands
        self.ops = Operands(a, b, plan.swap)
        shape = mm.result.shape
        self.batch = shape[:-2]
        m, n = shape[-2], shape[-1]
        self.rows, self.cols = (n, m) if plan.swap else (m, n)
        self.k = a.shape[-1]
        #: The product's dtype, and the one it accumulates in (f32 for half precision).
        self.mm_t = mm.result.dtype
        self.acc_t = dt.compute_dtype(self.mm_t)
        self.w = plan.lanes
        self.vt = ScalarType(self.acc_t, self.w)
        self.nvec = plan.nr // plan.lanes
        self.use_fma = plan.fma
        self.has_epilogue = root is not mm
        self.pb: Optional[lp.Buffer] = None
        self.cpart: Optional[lp.Buffer] = None
        self.tile: Optional[lp.Buffer] = None
        self.tile_out: Optional[lp.Buffer] = None
        #: B' read in place by the micro-kernel (no packing): its load and index variables.
        self.direct: Optional[tuple[ex.Load, Var, Var]] = None
        #: Reshapes between the product and the root that regroup the rows (see `fuse`).
        self.views = epilogue_views(root, mm, set(kb.buffers))

    def zero(self, lanes: int = 1) -> Expr:
        return ex.const(0, self.acc_t, lanes)

    def fma(self, a: Expr, b: Expr, c: Expr) -> Expr:
        if self.acc_t.is_float and self.use_fma:
            return ex.Call("fma", (a, b, c), c.type)
        return ex.Binary("add", ex.Binary("mul", a, b, c.type), c, c.type)

    # -- the nest --
    def build(self) -> lp.Stmt:
        if self.plan.dot:
            return self.build_dot()
        kb = self.kb
        kb.push()
        item, bvars, jc, extent = self.work_items(self.plan.nc)
        self.column_block(bvars, jc)
        return self.outer_loop(item, extent, kb.pop())

    def work_items(self, per_item: int) -> tuple[Var, tuple[Var, ...], Expr, Expr]:
        """The outer loop over batch x blocks of `per_item` columns: its variable, the batch
        variables and column block (bound in the current scope), and its extent."""
        kb = self.kb
        bvars = tuple(self.var("b") for _ in self.batch)
        nj = _cdiv_expr(self.cols, per_item)
        item = self.var("w")
        rest: Expr = item
        jc: Expr = item
        if bvars:
            jc = self.let(ex.mod(rest, nj), "jc")
            rest = ex.floordiv(rest, nj)
        for bv, size in reversed(list(zip(bvars, self.batch))):
            kb.emit(lp.Let(bv, ex.mod(rest, size)))
            rest = ex.floordiv(rest, size)
        extent: Expr = nj
        for size in self.batch:
            extent = ex.mul(extent, size)
        return item, bvars, jc, extent

    def outer_loop(self, item: Var, extent: Expr, body: lp.Stmt) -> lp.Stmt:
        kb, plan = self.kb, self.plan
        kind = "parallel" if plan.parallel == "columns" else "serial"
        described = plan.describe()
        previous = kb.attrs.get("gemm")
        kb.attrs["gemm"] = described if previous is None else f"{previous} | {described}"
        notes = ((("origin", "; ".join(kb.origins)),) if kb.origins else ()) + (("gemm", described),)
        return self.loop(item, extent, body, kind, notes)

    def build_dot(self) -> lp.Stmt:
        """Few rows: `C[i, j] = sum(A[i, k..k+W] * B^T[j, k..k+W])` over vectors along k, MR x NR
        accumulators, a scalar loop for the last K % W, lanes summed, then the epilogue on an
        MR x NR tile (whose loops the vectorizer widens along the columns)."""
        kb, plan, w = self.kb, self.plan, self.w
        kb.push()
        item, bvars, jc, extent = self.work_items(plan.nr)
        j0 = self.let(ex.mul(jc, Const(plan.nr)), "j")
        cols = [self.let(ex.minimum(ex.add(j0, Const(c)), ex.sub(self.cols, Const(1))), "jb")
                for c in range(plan.nr)]
        kv, xv = self.var("k"), self.var("x")
        a_probe = _Probe(kb, self.ops.a, (*bvars, xv, kv), kv, xv)
        b_probe = _Probe(kb, self.ops.b, (*bvars, kv, xv), kv, xv)
        assert a_probe.load is not None and b_probe.load is not None
        self.tile = self.local("ct", (plan.mr, plan.nr))
        ib = self.var("ib")
        kb.push()
        i0 = self.let(ex.mul(ib, Const(plan.mr)), "i")
        rows = [self.let(ex.minimum(ex.add(i0, Const(r)), ex.sub(self.rows, Const(1))), "ia")
                for r in range(plan.mr)]
        tiles = [(r, c) for r in range(plan.mr) for c in range(plan.nr)]
        accs = {t: self.local("acc", (w,)) for t in tiles}
        sums = {t: self.local("sum", (1,)) for t in tiles}
        lane = _ramp(Const(0), w)
        for t in tiles:
            kb.emit(lp.Store(accs[t].name, (lane,), self.zero(w)))
            kb.emit(lp.Store(sums[t].name, (Const(0),), self.zero()))

        def element(probe: _Probe, x: Expr, k: Expr, lanes: int) -> Expr:
            assert probe.load is not None
            index = tuple(ex.substitute(i, {xv.name: x}) for i in probe.load.index)
            if lanes > 1:
                widened = _lanes_index(index, kv.name, k, lanes)
                assert widened is not None
                index = widened
            else:
                index = tuple(ex.substitute(i, {kv.name: k}) for i in index)
            load = ex.Load(probe.load.buffer, index, ScalarType(self.mm_t, lanes))
            return kb.bind(ex.cast(load, self.acc_t), "x")

        kvec = self.var("kv")
        kb.push()
        k_first = ex.mul(kvec, Const(w))
        av = [element(a_probe, rows[r], k_first, w) for r in range(plan.mr)]
        # Each B vector is loaded just before its MR fmas: one B register in use, not NR.
        for c in range(plan.nr):
            bv = element(b_probe, cols[c], k_first, w)
            for r in range(plan.mr):
                cur = ex.Load(accs[(r, c)].name, (lane,), self.vt)
                kb.emit(lp.Store(accs[(r, c)].name, (lane,), self.fma(av[r], bv, cur)))
        kb.emit(self.loop(kvec, ex.floordiv(self.k, Const(w)), kb.pop()))
        kt = self.var("k")
        kb.push()
        k_tail = ex.add(kt, ex.mul(ex.floordiv(self.k, Const(w)), Const(w)))
        a_s = [element(a_probe, rows[r], k_tail, 1) for r in range(plan.mr)]
        b_s = [element(b_probe, cols[c], k_tail, 1) for c in range(plan.nr)]
        for r, c in tiles:
            cur = ex.Load(sums[(r, c)].name, (Const(0),), ScalarType(self.acc_t))
            kb.emit(lp.Store(sums[(r, c)].name, (Const(0),), self.fma(a_s[r], b_s[c], cur)))
        kb.emit(self.loop(kt, ex.mod(self.k, Const(w)), kb.pop()))
        for r, c in tiles:
            total = ex.Binary("add", ex.VectorReduce("add", ex.Load(accs[(r, c)].name, (lane,), self.vt),
                                                     ScalarType(self.acc_t)),
                              ex.Load(sums[(r, c)].name, (Const(0),), ScalarType(self.acc_t)),
                              ScalarType(self.acc_t))
            kb.emit(lp.Store(self.tile.name, (Const(r), Const(c)), total))
        kb.used_buffers[self.out.name] = self.out
        rows_left = ex.minimum(Const(plan.mr), ex.sub(self.rows, i0))
        cols_left = ex.minimum(Const(plan.nr), ex.sub(self.cols, j0))
        kb.emit(self.tile_loops(bvars, i0, j0, rows_left, cols_left))
        kb.emit(self.loop(ib, _cdiv_expr(self.rows, plan.mr), kb.pop()))
        return self.outer_loop(item, extent, kb.pop())

    def column_block(self, bvars: Index, jc: Expr) -> None:
        """One block of NC columns: pack B', then all rows (per k block)."""
        plan, kb = self.plan, self.kb
        j0 = self.let(ex.mul(jc, Const(plan.nc)), "j")
        nc = self.let(ex.minimum(Const(plan.nc), ex.sub(self.cols, j0)), "nc")
        kc = plan.kc or max(static_int(self.k) or 1, 1)
        if plan.kc == 0:
            self.direct = self.direct_b(bvars)
            if self.direct is None:
                self.pb = self.local("pb", (plan.nc // plan.nr, kc, plan.nr))
                self.pack(bvars, j0, nc, Const(0), self.k)
            self.row_panels(bvars, Const(0), self.rows, j0, nc, Const(0), self.k, True, True)
            return
        self.pb = self.local("pb", (plan.nc // plan.nr, kc, plan.nr))
        self.cpart = self.local("cpart", (plan.mc, plan.nc))
        ic, pc = self.var("ic"), self.var("pc")
        npc = ex.maximum(_cdiv_expr(self.k, plan.kc), Const(1))
        kb.push()
        i0 = self.let(ex.mul(ic, Const(plan.mc)), "i")
        mc = self.let(ex.minimum(Const(plan.mc), ex.sub(self.rows, i0)), "mc")
        kb.push()
        k0 = self.let(ex.mul(pc, Const(plan.kc)), "k")
        kcv = self.let(ex.minimum(Const(plan.kc), ex.sub(self.k, k0)), "kc")
        self.pack(bvars, j0, nc, k0, kcv)
        first = ex.binary("eq", pc, Const(0))
        last = ex.binary("eq", pc, ex.sub(npc, Const(1)))
        self.row_panels(bvars, i0, mc, j0, nc, k0, kcv, first, last)
        kb.emit(self.loop(pc, npc, kb.pop()))
        kb.emit(self.loop(ic, _cdiv_expr(self.rows, plan.mc), kb.pop()))

    # -- packing --
    def direct_b(self, bvars: Index) -> Optional[tuple[ex.Load, Var, Var]]:
        """B' itself, when the micro-kernel can stream it unpacked: rows unit-stride, no
        partial panel (columns a multiple of NR), and all of it fits in a quarter of L2, so
        rows of it far apart do not evict each other."""
        cols, k = static_int(self.cols), static_int(self.k)
        if cols is None or k is None or cols % self.plan.nr or not self.options.direct_b:
            return None
        if k * cols * self.acc_t.itemsize > self.cpu_l2 // 4 or self.mm_t != self.acc_t:
            return None
        kv, jv = self.var("k"), self.var("j")
        value, index = self.ops.b_index(bvars, kv, jv)
        probe = _Probe(self.kb, value, index, kv, jv)
        if probe.load is None or not probe.unit("x"):
            return None
        return probe.load, kv, jv

    def pack(self, bvars: Index, j0: Expr, nc: Expr, k0: Expr, kc: Expr) -> None:
        """`%pb[jp, k, jj] = B'[k0 + k, j0 + jp * NR + jj]`, zero past the last column.

        Whole panels of a B' unit-stride along its columns are copied with vector loads; one
        unit-stride along k (a transposed weight, or A when swapped) is transposed by a scalar
        loop over 16 x NR blocks, reading along k; anything else is computed element by
        element. The last, partial panel clamps its columns into bounds and stores zeros.
        """
        kb, plan = self.kb, self.plan
        assert self.pb is not None
        pb = self.pb.name
        jp = self.var("jp")
        kb.push()
        jb = self.let(ex.add(j0, ex.mul(jp, Const(plan.nr))), "jb")
        kv, jv = self.var("k"), self.var("j")
        value, index = self.ops.b_index(bvars, ex.add(k0, kv), jv)
        probe = _Probe(kb, value, index, kv, jv)
        load = probe.load
        if load is not None and probe.unit("x"):
            stores = []
            for c in range(self.nvec):
                idx = _lanes_index(load.index, jv.name, ex.add(jb, Const(c * self.w)), self.w)
                assert idx is not None
                stores.append(lp.Store(pb, (jp, kv, _ramp(Const(c * self.w), self.w)),
                                       ex.cast(ex.Load(load.buffer, idx, ScalarType(self.mm_t, self.w)), self.acc_t)))
            full = self.loop(kv, kc, lp.block(*stores))
        elif load is not None and probe.unit("k") and plan.nr % PACK_GROUP == 0:
            # (a panel narrower than a group, e.g. 4 f64 columns, takes the per-element copy
            # below: `nr // PACK_GROUP` groups would copy nothing.)
            # Blocks of PACK_BLOCK k x PACK_GROUP columns, one short loop along k (the rows of
            # B') per column, the columns of a group written out. No loop here stores with unit
            # stride, so a vectorizer leaves them scalar (gathers are slower on this copy).
            # The short k loop is kept rolled (`lp.KEEP_ROLLED`) around the columns of a group,
            # a loop marked `unrolled`: PACK_GROUP stores in the IR, not PACK_BLOCK x PACK_GROUP
            # in every GEMM kernel for every later stage. Each column's address arithmetic (a
            # division where B' is a view) stays outside the k loop; LLVM unrolls that loop.
            kb16, jg, c = self.var("kb"), self.var("jg"), self.var("jc")
            kb.push()
            k_first = ex.mul(kb16, Const(PACK_BLOCK))
            kn = self.let(ex.minimum(Const(PACK_BLOCK), ex.sub(kc, k_first)), "kn")
            kb.push()
            kk = self.var("kk")
            k = ex.add(k_first, kk)
            jj = ex.add(ex.mul(jg, Const(PACK_GROUP)), c)
            idx = tuple(ex.substitute(i, {kv.name: k, jv.name: ex.add(jb, jj)}) for i in load.index)
            store = lp.Store(pb, (jp, k, jj), ex.cast(ex.Load(load.buffer, idx, ScalarType(self.mm_t)), self.acc_t))
            columns = self.loop(c, Const(PACK_GROUP), store, kind="unrolled")
            kb.emit(self.loop(kk, kn, columns, annotations=(lp.KEEP_ROLLED,)))
            kb.emit(self.loop(jg, Const(plan.nr // PACK_GROUP), kb.pop()))
            full = self.loop(kb16, _cdiv_expr(kc, PACK_BLOCK), kb.pop())
        else:
            k, jj = self.var("k"), self.var("jj")
            kb.push()
            value, index = self.ops.b_index(bvars, ex.add(k0, k), ex.add(jb, jj))
            kb.emit(lp.Store(pb, (jp, k, jj), ex.cast(kb.value_at(value, index), self.acc_t)))
            full = self.loop(k, kc, self.loop(jj, Const(plan.nr), kb.pop()))
        k, jj = self.var("k"), self.var("jj")
        kb.push()
        col = ex.add(jb, jj)
        inside = self.let(ex.binary("lt", col, self.cols), "in")
        value, index = self.ops.b_index(bvars, ex.add(k0, k), ex.minimum(col, ex.sub(self.cols, Const(1))))
        val = ex.cast(kb.value_at(value, index), self.acc_t)
        kb.emit(lp.Store(pb, (jp, k, jj), ex.select(inside, val, self.zero())))
        edge = self.loop(k, kc, self.loop(jj, Const(plan.nr), kb.pop()))
        is_full = ex.binary("le", ex.add(jb, Const(plan.nr)), self.cols)
        kb.emit(lp.If(is_full, full, edge))
        kb.emit(self.loop(jp, _cdiv_expr(nc, plan.nr), kb.pop()))

    # -- compute --
    def row_panels(self, bvars: Index, i_start: Expr, rows: Expr, j0: Expr, nc: Expr, k0: Expr,
                   kc: Expr, first: "bool | Expr", last: "bool | Expr") -> None:
        """`for ir (MR rows) { for jr (NR columns of %pb) { micro-kernel } }`."""
        kb, plan = self.kb, self.plan
        ir, jr = self.var("ir"), self.var("jr")
        kb.push()
        # The edge tile lives inside the row loop: one per thread when that loop is parallel.
        self.tile = self.local("ct", (plan.mr, plan.nr))
        if plan.swap and self.has_epilogue:
            self.tile_out = self.local("co", (plan.mr, plan.nr), self.out.dtype)
        i0 = self.let(ex.add(i_start, ex.mul(ir, Const(plan.mr))), "i")
        # Rows past the end read the last row again (never stored): no load leaves A'.
        rows_a = [self.let(ex.minimum(ex.add(i0, Const(r)), ex.sub(self.rows, Const(1))), "ia")
                  for r in range(plan.mr)]
        kb.push()
        jb = self.let(ex.add(j0, ex.mul(jr, Const(plan.nr))), "jb")
        self.micro_tile(bvars, i0, rows_a, jb, ir, jr, k0, kc, first, last)
        kb.emit(self.loop(jr, _cdiv_expr(nc, plan.nr), kb.pop()))
        kind = "parallel" if plan.parallel == "rows" else "serial"
        kb.emit(self.loop(ir, _cdiv_expr(rows, plan.mr), kb.pop(), kind))

    def micro_tile(self, bvars: Index, i0: Expr, rows_a: list[Expr], jb: Expr, ir: Var, jr: Var,
                   k0: Expr, kc: Expr, first: "bool | Expr", last: "bool | Expr") -> None:
        kb, plan, w = self.kb, self.plan, self.w
        lane = _ramp(Const(0), w)
        accs = [[self.local("acc", (w,)) for _ in range(self.nvec)] for _ in range(plan.mr)]

        def acc(r: int, c: int) -> Expr:
            return ex.Load(accs[r][c].name, (lane,), self.vt)

        def cpart_index(r: int, c: int) -> Index:
            return (ex.add(ex.mul(ir, Const(plan.mr)), Const(r)),
                    _ramp(ex.add(ex.mul(jr, Const(plan.nr)), Const(c * w)), w))

        tiles = [(r, c) for r in range(plan.mr) for c in range(self.nvec)]
        zeros = lp.block(*(lp.Store(accs[r][c].name, (lane,), self.zero(w)) for r, c in tiles))
        if first is True:
            kb.emit(zeros)
        else:
            assert self.cpart is not None and isinstance(first, Expr)
            reload = lp.block(*(lp.Store(accs[r][c].name, (lane,),
                                         ex.Load(self.cpart.name, cpart_index(r, c), self.vt)) for r, c in tiles))
            kb.emit(lp.If(first, zeros, reload))
        # The k loop: NR/W vectors of packed B', MR broadcasts of A', MR * NR/W fmas.
        k = self.var("k")
        kb.push()
        if self.direct is not None:
            load, kv, jv = self.direct
            bv = []
            for c in range(self.nvec):
                idx = _lanes_index(tuple(ex.substitute(i, {kv.name: ex.add(k0, k)}) for i in load.index),
                                   jv.name, ex.add(jb, Const(c * w)), w)
                assert idx is not None
                bv.append(kb.bind(ex.cast(ex.Load(load.buffer, idx, ScalarType(self.mm_t, w)), self.acc_t), "bv"))
        else:
            assert self.pb is not None
            bv = [kb.bind(ex.Load(self.pb.name, (jr, k, _ramp(Const(c * w), w)), self.vt), "bv")
                  for c in range(self.nvec)]
        for r in range(plan.mr):
            value, index = self.ops.a_index(bvars, rows_a[r], ex.add(k0, k))
            av = kb.bind(ex.Broadcast(ex.cast(kb.value_at(value, index), self.acc_t), self.vt), "av")
            for c in range(self.nvec):
                kb.emit(lp.Store(accs[r][c].name, (lane,), self.fma(av, bv[c], acc(r, c))))
        kb.emit(self.loop(k, kc, kb.pop()))
        # Finish: the epilogue and the store, or partial sums back to %cpart.
        kb.push()
        self.finish(bvars, i0, jb, acc)
        done = kb.pop()
        if last is True:
            kb.emit(done)
        else:
            assert self.cpart is not None and isinstance(last, Expr)
            keep = lp.block(*(lp.Store(self.cpart.name, cpart_index(r, c), acc(r, c)) for r, c in tiles))
            kb.emit(lp.If(last, done, keep))

    # -- epilogue --
    def finish(self, bvars: Index, i0: Expr, jb: Expr, acc) -> None:  # type: ignore[no-untyped-def]
        """Store a finished tile: straight from the accumulators when it is whole and nothing
        is computed after the product, else through the local tile and the epilogue loops."""
        kb, plan, w = self.kb, self.plan, self.w
        assert self.tile is not None
        tile = self.tile.name
        kb.used_buffers[self.out.name] = self.out
        full = ex.Binary("and", ex.binary("le", ex.add(i0, Const(plan.mr)), self.rows),
                         ex.binary("le", ex.add(jb, Const(plan.nr)), self.cols), ex.BOOL)
        tiles = [(r, c) for r in range(plan.mr) for c in range(self.nvec)]
        to_tile = [lp.Store(tile, (Const(r), _ramp(Const(c * w), w)), acc(r, c)) for r, c in tiles]
        rows_left = ex.minimum(Const(plan.mr), ex.sub(self.rows, i0))
        cols_left = ex.minimum(Const(plan.nr), ex.sub(self.cols, jb))
        edge = lp.block(*to_tile, self.tile_loops(bvars, i0, jb, rows_left, cols_left))
        if self.has_epilogue or self.out.dtype != self.acc_t or plan.swap:
            interior = lp.block(*to_tile, self.tile_loops(bvars, i0, jb, Const(plan.mr), Const(plan.nr)))
        else:
            interior = lp.block(*(lp.Store(self.out.name,
                                           self.ops.c_index(bvars, ex.add(i0, Const(r)),
                                                            _ramp(ex.add(jb, Const(c * w)), w)), acc(r, c))
                                  for r, c in tiles))
        kb.emit(lp.If(full, interior, edge))

    def out_index(self, idx: Index) -> Index:
        """Where element `idx` of the product goes in the output: the same index, or, after a
        reshape regrouping the rows (`fuse`), the root's index of the same element."""
        if not self.views:
            return idx
        return (*regroup_rows(idx[:-1], self.mm.result.shape[:-1], self.root.result.shape[:-1]), idx[-1])

    def tile_loops(self, bvars: Index, i0: Expr, jb: Expr, rows: Expr, cols: Expr) -> lp.Stmt:
        """`C[i0 + r, jb + c] = epilogue(%ct[r, c])` for r < rows, c < cols, the inner loop
        along the tile's vectors. Swapped, C's rows run across the tile: the epilogue is
        computed in the tile (`%co`, along its vectors), then copied out transposed, the inner
        loop along C's rows."""
        kb = self.kb
        assert self.tile is not None
        r, c = self.var("r"), self.var("c")
        kb.push()
        idx = self.ops.c_index(bvars, ex.add(i0, r), ex.add(jb, c))
        value = kb.bind(ex.cast(ex.Load(self.tile.name, (r, c), ScalarType(self.acc_t)), self.mm_t), "x")
        kb.define(self.mm.result, idx, value)
        out_idx = self.out_index(idx)
        for view in self.views:
            # The ops before the view are computed at the product's index, the ones after it
            # (and the store) at the root's.
            kb.define(view.result, out_idx, kb.value_at(view.operands[0], idx))
        result = kb.compute(self.root, out_idx) if self.has_epilogue else value
        if not self.plan.swap:
            kb.emit(lp.Store(self.out.name, out_idx, result))
            return self.loop(r, rows, self.loop(c, cols, kb.pop()))
        src = self.tile
        steps: list[lp.Stmt] = []
        if self.has_epilogue:
            assert self.tile_out is not None
            src = self.tile_out
            kb.emit(lp.Store(src.name, (r, c), result))
            steps.append(self.loop(r, rows, self.loop(c, cols, kb.pop())))
        else:
            kb.pop()
        r2, c2 = self.var("r"), self.var("c")
        copy = lp.Store(self.out.name, self.out_index(self.ops.c_index(bvars, ex.add(i0, r2), ex.add(jb, c2))),
                        ex.Load(src.name, (r2, c2), ScalarType(src.dtype)))
        steps.append(self.loop(c2, cols, self.loop(r2, rows, copy)))
        return lp.block(*steps)


def epilogue_views(root: Op, mm: Op, materialized: set[Value]) -> list[Op]:
    """The reshapes inlined into the kernel of `root` between its product `mm` and `root` (at
    most one, by `fuse`'s rule). A reshape of another operand of the epilogue (a view of a
    buffer, even one some other kernel's product wrote) is not one: it is indexed as it is."""
    views: list[Op] = []
    stack = [root]
    seen: set[int] = set()
    while stack:
        op = stack.pop()
        if op.name == "matmul":
            continue
        for v in op.operands:
            p = v.producer
            if p is None or v in materialized or id(p) in seen:
                continue
            seen.add(id(p))
            if p.name == "reshape" and _reaches(p.operands[0], mm, materialized):
                views.append(p)
            stack.append(p)
    return views


def _reaches(value: Value, mm: Op, materialized: set[Value]) -> bool:
    """Whether `value` is computed from `mm`'s result inside the kernel (through values
    without a buffer: a buffer is an edge of the kernel, read as it is)."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        p = v.producer
        if p is None or id(v) in seen:
            continue
        seen.add(id(v))
        if p is mm:
            return True
        if v in materialized:
            continue
        stack.extend(p.operands)
    return False


#: Ops a kernel computes as a product with an epilogue (`fuse` never inlines them elsewhere).
PRODUCT_OPS = frozenset({"matmul", "qlinear", "conv"})


def fused_product(root: Op, materialized: set[Value], name: str) -> Optional[Op]:
    """The product op `name` computed inside the kernel of `root`: `root` itself, or the one
    such op its inlined elementwise producers read (an epilogue, see `fuse`); None when there
    is none or more than one."""
    if root.name == name:
        return root
    found: Optional[Op] = None
    stack = [root]
    seen: set[int] = set()
    while stack:
        op = stack.pop()
        for v in op.operands:
            p = v.producer
            if p is None or v in materialized or id(p) in seen:
                continue
            seen.add(id(p))
            if p.name == name:
                if found is not None and found is not p:
                    return None
                found = p
            elif p.name not in PRODUCT_OPS:
                stack.append(p)
    return found


def fused_matmul(root: Op, materialized: set[Value]) -> Optional[Op]:
    """`fused_product` for `matmul`."""
    return fused_product(root, materialized, "matmul")


#: Cycles per element of packing a panel: contiguous vector copy, scalar transpose.
PACK_COPY, PACK_TRANSPOSE = 0.5, 2.0
#: Cycles per element of storing C through the tile, along C's rows or across them (swapped).
STORE_DIRECT, STORE_TRANSPOSED = 0.0, 1.0
#: Sizes assumed for a dimension that is not known at compile time, when comparing plans.
GUESSED_SIZE = 1024


def _batch_size(shape: tuple[Expr, ...]) -> Optional[int]:
    batch: Optional[int] = 1
    for d in shape[:-2]:
        s = static_int(d)
        batch = None if s is None or batch is None else batch * s
    return batch


def gemm_root(kb: "KernelBuilder", op: Op, out: lp.Buffer, cpu: CpuInfo,
              options: GemmOptions = GemmOptions()) -> lp.Stmt:
    """A GEMM kernel: `op` is a matmul, or the last elementwise op of an epilogue computed from
    one (fused by `fuse`)."""
    if op.loc and op.loc not in kb.origins:
        kb.origins.append(op.loc)
    mm = fused_matmul(op, set(kb.buffers))
    if mm is None:
        raise LoweringError(f"lower-to-loops: kernel root {op.name} has no fused matmul")
    if mm.loc and mm.loc not in kb.origins:
        kb.origins.append(mm.loc)
    kb.used_buffers[out.name] = out
    return build_gemm(kb, op, mm, out, cpu, options)


def build_gemm(kb: "KernelBuilder", root: Op, mm: Op, out: lp.Buffer, cpu: CpuInfo,
               options: GemmOptions = GemmOptions()) -> lp.Stmt:
    """The loop nest computing `root` (a matmul, or the last op of its epilogue) into `out`.

    A few rows (M <= `DOT_MAX_ROWS`, both operands unit-stride along k) take the dot-product
    form. Otherwise two ways of computing the product compete (see `GemmPlan.swap`): packing
    B, or packing A and reading B in place. The cheaper one by `gemm_cost` is built; when M is
    not known at compile time both are, chosen at run time by comparing M with the size where
    they cost the same.
    """
    force_swap = options.swap
    shape = mm.result.shape
    batch = _batch_size(shape)
    a, b = mm.operands
    m, n, k = static_int(shape[-2]), static_int(shape[-1]), static_int(a.shape[-1])
    dtype = mm.result.dtype
    kv, xv = Var(kb.fresh("k")), Var(kb.fresh("x"))
    zeros = tuple(Const(0) for _ in shape[:-2])
    pack_b = PACK_COPY if _Probe(kb, b, (*zeros, kv, xv), kv, xv).unit("x") else PACK_TRANSPOSE
    pack_a = PACK_COPY if _Probe(kb, a, (*zeros, xv, kv), kv, xv).unit("x") else PACK_TRANSPOSE
    n_est, k_est = n or GUESSED_SIZE, k or GUESSED_SIZE

    def plans(m_: Optional[int]) -> tuple[GemmPlan, GemmPlan]:
        return (plan_gemm(m_, n, k, batch, dtype, cpu),
                plan_gemm(n, m_, k, batch, dtype, cpu, swap=True))

    def swap_wins(m_: int) -> bool:
        normal, swapped = plans(m_)
        return (gemm_cost(n_est, m_, k_est, swapped, pack_a, STORE_TRANSPOSED)
                < gemm_cost(m_, n_est, k_est, normal, pack_b, STORE_DIRECT))

    k_runs = (_Probe(kb, a, (*zeros, xv, kv), kv, xv).unit("k")
              and _Probe(kb, b, (*zeros, kv, xv), kv, xv).unit("k"))
    if m is not None and 0 < m <= DOT_MAX_ROWS and k_runs and force_swap is None and options.dot:
        return GemmBuilder(kb, root, mm, out, dot_plan(m, n, k, batch, dtype, cpu), cpu.l2_bytes, options).build()
    if m is not None:
        normal, swapped = plans(m)
        plan = swapped if m > 0 and swap_wins(m) else normal
        if force_swap is not None:
            plan = swapped if force_swap else normal
        return GemmBuilder(kb, root, mm, out, plan, cpu.l2_bytes, options).build()
    # M is known at run time only: find the largest M for which swapping wins.
    cross = 0
    for m_ in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096):
        if swap_wins(m_):
            cross = m_
        else:
            break
    normal, _ = plans(None)
    if force_swap is not None:
        cross = GUESSED_SIZE if force_swap else 0
    if cross == 0:
        return GemmBuilder(kb, root, mm, out, normal, cpu.l2_bytes, options).build()
    swapped = plan_gemm(n, None, k, batch, dtype, cpu, swap=True, n_max=cross)
    small = GemmBuilder(kb, root, mm, out, swapped, cpu.l2_bytes, options).build()
    large = GemmBuilder(kb, root, mm, out, normal, cpu.l2_bytes, options).build()
    return lp.If(ex.binary("le", shape[-2], Const(cross)), small, large)
