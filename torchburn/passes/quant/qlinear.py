"""Dequantizing linear kernels: `qlinear` (INT8 / INT4 weights) with a fused epilogue.

A quantized linear is a stream over its weight: at batch 1 every weight byte is used once, so
the kernel must read the packed bytes at memory speed and never write the dequantized weight
anywhere. `build_qlinear` (`qlinear_forms.py`, which also picks the int8-activation form of
`qlinear_i8.py`) lowers one `qlinear` (and the elementwise ops `fuse` put after it:
bias add, activation, cast back to x's dtype) to explicit SIMD loops over the packed bytes
(M rows of x, N output features, K inputs, `g` the group size, `h = g / 2`, W lanes):

    parallel for w in 0..cdiv(N, NR)                 NR weight rows per work item
      for ib in 0..cdiv(M, MR)                       MR rows of x (rows clamped into range)
        MR x NR vector accumulators = 0
        for G in 0..K / g                            groups: one scale (and min) per row
          d_c = broadcast(f32(scales[n_c, G]))       m_c = broadcast(mins or -8 d_c)
          p[r][c] = 0;  xs_r = 0                     (values, not memory: chunks unrolled)
          for ch in 0..h / L
            b_c   = i32(%q[n_c, ramp(G h + ch L, 1, L)])           L packed bytes, one load
            xl_r  = %x[i_r, ramp(G g + ch L, 1, L)]                elements G g + ch L + 0..L
            xh_r  = %x[i_r, ramp(G g + h + ch L, 1, L)]            elements ... + h
            p[r][c] = fma(f32(b_c >> 4), xh_r, fma(f32(b_c & 15), xl_r, p[r][c]))
            xs_r += xl_r + xh_r
          acc[r][c] = fma(xs_r, m_c, fma(p[r][c], d_c, acc[r][c]))
        %ct[r, c] = vreduce_add(acc[r][c])
        for r < rows left: for c < columns left: %out[i0 + r, n0 + c] = epilogue(%ct[r, c])

The scale is taken out of each group's sum and the offset out of every element:
`sum_k (d q_k + m) x_k = d sum_k q_k x_k + m sum_k x_k`, so a weight vector costs one widening
load, one conversion and one fma (plus the nibble mask or shift), the x sums are shared by
the NR weight rows, and `p` starts afresh each group (the chains of successive groups are
independent). INT8 is the same without nibbles and offset (`p = sum f32(q) x`, then
`fma(p, d, acc)`); per-channel scales multiply the finished sum instead. Groups of more than
MAX_UNROLLED_CHUNKS chunks keep the loop over chunks and dequantize each vector
(`w = fma(f32(q), d, m)`, `acc = fma(w, x, acc)`, low and high nibbles in two accumulators).
Rounding: one extra f32 rounding per group (the product `p d`), and for INT4 the offset's sum
of x; both are far below the weight's own quantization error. The nibble order of the
layout (byte `j` of a group holds elements `j` and `j + h`) is what makes the low and high
nibbles of one vector load two *contiguous* vectors of elements: no shuffles.

**Shapes.** At batch 1 (`M = 1`) the kernel is a GEMV: MR = 1 and NR = 1 weight row per
step (`NR_GEMV`), so the weight's bytes are one sequential stream (NR rows read side by side
are NR streams, which the prefetchers follow badly: with NR = 4, a 576 x 1536 INT4 weight
streamed at half the speed of a 1536 x 576 one); each accumulator grows by one chain of `p` per group,
and the groups' chains overlap, which hides the FMA latency. With more rows (MR = 4) each
dequantized weight vector is used four times from registers, and the NR weight rows of one
work item (a few KiB) stay in L1 while all row blocks of x pass over them, so each weight
byte comes from memory once per call. When M is known only at run time both forms are built
and chosen by M.

**Bounds.** Chunks of L = gcd(h, W) lanes (gcd(g, W) for INT8) never cross a group, and
groups divide K, so vector loads stay inside their rows whatever K and g are; edge rows and
columns are clamped for loads and skipped for stores.

x must be read as a buffer unit-stride along K and the weight as bytes unit-stride along its
rows, with K known at compile time. x may also be a reshape of a buffer whose K is split into
`k // c` and `k % c` (the attention output `[B, H, 1, D]` read as `[B, 1, H * D]` by `o_proj`:
`%attn[0, k // 64, 0, k % 64]`), when `c` is a multiple of `CHUNK_DIVISOR` and the `k % c`
dimension is unit-stride: a chunk of L <= 16 lanes starting at a multiple of L never crosses
a multiple of `c`, so it is one vector load `%attn[0, k0 // 64, 0, ramp(k0 % 64, 1, L)]`
(`x_lanes_index`). Otherwise (and on GPUs, see `gpu_lower`)
`build_qlinear_plain` computes each output element with a scalar loop over k.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from ..loopgen.matmul import (MIN_PARALLEL_FLOPS, CpuInfo, _cdiv_expr, _lanes_index, _linear_coefficient, _Probe, _ramp,
                     fused_product, static_int)

if TYPE_CHECKING:
    from ..loopgen.kernel_builder import KernelBuilder

Index = tuple[Expr, ...]
F32 = ScalarType(dt.f32)
I32 = ScalarType(dt.i32)
#: Chunks per group up to this many are unrolled in the IR; longer ones stay a loop.
MAX_UNROLLED_CHUNKS = 8
#: How far ahead of its loads a kernel streaming a quantized weight prefetches it (kernel
#: attribute `prefetch`): the hardware prefetchers keep one core's stream short of bytes in
#: flight; the Q6_K decode GEMV over 660 MB read 19.5 GB/s on two cores, 28.5 with 2 KB ahead,
#: 1.9 KB-4 KB measured alike within noise, 4 KB already less (docs/benchmarks.md, issue 34).
PREFETCH_BYTES = 2048
#: Rows of x per step of the multi-row form, and weight rows per step of each form. The GEMV
#: takes one weight row per step: its bytes are then read as one sequential stream (four
#: rows read side by side are four streams, which the prefetchers follow badly: half the
#: bandwidth or less).
MR_ROWS = 4
NR_GEMV, NR_INT8, NR_INT4 = 1, 4, 2


#: A divisor of K in x's index (`k // c`, `k % c`) must be a multiple of this: every chunk of
#: x the kernels load has a power-of-two number of lanes up to 16 and starts at a multiple of it.
CHUNK_DIVISOR = 16


def fused_qlinear(root: Op, materialized: set[Value]) -> Optional[Op]:
    """`fused_product` for `qlinear`: the one computed inside the kernel of `root`."""
    return fused_product(root, materialized, "qlinear")


@dataclass(frozen=True)
class QLinear:
    """The operands and attributes of one `qlinear`, and its sizes."""

    x: Value
    q: Value
    #: The scales operand; for kind "blocks" the weight itself (its scales are in its blocks).
    scales: Value
    mins: Optional[Value]
    kind: str
    group: int
    symmetric: bool
    #: The optional attribute `activations`: "int8", "f32" or "auto" (int8 where the CPU has
    #: byte dot products); the frontend writes TORCHBURN_QLINEAR_ACTIVATIONS there.
    activations: str = "auto"
    #: Kind "blocks": the name of the weight's entry in `ir/qblocks.py` (see `qlinear_blocks`).
    block_type: str = ""
    #: The optional attribute `form` ("auto", "panel", "rows", "gemm", "tiles"; see the op's docs).
    form: str = "auto"

    @staticmethod
    def of(op: Op) -> "QLinear":
        x, q = op.operands[:2]
        s = op.operands[2] if len(op.operands) > 2 else q
        mins = op.operands[3] if len(op.operands) == 4 else None
        return QLinear(x, q, s, mins, op.attrs["kind"], int(op.attrs["group_size"]), bool(op.attrs["symmetric"]),
                       str(op.attrs.get("activations", "auto")), str(op.attrs.get("block_type", "")),
                       str(op.attrs.get("form", "auto")))

    @property
    def lead(self) -> tuple[Expr, ...]:
        """x's leading dims (the rows), flattened into M by the kernels."""
        return self.x.shape[:-1]

    @property
    def m(self) -> Expr:
        total: Expr = Const(1)
        for d in self.lead:
            total = ex.mul(total, d)
        return total

    @property
    def n(self) -> Expr:
        return self.q.shape[0]

    @property
    def k(self) -> Expr:
        return self.x.shape[-1]

    @property
    def per_channel(self) -> bool:
        return self.scales.type.rank == 1

    def row_index(self, row: Expr) -> Index:
        """The index of x's leading dims for the flat row number `row`."""
        out: list[Expr] = []
        inner: Expr = Const(1)
        for pos in reversed(range(len(self.lead))):
            quotient = ex.floordiv(row, inner)
            out.append(quotient if pos == 0 else ex.mod(quotient, self.lead[pos]))
            inner = ex.mul(inner, self.lead[pos])
        return tuple(reversed(out))


