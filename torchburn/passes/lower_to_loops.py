"""`lower-to-loops`: turn a fused tensor graph into a loop-level program.

Matrix products and quantized linears are blocked for the pass context's target (vector
width, cache sizes, threads, native dot products; see `loopgen/matmul.py`). Options steer the
GEMM kernels, for tests and experiments: `gemm_swap` (`auto` compares the plain and the
swapped plan by cost, `always`, `never`), `gemm_direct_b` (read a small row-major B in place)
and `gemm_dot` (the dot-product form for a few rows), as in
`lower-to-loops{gemm_swap=always,gemm_dot=false}`. Convolutions (with their fused epilogues)
and their weight gradients become the register-blocked kernels of `loopgen/conv.py` and
`loopgen/conv_grad_weight.py`; an `attention` op becomes one flash-attention kernel
(`loopgen/attention.py`; with many query rows its tile form, `loopgen/attention_tiles.py`,
which `lower-to-loops{attention_tiles=false}` turns off);
`lower-to-loops{conv_kernels=false}` keeps the per-element nests of `loopgen/nn_rules.py`.

Every kernel root (see `fuse`) becomes one kernel; its result goes to an output buffer when
it is a graph output and to a workspace temporary otherwise. Graph inputs keep their strides,
so kernels read the caller's memory in place. Without a prior `fuse`, every op is its own
kernel (correct, just slower). A graph that returns an input as is, or one value twice, lists
what it returns in the program's `return` line (`Program.results`).

A graph output that is a reshape of a value another kernel computes (and nothing else reads)
costs no kernel: the producer stores into the output buffer in its own shape, and the
program returns that buffer viewed in the output's shape (`Program.result_views`; both are
contiguous, so the view is the same memory):

    %0 = matmul(%a, %b) {kernel = 0} : f32[64, 288]
    %1 = reshape(%0) {shape = [64, 32, 3, 3], kernel = 1} : f32[64, 32, 3, 3]
    return %1

becomes (a convolution's weight gradient as a GEMM, which had copied `[Cout, C*9]` into
`[Cout, C, 3, 3]` by a kernel of its own)

    program @main(%a: ..., %b: ...) -> (%out0: f32[64, 288] strides [288, 1]) {
      call @k0(%b, %a, %out0)
      return %out0 as [64, 32, 3, 3]
    }

An `index_put` or `scatter` marked `inplace` (the importer marks the write-back of a mutated
graph input, such as a KV cache's new slots) stores into its `self` input's own buffer: the
kernel writes only the indexed elements and the program returns that input (`return %x`).
It is in place only when that is safe: `self` is a graph input no other in-place op writes,
the result is read by no op, and no producer computed inside the same kernel reads `self`.
Kernels that read `self` are called before it (they see the old values). Otherwise the mark is
dropped and the op copies `self` as usual.

    graph @main(%c: f32[4, 2], %v: f32[1, 2], %i: i64[1]) {
      %0 = index_put(%c, %v, %i) {dims = [0], pos = 0, accumulate = false, inplace = true} : f32[4, 2]
      return %0
    }

becomes a program with no output buffer whose kernel stores `%v` at row `%i[0]` of `%c`:

    program @main(%c: ..., %v: ..., %i: ...) -> () {
      call @k0(%v, %i, %c)
      return %c
    }

Before:

    graph @main(%x: f32[s0, 4]) {
      %0 = exp(%x) {fused_into = [0]} : f32[s0, 4]
      %1 = add(%0, %x) {kernel = 0} : f32[s0, 4]
      return %1
    }

After:

    program @main(%x: f32[s0, 4] strides [4, 1]) -> (%out0: f32[s0, 4] strides [4, 1]) symbols(s0) {
      call @k0(%x, %out0)
    }
    kernel @k0(%x: f32[s0, 4] strides [4, 1], %out0: f32[s0, 4] strides [4, 1]) symbols(s0) {
      for i0 in 0..s0 attrs {origin = "aten.exp.default; aten.add.Tensor"} {
        for i1 in 0..4 {
          let x2 = %x[i0, i1]
          let t3 = exp(x2)
          let t4 = t3 + x2
          %out0[i0, i1] = t4
        }
      }
    }
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar, Optional

from ..ir import dtypes as dt
from ..ir import expr as ex
from ..ir import loop as lp
from ..ir.expr import Expr, Var
from ..ir.loop import contiguous_strides
from ..ir.ops import get_op
from ..ir.tensor import Graph, Op, Value
from .base import Pass, PassContext, PassError, register_pass
from .loopgen.attention import build_attention
from .loopgen.attention_tiles import tile_plan
from .loopgen.kernel_builder import ROOT_RULES, KernelBuilder
from .loopgen.matmul import CpuInfo, GemmOptions, fused_matmul, fused_product, gemm_root
from .loopgen.root_key import RootKey, root_key
from .loopgen.store_views import fused_through_views

#: Values of `lower-to-loops{gemm_swap=...}`.
SWAP_CHOICES = {"auto": None, "always": True, "never": False}
#: Rows of x from which a static-M `qlinear` takes the AMX tile form where the target has
#: AMX-INT8 (`lower-to-loops{qlinear_tile_rows=N}`; up to the panel form's 32 rows). The
#: rows form costs about the same per row of x, the tile form about the same per 16 rows
#: (fewer are zeros): on the default model's 576 -> 1536 int4 weight the rows form was 1.7x
#: faster at 4 rows, the tile form 1.2x at 8 and 1.7x at 12 (`bench_qlinear_gemm.py --forms
#: rows,tiles`), but the whole 8-row decode step (all its shapes, the 49152-row LM head
#: among them) took 10% longer with it and the 16-row step 30% less
#: (`bench_batched_step.py`, docs/serve.md): from 12 rows, so a server's 16-row bucket.
QLINEAR_TILE_ROWS = 12


def _is_root(op: Op, fused: bool) -> bool:
    return "kernel" in op.attrs if fused else True


def _output_views(graph: Graph, fused: bool, inplace: dict[Op, Value]) -> dict[Value, Value]:
    """Graph outputs returned as a view of another kernel's result (module docstring): output
    -> the reshaped value, where the output is a kernel root `reshape` read by no op and
    returned once, and its operand is computed by a kernel root (not inlined, not an input)
    into a buffer of its own: returned by no other position, and neither written in place
    nor the target of an in-place write."""
    if not fused:
        return {}
    read = {x for op in graph.ops for x in op.operands}
    counts: dict[Value, int] = {}
    for v in graph.outputs:
        counts[v] = counts.get(v, 0) + 1
    in_place = set(inplace.values()) | {op.result for op in inplace}
    found: dict[Value, Value] = {}
    for v, n in counts.items():
        op = v.producer
        if (n != 1 or op is None or op.name != "reshape" or "kernel" not in op.attrs or v in read
                or len(op.results) != 1):
            continue
        u = op.operands[0]
        if (u.producer is None or "kernel" not in u.producer.attrs or len(u.producer.results) != 1
                or u in counts or u in in_place or u.dtype != v.dtype or u in found.values()):
            continue
        found[v] = u
    return found


def _collect_symbols(graph: Graph) -> tuple[Var, ...]:
    """Symbols in the order the caller binds them: scalar inputs, then input shapes/strides."""
    seen: dict[str, Var] = {}
    for v in graph.inputs:
        if isinstance(v, Var):
            seen.setdefault(v.name, v)
        else:
            for d in (*v.shape, *v.layout()):
                for name in sorted(ex.free_vars(d)):
                    seen.setdefault(name, Var(name))
    for op in graph.ops:
        for r in op.results:
            for d in r.shape:
                for name in sorted(ex.free_vars(d)):
                    seen.setdefault(name, Var(name))
    return tuple(v for k, v in seen.items() if not k.startswith("_"))


@register_pass
@dataclass(frozen=True)
class LowerToLoops(Pass):
    """Lower a tensor graph to a loop program (see the module docstring)."""

    name: ClassVar[str] = "lower-to-loops"
    level: ClassVar[str] = "lowering"
    #: Lower `qlinear` to the SIMD dequantizing kernel (`loopgen/qlinear.py`); GPUs want the
    #: plain per-element nest instead.
    simd_qlinear: ClassVar[bool] = True
    #: Lower convolutions to the register-blocked kernels of `loopgen/conv.py`; GPUs keep the
    #: per-element nest.
    simd_conv: ClassVar[bool] = True
    #: Loop over a concat one operand at a time (`KernelBuilder.concat_parts`); GPUs keep one
    #: nest (each would be a dispatch).
    split_concats: ClassVar[bool] = True
    #: Pass a constant slice of a buffer to kernels as a view at a byte offset
    #: (`KernelCall.offsets`) rather than as index arithmetic inside them: the layers of a
    #: stacked KV cache then read their slices through one kernel. The GPU and reference
    #: engines bind whole buffers only.
    slice_views: ClassVar[bool] = True
    #: GEMM plan choice: "auto" (by cost), "always" or "never" swap the operands' roles.
    gemm_swap: str = "auto"
    #: Let the micro-kernel read a small row-major B in place instead of packing it.
    gemm_direct_b: bool = True
    #: The dot-product form for products of a few rows.
    gemm_dot: bool = True
    #: Register-blocked convolution kernels (`loopgen/conv.py`); false keeps the per-element
    #: nest of `loopgen/nn_rules.py` (tests and experiments).
    conv_kernels: bool = True
    #: Lower each distinct kernel root once (`loopgen/root_key.py`): a root whose key was met
    #: before calls the kernel lowered for it with its own buffers; false lowers every root
    #: (`dedup-kernels` merges the copies afterwards, to the same program).
    dedup: bool = True
    #: Query rows per parallel task and keys per score block of the attention kernel's row
    #: form (`loopgen/attention.py`).
    attention_block_q: int = 8
    attention_block_k: int = 32
    #: Query rows a task of the row form computes together, sharing each key and value load.
    attention_rows: int = 4
    #: Steps of many query rows (prefill) take the attention kernel's tile form, query rows
    #: along the vector lanes (`loopgen/attention_tiles.py`); false keeps the row form.
    attention_tiles: bool = True
    #: Whether the target runs the tile form (a GPU maps the row form onto its grid).
    simd_attention: ClassVar[bool] = True
    #: Rows of x from which a static-M `qlinear` takes the AMX tile form
    #: (`quant/qlinear_tiles.py`) on a target with AMX-INT8; 0: never (the rows and panel forms).
    qlinear_tile_rows: int = QLINEAR_TILE_ROWS

    def __post_init__(self) -> None:
        if self.gemm_swap not in SWAP_CHOICES:
            raise PassError(f"pass {self.name}: gemm_swap={self.gemm_swap!r}; expected one of {', '.join(SWAP_CHOICES)}")
        if isinstance(self.qlinear_tile_rows, bool) or not isinstance(self.qlinear_tile_rows, int) \
                or self.qlinear_tile_rows < 0:
            raise PassError(f"pass {self.name}: qlinear_tile_rows={self.qlinear_tile_rows!r}; expected an integer >= 0")
        for knob in ("attention_block_q", "attention_block_k", "attention_rows"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise PassError(f"pass {self.name}: {knob}={value!r}; expected a positive integer")

    def gemm_options(self) -> GemmOptions:
        return GemmOptions(SWAP_CHOICES[self.gemm_swap], self.gemm_direct_b, self.gemm_dot)

    def run(self, graph: Graph) -> lp.Program:
        return self.run_in(graph, PassContext())

    def run_in(self, graph: Graph, ctx: PassContext) -> lp.Program:
        cpu = CpuInfo.of(ctx.target)
        fused = any("kernel" in op.attrs for op in graph.ops)
        buffers: dict[Value, lp.Buffer] = {}
        inputs: list[lp.Buffer] = []
        for v in graph.tensor_inputs():
            b = lp.Buffer(v.name, v.dtype, v.shape, v.layout())
            buffers[v] = b
            inputs.append(b)
        inplace = _inplace_writes(graph, fused)
        for op, x in inplace.items():
            buffers[op.result] = buffers[x]
        outputs: list[lp.Buffer] = []
        viewed = _output_views(graph, fused, inplace)
        for i, v in enumerate(graph.outputs):
            if v in buffers:
                continue  # an input returned as is, or an output listed twice
            stored = viewed.get(v, v)  # a viewed output: its producer's value, stored there
            b = lp.Buffer(f"out{len(outputs)}", stored.dtype, stored.shape, contiguous_strides(stored.shape))
            buffers[v] = buffers[stored] = b
            outputs.append(b)
        temps: list[lp.Buffer] = []
        roots = [op for op in graph.ops if _is_root(op, fused) and op.result not in viewed]
        for op in roots:
            for r in op.results:
                if r not in buffers:
                    b = lp.Buffer(f"tmp{len(temps)}", r.dtype, r.shape, contiguous_strides(r.shape))
                    buffers[r] = b
                    temps.append(b)
        views = self._slice_views(graph, buffers) if self.slice_views else {}
        symbols = _collect_symbols(graph)
        kernels: list[lp.Kernel] = []
        calls: list[lp.KernelCall] = []
        #: Root key -> the kernel lowered for it and where its parameters come from (None:
        #: a parameter the key does not place; every root of that key is lowered).
        firsts: dict[str, Optional[Places]] = {}
        #: Root index -> its call (a shared kernel is called under its first root's name).
        root_calls: dict[int, lp.KernelCall] = {}
        for n, op in enumerate(roots):
            key = root_key(op, buffers) if self.dedup else None
            first = firsts.get(key.key) if key is not None else None
            if key is not None and first is not None:
                calls.append(_call(first[0].name, _bind(first, key, f"k{n}", temps), views))
                root_calls[n] = calls[-1]
                continue
            scratch_from = len(temps)
            kernel = self._lower_root(f"k{n}", op, buffers, symbols, temps, cpu)
            kernels.append(kernel)
            calls.append(_call(kernel.name, tuple(p.name for p in kernel.params), views))
            if key is not None and key.key not in firsts:
                firsts[key.key] = _places(kernel, key, temps[scratch_from:])
            root_calls[n] = calls[-1]
        calls = _readers_first(calls, [(root_calls[roots.index(op)], buffers[x].name) for op, x in inplace.items()])
        results = tuple(buffers[v].name for v in graph.outputs)
        result_views = tuple((k, tuple(v.shape)) for k, v in enumerate(graph.outputs) if v in viewed)
        if results == tuple(b.name for b in outputs) and not result_views:
            results = ()  # the common case, left implicit (see `Program.results`)
        constant_inputs = tuple(buffers[v].name for v in graph.tensor_inputs() if v.constant)
        return lp.Program(graph.name, tuple(inputs), tuple(outputs), tuple(temps), symbols,
                          tuple(calls), tuple(kernels), results=results, result_views=result_views,
                          constant_inputs=constant_inputs)

    def _slice_views(self, graph: Graph, buffers: dict[Value, lp.Buffer]) -> dict[str, tuple[str, Expr]]:
        """Give each constant slice of a buffer (not itself materialized) a view buffer in
        `buffers`, where the buffer is sliced alike at several places (a stacked cache's
        layers; a lone slice keeps its index arithmetic, and its kernel its code); returns
        view name -> (program buffer, byte offset). A slice of a view is a view of the same
        buffer."""
        views: dict[str, tuple[str, Expr]] = {}
        taken = {b.name for b in buffers.values()}
        candidates = [op for op in graph.ops if _constant_slice(op, buffers)]
        starts: dict[tuple[Any, ...], set[int]] = {}
        for op in candidates:
            starts.setdefault(_slice_family(op), set()).add(op.attrs["start"])
        for op in candidates:
            if len(starts[_slice_family(op)]) < 2:
                continue
            start, step, dim = op.attrs["start"], op.attrs["step"], op.attrs["dim"]
            base = buffers[op.operands[0]]
            root, offset = views.get(base.name, (base.name, ex.Const(0)))
            strides = list(base.strides)
            offset = ex.add(offset, ex.mul(ex.Const(start * base.dtype.itemsize), strides[dim]))
            strides[dim] = ex.mul(strides[dim], ex.Const(step))
            name = f"{root}_v{len(views)}"
            while name in taken:
                name += "_"
            taken.add(name)
            buffers[op.result] = lp.Buffer(name, base.dtype, op.result.shape, tuple(strides))
            views[name] = (root, offset)
        return views

    def _conv_kernel(self, op: Op, buffers: dict[Value, lp.Buffer]) -> bool:
        """Whether `op`'s kernel is a convolution (with an epilogue) to block."""
        if not (self.simd_conv and self.conv_kernels):
            return False
        return op.name == "conv" or (get_op(op.name).category == "elementwise"
                                     and fused_product(op, set(buffers), "conv") is not None)

    def _lower_root(self, name: str, op: Op, buffers: dict[Value, lp.Buffer], symbols: tuple[Var, ...],
                    temps: list[lp.Buffer], cpu: CpuInfo) -> lp.Kernel:
        """One kernel for `op`; workspace it asks for (`KernelBuilder.scratch`) joins `temps`."""
        kb = KernelBuilder(name, buffers)
        kb.split_concats = self.split_concats
        out = buffers[op.result]
        qop = fused_product(op, set(buffers), "qlinear")
        attn = (op, []) if op.name == "attention" else fused_through_views(op, set(buffers), {"attention"})
        if attn is not None:
            tiles = (tile_plan(cpu.lanes(dt.f32), cpu.vector_registers(), 16)
                     if self.simd_attention and self.attention_tiles else None)
            body = build_attention(kb, attn[0], out, self.attention_block_q, self.attention_block_k,
                                   self.attention_rows, attn[1], tiles)
        elif qop is not None:  # (the convolution and quantized-product builders load when a graph has one)
            from .quant.qlinear_forms import build_qlinear, plain_qlinear

            body = build_qlinear(kb, op, qop, out, cpu, tile_rows=self.qlinear_tile_rows) \
                if self.simd_qlinear else plain_qlinear(kb, op, qop, out, grouped=True)
        elif op.name == "matmul" or (get_op(op.name).category == "elementwise" and fused_matmul(op, set(buffers))):
            body = gemm_root(kb, op, out, cpu, self.gemm_options())
        elif self._conv_kernel(op, buffers) and (conv := _conv_root(kb, op, out, cpu)) is not None:
            body = conv
        elif (op.name == "conv_grad_weight" and self.simd_conv and self.conv_kernels
              and (gw := _grad_weight_root(kb, op, out, cpu)) is not None):
            body = gw
        elif op.name in ROOT_RULES:
            body = ROOT_RULES[op.name](kb, op, out)
        else:
            body = kb.element_root(op, out)
        temps.extend(kb.scratch_buffers)
        params = tuple(kb.used_buffers.values())
        # Outputs last, inputs first: a stable, readable order.
        params = tuple(sorted(params, key=lambda b: b.name == out.name))
        kernel_symbols = _used_symbols(params, body, symbols) if symbols else ()
        attrs: tuple[tuple[str, str], ...] = (("origin", "; ".join(kb.origins)),) if kb.origins else ()
        attrs += tuple(kb.attrs.items())
        return lp.Kernel(name, params, kernel_symbols, body, attrs)


