"""Deep Python work run on one large chunk of CPython's frame stack, so that it does not map and
unmap memory at every call that crosses a chunk boundary.

CPython (3.11 on) keeps the frames of a thread in 16 KiB chunks allocated with `mmap`; a call
that does not fit in the current chunk maps a new one, and its return unmaps it again (CPython
gh-142183: a cache of one spare chunk was merged in March 2026 for 3.15 and backported to 3.13
and 3.14; 3.11 and 3.12 keep the old behaviour). A recursive
walk that keeps descending and returning across one boundary (an IR visitor, a pass manager
below Dynamo's and AOTAutograd's frames) then pays a `mmap`, up to four page faults and a `munmap`
per crossing: the tiny Llama's cold compile made 104,000 such pairs, 0.6 s of system time on
a virtual machine, and whether a run is hit depends only on how deep its caller's stack was.

`run_on_deep_stack(fn, ...)` calls `fn` from a trampoline whose frame is declared half a MiB
deep (its code's `co_stacksize`; the slots are never written), so CPython gives it a chunk of
its own of 1 MiB and everything `fn` calls lands in the other half of that chunk: one `mmap`
per call instead of one per crossing. Pages of the chunk are touched only where frames go. A
call already inside the trampoline, on this thread, goes straight on.
"""
from __future__ import annotations

import sys
import threading
import types
from typing import Any, Callable, TypeVar

T = TypeVar("T")

#: Slots of the trampoline's frame (8 bytes each): just over half of a 1 MiB chunk, since
#: CPython sizes a new chunk as the smallest 16 KiB * 2**k holding the frame plus 1000 slots,
#: which leaves the other ~500 KiB (a few thousand frames) free for the callees.
TRAMPOLINE_SLOTS = 64537

_inside = threading.local()


def _call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    _inside.depth = getattr(_inside, "depth", 0) + 1
    try:
        return fn(*args, **kwargs)
    finally:
        _inside.depth -= 1


def _trampoline() -> Callable[..., Any]:
    if sys.implementation.name != "cpython" or sys.version_info < (3, 11):
        return _call  # no chunked frame stack
    code = _call.__code__.replace(co_stacksize=TRAMPOLINE_SLOTS)
    return types.FunctionType(code, _call.__globals__, "_call_on_deep_stack")


_TRAMPOLINE = _trampoline()


def run_on_deep_stack(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`fn(*args, **kwargs)`, its frames (and its callees') in one large frame-stack chunk."""
    if getattr(_inside, "depth", 0):
        return fn(*args, **kwargs)
    result: T = _TRAMPOLINE(fn, args, kwargs)
    return result