def _f32(e: Expr) -> Expr:
    return ex.cast(e, dt.f32)


def _fma(a: Expr, b: Expr, c: Expr) -> Expr:
    return ex.Call("fma", (a, b, c), c.type)


def weight_element(kb: "KernelBuilder", ql: QLinear, n: Expr, k: Expr) -> Expr:
    """`W[n, k]` in f32, dequantized from the layout (the definition the SIMD kernel follows)."""
    g = ql.group
    group = ex.floordiv(k, Const(g))
    scale = _f32(kb.value_at(ql.scales, (n,) if ql.per_channel else (n, group)))
    if ql.kind == "int8":
        return kb.bind(ex.Binary("mul", _f32(kb.value_at(ql.q, (n, k))), scale, F32), "w")
    h = g // 2
    j = kb.bind(ex.mod(k, Const(g)), "j")
    high = kb.bind(ex.floordiv(j, Const(h)), "hi")
    byte = ex.cast(kb.value_at(ql.q, (n, ex.add(ex.mul(group, Const(h)), ex.sub(j, ex.mul(high, Const(h)))))), dt.i32)
    shift = ex.cast(ex.mul(high, Const(4)), dt.i32)
    code = kb.bind(ex.Binary("and", ex.Binary("shr", byte, shift, I32), Const(15, I32), I32), "q")
    assert ql.symmetric or ql.mins is not None
    low = None if ql.symmetric else _f32(kb.value_at(ql.mins, (n, group)))  # type: ignore[arg-type]
    return _int4_weight(kb, code, scale, low)