def _inplace_writes(graph: Graph, fused: bool) -> dict[Op, Value]:
    """The ops marked `inplace` that may store into their `self` input (module docstring),
    each with that input; the mark is dropped from the others."""
    inputs = set(graph.tensor_inputs())
    users = graph.users()
    found: dict[Op, Value] = {}
    for op in graph.ops:
        if not op.attrs.get("inplace"):
            continue
        x = op.operands[0]
        ok = (op.name in ("index_put", "scatter") and x in inputs and x not in found.values() and x not in graph.outputs
              and not users.get(op.result) and op.result in graph.outputs
              and not op.attrs.get("accumulate", False) and op.attrs.get("reduce", "none") == "none"
              and not any(_reads_inline(v, x, fused) for v in op.operands[1:]))
        if ok:
            found[op] = x
        else:
            op.attrs = {k: v for k, v in op.attrs.items() if k != "inplace"}
    return found


def _reads_inline(v: Value, x: Value, fused: bool) -> bool:
    """Whether computing `v` inside the consuming kernel (fused producers) reads `x`."""
    if v is x:
        return True
    op = v.producer
    if op is None or _is_root(op, fused):
        return False  # an input, or a value another kernel computed before
    return any(_reads_inline(o, x, fused) for o in op.operands)


def _readers_first(calls: list[lp.KernelCall], writers: list[tuple[lp.KernelCall, str]]) -> list[lp.KernelCall]:
    """Move each in-place call (`writers`: the call, the buffer it writes) after the last other
    call that names its buffer, so those calls read the old values. Nothing reads an in-place
    result, so calling it later changes nothing else. Calls are matched by identity: a kernel
    shared by several roots (`dedup`) has several calls of one name."""
    calls = list(calls)
    for writer, buf in writers:
        at = next(i for i, c in enumerate(calls) if c is writer)
        last = max((i for i, c in enumerate(calls) if c is not writer and buf in c.args), default=at)
        if last > at:
            calls.insert(last, calls.pop(at))
    return calls


