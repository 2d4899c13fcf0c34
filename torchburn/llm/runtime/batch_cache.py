"""`BatchCache`: one KV cache of ``rows`` rows that running requests share, one row each.

The engine's decode step runs a batch whose rows all write the same slot (``slots [1]``) and
attend from their own first slot on (``starts [B]``; left padding before it is masked), so the
rows of a running batch are kept *aligned at the end*: every running request's keys and values
end at slot `end`, a request's prompt is placed at ``end - len(prompt) .. end`` when it joins,
and one decode step then feeds every row's pending token at slot `end`.  A row is a request's
slot in the cache: taken when it joins, given back when it ends (at any step), with nothing
copied for the rows that stay.

The shared end moves by one slot per step.  Two moves keep it within the cache:
- *compaction*: when the earliest row start is far from slot 0 (rows that started long ago
  ended), every row is moved left by that amount (one copy of the filled slots);
- *room for a prompt*: a prompt longer than `end` moves the rows right first.
A row's positions (rope) count from its own start, so moving a row does not change its keys.

Decode steps run on the first ``bucket`` rows (a view, no copy): the smallest of `BUCKETS`
that covers the highest row in use, so a handful of compiled decode graphs serve every load.
"""
from __future__ import annotations

import torch

from ..model.kv_cache import KVCache

#: Batch sizes of the decode step (each its own compiled graph); capped at the row count.
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
#: Compaction happens once the earliest start is at least this many slots from slot 0 and at
#: least half of `end` (the masked slots before it cost attention work on every row).
COMPACT_MIN = 64


def bucket_for(rows: int, limit: int) -> int:
    """The decode batch size for ``rows`` rows in use: the smallest bucket that holds them."""
    for b in BUCKETS:
        if b >= rows:
            return min(b, limit)
    return limit


class BatchCache:
    """``rows`` request rows of ``context`` slots each, aligned at a shared end slot."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache
        self.rows = int(cache.tensor.shape[1])
        self.context = cache.context
        self.end = 0                                   # the next slot every running row writes
        self.starts = [0] * self.rows                  # first slot of each row in use
        self.used = [False] * self.rows
        self._views: dict[int, KVCache] = {}

    def free_rows(self) -> int:
        return self.used.count(False)

    def active(self) -> list[int]:
        return [r for r in range(self.rows) if self.used[r]]

    def view(self, batch: int) -> KVCache:
        """The first ``batch`` rows as a `KVCache` (the same memory)."""
        if batch not in self._views:
            view = KVCache.__new__(KVCache)
            view.context = self.context
            view.tensor = self.cache.tensor[:, :batch]
            self._views[batch] = view
        return self._views[batch]

    def bucket(self) -> int:
        """The decode batch: the bucket covering the highest row in use."""
        top = max((r for r in range(self.rows) if self.used[r]), default=-1)
        return bucket_for(top + 1, self.rows)

    def join(self, prompt: KVCache, length: int, source_row: int = 0, first: int = 0) -> int:
        """Take a free row for a request whose ``length`` prompt slots sit at slots ``first ..
        first + length`` of ``prompt``'s row ``source_row``: copy them to end at `end`; the
        row."""
        row = self.used.index(False)
        if not any(self.used):
            self.end = length
        elif length > self.end:
            self._move(length - self.end)
        self.used[row] = True
        self.starts[row] = self.end - length
        dst = self.cache.tensor[:, row, :, self.end - length:self.end]
        dst.copy_(prompt.tensor[:, source_row, :, first:first + length])
        return row

    def leave(self, row: int) -> None:
        self.used[row] = False
        if not any(self.used):
            self.end = 0

    def make_room(self) -> None:
        """Before a decode step: keep `end` inside the cache, and compact when the masked slots
        before the earliest start are most of the work."""
        rows = self.active()
        if not rows:
            return
        first = min(self.starts[r] for r in rows)
        if self.end >= self.context or (first >= COMPACT_MIN and 2 * first >= self.end):
            if first == 0:  # every row's budget keeps its length below the context
                raise RuntimeError("a running request outgrew the KV cache")
            self._move(-first)

    def row_starts(self, batch: int) -> torch.Tensor:
        """``starts [batch]`` for a decode step: each row's start; free rows attend only to
        the step's own slot."""
        return torch.tensor([self.starts[r] if self.used[r] else self.end for r in range(batch)],
                            dtype=torch.long)

    def length(self, row: int) -> int:
        """Slots the row's request fills (its prompt and the tokens fed back so far)."""
        return self.end - self.starts[row]

    def _move(self, by: int) -> None:
        """Move every running row's slots by ``by`` (left when negative)."""
        rows = self.active()
        top = max(rows) + 1
        first = min(self.starts[r] for r in rows)
        t = self.cache.tensor[:, :top]
        part = t[:, :, :, first:self.end].clone()
        t[:, :, :, first + by:self.end + by] = part
        self.end += by
        for r in rows:
            self.starts[r] += by
