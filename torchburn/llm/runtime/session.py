"""`ChatSession`: one conversation whose KV cache is kept from turn to turn.

Each turn renders the whole history with the chat template, but only the tokens after the
longest common prefix with what the cache already holds are prefilled.  The prefix is found on
token ids, not on turns: a template may render an earlier turn differently once more follows
it, and a generated answer re-encoded from its text may split into other tokens; either way the
cache is reused up to the first differing id and refilled from there.

The cache holds the prompt and every generated token that was fed back to the model (the last
sampled one never is); after an answer stopped by Ctrl-C, only the tokens of steps that
finished count.  The session owns its batch-1 cache (taken from the `LLM`'s pool on its first
turn and handed back by `close`), so other requests on the same `LLM`, other sessions included,
never touch what it holds.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Optional, Sequence

if TYPE_CHECKING:
    from .engine import LLM
    from ..model.kv_cache import KVCache
    from .sampling import SamplingParams


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading ids ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class ChatSession:
    """Streams answers for successive prompts of one conversation, reusing the cache."""

    def __init__(self, llm: "LLM") -> None:
        self.llm = llm
        self.cached: list[int] = []          # ids whose keys and values sit at slots 0..
        self._cache: Optional["KVCache"] = None
        #: Tokens prefilled by the last turn (the rest came from the cache).
        self.last_prefill = 0

    def reset(self) -> None:
        """Forget what the cache holds (the next turn prefills everything)."""
        self.cached = []

    def close(self) -> None:
        """Hand the session's cache back to the `LLM`'s pool (a later turn takes one again)."""
        if self._cache is not None:
            self.llm.release_cache(self._cache)
        self._cache = None
        self.cached = []

    def stream(self, prompt_ids: list[int], max_new_tokens: int, params: "SamplingParams",
               seed: Optional[int] = None,
               stop: Optional[Sequence[str]] = None) -> Iterator[str]:
        """The answer's text pieces for the whole conversation ``prompt_ids``."""
        yield from self.llm.stream_tokens(self.stream_ids(prompt_ids, max_new_tokens, params,
                                                          seed), stop)

    def stream_ids(self, prompt_ids: list[int], max_new_tokens: int, params: "SamplingParams",
                   seed: Optional[int] = None) -> Iterator[Optional[int]]:
        """The answer's token ids (None at its end); the cache bookkeeping happens here."""
        llm = self.llm
        if self._cache is None:
            self._cache = llm.cache_for(1)
            self.cached = []
        reuse = min(common_prefix(self.cached, prompt_ids), len(prompt_ids) - 1)
        self.last_prefill = len(prompt_ids) - max(reuse, 0)
        fed = list(prompt_ids)
        self.cached = []                    # invalid until the prefill has run
        pending: Optional[int] = None       # the last yielded id: fed once the next step runs
        steps = llm.generate_ids([prompt_ids], max_new_tokens, params, seed,
                                 cached=max(reuse, 0), cache=self._cache)
        try:
            for step in steps:
                if pending is None:         # the prefill finished
                    self.cached = fed
                else:
                    fed.append(pending)
                t = step[0]
                pending = t
                yield t
                if t is None:
                    return
        finally:
            steps.close()