#: Where a shared kernel's parameters come from (`_places`), and its workspace buffers.
Places = tuple[lp.Kernel, tuple[tuple[str, int], ...], tuple[lp.Buffer, ...]]


def _places(kernel: lp.Kernel, key: RootKey, scratch: list[lp.Buffer]) -> Optional[Places]:
    """Where each parameter of the kernel lowered for `key` comes from: ("edge", i) is the
    root's i-th key buffer, ("scratch", j) its j-th workspace buffer; None when a parameter
    is neither (the kernel is then not shared)."""
    edges = {name: i for i, name in enumerate(key.buffers)}
    own = {b.name: j for j, b in enumerate(scratch)}
    places = []
    for p in kernel.params:
        if p.name in edges:
            places.append(("edge", edges[p.name]))
        elif p.name in own:
            places.append(("scratch", own[p.name]))
        else:
            return None
    return kernel, tuple(places), tuple(scratch)


def _bind(first: Places, key: RootKey, name: str, temps: list[lp.Buffer]) -> tuple[str, ...]:
    """The buffers a copy of the shared kernel is called with: its own key buffers, and
    workspace buffers of its own, named and added to `temps` as its lowering would have."""
    _, places, scratch = first
    own = [replace(b, name=f"{name}_ws{j}") for j, b in enumerate(scratch)]
    temps.extend(own)
    return tuple(key.buffers[i] if where == "edge" else own[i].name for where, i in places)


