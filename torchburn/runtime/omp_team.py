"""Giving back a thread's idle OpenMP team, so that one team serves the process.

libgomp keeps a team of worker threads for every thread that has started a parallel region
(torch's intra-op loops and our generated `GOMP_parallel` loops use the same libgomp) and
counts the threads of all teams together.  While that count is above the CPUs it found at
start-up, every waiting thread of every team spins ``gomp_throttled_spin_count_var`` (100)
times instead of ``gomp_spin_count_var`` (300,000) before it sleeps on a futex: one team of 2
threads on 2 CPUs spins between a decode step's hundreds of parallel regions; a second team
(the model loaded, or a step run, in the main thread, then decoding in another) makes every
team sleep and be woken at each region.  On the quiet 2-core machine that was one stream of the
default model at 59 tok/s from a worker thread against 177 from the main thread, which was
not about the thread but about the second team: a worker thread decodes as fast as the
main one once the main thread's team is given back, and the main thread as slowly as a worker
while another thread's team is alive.

`release` gives back the calling thread's team (OpenMP 5's ``omp_pause_resource_all``, soft:
its workers exit; that thread's next parallel region makes a new team, ~0.1 ms), so a thread
that hands the model to another, or finishes a generation, leaves no team behind.

This module imports only the standard library.
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Optional

from .shared_lib import find_libgomp

#: ``omp_pause_soft`` of OpenMP 5's ``omp_pause_resource_t``.
_PAUSE_SOFT = 1


@functools.lru_cache(maxsize=1)
def _loaded_libgomp() -> Optional[ctypes.CDLL]:
    """The libgomp torch and generated code use, if this process has loaded it (RTLD_NOLOAD:
    never loaded here), and only if it has ``omp_pause_resource_all`` (GCC 9 and later)."""
    path = find_libgomp()
    if path is None or not hasattr(os, "RTLD_NOLOAD"):
        return None
    try:
        lib = ctypes.CDLL(path, mode=os.RTLD_NOLOAD | getattr(os, "RTLD_LAZY", 1))
    except OSError:
        return None
    if not hasattr(lib, "omp_pause_resource_all"):
        return None
    lib.omp_pause_resource_all.argtypes = [ctypes.c_int]
    lib.omp_pause_resource_all.restype = ctypes.c_int
    return lib


def release() -> bool:
    """Give back the calling thread's idle OpenMP team (see the module's docstring); whether
    there was a libgomp to ask.  Never call it from inside a parallel region (libgomp refuses)."""
    lib = _loaded_libgomp()
    if lib is None:
        _loaded_libgomp.cache_clear()   # not loaded yet: ask again next time
        return False
    return lib.omp_pause_resource_all(_PAUSE_SOFT) == 0