def _int4_weight(kb: "KernelBuilder", code: Expr, scale: Expr, low: Optional[Expr]) -> Expr:
    """An int4 code (0..15) as its f32 weight: `(code - 8) * d` symmetric, `code * d + m` not."""
    if low is None:
        return kb.bind(ex.Binary("mul", _f32(ex.Binary("sub", code, Const(8, I32), I32)), scale, F32), "w")
    return kb.bind(ex.Binary("add", ex.Binary("mul", _f32(code), scale, F32), low, F32), "w")


def _store_epilogue(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer, idx: Index, value: Expr) -> None:
    """`out[idx] = root(...)` with the product's element `idx` reading as `value`."""
    kb.define(qop.result, idx, value)
    result = kb.compute(root, idx) if root is not qop else value
    kb.used_buffers[out.name] = out
    kb.emit(lp.Store(out.name, idx, result))


def _per_output_nest(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer, loop: str,
                     reduce: Callable[[tuple[Var, ...], Var, Var, Expr], None]) -> lp.Stmt:
    """A nest over the result, one output element an iteration: an f32 accumulator,
    `reduce(lead, n, r, acc)` emitting the loops over `r` (a fresh `loop` variable) that add
    into it, then the epilogue's store."""
    shape = qop.result.shape
    vars_ = kb.loops(shape, "i")
    r = Var(kb.fresh(loop))
    kb.push()
    acc = lp.Buffer(kb.fresh("acc"), dt.f32, (Const(1),), (Const(1),), "local")
    kb.emit(lp.Alloc(acc))
    kb.emit(lp.Store(acc.name, (Const(0),), Const(0.0, F32)))
    reduce(vars_[:-1], vars_[-1], r, ex.Load(acc.name, (Const(0),), F32))
    total = kb.bind(ex.Load(acc.name, (Const(0),), F32), "x")
    _store_epilogue(kb, root, qop, out, tuple(vars_), total)
    body = kb.pop()
    origin = (("origin", "; ".join(kb.origins)),) if kb.origins else ()
    return kb.nest(vars_, shape, body, origin)


def _add_to(kb: "KernelBuilder", acc: Expr, x: Expr, w: Expr) -> None:
    """`acc = fma(x, w, acc)`. An fma, not `acc + x * w`: `gpu-map` would take the latter for a
    plain matrix product, which the weight's index arithmetic is not."""
    assert isinstance(acc, ex.Load)
    kb.emit(lp.Store(acc.buffer, acc.index, _fma(x, w, acc)))


def build_qlinear_plain(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer) -> lp.Stmt:
    """One output element per iteration of a nest over the result, a scalar loop over k inside
    (the GPU form, and the CPU form for operands the SIMD kernel cannot stream)."""
    ql = QLinear.of(qop)

    def reduce(lead: tuple[Var, ...], n: Var, k: Var, acc: Expr) -> None:
        kb.push()
        _add_to(kb, acc, _f32(kb.value_at(ql.x, (*lead, k))), weight_element(kb, ql, n, k))
        kb.emit(lp.For(k, Const(0), ql.k, "serial", kb.pop()))

    return _per_output_nest(kb, root, qop, out, "k", reduce)


