"""Faults of generated code: integer division by zero, recorded instead of trapped.

x86 traps (SIGFPE) on an integer division by zero and on `INT_MIN / -1`, and LLVM calls both
undefined. Eager PyTorch raises `RuntimeError("ZeroDivisionError")` for the first and returns
a wrapped value for the second. So the division emitters (`binary.py`) never divide by 0 or
-1: they divide by a safe divisor and, where a lane's divisor was 0, call

    call void @torchburn.fault.check(i1 %any_zero)     ; inlined: one predictable branch

which, when the flag is set, adds 1 to the process-wide fault counter:

    @torchburn_fault = global ptr @torchburn_fault.default   ; the loader repoints it
    define internal void @torchburn.fault.record() cold noinline {
      %counter = load ptr, ptr @torchburn_fault
      atomicrmw add ptr %counter, i64 1 monotonic
      ret void
    }

The counter is one `int64` of the process (`runtime/faults.py`), shared by every loaded
module, written atomically from any OpenMP thread. A launcher whose program can fault reads
it before and after the native call; when it changed, the call is run again in PyTorch,
which raises eager's own error (or, when another thread's call faulted meanwhile, returns the
right values). The kernel itself carries on with defined values, so a parallel or vectorized
loop needs no early exit.
"""
from __future__ import annotations

import llvmlite.ir as ir

from .context import ModuleContext
from .types import I1, I64, PTR, VOID, lanes_of

#: The global's name (`runtime/faults.py` spells it again: the warm path imports no codegen).
FAULT_GLOBAL = "torchburn_fault"


def fault_global(module: ir.Module) -> ir.GlobalVariable:
    """`@torchburn_fault`, defined on first use: a pointer to an internal counter until the
    loader points it at the process's counter."""
    existing = module.globals.get(FAULT_GLOBAL)
    if isinstance(existing, ir.GlobalVariable):
        return existing
    default = ir.GlobalVariable(module, I64, FAULT_GLOBAL + ".default")
    default.linkage = "internal"
    default.initializer = ir.Constant(I64, 0)
    g = ir.GlobalVariable(module, PTR, FAULT_GLOBAL)
    g.initializer = default
    return g


def _build_record(ctx: ModuleContext, fn: ir.Function) -> None:
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    counter = b.load(fault_global(ctx.module), typ=PTR)
    b.atomic_rmw("add", counter, ir.Constant(I64, 1), "monotonic")
    b.ret_void()


def _build_check(ctx: ModuleContext, fn: ir.Function) -> None:
    record = ctx.helper("torchburn.fault.record", VOID, [], _build_record)
    record.attributes.add("cold")
    record.attributes.add("noinline")
    (hit,) = fn.args
    entry = fn.append_basic_block("entry")
    fault = fn.append_basic_block("fault")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    b.cbranch(hit, fault, done)
    b.position_at_end(fault)
    b.call(record, [])
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()


def record_fault_if(b: ir.IRBuilder, ctx: ModuleContext, hit: ir.Value) -> None:
    """Count a fault when `hit` (an i1, or a vector of i1: any lane) is true."""
    lanes = lanes_of(hit.type)
    if lanes > 1:
        reduce = ctx.intrinsic("llvm.vector.reduce.or", I1, [hit.type], [hit.type])
        hit = b.call(reduce, [hit])
    check = ctx.helper("torchburn.fault.check", VOID, [I1], _build_check)
    check.attributes.add("alwaysinline")
    b.call(check, [hit])
