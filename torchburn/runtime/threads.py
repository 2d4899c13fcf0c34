"""The thread count of generated parallel loops (TORCHBURN_NUM_THREADS).

Every loaded module with parallel loops has a global `@torchburn_num_threads`
(`codegen/llvm/parallel.py`) that points at one process-wide int, set here; the parallel loops
pass that int to `GOMP_parallel` as the team size, so the setting applies to generated code
only: torch's own thread setting (`omp_set_num_threads`, `torch.set_num_threads`) is never
changed. 0 means the OpenMP runtime's default, which is torch's setting.

The count follows the configuration (`TORCHBURN_NUM_THREADS`), read whenever a module is
loaded; `set_num_threads` changes it for every loaded module at once, and it stays so until
the configured value itself changes (a later module load does not undo it).
"""
from __future__ import annotations

import ctypes
from typing import Callable, Optional

from .config import get_config

#: The global's name, as `codegen/llvm/parallel.py` spells it (not imported from there: the warm
#: path loads cached libraries without importing the compiler; a test checks the two agree).
THREADS_GLOBAL = "torchburn_num_threads"

#: The one thread count all loaded modules read.
_count = ctypes.c_int(0)
#: The configured value last taken into `_count` (None: none yet).
_configured: Optional[int] = None


def num_threads() -> int:
    """The team size generated parallel loops ask for (0: OpenMP's default)."""
    return int(_count.value)


def set_num_threads(n: int) -> None:
    """Set the team size of generated parallel loops, for every loaded module (0: default)."""
    if n < 0:
        raise ValueError(f"number of threads must be >= 0, got {n}")
    _count.value = n


def attach(global_address: Callable[[str], Optional[int]]) -> None:
    """Point a freshly loaded module's `@torchburn_num_threads` at the process's count, after
    taking the count from the configuration if that changed since it was last taken (an
    explicit `set_num_threads` stays). `global_address(name)` gives the address of a global of
    the module, or None when it has none (no parallel loops)."""
    global _configured
    configured = get_config().num_threads
    if configured != _configured:
        _count.value, _configured = configured, configured
    addr = global_address(THREADS_GLOBAL)
    if addr:
        ctypes.c_void_p.from_address(addr).value = ctypes.addressof(_count)
