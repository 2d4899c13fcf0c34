"""LLVM code generation: a loop-IR `Program` -> LLVM IR text (one module, one entry function).

Modules, in the order a program flows through them: `module` (program, kernels, entry),
`stmt` (statements and loops), `parallel` (OpenMP outlining), `expr` (expressions), and the
tables it uses: `binary`, `mathfuncs`, `reduce`, `casts`, `memory`; `types` maps dtypes to LLVM
types and `helpers` builds internal functions (integer pow, erfinv, digamma).
"""
from . import optable  # noqa: F401  (registers the LLVM interpretation of the scalar ops)
from .module import build_module, emit_program, entry_name

__all__ = ["build_module", "emit_program", "entry_name"]
