"""The reference engine (`TORCHBURN_ENGINE=reference`): the loop IR interpreted on NumPy.

The golden model the other engines are tested against: no llvmlite, no wgpu. `interp.py`
runs a program, `lanes.py` decides which loops run all iterations at once, `entry.py` gives it
the native calling convention (so the launcher is the same) and a NumPy-array front door,
`ops.py` maps each scalar op to `torchburn.ir.semantics`, `values.py` holds dtypes in NumPy.
"""
from __future__ import annotations

from .entry import ReferenceEntry, bind_symbols, run_arrays
from .interp import ExecutionError, ProgramCode, program_code

__all__ = ["ReferenceEntry", "ExecutionError", "ProgramCode", "bind_symbols", "program_code", "run_arrays"]
