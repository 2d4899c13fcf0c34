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


def kernel_function_name(program: lp.Program, kernel: lp.Kernel) -> str:
    return f"{symbol_name(program.name)}.{symbol_name(kernel.name)}"


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
    declared: dict[str, tuple[str, ir.FunctionType]] = {}
    loader_globals: set[str] = set()
    needs_bf16 = False
    for names in _identical_kernels(program):
        ctx = ModuleContext(f"{program.name}.{names[0]}", target, bounds_check)
        shared_unsafe = set().union(*(unsafe[n] for n in names))
        kernel = program.kernel(names[0])
        fn = _emit_kernel(ctx, program, kernel, shared_unsafe, linkage="hidden")
        for n in names:
            declared[n] = (fn.name, fn.function_type)
        loader_globals |= _declare_loader_globals(ctx.module)
        text = str(ctx.module)
        needs_bf16 = needs_bf16 or "bfloat" in text
        yield MICRO_KERNEL_MARK + text if has_micro_kernel(kernel) else text
    ctx = ModuleContext(program.name, target, bounds_check)
    functions: dict[str, ir.Function] = {}
    for n, (name, fn_type) in declared.items():
        existing = ctx.module.globals.get(name)
        if not isinstance(existing, ir.Function):
            existing = ir.Function(ctx.module, fn_type, name)
            existing.linkage = "hidden"
        functions[n] = existing
    for name in sorted(loader_globals):
        _LOADER_GLOBALS[name](ctx.module)
    _emit_entry(ctx, program, functions)
    text = str(ctx.module)
    yield text
    if needs_bf16 or "bfloat" in text:
        yield _BF16_RUNTIME


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
        fn = _emit_kernel(ctx, program, first, shared_unsafe)
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
    unsafe: dict[str, set[int]] = defaultdict(set)
    for call in program.calls:
        kernel = program.kernel(call.kernel)
        written = written_buffers(kernel.body)
        positions: dict[str, list[int]] = defaultdict(list)
        for pos, arg in enumerate(call.args):
            positions[arg].append(pos)
        for same in positions.values():
            if len(same) > 1 and any(kernel.params[p].name in written for p in same if p < len(kernel.params)):
                unsafe[kernel.name].update(same)
    return unsafe


def _emit_kernel(ctx: ModuleContext, program: lp.Program, kernel: lp.Kernel, unsafe: set[int],
                 linkage: str = "internal") -> ir.Function:
    arg_types = [PTR] * len(kernel.params) + [reg_type(v.type) for v in kernel.symbols]
    fn = ir.Function(ctx.module, ir.FunctionType(VOID, arg_types), kernel_function_name(program, kernel))
    # ("hidden" is a visibility, not a linkage; llvmlite writes it where the linkage goes,
    # `define hidden void @...`, which is what LLVM reads)
    fn.linkage = linkage
    fn.attributes.add("nounwind")
    # A kernel is a whole loop nest called once per call site: inlining it into the entry gains
    # nothing and would make LLVM's work grow with the number of calls, not of distinct kernels.
    fn.attributes.add("noinline")
    attrs = dict(kernel.attrs)
    fs = FunctionState(ctx, fn, contract="contract" in attrs.get("fastmath", ""))
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
