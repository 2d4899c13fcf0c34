"""KV caches owned by requests, so that one `LLM` serves many callers.

Every `LLM.generate_ids` run holds a `KVCache` of its own from its prefill to its last step:
two requests never write the same slots, whether they run on two threads or as two generators
interleaved on one thread (two ``llm.stream(...)`` iterators advanced in turn).  A finished
request hands its cache back; the pool keeps the last ``keep`` idle caches for the next request
(one, as before: a lone caller allocates its cache once and reuses it), and makes a new cache
only while more requests run at once than it holds idle.  Nothing is copied per token: a
request steps its own cache in place, exactly as a lone request did.

The pool's bookkeeping is guarded by a lock; the steps themselves are serialized by the
engine (`LLM.run_step`), not here.
"""
from __future__ import annotations

import threading
from typing import Callable

from ..model.kv_cache import KVCache


class KVPool:
    """Idle KV caches by batch size, handed out one request at a time."""

    def __init__(self, make: Callable[[int], KVCache], keep: int = 1) -> None:
        self._make = make
        self._keep = keep
        self._idle: list[tuple[int, KVCache]] = []   # (batch, cache), most recently released last
        self._lock = threading.Lock()

    def acquire(self, batch: int) -> KVCache:
        """A cache for ``batch`` rows that no other request holds (an idle one, else a new one)."""
        with self._lock:
            for i in range(len(self._idle) - 1, -1, -1):
                if self._idle[i][0] == batch:
                    return self._idle.pop(i)[1]
        return self._make(batch)

    def release(self, batch: int, cache: KVCache) -> None:
        """``cache`` is free again; the oldest idle caches beyond ``keep`` are dropped."""
        with self._lock:
            if any(c is cache for _, c in self._idle):
                return
            self._idle.append((batch, cache))
            del self._idle[:max(len(self._idle) - self._keep, 0)]

    def idle(self) -> list[KVCache]:
        """The idle caches (oldest first)."""
        with self._lock:
            return [c for _, c in self._idle]

    def clear(self) -> None:
        """Drop every idle cache (the model changed shape, e.g. split for tensor parallelism)."""
        with self._lock:
            self._idle.clear()
