"""`PrefixCache`: the last few prompts' keys and values, so that a prompt sharing a prefix with
one of them (the same system prompt, an earlier turn of the same chat) prefills only the rest.

Each entry is a batch-1 `KVCache` whose slots ``0 .. len(ids)`` hold the keys and values of
``ids`` at positions ``0 ..``: a prompt is prefilled into an entry from the first token where
it differs from what the entry holds, then copied into the request's row of the `BatchCache`.
The entry kept is the one sharing the longest prefix (else the least recently used), so
prefix reuse costs nothing but the entries' memory (the pages a prompt touched).
"""
from __future__ import annotations

from typing import Callable, Sequence

from ..model.kv_cache import KVCache
from .session import common_prefix


class PrefixEntry:
    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.ids: list[int] = []     # ids whose keys and values sit at slots 0 .. len(ids)
        self.used = 0                # a clock value: the larger, the more recently used


class PrefixCache:
    """Up to ``size`` batch-1 caches of recent prompts (``size`` 0: none kept; each prompt is
    prefilled whole into one scratch cache)."""

    def __init__(self, make: Callable[[], KVCache], size: int) -> None:
        if size < 0:
            raise ValueError(f"the prefix cache size must be >= 0; got {size}")
        self._make = make
        self.size = size
        self.entries: list[PrefixEntry] = []
        self._clock = 0
        #: Prompt tokens that came from an entry rather than from a prefill.
        self.reused_tokens = 0

    def best(self, ids: Sequence[int]) -> tuple[PrefixEntry | None, int]:
        """The entry sharing the longest prefix with ``ids`` (the least recently used among
        equals: the one to replace when none shares any), and that length; nothing changes (a
        batched prefill copies the entry's first slots, `Scheduler._held_together`)."""
        best, shared = None, 0
        for e in self.entries:
            n = common_prefix(e.ids, ids)
            if best is None or n > shared or (n == shared and e.used < best.used):
                best, shared = e, n
        return best, shared

    def held(self, ids: Sequence[int]) -> int:
        """How many first ids of ``ids`` an entry holds (nothing changes)."""
        return self.best(ids)[1]

    def take(self, ids: Sequence[int], align: int = 1) -> tuple[PrefixEntry, int]:
        """The entry to prefill ``ids`` into and how many of its first ids it already holds
        (at most ``len(ids) - 1``: the last token is always run, for its logits). Short of
        that, the count is a multiple of ``align``: an aligned prefill (`Scheduler`'s batch
        invariant one) starts at a chunk boundary."""
        self._clock += 1
        best, shared = self.best(ids)
        if best is None or (shared == 0 and len(self.entries) < max(self.size, 1)):
            best, shared = PrefixEntry(self._make()), 0
            self.entries.append(best)
        best.used = self._clock
        shared = min(shared, len(ids) - 1)
        if shared < len(ids) - 1:
            shared -= shared % align
        best.ids = list(ids[:shared])   # what it holds until the prefill fills the rest
        self.reused_tokens += shared
        return best, shared

    def keep(self, ids: Sequence[int], source: KVCache, row: int, first: int) -> None:
        """Keep the keys and values of ``ids``, which sit at slots ``first ..`` of ``source``'s
        ``row`` (a batched prefill's), in an entry (a new one, else the least recently used)."""
        if not self.size or not ids:
            return
        self._clock += 1
        if len(self.entries) < self.size:
            entry = PrefixEntry(self._make())
            self.entries.append(entry)
        else:
            entry = min(self.entries, key=lambda e: e.used)
        entry.used = self._clock
        entry.cache.tensor[:, 0, :, :len(ids)].copy_(source.tensor[:, row, :, first:first + len(ids)])
        entry.ids = list(ids)

    def filled(self, entry: PrefixEntry, ids: Sequence[int]) -> None:
        """``entry`` now holds the keys and values of ``ids``; with no cache kept, forget them."""
        entry.ids = list(ids) if self.size else []