def build_qlinear_grouped(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer) -> Optional[lp.Stmt]:
    """An int4 or grouped int8 product as `build_qlinear_plain` computes it (the same sums in
    the same order), with the k loop split by quantization group: per group its scale (and
    minimum) once, then, int4, a loop over the group's `h = g / 2` bytes taking their low
    nibbles (elements `j`) and one taking their high nibbles (elements `h + j`); int8, one
    loop over the group's bytes. The GPU form: `gpu-map` maps this nest as it maps ggml blocks
    (`passes/gpu/block_rows.py`: a row's invocations share out the groups, one byte each per
    loop, vec4s where the loads allow), where the flat k loop re-derived group, byte and
    nibble from `k` per element (and a grouped int8 row lost its vec4 loads to `k // g`: 347 us
    for the int8 head of an int4 Qwen2.5-0.5B decode step on the H100). None when K is not a
    static multiple of the group, or for per-channel int8 (no groups: the flat loop is the form).

        for i0, n { acc = 0; for g in 0..K/32 { let d = %s[n, g]
          for j in 0..16 { acc = fma(%x[i0, g * 32 + j], cast<f32>(%q[n, g * 16 + j] & 15 - 8) * d, acc) }
          for j in 0..16 { acc = fma(%x[i0, g * 32 + 16 + j], cast<f32>(%q[n, g * 16 + j] >> 4 & 15 - 8) * d, acc) } }
          %out[i0, n] = acc }

    and grouped int8:

        for i0, n { acc = 0; for g in 0..K/32 { let d = %s[n, g]
          for j in 0..32 { acc = fma(%x[i0, g * 32 + j], cast<f32>(%q[n, g * 32 + j]) * d, acc) } }
          %out[i0, n] = acc }
    """
    ql = QLinear.of(qop)
    k_static = static_int(ql.k)
    if k_static is None or k_static % ql.group:
        return None
    if ql.kind == "int8" and not ql.per_channel:
        return _grouped_int8(kb, root, qop, out, ql, k_static)
    if ql.kind != "int4":
        return None
    g_size, h = ql.group, ql.group // 2

    def reduce(lead: tuple[Var, ...], n: Var, g: Var, acc: Expr) -> None:
        kb.push()
        scale = kb.bind(_f32(kb.value_at(ql.scales, (n,) if ql.per_channel else (n, g))), "d")
        low = None if ql.symmetric else kb.bind(_f32(kb.value_at(ql.mins, (n, g))), "m")  # type: ignore[arg-type]
        for half in (0, 1):
            j = Var(kb.fresh("j"))
            kb.push()
            byte = ex.cast(kb.value_at(ql.q, (n, ex.add(ex.mul(g, Const(h)), j))), dt.i32)
            nibble = ex.Binary("shr", byte, Const(4, I32), I32) if half else byte
            code = kb.bind(ex.Binary("and", nibble, Const(15, I32), I32), "q")
            w = _int4_weight(kb, code, scale, low)
            x = _f32(kb.value_at(ql.x, (*lead, ex.add(ex.mul(g, Const(g_size)), ex.add(Const(half * h), j)))))
            _add_to(kb, acc, x, w)
            kb.emit(lp.For(j, Const(0), Const(h), "serial", kb.pop()))
        kb.emit(lp.For(g, Const(0), Const(k_static // g_size), "serial", kb.pop()))

    return _per_output_nest(kb, root, qop, out, "g", reduce)


def _grouped_int8(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer, ql: QLinear, k_static: int) -> lp.Stmt:
    """`build_qlinear_grouped` for int8 with a scale per group: `w = f32(q) * d` as
    `weight_element` computes it, the group's scale loaded once."""
    g_size = ql.group

    def reduce(lead: tuple[Var, ...], n: Var, g: Var, acc: Expr) -> None:
        kb.push()
        scale = kb.bind(_f32(kb.value_at(ql.scales, (n, g))), "d")
        j = Var(kb.fresh("j"))
        kb.push()
        k = ex.add(ex.mul(g, Const(g_size)), j)
        w = kb.bind(ex.Binary("mul", _f32(kb.value_at(ql.q, (n, k))), scale, F32), "w")
        _add_to(kb, acc, _f32(kb.value_at(ql.x, (*lead, k))), w)
        kb.emit(lp.For(j, Const(0), Const(g_size), "serial", kb.pop()))
        kb.emit(lp.For(g, Const(0), Const(k_static // g_size), "serial", kb.pop()))

    return _per_output_nest(kb, root, qop, out, "g", reduce)


@dataclass(frozen=True)
class QPlan:
    """Blocking of one SIMD `qlinear`: MR rows of x by NR weight rows per step, chunks of L
    lanes, and whether the work-item loop is parallel."""

    mr: int
    nr: int
    lanes: int
    parallel: bool

    def describe(self) -> str:
        return f"mr={self.mr} nr={self.nr} lanes={self.lanes} parallel={'yes' if self.parallel else 'no'}"


def plan_qlinear(ql: QLinear, m: Optional[int], cpu: CpuInfo) -> QPlan:
    """MR x NR from the rows of x (`m`, None when known at run time only), L from the group."""
    w = cpu.lanes(dt.f32)
    span = ql.group // 2 if ql.kind == "int4" else ql.group
    lanes = math.gcd(span, w)
    mr = 1 if m is not None and m <= 1 else MR_ROWS if m is None else min(m, MR_ROWS)
    if mr == 1:
        nr = NR_GEMV
    else:
        nr = NR_INT4 if ql.kind == "int4" else NR_INT8
    k, n = static_int(ql.k) or 0, static_int(ql.n)
    flops = 2.0 * (m if m is not None else 1 << 10) * (n if n is not None else 1 << 20) * k
    return QPlan(mr, nr, lanes, cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS)


class QLinearBuilder:
    """Builds the SIMD nest of the module docstring for one plan."""

    #: The rows of x one pass of the nest computes: from `row_base`, `row_count` of them (None:
    #: all of x's). `Q8Builder` sets them per block of rows whose quantized x fits its buffer.
    row_base: Expr = Const(0)
    row_count: Optional[Expr] = None

    def __init__(self, kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer, plan: QPlan,
                 x_load: ex.Load, q_load: ex.Load, row_var: Var, k_var: Var, n_var: Var) -> None:
        self.kb, self.root, self.qop, self.out, self.plan = kb, root, qop, out, plan
        self.ql = QLinear.of(qop)
        self.x_load, self.q_load = x_load, q_load
        self.row_var, self.k_var, self.n_var = row_var, k_var, n_var
        self.vt = ScalarType(dt.f32, plan.lanes)

    def var(self, prefix: str) -> Var:
        return Var(self.kb.fresh(prefix))

    def let(self, e: Expr, prefix: str) -> Expr:
        if isinstance(e, (Const, Var)):
            return e
        v = Var(self.kb.fresh(prefix), e.type)
        self.kb.emit(lp.Let(v, e))
        return v

    def buffer(self, prefix: str, dtype: dt.DType, shape: tuple[int, ...]) -> lp.Buffer:
        dims = tuple(Const(d) for d in shape)
        buf = lp.Buffer(self.kb.fresh(prefix), dtype, dims, lp.contiguous_strides(dims), "local")
        self.kb.emit(lp.Alloc(buf))
        return buf

    def local(self, prefix: str, shape: tuple[int, ...]) -> lp.Buffer:
        return self.buffer(prefix, dt.f32, shape)

    def repeat(self, prefix: str, count: int, body: Callable[[Expr], None], max_unrolled: int) -> None:
        """`body(i)` for i in 0..count-1: unrolled (constant i) up to `max_unrolled` times, a
        serial loop over a fresh variable beyond, so a long row does not grow the code."""
        if count <= max_unrolled:
            for i in range(count):
                body(Const(i))
            return
        v = self.var(prefix)
        self.kb.push()
        body(v)
        self.kb.emit(lp.For(v, Const(0), Const(count), "serial", self.kb.pop()))

    def open_tiles(self) -> tuple[Var, Expr, list[Expr], lp.Buffer, Var, Expr, list[Expr]]:
        """The two outer loops' heads, shared by every form: a block of `nr` weight rows per
        item (`n0`, clamped rows `ns`, the output tile), then a block of `mr` rows of x per
        `ib` (`i0`, clamped rows). Pushes one statement list per loop (`close_tiles` pops)."""
        kb, plan, ql = self.kb, self.plan, self.ql
        item = self.var("w")
        kb.push()
        n0 = self.let(ex.mul(item, Const(plan.nr)), "n")
        ns = [self.let(ex.minimum(ex.add(n0, Const(c)), ex.sub(ql.n, Const(1))), "nc") for c in range(plan.nr)]
        tile = self.local("ct", (plan.mr, plan.nr))
        ib = self.var("ib")
        kb.push()
        i0 = self.let(ex.mul(ib, Const(plan.mr)), "i")
        rows = [self.let(ex.minimum(ex.add(i0, Const(r)), ex.sub(self.rows_m, Const(1))), "ia") for r in range(plan.mr)]
        return item, n0, ns, tile, ib, i0, rows

    @property
    def rows_m(self) -> Expr:
        """The rows of x this pass computes (`row_count`, else M)."""
        return self.ql.m if self.row_count is None else self.row_count

    def close_tiles(self, tile: lp.Buffer, item: Var, ib: Var, i0: Expr, n0: Expr) -> lp.For:
        """The epilogue of the filled tile and the two loops `open_tiles` began."""
        kb, plan, ql = self.kb, self.plan, self.ql
        rows_left = ex.minimum(Const(plan.mr), ex.sub(self.rows_m, i0))
        cols_left = ex.minimum(Const(plan.nr), ex.sub(ql.n, n0))
        kb.emit(self.epilogue(tile, ex.add(self.row_base, i0), n0, rows_left, cols_left))
        kb.emit(lp.For(ib, Const(0), _cdiv_expr(self.rows_m, plan.mr), "serial", kb.pop()))
        described = plan.describe()
        previous = kb.attrs.get("qlinear")
        kb.attrs["qlinear"] = described if previous is None else f"{previous} | {described}"
        # the weight is read once, in order: its loads prefetch ahead (`codegen.llvm.memory`)
        kb.attrs["prefetch"] = f"{self.q_load.buffer}:{PREFETCH_BYTES}"
        notes = ((("origin", "; ".join(kb.origins)),) if kb.origins else ()) + (("qlinear", described),)
        kind = "parallel" if plan.parallel else "serial"
        return lp.For(item, Const(0), _cdiv_expr(ql.n, plan.nr), kind, kb.pop(), notes)

    def x_vector(self, row: Expr, k0: Expr) -> Expr:
        """L elements of x's row `row` from column `k0`, in f32."""
        index = tuple(ex.substitute(i, {self.row_var.name: row}) for i in self.x_load.index)
        widened = x_lanes_index(index, self.k_var.name, k0, self.plan.lanes)
        assert widened is not None
        load = ex.Load(self.x_load.buffer, widened, ScalarType(self.ql.x.dtype, self.plan.lanes))
        return self.kb.bind(_f32(load), "xv")

    def q_vector(self, n: Expr, col: Expr) -> Expr:
        """L bytes of weight row `n` from byte column `col` (i8 or u8 lanes)."""
        index = tuple(ex.substitute(i, {self.n_var.name: n}) for i in self.q_load.index)
        widened = _lanes_index(index, self.k_var.name, col, self.plan.lanes)
        assert widened is not None
        return ex.Load(self.q_load.buffer, widened, ScalarType(self.ql.q.dtype, self.plan.lanes))

    def build(self) -> lp.Stmt:
        kb, plan, ql = self.kb, self.plan, self.ql
        item, n0, ns, tile, ib, i0, rows = self.open_tiles()
        halves = 2 if ql.kind == "int4" else 1
        lane = ex.Ramp(Const(0), Const(1), ScalarType(dt.index, plan.lanes))
        accs = {(r, c, s): self.local("acc", (plan.lanes,))
                for r in range(plan.mr) for c in range(plan.nr) for s in range(halves)}
        for a in accs.values():
            kb.emit(lp.Store(a.name, (lane,), ex.const(0.0, dt.f32, plan.lanes)))

        def acc(key: tuple[int, int, int]) -> Expr:
            return ex.Load(accs[key].name, (lane,), self.vt)

        self.group_loop(rows, ns, acc, accs)
        for r in range(plan.mr):
            for c in range(plan.nr):
                vec = acc((r, c, 0))
                if halves == 2:
                    vec = ex.Binary("add", vec, acc((r, c, 1)), self.vt)
                total: Expr = ex.VectorReduce("add", vec, F32)
                if ql.per_channel:
                    total = ex.Binary("mul", total, _f32(kb.value_at(ql.scales, (ns[c],))), F32)
                kb.emit(lp.Store(tile.name, (Const(r), Const(c)), total))
        return self.close_tiles(tile, item, ib, i0, n0)

    def group_loop(self, rows: list[Expr], ns: list[Expr], acc: Callable[[tuple[int, int, int]], Expr],
                   accs: dict[tuple[int, int, int], lp.Buffer]) -> None:
        """`for G in groups { scales; for ch in chunks { dequantize; fma } }`."""
        kb, plan, ql = self.kb, self.plan, self.ql
        k = static_int(ql.k)
        assert k is not None
        g = ql.group
        span = g // 2 if ql.kind == "int4" else g
        chunks = span // plan.lanes
        lane = ex.Ramp(Const(0), Const(1), ScalarType(dt.index, plan.lanes))
        gv = self.var("g")
        kb.push()
        scale: list[Optional[Expr]] = [None] * plan.nr
        offset: list[Optional[Expr]] = [None] * plan.nr
        if not ql.per_channel:
            for c in range(plan.nr):
                d = kb.bind(_f32(kb.value_at(ql.scales, (ns[c], gv))), "d")
                scale[c] = kb.bind(ex.Broadcast(d, self.vt), "dv")
                if ql.kind == "int4":
                    if ql.symmetric:
                        m = ex.Binary("mul", d, Const(-8.0, F32), F32)
                    else:
                        assert ql.mins is not None
                        m = _f32(kb.value_at(ql.mins, (ns[c], gv)))
                    offset[c] = kb.bind(ex.Broadcast(kb.bind(m, "m"), self.vt), "mv")

        if not ql.per_channel and chunks <= MAX_UNROLLED_CHUNKS:
            self.factored_group(gv, rows, ns, scale, offset, acc, accs)
            kb.emit(lp.For(gv, Const(0), Const(k // g), "serial", kb.pop()))
            return

        def chunk(ch: Expr) -> None:
            base = ex.add(ex.mul(gv, Const(g)), ex.mul(ch, Const(plan.lanes)))
            if ql.kind == "int4":
                col = ex.add(ex.mul(gv, Const(span)), ex.mul(ch, Const(plan.lanes)))
                xs = [[self.x_vector(rows[r], ex.add(base, Const(s * span))) for s in range(2)]
                      for r in range(plan.mr)]
                it = ScalarType(dt.i32, plan.lanes)
                for c in range(plan.nr):
                    b = kb.bind(ex.cast(self.q_vector(ns[c], col), dt.i32), "b")
                    codes = (ex.Binary("and", b, ex.const(15, dt.i32, plan.lanes), it),
                             ex.Binary("shr", b, ex.const(4, dt.i32, plan.lanes), it))
                    for s in range(2):
                        scl, off = scale[c], offset[c]
                        assert scl is not None and off is not None
                        wv = kb.bind(_fma(_f32(codes[s]), scl, off), "wv")
                        for r in range(plan.mr):
                            kb.emit(lp.Store(accs[(r, c, s)].name, (lane,), _fma(wv, xs[r][s], acc((r, c, s)))))
                return
            xs1 = [self.x_vector(rows[r], base) for r in range(plan.mr)]
            for c in range(plan.nr):
                qv = _f32(self.q_vector(ns[c], base))
                scl = scale[c]
                wv = kb.bind(qv if scl is None else ex.Binary("mul", qv, scl, self.vt), "wv")
                for r in range(plan.mr):
                    kb.emit(lp.Store(accs[(r, c, 0)].name, (lane,), _fma(wv, xs1[r], acc((r, c, 0)))))

        self.repeat("ch", chunks, chunk, MAX_UNROLLED_CHUNKS)
        kb.emit(lp.For(gv, Const(0), Const(k // g), "serial", kb.pop()))

    def factored_group(self, gv: Var, rows: list[Expr], ns: list[Expr], scale: list[Optional[Expr]],
                       offset: list[Optional[Expr]], acc: Callable[[tuple[int, int, int]], Expr],
                       accs: dict[tuple[int, int, int], lp.Buffer]) -> None:
        """One group with its scale taken out of the sum (unrolled chunks, grouped scales):

            p[r][c] = sum_ch f32(q_c[ch]) * x_r[ch]                   (int4: both nibbles)
            acc[r][c] = fma(p[r][c], d_c, acc[r][c])
            acc[r][c] = fma(sum_ch x_r[ch], m_c, acc[r][c])           (int4 only: the offset)

        The weight is converted (no scale multiply, no per-element offset) and multiplied in,
        so a weight vector costs a widening load, a conversion and one fma; `p` starts afresh
        every group, so the chains of different groups are independent. One accumulator per
        (r, c) (int4's high half stays 0), so 4 x 4 of them fit the 16 AVX2 registers."""
        kb, plan, ql = self.kb, self.plan, self.ql
        g = ql.group
        span = g // 2 if ql.kind == "int4" else g
        lane = ex.Ramp(Const(0), Const(1), ScalarType(dt.index, plan.lanes))
        it = ScalarType(dt.i32, plan.lanes)
        part: dict[tuple[int, int], Expr] = {}
        xsum: dict[int, Expr] = {}

        def add_product(key: tuple[int, int], w: Expr, xv: Expr) -> None:
            prev = part.get(key)
            value = ex.Binary("mul", w, xv, self.vt) if prev is None else _fma(w, xv, prev)
            part[key] = kb.bind(value, "p")

        for ch in range(span // plan.lanes):
            base = ex.add(ex.mul(gv, Const(g)), Const(ch * plan.lanes))
            if ql.kind == "int4":
                col = ex.add(ex.mul(gv, Const(span)), Const(ch * plan.lanes))
                xs = [[self.x_vector(rows[r], ex.add(base, Const(s * span))) for s in range(2)]
                      for r in range(plan.mr)]
                for r in range(plan.mr):
                    for s in range(2):
                        prev_x = xsum.get(r)
                        xsum[r] = xs[r][s] if prev_x is None else kb.bind(ex.Binary("add", prev_x, xs[r][s], self.vt), "xs")
                for c in range(plan.nr):
                    b = kb.bind(ex.cast(self.q_vector(ns[c], col), dt.i32), "b")
                    codes = (ex.Binary("and", b, ex.const(15, dt.i32, plan.lanes), it),
                             ex.Binary("shr", b, ex.const(4, dt.i32, plan.lanes), it))
                    for s in range(2):
                        qf = kb.bind(_f32(codes[s]), "qf")
                        for r in range(plan.mr):
                            add_product((r, c), qf, xs[r][s])
                continue
            xs1 = [self.x_vector(rows[r], base) for r in range(plan.mr)]
            for c in range(plan.nr):
                qf = kb.bind(_f32(self.q_vector(ns[c], base)), "qf")
                for r in range(plan.mr):
                    add_product((r, c), qf, xs1[r])
        for r in range(plan.mr):
            for c in range(plan.nr):
                scl = scale[c]
                assert scl is not None
                total = _fma(part[(r, c)], scl, acc((r, c, 0)))
                off = offset[c]
                if ql.kind == "int4":
                    assert off is not None
                    total = _fma(xsum[r], off, total)
                kb.emit(lp.Store(accs[(r, c, 0)].name, (lane,), total))

    def epilogue(self, tile: lp.Buffer, i0: Expr, n0: Expr, rows: Expr, cols: Expr) -> lp.Stmt:
        """`out[row(i0 + r), n0 + c] = epilogue(%ct[r, c])` for the valid part of the tile."""
        kb = self.kb
        r, c = self.var("r"), self.var("c")
        kb.push()
        value = kb.bind(ex.Load(tile.name, (r, c), F32), "x")
        idx = (*self.ql.row_index(ex.add(i0, r)), ex.add(n0, c))
        _store_epilogue(kb, self.root, self.qop, self.out, idx, value)
        inner = lp.For(c, Const(0), cols, "serial", kb.pop())
        return lp.For(r, Const(0), rows, "serial", inner)


def _split_k(e: Expr, name: str) -> Optional[tuple[str, int]]:
    """("floordiv" or "mod", c) when `e` is `name // c` or `name % c` with a constant `c`."""
    if (isinstance(e, ex.Binary) and e.op in ("floordiv", "mod") and isinstance(e.a, Var)
            and e.a.name == name and isinstance(e.b, Const) and int(e.b.value) > 0):
        return e.op, int(e.b.value)
    return None


def x_lanes_index(index: Index, name: str, base: Expr, lanes: int) -> Optional[Index]:
    """`_lanes_index` that also widens `name // c` (the same for every lane) and `name % c`
    (a ramp), valid because `base` is a multiple of `lanes` and `lanes` divides `c`:

        [0, k // 64, 0, k % 64] with k := k0 + 0..8  ->  [0, k0 // 64, 0, ramp(k0 % 64, 1, 8)]

    None when a component is neither affine in `name` nor such a split with `lanes | c`."""
    out: list[Expr] = []
    for i in index:
        c = _linear_coefficient(i, name)
        start = ex.substitute(i, {name: base})
        if c is not None:
            out.append(start if c == Const(0) else _ramp(start, lanes, c))
            continue
        split = _split_k(i, name)
        if split is None or split[1] % lanes:
            return None
        out.append(start if split[0] == "floordiv" else _ramp(start, lanes))
    return tuple(out)


def _chunk_unit(load: ex.Load, buf: lp.Buffer, name: str) -> bool:
    """Whether consecutive `name` within a chunk (see `x_lanes_index`) are consecutive
    addresses of `load`: the affine parts and the `name % c` parts (c a multiple of
    `CHUNK_DIVISOR`) add up to stride 1; `name // c` parts are fixed within a chunk."""
    total: Expr = Const(0)
    for i, st in zip(load.index, buf.strides):
        c = _linear_coefficient(i, name)
        if c is None:
            split = _split_k(i, name)
            if split is None or split[1] % CHUNK_DIVISOR:
                return False
            c = Const(1) if split[0] == "mod" else Const(0)
        total = ex.add(total, ex.mul(c, st))
    return total == Const(1)


def _probes(kb: "KernelBuilder", ql: QLinear) -> Optional[tuple[ex.Load, ex.Load, Var, Var, Var]]:
    """x and the weight as single loads unit-stride along k (with the variables standing for
    the row, k and the weight row), or None when the SIMD kernel cannot stream them."""
    row, k, n = Var(kb.fresh("row")), Var(kb.fresh("k")), Var(kb.fresh("n"))
    xp = _Probe(kb, ql.x, (*ql.row_index(row), k), k, row)
    qp = _Probe(kb, ql.q, (n, k), k, n)
    if xp.load is None or qp.load is None or not qp.unit("k"):
        return None
    if not xp.unit("k"):
        buf = kb.used_buffers.get(xp.load.buffer)
        if buf is None or not _chunk_unit(xp.load, buf, k.name):
            return None
    if ql.x.dtype not in (dt.f32, dt.f16, dt.bf16):
        return None
    return xp.load, qp.load, row, k, n