def _constant_slice(op: Op, buffers: dict[Value, lp.Buffer]) -> bool:
    """Whether `op` slices a buffer at a constant place with a byte address, unmaterialized."""
    if op.name != "slice" or op.operands[0] not in buffers or op.result in buffers:
        return False
    start, step, dim = op.attrs.get("start"), op.attrs.get("step"), op.attrs.get("dim")
    return (all(type(a) is int for a in (start, step, dim)) and start >= 0 and step >= 1
            and buffers[op.operands[0]].dtype.bits % 8 == 0)


def _slice_family(op: Op) -> tuple[Any, ...]:
    """Slices of one family differ only in where they start: views of them share kernels."""
    return (id(op.operands[0]), op.attrs["dim"], op.attrs["step"], op.result.type)


def _call(kernel: str, names: tuple[str, ...], views: dict[str, tuple[str, Expr]]) -> lp.KernelCall:
    """The call of `kernel` with buffers `names`, views passed as their buffer and offset."""
    if not any(n in views for n in names):
        return lp.KernelCall(kernel, names)
    args = tuple(views[n][0] if n in views else n for n in names)
    return lp.KernelCall(kernel, args, tuple(views[n][1] if n in views else None for n in names))


def _used_symbols(params: tuple[lp.Buffer, ...], body: lp.Stmt, symbols: tuple[Var, ...]) -> tuple[Var, ...]:
    """The program symbols a kernel reads (in its parameters' layouts or its body), in order."""
    used: set[str] = set()
    for b in params:
        for d in (*b.shape, *b.strides):
            used |= ex.free_vars(d)
    for s in lp.walk_stmts(body):
        for e in lp.stmt_exprs(s):
            used |= ex.free_vars(e)
    return tuple(v for v in symbols if v.name in used)


def _conv_root(kb: KernelBuilder, op: Op, out: lp.Buffer, cpu: CpuInfo) -> Optional[lp.Stmt]:
    """`loopgen.conv_root.conv_root` (its modules load with the first convolution)."""
    from .loopgen.conv_root import conv_root

    return conv_root(kb, op, out, cpu)


def _grad_weight_root(kb: KernelBuilder, op: Op, out: lp.Buffer, cpu: CpuInfo) -> Optional[lp.Stmt]:
    """`loopgen.conv_grad_weight.grad_weight_root` (loads with the first weight gradient)."""
    from .loopgen.conv_grad_weight import grad_weight_root

    return grad_weight_root(kb, op, out, cpu)
