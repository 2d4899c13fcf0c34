"""Loop-IR kernel -> one WGSL compute shader.

The `gpu-map` pass has annotated the loops; this module follows the annotations:

- `gpu = "grid"` loops (a perfect nest, outermost first) are flattened onto the invocations of
  the dispatch: invocation `g` computes the element whose row-major position is `g`, and an
  invocation past the end returns (bounds-checked, so nothing is out of range). With
  `gpu_vec = "4"` each invocation computes four consecutive elements of the innermost loop
  with `vec4` loads and stores.
- `gpu = "block"` loops are flattened onto workgroups: one workgroup per output element. A
  reduction nest inside marked `gpu = "threads"` is shared by the workgroup's invocations
  (each strides over the reduction space), followed by a tree reduction in workgroup memory;
  global stores outside it are made by invocation 0.
- `gpu = "gemm"` hands the kernel to the tiled matrix-product template (`gemm.py`).
- `gpu = "attention"` hands it to the flash-attention template (`attention.py`).
- Anything else runs in one invocation (correct, slow).

Every buffer parameter gets accessor functions (`ld_x`, `st_x`, and `ld4_x`/`st4_x` where
vectorized) that hide its storage type (bool lives in `u32`) and binding shape.
"""
from __future__ import annotations

from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ...ir.expr import Const, Expr, Var
from . import ops
from .attention import AttentionEmitter
from .expr import ExprRenderer, Helpers, Rendered
from .gemm import GemmEmitter
from .kernel_state import Access, Local
from .shader import Binding, Grid, KernelShader
from .types import Caps, WgslUnsupported, packed, storage_type, value_type, vec
from .vec4 import runs_of_four

MAX_GROUPS_X = 65535


def loop_nest(s: lp.Stmt, tag: str) -> tuple[list[lp.For], lp.Stmt]:
    """The perfect nest of loops annotated `gpu = tag` starting at `s`, and the body inside."""
    loops: list[lp.For] = []
    while isinstance(s, lp.For) and s.annotation("gpu") == tag:
        loops.append(s)
        s = s.body
    return loops, s


def product(exprs: list[Expr]) -> Expr:
    out: Expr = Const(1)
    for e in exprs:
        out = ex.mul(out, e)
    return out


def stores_to(s: lp.Stmt) -> set[str]:
    return {x.buffer for x in lp.walk_stmts(s) if isinstance(x, lp.Store)}


