"""Program -> LLVM module: one internal function per kernel and one exported entry function.

Entry ABI (the runtime calls this, once per compiled graph):

    void <entry_name(program)>(ptr buffers, ptr symbols, ptr workspace)

- `buffers`: array of data pointers, `program.inputs` then `program.outputs`, in order;
- `symbols`: array of i64, one per `program.symbols`, in order;
- `workspace`: at least `program.workspace_bytes` bytes; temporary `t` lives at
  `workspace + temp_offset(t)` (byte offsets, index expressions in the symbols). May be null
  when the program has no temporaries.

The entry loads the pointers and symbols and calls the kernels in `program.calls` order; an
argument passed as a view (`call @k(%cache offset 4096)`) is its buffer's pointer plus the
byte offset.

Kernels equal up to names and provenance (the same structural hash: a transformer's layers
give the same kernels again) share one function, so codegen and LLVM do their work once
(`dedup-kernels` already merged most of them before the loop passes). Kernel functions are
`noinline`: the entry stays a list of calls, and LLVM's time grows with the distinct kernels.

Kernel functions take their parameters as pointers followed by their `symbols` as i64, bound
by name to the program's symbols. Aliasing contract: a buffer a kernel writes never overlaps
any other buffer passed to the same call (outputs and temps never alias inputs; memory
planning never hands the same bytes to two buffers one kernel touches). Under that contract
every parameter is `noalias`: LLVM's noalias only constrains memory that is *modified*, so two
read-only parameters bound to the same tensor are still fine. Where a call passes one program
buffer to two parameters and one of them is written (an in-place kernel), those parameters
lose `noalias`. Parameters a kernel never writes are marked `readonly`.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterator

import llvmlite.ir as ir

from ...ir import loop as lp
from ..errors import CodegenError
from ..target import Target
from .bounds import BOUNDS_GLOBAL, bounds_global
from .context import ModuleContext, symbol_name
from .faults import FAULT_GLOBAL, fault_global
from .expr import ExprEmitter
from .function import BufferRef, FunctionState, Scope
from .stmt import StmtEmitter
from .parallel import THREADS_GLOBAL, thread_count_global
from .types import I8, I64, PTR, VOID, reg_type

#: Globals the loader points at the process's own (`runtime/faults.py`, `threads.py`, the
#: bounds record): each module that uses one defines it; a program in parts defines each once.
_LOADER_GLOBALS = {FAULT_GLOBAL: fault_global, THREADS_GLOBAL: thread_count_global, BOUNDS_GLOBAL: bounds_global}


def entry_name(program: lp.Program) -> str:
    """The exported symbol of a program's entry function."""
    return f"torchburn_{symbol_name(program.name)}"


def kernel_function_name(program_name: str, kernel_name: str) -> str:
    """The symbol of a kernel's function in the program's module."""
    return f"{symbol_name(program_name)}.{symbol_name(kernel_name)}"


def emit_program(program: lp.Program, target: Target, bounds_check: bool = False) -> str:
    """LLVM IR text of one module holding all kernels of `program` and its entry function;
    with `bounds_check`, every load and store is checked against its buffer (`bounds.py`)."""
    text = str(build_module(program, target, bounds_check).module)
    return text + _BF16_RUNTIME if "bfloat" in text else text


#: compiler-rt's f32 -> bf16 rounding, defined by every module that has `bfloat` values. A CPU
#: without bf16 instructions computes a `bfloat` operation the IR leaves (a `select` LLVM
#: formed, an `fadd` a pass folded) in f32, and LLVM's code generator rounds the result back
#: with a call to `__truncsfbf2`, added after the IR is optimized, which neither this process
#: nor libgcc before GCC 13 provides. The module's own definition (hidden: never exported
#: from a shared library) binds it; integer operations only (a `fptrunc` here would call
#: itself), rounding to nearest even with NaN to 0x7FC0, as `halfconv.from_f32` and torch.
_BF16_RUNTIME = """
define hidden bfloat @__truncsfbf2(float %x) nounwind {
  %bits = bitcast float %x to i32
  %high = lshr i32 %bits, 16
  %odd = and i32 %high, 1
  %bias = add i32 %odd, 32767
  %rounded = add i32 %bits, %bias
  %top = lshr i32 %rounded, 16
  %top16 = trunc i32 %top to i16
  %nan = fcmp uno float %x, 0.0
  %result = select i1 %nan, i16 32704, i16 %top16
  %bf = bitcast i16 %result to bfloat
  ret bfloat %bf
}
"""


