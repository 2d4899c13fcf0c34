"""The static KV cache and how a step uses it: read the filled slots, write the new ones.

One tensor ``[2 * layers, B, K, C, D]`` (keys and values of every layer, ``C`` slots) holds
the whole cache.  A step reads only the slots filled before it: it gets the view
``cache[..., :filled, :]`` (no copy), whose length is a dynamic dimension of the compiled
graph, so attention costs the tokens so far (not ``max_context``) and one graph serves every
length.  The step returns its new keys and values ``[2 * layers, B, K, T, D]`` and they are
written into their slots with one ``index_copy_`` after the native call.

Why not write the cache inside the graph: the graph would mutate its input, which
AOTAutograd turns into "compute a new cache, copy it back" -- two copies of the whole cache per
step.  Writing only the new slots afterwards costs ``T`` slots.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .config import DecoderConfig

#: The filled length handed to a step is never below this: Dynamo specialises sizes 0 and 1,
#: which would compile extra graphs.  Slots past the filled ones are masked (they are at or
#: after the step's own slots), so reading them is harmless.
MIN_VIEW = 2


class KVCache:
    """Keys and values of every layer for ``batch`` rows and ``context`` slots."""

    def __init__(self, config: DecoderConfig, batch: int, context: int,
                 dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None) -> None:
        c = config
        self.context = context
        self.tensor = torch.zeros((2 * c.num_hidden_layers, batch, c.num_key_value_heads,
                                   context, c.head_dim), dtype=dtype, device=device)

    def past(self, filled: int) -> torch.Tensor:
        """The first ``max(filled, MIN_VIEW)`` slots (a view) for a step starting at ``filled``."""
        return self.tensor[:, :, :, :min(max(filled, MIN_VIEW), self.context)]

    def write(self, slots: torch.Tensor, new: torch.Tensor) -> None:
        """Store a step's keys and values ``[2L, B, K, T, D]`` at ``slots [T]``."""
        self.tensor.index_copy_(3, slots, new)

    def step(self, fn: Callable[..., Any], ids: torch.Tensor, positions: torch.Tensor,
             slots: torch.Tensor, starts: torch.Tensor,
             logit_index: Optional[torch.Tensor] = None, *, dynamic: bool = False) -> torch.Tensor:
        """Run ``fn`` (the decoder, or a compiled function of its arguments) for one step whose
        slots ``slots`` are consecutive, write its keys and values, return its logits.

        ``dynamic`` marks the past's length as a dynamic dimension (for a compiled ``fn``: one
        graph for every length)."""
        first = int(slots[0])
        if first + slots.shape[0] > self.context:
            raise ValueError(f"slots up to {first + slots.shape[0]} do not fit {self.context} slots")
        past = self.past(first)
        if dynamic:
            torch._dynamo.mark_dynamic(past, 3, min=MIN_VIEW, max=max(self.context, MIN_VIEW + 1))
        logits, new = fn(ids, positions, slots, starts, past, logit_index)
        self.write(slots, new)
        return logits
