"""The process-wide fault counter of generated code (integer division by zero).

Generated code never executes a division by zero: where a divisor is 0 it adds 1 to a
counter and carries on with a defined value (`codegen/llvm/faults.py`). Every loaded module's
global `@torchburn_fault` points at the one counter here; the reference engine adds to it too
(`runtime/reference/entry.py`). A launcher whose program can fault compares the counter
before and after its native call (`backend/launcher_gen.py`) and, when it moved, runs the call
again in PyTorch, which raises eager's own error. The counter only grows, so concurrent calls
never hide each other's faults; a call that sees another's fault merely runs in PyTorch once.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

#: The global's name, as `codegen/llvm/faults.py` spells it (not imported from there: the warm
#: path loads cached libraries without importing the compiler; a test checks the two agree).
FAULT_GLOBAL = "torchburn_fault"

#: The counter every loaded module adds to. Launchers read `counter.value`.
counter = ctypes.c_int64(0)


def record() -> None:
    """Count one fault (for engines that are not native code)."""
    counter.value += 1


def attach(global_address: Callable[[str], Optional[int]]) -> None:
    """Point a freshly loaded module's `@torchburn_fault` at the process's counter.
    `global_address(name)` gives the address of a global of the module, or None when it has
    none (no division that can fault)."""
    addr = global_address(FAULT_GLOBAL)
    if addr:
        ctypes.c_void_p.from_address(addr).value = ctypes.addressof(counter)