def emit_program_parts(program: lp.Program, target: Target, bounds_check: bool = False) -> Iterator[str]:
    """`emit_program` as several modules, yielded one at a time so that LLVM can work on one
    while the next is emitted (`runtime.jit.ModuleParts`): one per distinct kernel (its function
    `hidden`: visible to the other modules, never exported from a shared library), then the
    entry's, which declares the kernels and defines the globals the loader repoints, then the
    bf16 helper where a module has `bfloat` values. Linked, they are the module
    `emit_program` builds, less what LLVM's interprocedural passes could do across kernels
    (kernels are `noinline` and the entry passes them run-time values)."""
    unsafe = _aliased_params(program)
    parts = PartEmitter(program, target, bounds_check)
    for names in _identical_kernels(program):
        shared_unsafe = set().union(*(unsafe[n] for n in names))
        text = parts.kernel(program.kernel(names[0]), shared_unsafe)
        for n in names[1:]:
            parts.kernel(program.kernel(n), shared_unsafe)
        if text is not None:
            yield text
    yield from parts.entry(program)


class PartEmitter:
    """The modules of `emit_program_parts`, a kernel at a time as its loop passes finish (the
    driver hands each kernel over as soon as it has one, so LLVM's thread starts on the first
    kernel while the passes run on the next):

        parts = PartEmitter(program, target)   # the program after the loop-level lowering
        for kernel in kernels_after_their_loop_passes:
            text = parts.kernel(kernel)        # None: a kernel equal to one emitted before
        texts = parts.entry(final_program)     # the entry's module (and the bf16 helper)

    A kernel equal to one emitted before (structural hash) calls that function where its own
    calls' aliasing allows the other's `noalias` parameters; `emit_program_parts`, which knows
    every kernel beforehand, gives each group the union of its members' aliased parameters."""

    def __init__(self, program: lp.Program, target: Target, bounds_check: bool = False) -> None:
        self.name, self.target, self.bounds_check = program.name, target, bounds_check
        self._calls: dict[str, list[lp.KernelCall]] = defaultdict(list)
        for call in program.calls:
            self._calls[call.kernel].append(call)
        #: structural hash -> (aliased parameter positions, the function's name and type)
        self._functions: dict[str, list[tuple[set[int], tuple[str, ir.FunctionType]]]] = {}
        #: kernel name -> (the kernel as emitted, its function's name and type)
        self.declared: dict[str, tuple[lp.Kernel, tuple[str, ir.FunctionType]]] = {}
        self._loader_globals: set[str] = set()
        self._needs_bf16 = False

    def kernel(self, kernel: lp.Kernel, unsafe: "set[int] | None" = None) -> "str | None":
        """The module of `kernel`'s function, or None where an equal kernel's serves it.
        `unsafe`: the parameter positions that must not be `noalias` (default: those its own
        calls alias)."""
        from ...ir.hashing import structural_hash

        if unsafe is None:
            unsafe = _aliased_positions(kernel, self._calls[kernel.name])
        key = structural_hash(kernel)
        for positions, function in self._functions.get(key, ()):
            if unsafe <= positions:
                self.declared[kernel.name] = (kernel, function)
                return None
        ctx = ModuleContext(f"{self.name}.{kernel.name}", self.target, self.bounds_check)
        fn = _emit_kernel(ctx, self.name, kernel, unsafe, linkage="hidden")
        function = (fn.name, fn.function_type)
        self._functions.setdefault(key, []).append((set(unsafe), function))
        self.declared[kernel.name] = (kernel, function)
        self._loader_globals |= _declare_loader_globals(ctx.module)
        text = str(ctx.module)
        self._needs_bf16 = self._needs_bf16 or "bfloat" in text
        return MICRO_KERNEL_MARK + text if has_micro_kernel(kernel) else text

    def covers(self, program: lp.Program) -> bool:
        """Whether every kernel of `program` was handed over, unchanged since (the same object)."""
        return (len(self.declared) == len(program.kernels)
                and all(self.declared.get(k.name, (None,))[0] is k for k in program.kernels))

    def entry(self, program: lp.Program) -> list[str]:
        """The entry's module for the final `program` (memory planned), and the bf16 helper
        where a module has `bfloat` values; every kernel must have been handed over."""
        if not self.covers(program):
            raise CodegenError(f"program @{program.name}: entry emitted before all its kernels")
        ctx = ModuleContext(program.name, self.target, self.bounds_check)
        functions: dict[str, ir.Function] = {}
        for n, (_, (name, fn_type)) in self.declared.items():
            existing = ctx.module.globals.get(name)
            if not isinstance(existing, ir.Function):
                existing = ir.Function(ctx.module, fn_type, name)
                existing.linkage = "hidden"
            functions[n] = existing
        for name in sorted(self._loader_globals):
            _LOADER_GLOBALS[name](ctx.module)
        _emit_entry(ctx, program, functions)
        text = str(ctx.module)
        return [text, _BF16_RUNTIME] if self._needs_bf16 or "bfloat" in text else [text]