class KernelEmitter:
    """Emits one kernel (see the module docstring)."""

    def __init__(self, kernel: lp.Kernel, program_symbols: tuple[Var, ...], caps: Caps) -> None:
        self.kernel = kernel
        self.symbols = {v.name for v in program_symbols}
        self.program_symbols = program_symbols
        self.caps = caps
        self.helpers = Helpers()
        self.r = ExprRenderer(caps, self.helpers, self._load, self._var)
        self.params = {b.name: Access(b) for b in kernel.params}
        for name in stores_to(kernel.body):
            if name in self.params:
                self.params[name].written = True
        for b in kernel.params:
            storage_type(b.dtype, caps)  # rejects f64/i64 buffers with a clear message
        for b in kernel.params:
            for d in (*b.shape, *b.strides):
                self.r.nonneg |= ex.free_vars(d)
        for s in lp.walk_stmts(kernel.body):
            if isinstance(s, lp.For) and self.r.is_nonneg(s.start):
                self.r.nonneg.add(s.var.name)
        self.locals: dict[str, Local] = {}
        self.vector_vars: set[str] = set()
        #: The innermost grid loop variable of vectorized code.
        self.vec_var: Optional[str] = None
        #: Vectorized accesses may add multiples of 4 to the variable (`vec4.runs_of_four`; the
        #: blocks form of row kernels, `rows.py`), not only index by it.
        self.vec_offsets = False
        self.block_mode = False
        #: Inside a cooperative reduction loop (global stores there are not guarded).
        self.in_threads = False
        #: Workgroup size of a "groups" kernel.
        self.wg = 1
        self.workgroup_arrays: dict[str, str] = {}
        self.lines: list[str] = []
        self.indent = 1

    # ---- entry -------------------------------------------------------------------------------------
    def emit(self) -> KernelShader:
        body = self.kernel.body
        if isinstance(body, lp.For) and body.annotation("gpu") == "gemm":
            return GemmEmitter(self).emit(body)
        if isinstance(body, lp.For) and body.annotation("gpu") == "attention":
            return AttentionEmitter(self).emit(body)
        grid_loops, inner = loop_nest(body, "grid")
        if grid_loops:
            return self._emit_threads(grid_loops, inner)
        block_loops, inner = loop_nest(body, "block")
        if block_loops or self._has_threads_loop(body):
            return self._emit_groups(block_loops, inner)
        return self._emit_single(body)

    # ---- the three mappings ----------------------------------------------------------------------------
    def _emit_threads(self, loops: list[lp.For], inner: lp.Stmt) -> KernelShader:
        wg = int(loops[0].annotation("gpu_wg") or 256)
        vec4 = loops[0].annotation("gpu_vec") == "4" and self._plan_vec4(loops, inner)
        extents = [f.extent for f in loops]
        if vec4:
            extents[-1] = ex.floordiv(extents[-1], Const(4))
        count = product(extents)
        self.line(f"let tb_g = (wid.y * nwg.x + wid.x) * {wg}u + lid;")
        self.line(f"if (tb_g >= u32({self.r.scalar(count)})) {{ return; }}")
        self.unflatten("tb_g", loops, extents, scale_last=4 if vec4 else 1)
        self.stmt(inner)
        groups = (ex.floordiv(ex.add(count, Const(wg - 1)), Const(wg)), Const(1), Const(1))
        summary = "threads/vec4" if vec4 else "threads"
        return self._finish(Grid(groups, wg, "threads"), wg, summary)

    def _emit_groups(self, loops: list[lp.For], inner: lp.Stmt) -> KernelShader:
        self.block_mode = True
        wg = self._threads_workgroup(inner)
        count = product([f.extent for f in loops])
        self.line("let tb_g = wid.y * nwg.x + wid.x;")
        self.line(f"if (tb_g >= u32({self.r.scalar(count)})) {{ return; }}")
        self.unflatten("tb_g", loops, [f.extent for f in loops])
        self.wg = wg
        self.stmt(inner)
        reduce = sorted({f.annotation("gpu_reduce") or "" for f in lp.walk_stmts(inner)
                         if isinstance(f, lp.For) and f.annotation("gpu_reduce")})
        return self._finish(Grid((count, Const(1), Const(1)), wg, "groups"), wg,
                            "groups/tree-" + "+".join(reduce))

    def _emit_single(self, body: lp.Stmt) -> KernelShader:
        self.line("if (lid != 0u || wid.x != 0u || wid.y != 0u) { return; }")
        self.stmt(body)
        return self._finish(Grid((Const(1), Const(1), Const(1)), 1, "single"), 1, "single")

    def _has_threads_loop(self, s: lp.Stmt) -> bool:
        return any(isinstance(x, lp.For) and x.annotation("gpu") == "threads" for x in lp.walk_stmts(s))

    def _threads_workgroup(self, s: lp.Stmt) -> int:
        sizes = {int(x.annotation("gpu_wg") or 256) for x in lp.walk_stmts(s)
                 if isinstance(x, lp.For) and x.annotation("gpu") == "threads" and x.annotation("gpu_reduce")}
        if len(sizes) > 1:
            raise WgslUnsupported(f"cooperative reductions of one kernel ask for different workgroup sizes {sizes}")
        wg = sizes.pop() if sizes else 64
        if wg & (wg - 1) or wg > self.caps.max_invocations:
            raise WgslUnsupported(f"workgroup size {wg} is not a power of two within the device limit")
        return wg

    def unflatten(self, linear: str, loops: list[lp.For], extents: list[Expr], scale_last: int = 1) -> None:
        """Bind each loop variable from a linear u32 index (row-major, innermost fastest)."""
        cur = linear
        for k in range(len(loops) - 1, -1, -1):
            f = loops[k]
            start = self.r.scalar(f.start)
            if k == 0:
                pos = f"i32({cur})"
            else:
                e = self.r.scalar(extents[k])
                pos = f"i32({cur} % u32({e}))"
                nxt = f"tb_q{k}"
                self.line(f"let {nxt} = {cur} / u32({e});")
            if scale_last != 1 and k == len(loops) - 1:
                pos = f"({pos} * {scale_last}i)"
            if f.start != Const(0):
                pos = f"({start} + {pos})"
            self.line(f"let v_{f.var.name} = {pos};")
            if k != 0:
                cur = f"tb_q{k}"

    # ---- vectorization plan --------------------------------------------------------------------------
    def _plan_vec4(self, loops: list[lp.For], inner: lp.Stmt) -> bool:
        """Decide whether the elementwise body can run on vec4s along the innermost loop:
        every load or store that varies with it must be contiguous there and 16-byte aligned."""
        last = loops[-1]
        if not (isinstance(last.extent, Const) and int(last.extent.value) % 4 == 0) or last.start != Const(0):
            return False
        v = last.var.name
        stmts = inner.stmts if isinstance(inner, lp.Block) else (inner,)
        varying: set[str] = set()
        vec_buffers: set[str] = set()

        def data_varies(e: Expr) -> Optional[bool]:
            """Whether a data expression varies along v; None when it cannot be vectorized."""
            if isinstance(e, Var):
                if e.name == v:
                    return None
                return e.name in varying
            if isinstance(e, ex.Load):
                return load_varies(e.buffer, e.index)
            result = False
            for c in e.children():
                r = data_varies(c)
                if r is None:
                    return None
                result = result or r
            return result

        def load_varies(buffer: str, index: tuple[Expr, ...]) -> Optional[bool]:
            names = set().union(*(ex.free_vars(i) for i in index)) if index else set()
            if v not in names and not (names & varying):
                return False
            if buffer not in self.params or not index:
                return None
            if any(ex.free_vars(i) & varying for i in index):
                return None
            if self.vec_offsets:
                # `g * 16 + j`: four values of j from a multiple of 4 read one aligned vec4
                if not runs_of_four(index, Var(v)):
                    return None
            elif index[-1] != Var(v) or any(v in ex.free_vars(i) for i in index[:-1]):
                return None
            b = self.params[buffer].buffer
            if b.strides[-1] != Const(1):
                return None
            for size, stride in zip(b.shape[:-1], b.strides[:-1]):
                if size == Const(1):
                    continue
                if not (isinstance(stride, Const) and int(stride.value) % 4 == 0):
                    return None
            vec_buffers.add(buffer)
            return True

        for s in stmts:
            if isinstance(s, lp.Let):
                r = data_varies(s.value)
                if r is None:
                    return False
                if r:
                    varying.add(s.var.name)
            elif isinstance(s, lp.Store):
                if s.buffer not in self.params or load_varies(s.buffer, s.index) is not True:
                    return False
                if data_varies(s.value) is None:
                    return False
            else:
                return False
        self.vec_var = v
        self.vector_vars = varying
        for name in vec_buffers:
            self.params[name].vec4 = True
        return True

    # ---- statements ------------------------------------------------------------------------------------
    def line(self, text: str) -> None:
        self.lines.append("  " * self.indent + text)

    def stmt(self, s: lp.Stmt) -> None:
        method = getattr(self, "_stmt_" + type(s).__name__, None)
        if method is None:
            raise WgslUnsupported(f"statement {type(s).__name__} has no WGSL form")
        method(s)

    def _stmt_Block(self, s: lp.Block) -> None:
        for x in s.stmts:
            self.stmt(x)

    def _stmt_Let(self, s: lp.Let) -> None:
        text, _ = self.r.render(s.value)
        self.line(f"let v_{s.var.name} = {text};")
        if s.value.type.dtype == dt.i64 and self.r.is_nonneg(s.value):
            # index arithmetic on known non-negative values (`k % 32` of a loop variable): later
            # divisions by it, or of it, are unsigned, not through the flooring helpers
            self.r.nonneg.add(s.var.name)

    def _stmt_Alloc(self, s: lp.Alloc) -> None:
        b = s.buffer
        size = 1
        for d in b.shape:
            if not isinstance(d, Const):
                raise WgslUnsupported(f"local buffer %{b.name} has a symbolic size")
            size *= int(d.value)
        t = self._local_type(b.dtype)
        self.locals[b.name] = Local(b, size)
        if size == 1:
            self.line(f"var l_{b.name}: {t};")
        else:
            self.line(f"var l_{b.name}: array<{t}, {size}>;")

    def _stmt_Store(self, s: lp.Store) -> None:
        if s.buffer in self.locals:
            self.line(f"{self._local_ref(s.buffer, s.index)} = {self.r.render(s.value)[0]};")
            return
        if s.buffer not in self.params:
            raise WgslUnsupported(f"store to unknown buffer %{s.buffer}")
        acc = self.params[s.buffer]
        value = self.r.render(s.value)
        offset = self.offset(acc.buffer, s.index)
        if acc.vec4 and self._vec_index(s.index):
            text = f"st4_{s.buffer}({offset}, {self.r.splat(value, acc.buffer.dtype, 4)});"
        else:
            text = f"st_{s.buffer}({offset}, {value[0]});"
        if self.block_mode and not self.in_threads:
            text = f"if (lid == 0u) {{ {text} }}"
        self.line(text)

    def _stmt_If(self, s: lp.If) -> None:
        self.line(f"if ({self.r.scalar(s.cond)}) {{")
        self._nested(s.then)
        if s.orelse is not None:
            self.line("} else {")
            self._nested(s.orelse)
        self.line("}")

    def _nested(self, s: lp.Stmt) -> None:
        self.indent += 1
        self.stmt(s)
        self.indent -= 1

    def _stmt_For(self, s: lp.For) -> None:
        if self.block_mode and s.annotation("gpu") == "threads" and s.annotation("gpu_reduce") and not self.in_threads:
            self._cooperative(s)
            return
        v = f"v_{s.var.name}"
        start = self.r.scalar(s.start)
        end = self.r.scalar(ex.add(s.start, s.extent))
        self.line(f"for (var {v}: i32 = {start}; {v} < {end}; {v} = {v} + 1) {{")
        self._nested(s.body)
        self.line("}")

    def _cooperative(self, s: lp.For) -> None:
        """A reduction nest shared by the workgroup, then a tree reduction of the accumulator."""
        loops, body = loop_nest(s, "threads")
        op = s.annotation("gpu_reduce") or ""
        acc = s.annotation("gpu_acc") or ""
        if op not in ops.COMBINE or acc not in self.locals or self.locals[acc].size != 1:
            raise WgslUnsupported(f"cooperative reduction {op!r} over %{acc} is not a scalar accumulator")
        for name in stores_to(body):
            if name not in self.locals:
                raise WgslUnsupported(f"a cooperative reduction loop stores to %{name}")
        wg = self.wg
        extents = [f.extent for f in loops]
        total = self.r.scalar(product(extents))
        self.line(f"for (var tb_r: u32 = lid; tb_r < u32({total}); tb_r = tb_r + {wg}u) {{")
        self.indent += 1
        self.unflatten("tb_r", loops, extents)
        self.in_threads = True
        self.stmt(body)
        self.in_threads = False
        self.indent -= 1
        self.line("}")
        d = self.locals[acc].buffer.dtype
        t = "u32" if d.is_bool else value_type(d, self.caps)
        red = f"tb_red_{t}"
        self.workgroup_arrays[red] = f"var<workgroup> {red}: array<{t}, {wg}>;"
        to_shared = f"select(0u, 1u, l_{acc})" if d.is_bool else f"l_{acc}"
        self.line(f"{red}[lid] = {to_shared};")
        self.line("workgroupBarrier();")
        step = wg // 2
        while step >= 1:
            combined = ops.fill(ops.COMBINE[op], a=f"{red}[lid]", b=f"{red}[lid + {step}u]")
            self.line(f"if (lid < {step}u) {{ {red}[lid] = {combined}; }}")
            self.line("workgroupBarrier();")
            step //= 2
        self.line(f"l_{acc} = {red}[0]{' != 0u' if d.is_bool else ''};")
        self.line("workgroupBarrier();")

    # ---- loads, variables, locals --------------------------------------------------------------------
    def _var(self, v: Var) -> Rendered:
        if v.name in self.symbols:
            return f"tb_u.s_{v.name}", 1
        return f"v_{v.name}", 4 if v.name in self.vector_vars else 1

    def _load(self, e: ex.Load) -> Rendered:
        if e.buffer in self.locals:
            return self._local_ref(e.buffer, e.index), 1
        acc = self.params.get(e.buffer)
        if acc is None:
            raise WgslUnsupported(f"load from unknown buffer %{e.buffer}")
        vec_last = acc.vec4 and self._vec_index(e.index)
        offset = self.offset(acc.buffer, e.index)
        if vec_last:
            return f"ld4_{e.buffer}({offset})", 4
        return f"ld_{e.buffer}({offset})", 1

    def _vec_index(self, index: tuple[Expr, ...]) -> bool:
        """Whether an access of a vec4-planned buffer at `index` reads four elements: its
        innermost index is the vectorized loop variable (or, with `vec_offsets`, reads it)."""
        if self.vec_var is None or not index:
            return False
        if self.vec_offsets:
            return any(self.vec_var in ex.free_vars(i) for i in index)
        return index[-1] == Var(self.vec_var)

    def offset(self, b: lp.Buffer, index: tuple[Expr, ...]) -> str:
        if len(index) != b.ndim:
            raise WgslUnsupported(f"%{b.name} has {b.ndim} dims but is indexed with {len(index)}")
        off: Expr = Const(0)
        for i, (idx, stride) in enumerate(zip(index, b.strides)):
            if b.shape[i] == Const(1):
                continue  # the index of a dimension of size 1 is 0
            off = ex.add(off, ex.mul(idx, stride))
        return self.r.scalar(off)

    def _local_type(self, d: DType) -> str:
        return value_type(d, self.caps)

    def _local_ref(self, name: str, index: tuple[Expr, ...]) -> str:
        loc = self.locals[name]
        if loc.size == 1:
            return f"l_{name}"
        return f"l_{name}[{self.offset(loc.buffer, index)}]"

    # ---- assembly --------------------------------------------------------------------------------------
    def _finish(self, grid: Grid, wg: int, summary: str) -> KernelShader:
        bindings = self.bindings()
        if len(bindings) + self.uses_fault > self.caps.max_storage_buffers:
            raise WgslUnsupported(
                f"kernel @{self.kernel.name} needs {len(bindings) + self.uses_fault} storage buffers; the device allows "
                f"{self.caps.max_storage_buffers} per shader stage")
        source = self.assemble(bindings, wg, self.lines)
        return KernelShader(self.kernel.name, source, bindings, grid, summary)

    def bindings(self) -> tuple[Binding, ...]:
        out = []
        for name, acc in self.params.items():
            el = storage_type(acc.buffer.dtype, self.caps)
            if packed(acc.buffer.dtype, self.caps):
                if acc.written:
                    raise WgslUnsupported(f"kernel @{self.kernel.name} writes %{name}, stored as packed bytes")
                out.append(Binding(name, el, False))  # a word holds four elements: vec4 loads too
                continue
            out.append(Binding(name, vec(el, 4) if acc.vec4 else el, acc.written))
        return tuple(out)

    @property
    def uses_fault(self) -> bool:
        """Whether the shader checks an index (`checked_index`): it then binds the fault flag
        `tb_fault` after its buffers (`KernelShader.fault`)."""
        return any(key.startswith("checked_") for key in self.helpers.sources)

    def declarations(self, bindings: tuple[Binding, ...]) -> list[str]:
        uses_f16 = any("f16" in b.element for b in bindings) or (self.caps.f16 and "f16" in "\n".join(self.lines))
        decl = ["enable f16;"] if uses_f16 else []
        fields = [f"  s_{v.name}: i32," for v in self.program_symbols] or ["  tb_pad: i32,"]
        decl += ["struct TbSymbols {", *fields, "}", "@group(0) @binding(0) var<uniform> tb_u: TbSymbols;"]
        for k, b in enumerate(bindings):
            access = "read_write" if b.writable else "read"
            decl.append(f"@group(0) @binding({k + 1}) var<storage, {access}> b_{b.buffer}: array<{b.element}>;")
        if self.uses_fault:
            decl.append(f"@group(0) @binding({len(bindings) + 1}) var<storage, read_write> tb_fault: array<u32>;")
        decl += list(self.workgroup_arrays.values())
        decl.append(ops.PRELUDE)
        for b in bindings:
            decl += self.accessors(b)
        return decl

    def accessors(self, b: Binding) -> list[str]:
        d = self.params[b.buffer].buffer.dtype
        t = value_type(d, self.caps)
        if packed(d, self.caps):
            return self._byte_accessors(b.buffer, signed=d.kind == "i", vec4=self.params[b.buffer].vec4)
        is_vec = b.element.startswith("vec4")
        scalar_ref = "b_{0}[u32(i) >> 2u][u32(i) & 3u]" if is_vec else "b_{0}[i]"
        scalar_ref = scalar_ref.format(b.buffer)
        out = []
        if d.is_bool:
            out.append(f"fn ld_{b.buffer}(i: i32) -> bool {{ return {scalar_ref} != 0u; }}")
        else:
            out.append(f"fn ld_{b.buffer}(i: i32) -> {t} {{ return {scalar_ref}; }}")
        if is_vec:
            ref4 = f"b_{b.buffer}[u32(i) >> 2u]"
            if d.is_bool:
                out.append(f"fn ld4_{b.buffer}(i: i32) -> vec4<bool> {{ return {ref4} != vec4<u32>(0u); }}")
            else:
                out.append(f"fn ld4_{b.buffer}(i: i32) -> vec4<{t}> {{ return {ref4}; }}")
        if b.writable:
            if d.is_bool:
                out.append(f"fn st_{b.buffer}(i: i32, v: bool) {{ {scalar_ref} = select(0u, 1u, v); }}")
            else:
                out.append(f"fn st_{b.buffer}(i: i32, v: {t}) {{ {scalar_ref} = v; }}")
            if is_vec:
                ref4 = f"b_{b.buffer}[u32(i) >> 2u]"
                if d.is_bool:
                    out.append(f"fn st4_{b.buffer}(i: i32, v: vec4<bool>) {{ {ref4} = select(vec4<u32>(0u), vec4<u32>(1u), v); }}")
                else:
                    out.append(f"fn st4_{b.buffer}(i: i32, v: vec4<{t}>) {{ {ref4} = v; }}")
        return out

    @staticmethod
    def _byte_accessors(name: str, signed: bool, vec4: bool) -> list[str]:
        """Loads of a packed byte buffer (`Caps.packed_bytes`): element `i` is byte `i % 4` of
        word `i / 4`, sign-extended for i8 (`extractBits` of an i32 extends the top bit); a vec4
        load (at a multiple of 4) is one word."""
        word = f"b_{name}[u32(i) >> 2u]"
        if signed:
            out = [f"fn ld_{name}(i: i32) -> i32 {{ return extractBits(bitcast<i32>({word}), (u32(i) & 3u) * 8u, 8u); }}"]
            four = f"(vec4<i32>(bitcast<i32>({word})) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u)"
        else:
            out = [f"fn ld_{name}(i: i32) -> i32 {{ return i32(extractBits({word}, (u32(i) & 3u) * 8u, 8u)); }}"]
            four = f"vec4<i32>((vec4<u32>({word}) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(255u))"
        if vec4:
            out.append(f"fn ld4_{name}(i: i32) -> vec4<i32> {{ return {four}; }}")
        return out

    def assemble(self, bindings: tuple[Binding, ...], wg: int, body: list[str]) -> str:
        head = self.declarations(bindings)
        helpers = self.helpers.text()
        main = [f"@compute @workgroup_size({wg})",
                "fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>,",
                "        @builtin(num_workgroups) nwg: vec3<u32>) {",
                *body, "}"]
        parts = [f"// torchburn kernel @{self.kernel.name}", *head]
        if helpers:
            parts.append(helpers)
        parts += main
        return "\n".join(parts) + "\n"
