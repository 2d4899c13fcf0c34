"""The process-wide fault counter of generated code (integer division by zero, and accesses
out of range under `TORCHBURN_DEBUG=bounds`).

Generated code never executes a division by zero: where a divisor is 0 it adds 1 to a
counter and carries on with a defined value (`codegen/llvm/faults.py`). Every loaded module's
global `@torchburn_fault` points at the one counter here; the reference engine adds to it too
(`runtime/reference/entry.py`). A launcher whose program can fault compares the counter
before and after its native call (`backend/launcher_gen.py`) and, when it moved, runs the call
again in PyTorch, which raises eager's own error. The counter only grows, so concurrent calls
never hide each other's faults; a call that sees another's fault merely runs in PyTorch once.

Bounds mode (`TORCHBURN_DEBUG=bounds`, `codegen/llvm/bounds.py`): every load and store is
checked against its buffer's extent; an access out of range is not made (a load reads 0) and
is recorded in `bounds_record` (`@torchburn_bounds` points there): the first one's place
(kernel and buffer, as a C string in the module), element offset and the buffer's extent. It
also moves the counter, and the launcher then raises `OutOfBounds` with those details instead
of running the call in PyTorch. With several threads faulting at once, the first record wins
and the call that finds it raises.
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

#: The global's name, as `codegen/llvm/faults.py` spells it (not imported from there: the warm
#: path loads cached libraries without importing the compiler; a test checks the two agree).
FAULT_GLOBAL = "torchburn_fault"

#: The counter every loaded module adds to. Launchers read `counter.value`.
counter = ctypes.c_int64(0)


#: The global the bounds checks write through, as `codegen/llvm/bounds.py` spells it.
BOUNDS_GLOBAL = "torchburn_bounds"


class BoundsRecord(ctypes.Structure):
    """The first access out of range since the last `take_out_of_bounds` (count 0: none)."""

    _fields_ = [("count", ctypes.c_int64), ("where", ctypes.c_void_p), ("index", ctypes.c_int64),
                ("extent", ctypes.c_int64)]


bounds_record = BoundsRecord()


class OutOfBounds(IndexError):
    """Generated code, in bounds mode, found an access outside its buffer (and did not make it)."""


def take_out_of_bounds() -> "OutOfBounds | None":
    """The error for the recorded access out of range, clearing the record; None if none."""
    r = bounds_record
    if not r.count:
        return None
    where = ctypes.string_at(r.where).decode("utf-8", "replace") if r.where else "generated code"
    err = OutOfBounds(f"{where}: element {r.index} is out of range (the buffer spans {r.extent} elements; "
                      f"{r.count} access(es) out of range)")
    r.count = 0
    return err


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
    addr = global_address(BOUNDS_GLOBAL)
    if addr:
        ctypes.c_void_p.from_address(addr).value = ctypes.addressof(bounds_record)
