"""Python's cyclic garbage collector paused over work that allocates many short-lived objects.

Compiling a graph allocates hundreds of thousands of IR nodes, most freed by reference
counting; each full collection meanwhile walks every object of the process (torch,
transformers: millions), which cost about a fifth of the tiny Llama's compile time. The warm
LLM path has the same shape on a smaller scale: mapping the weight cache and pinning a step's
launcher (parsing its source: ~100k AST nodes) set off full collections worth ~0.4 s of a
2 s start. Cycles made while paused are collected afterwards. This module imports nothing
heavy: the warm path uses it without the compiler.
"""
from __future__ import annotations

import contextlib
import gc
import threading
from typing import Iterator

_lock = threading.Lock()
_pausers = 0
_was_enabled = False


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """The collector off inside the block; back on after the last of concurrent or nested
    pauses ends, if it was on before the first."""
    global _pausers, _was_enabled
    with _lock:
        if _pausers == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pausers += 1
    try:
        yield
    finally:
        with _lock:
            _pausers -= 1
            if _pausers == 0 and _was_enabled:
                gc.enable()
