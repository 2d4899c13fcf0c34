"""Code generation: loop IR -> native code sources (LLVM IR for CPUs, WGSL for GPUs).

    from torchburn.codegen import emit_program, entry_name, host_target
    llvm_ir = emit_program(program, host_target())
"""
from typing import Any

from .errors import CodegenError

__all__ = ["CodegenError", "Target", "TargetError", "emit_program", "entry_name", "host_target", "named_target",
           "runs_here"]

_TARGET_NAMES = ("Target", "TargetError", "host_target", "named_target", "runs_here")


def __getattr__(name: str) -> Any:
    # Everything loads on first use: a process whose programs all come from the disk cache
    # reads the target's name (`target_names`) and is spared the IR and the LLVM emitter.
    if name in ("emit_program", "entry_name"):
        from . import llvm

        return getattr(llvm, name)
    if name in _TARGET_NAMES:
        from . import target

        return getattr(target, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
