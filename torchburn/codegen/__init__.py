"""Code generation: loop IR -> native code sources (LLVM IR for CPUs).

    from torchburn.codegen import Target, emit_program, entry_name
    llvm_ir = emit_program(program, Target.host())
"""
from typing import Any

from .errors import CodegenError
from .target import Target

__all__ = ["CodegenError", "Target", "emit_program", "entry_name"]


def __getattr__(name: str) -> Any:
    # The LLVM emitter (and llvmlite.ir) loads on first use: a process whose programs all come
    # from the disk cache needs only `Target`, and is spared importing it.
    if name in ("emit_program", "entry_name"):
        from . import llvm

        return getattr(llvm, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