#: The first line of a part whose kernel is a register-blocked product (`runtime/jit.py`
#: optimizes it at `MICRO_KERNEL_OPT_LEVEL`).
MICRO_KERNEL_MARK = "; torchburn: micro-kernel\n"
#: Kernel attributes of the register-blocked products (`passes/loopgen`: matmul, qlinear, conv).
_MICRO_KERNEL_ATTRS = ("gemm", "qlinear", "conv")


def has_micro_kernel(kernel: lp.Kernel) -> bool:
    """Whether the kernel is a register-blocked product (its attributes say which)."""
    return any(name in _MICRO_KERNEL_ATTRS for name, _ in kernel.attrs)


def _declare_loader_globals(module: ir.Module) -> set[str]:
    """Turn the module's definitions of the globals the loader repoints (`@torchburn_fault`,
    `@torchburn_num_threads`, `@torchburn_bounds`) into declarations, so a program in parts
    defines each once (in the entry's module); returns the names found."""
    found = set()
    for name in _LOADER_GLOBALS:
        g = module.globals.get(name)
        if isinstance(g, ir.GlobalVariable):
            g.initializer = None
            found.add(name)
    return found


def build_module(program: lp.Program, target: Target, bounds_check: bool = False) -> ModuleContext:
    """Build the llvmlite module (kept for callers that inspect it before printing)."""
    ctx = ModuleContext(program.name, target, bounds_check)
    unsafe = _aliased_params(program)
    groups = _identical_kernels(program)
    functions: dict[str, ir.Function] = {}
    for names in groups:
        first = program.kernel(names[0])
        shared_unsafe = set().union(*(unsafe[n] for n in names))  # every call's aliasing holds
        fn = _emit_kernel(ctx, program.name, first, shared_unsafe)
        for n in names:
            functions[n] = fn
    _emit_entry(ctx, program, functions)
    return ctx


def _identical_kernels(program: lp.Program) -> list[list[str]]:
    """The kernels' names grouped by structural hash (names and `origin` ignored: parameters
    and symbols correspond by position), in program order."""
    from ...ir.hashing import structural_hash

    groups: dict[str, list[str]] = {}
    for k in program.kernels:
        groups.setdefault(structural_hash(k), []).append(k.name)
    return list(groups.values())


def written_buffers(body: lp.Stmt) -> set[str]:
    """Names of the buffers a statement tree stores to."""
    return {s.buffer for s in lp.walk_stmts(body) if isinstance(s, lp.Store)}


def _aliased_params(program: lp.Program) -> dict[str, set[int]]:
    """Per kernel, the parameter positions that may share memory with a parameter being written
    (the same program buffer passed twice to one call) and so must not be `noalias`."""
    calls: dict[str, list[lp.KernelCall]] = defaultdict(list)
    for call in program.calls:
        calls[call.kernel].append(call)
    unsafe: dict[str, set[int]] = defaultdict(set)
    for name, its_calls in calls.items():
        positions = _aliased_positions(program.kernel(name), its_calls)
        if positions:
            unsafe[name] = positions
    return unsafe


def _aliased_positions(kernel: lp.Kernel, calls: "list[lp.KernelCall]") -> set[int]:
    """`_aliased_params` of one kernel, given its calls."""
    if not calls:
        return set()
    written = written_buffers(kernel.body)
    unsafe: set[int] = set()
    for call in calls:
        positions: dict[str, list[int]] = defaultdict(list)
        for pos, arg in enumerate(call.args):
            positions[arg].append(pos)
        for same in positions.values():
            if len(same) > 1 and any(kernel.params[p].name in written for p in same if p < len(kernel.params)):
                unsafe.update(same)
    return unsafe


