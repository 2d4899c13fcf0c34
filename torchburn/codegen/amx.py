"""Permission for AMX tiles: Linux gives a process the tile state only when it asks.

AMX's tile data (8 KiB of registers a thread) is an "XSAVE-enabled feature" that Linux 5.16+
leaves off until the process requests it with `arch_prctl(ARCH_REQ_XCOMP_PERM,
XFEATURE_XTILEDATA)`; the first tile instruction of a process that did not is killed with
SIGILL. The host probe (`target.host_target`) asks once, before any code is compiled for
the host, and keeps the AMX features in the host's description only when the kernel says
yes: where it says no (an older kernel, a seccomp policy, a CPU without AMX), the host
target simply has no AMX and the compiler picks the kernels it would pick on such a CPU.
The permission holds for the whole process and every thread it starts.
"""
from __future__ import annotations

import ctypes
import functools
import logging
import platform
import sys

log = logging.getLogger("torchburn")

#: x86-64 Linux: the `arch_prctl` system call and its "request a dynamic XSTATE feature" code.
SYS_ARCH_PRCTL = 158
ARCH_REQ_XCOMP_PERM = 0x1023
#: The XSTATE component of the tile data (TILEDATA), AMX's registers.
XFEATURE_XTILEDATA = 18


def _syscall(*args: int) -> tuple[int, int]:
    """`syscall(args...)` through libc: (result, errno)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    result = libc.syscall(*(ctypes.c_long(a) for a in args))
    return int(result), ctypes.get_errno()


@functools.lru_cache(maxsize=1)
def request_tiles() -> bool:
    """Whether this process may run AMX tile instructions (asked for once, then remembered)."""
    if sys.platform != "linux" or platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        result, errno = _syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    except (OSError, AttributeError) as err:  # no libc `syscall`
        log.info("AMX: cannot ask for the tile state (%s); compiling without AMX", err)
        return False
    if result != 0:
        log.info("AMX: the kernel refused the tile state (errno %d); compiling without AMX", errno)
        return False
    return True


def without_tiles(features: str) -> str:
    """An LLVM feature string with every AMX feature turned off (`+amx-int8` -> `-amx-int8`)."""
    return ",".join("-" + f[1:] if f.startswith("+amx-") else f for f in features.split(",") if f)
