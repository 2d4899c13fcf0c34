"""A short GIL switch interval while a compile has LLVM working in a second thread.

LLVM's thread (`jit.ModuleParts`) spends its time in LLVM, outside the GIL, but every call
into LLVM returns into Python and must take the GIL back from the compiling thread, which runs
the passes and codegen without pause: CPython hands the GIL over only after the switch
interval (5 ms by default). On a training step's graphs (Mistral of the model suite, 134 LLVM
modules) LLVM's thread waited 1.5 s of its 3.5 s for the GIL, and the compile ended waiting
for it; at 0.5 ms it waits 0.4 s, and the graphs' LLVM tail after the last module fell from
1.2-1.3 s to 0.65-0.7 s (2026-12-02). The shorter interval costs the compiling thread
nothing measurable: the GIL is only handed over when another thread asks for it.

The interval is the process's; it is set for the compile and put back after the last of
nested or concurrent compiles ends (as `gc_pause.gc_paused` does with the collector).
"""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Iterator

#: Seconds between the compiling thread's offers of the GIL to LLVM's thread.
COMPILE_SWITCH_INTERVAL = 0.0005

_lock = threading.Lock()
_users = 0
_previous = 0.0


@contextlib.contextmanager
def short_switch_interval(seconds: float = COMPILE_SWITCH_INTERVAL) -> Iterator[None]:
    """`sys.setswitchinterval(seconds)` inside the block (unless the interval is shorter
    already); the interval found before the first of nested or concurrent blocks is put back
    after the last one ends."""
    global _users, _previous
    with _lock:
        if _users == 0:
            _previous = sys.getswitchinterval()
            if seconds < _previous:
                sys.setswitchinterval(seconds)
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                sys.setswitchinterval(_previous)