def _emit_kernel(ctx: ModuleContext, program_name: str, kernel: lp.Kernel, unsafe: set[int],
                 linkage: str = "internal") -> ir.Function:
    arg_types = [PTR] * len(kernel.params) + [reg_type(v.type) for v in kernel.symbols]
    fn = ir.Function(ctx.module, ir.FunctionType(VOID, arg_types), kernel_function_name(program_name, kernel.name))
    # ("hidden" is a visibility, not a linkage; llvmlite writes it where the linkage goes,
    # `define hidden void @...`, which is what LLVM reads)
    fn.linkage = linkage
    fn.attributes.add("nounwind")
    # A kernel is a whole loop nest called once per call site: inlining it into the entry gains
    # nothing and would make LLVM's work grow with the number of calls, not of distinct kernels.
    fn.attributes.add("noinline")
    attrs = dict(kernel.attrs)
    fs = FunctionState(ctx, fn, contract="contract" in attrs.get("fastmath", ""),
                       prefetch=parse_prefetch(attrs.get("prefetch", "")))
    written = written_buffers(kernel.body)
    scope = Scope()
    for pos, (param, arg) in enumerate(zip(kernel.params, fn.args)):
        if param.scope != "global":
            raise CodegenError(f"kernel @{kernel.name}: parameter %{param.name} has scope {param.scope!r}")
        arg.name = param.name
        noalias = pos not in unsafe
        readonly = param.name not in written
        if noalias:
            arg.attributes.add("noalias")
        if readonly:
            set.add(arg.attributes, "readonly")  # llvmlite's list of parameter attributes lacks it
        scope.buffers[param.name] = BufferRef(param, arg, noalias, readonly)
    for sym, arg in zip(kernel.symbols, fn.args[len(kernel.params):]):
        arg.name = sym.name
        scope.vars[sym.name] = arg
    StmtEmitter(fs).emit(kernel.body, scope)
    fs.finish()
    return fn


def _emit_entry(ctx: ModuleContext, program: lp.Program, functions: dict[str, ir.Function]) -> None:
    fn = ir.Function(ctx.module, ir.FunctionType(VOID, [PTR, PTR, PTR]), entry_name(program))
    fn.attributes.add("nounwind")
    buffers_arg, symbols_arg, workspace_arg = fn.args
    buffers_arg.name, symbols_arg.name, workspace_arg.name = "buffers", "symbols", "workspace"
    fs = FunctionState(ctx, fn)
    b = fs.builder
    scope = Scope()
    for k, sym in enumerate(program.symbols):
        if reg_type(sym.type) != I64:
            raise CodegenError(f"program symbol {sym.name} has type {sym.type}; symbols are i64")
        ptr = b.gep(symbols_arg, [ir.Constant(I64, k)], inbounds=True, source_etype=I64)
        scope.vars[sym.name] = b.load(ptr, name=symbol_name(sym.name), typ=I64, align=8)

    pointers: dict[str, ir.Value] = {}
    for k, buf in enumerate((*program.inputs, *program.outputs)):
        ptr = b.gep(buffers_arg, [ir.Constant(I64, k)], inbounds=True, source_etype=PTR)
        pointers[buf.name] = b.load(ptr, name=symbol_name(buf.name), typ=PTR, align=8)
    offsets = dict(program.temp_offsets)
    for buf in program.temps:
        if buf.name not in offsets:
            raise CodegenError(f"temporary %{buf.name} has no workspace offset (run memory planning)")
        offset = ExprEmitter(fs, scope).index_value(offsets[buf.name])
        pointers[buf.name] = b.gep(workspace_arg, [offset], inbounds=True, source_etype=I8,
                                   name=symbol_name(buf.name))

    for call in program.calls:
        kernel = program.kernel(call.kernel)
        if len(call.args) != len(kernel.params):
            raise CodegenError(f"call @{call.kernel} passes {len(call.args)} buffers to "
                               f"{len(kernel.params)} parameters")
        args = []
        for i, name in enumerate(call.args):
            if name not in pointers:
                raise CodegenError(f"call @{call.kernel}: %{name} is not a buffer of program @{program.name}")
            offset = call.offset(i)
            if offset is None:
                args.append(pointers[name])
            else:  # a view of the buffer (`KernelCall.offsets`)
                byte = ExprEmitter(fs, scope).index_value(offset)
                args.append(b.gep(pointers[name], [byte], inbounds=True, source_etype=I8))
        for sym in kernel.symbols:
            if sym.name not in scope.vars:
                raise CodegenError(f"kernel @{kernel.name} needs symbol {sym.name}, which program "
                                   f"@{program.name} does not have")
            args.append(scope.vars[sym.name])
        b.call(functions[kernel.name], args)
    fs.finish()


def parse_prefetch(text: str) -> dict[str, int]:
    """A kernel's `prefetch` attribute, ``"buffer:bytes[,buffer:bytes]"``, as a dict."""
    out: dict[str, int] = {}
    for item in filter(None, (t.strip() for t in text.split(","))):
        name, _, ahead = item.rpartition(":")
        if not name or not ahead.isdigit():
            raise CodegenError(f"kernel attribute prefetch={text!r}: expected buffer:bytes")
        out[name] = int(ahead)
    return out
