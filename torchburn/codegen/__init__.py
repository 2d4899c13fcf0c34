"""Code generation: loop IR -> native code sources (LLVM IR for CPUs).

    from torchburn.codegen import Target, emit_program, entry_name
    llvm_ir = emit_program(program, Target.host())
"""
from .errors import CodegenError
from .llvm import emit_program, entry_name
from .target import Target

__all__ = ["CodegenError", "Target", "emit_program", "entry_name"]
