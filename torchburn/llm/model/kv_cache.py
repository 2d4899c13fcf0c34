"""The static KV cache and how a step uses it: read the filled slots, write the new ones.

One tensor ``[2 * layers, B, K, C, D]`` (keys and values of every layer, ``C`` slots) holds
the whole cache.  A step at slots ``first .. first + T`` gets the view ``cache[..., :first + T, :]``
(no copy), whose length is a dynamic dimension of the compiled graph, so attention costs the
tokens so far (not ``max_context``) and one graph serves every length.  It attends to the
view's slots before ``first`` (the rest are masked) and to its own new keys and values, and
writes those into the view's last ``T`` slots with ``index_copy_`` inside the step
(`engine.LLM._eager_step`), so a compiled decode step is one native call, KV update included.

Why that write costs only ``T`` slots: AOTAutograd turns a mutation of a graph input into
"compute a new cache, copy it back" (two whole-cache copies); the backend recognises that
write-back (`frontend/inplace_writes.py`) and stores only the written slots into the input's
own memory, on the CPU engine and, with the cache resident on the device, on the GPU engine
(`backend/gpu_resident.py`).  A step function that returns ``(logits, new)`` instead (the bare
`Decoder`, as tests call it) has its keys and values written after it returns.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch

from .config import DecoderConfig

#: The filled length handed to a step is never below this: Dynamo specialises sizes 0 and 1,
#: which would compile extra graphs.  Slots past the filled ones are masked (they are at or
#: after the step's own slots), so reading them is harmless.
MIN_VIEW = 2


#: CPU caches from this size on are zero pages of their own anonymous map (see `lazy_zeros`).
LAZY_BYTES = 1 << 20


def lazy_zeros(shape: tuple[int, ...], dtype: torch.dtype, device: Optional[torch.device] = None) -> torch.Tensor:
    """Zeros whose pages the kernel supplies when first touched: an anonymous map is zero
    filled on demand, where `torch.zeros` writes every byte up front. The default model's
    cache is 2 x 30 layers x 3 heads x 4096 slots x 64 x 4 bytes = 377 MB, of which a short
    chat touches a few MB; writing all of it cost a warm start ~0.1-0.2 s of CPU (and the
    memory)."""
    numel = 1
    for s in shape:
        numel *= int(s)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    if (device is not None and torch.device(device).type != "cpu") or nbytes < LAZY_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    import mmap

    return torch.frombuffer(mmap.mmap(-1, nbytes), dtype=dtype, count=numel).view(shape)


class KVCache:
    """Keys and values of every layer for ``batch`` rows and ``context`` slots."""

    def __init__(self, config: DecoderConfig, batch: int, context: int,
                 dtype: torch.dtype = torch.float32, device: Optional[torch.device] = None) -> None:
        c = config
        self.context = context
        self.tensor = lazy_zeros((2 * c.num_hidden_layers, batch, c.num_key_value_heads,
                                  context, c.head_dim), dtype, device)
        #: Per-step input tensors a decode loop keeps with the cache, written in place each
        #: step and each request (the GPU's greedy loop, `LLM._decode_greedy`: the same
        #: tensors keep the same device buffers and bind groups across steps and requests).
        self.step_inputs: dict[str, torch.Tensor] = {}

    def past(self, filled: int, tokens: int = 0) -> torch.Tensor:
        """The first ``max(filled + tokens, MIN_VIEW)`` slots (a view) for a step of ``tokens``
        tokens starting at ``filled``: the filled slots, then the step's own."""
        return self.tensor[:, :, :, :min(max(filled + tokens, MIN_VIEW), self.context)]

    def write(self, slots: torch.Tensor, new: torch.Tensor) -> None:
        """Store a step's keys and values ``[2L, B, K, T, D]`` at ``slots [T]``."""
        self.tensor.index_copy_(3, slots, new)

    def step(self, fn: Callable[..., Any], ids: torch.Tensor, positions: torch.Tensor,
             slots: torch.Tensor, starts: torch.Tensor,
             logit_index: Optional[torch.Tensor] = None, *, dynamic: bool = False) -> torch.Tensor:
        """Run ``fn`` (the decoder, or a compiled function of its arguments) for one step whose
        slots ``slots`` are consecutive, return its logits. ``fn`` writes its keys and values
        into the view it is handed (its last ``T`` slots), or returns ``(logits, new)`` for
        them to be written here.

        ``dynamic`` marks the past's length as a dynamic dimension (for a compiled ``fn``: one
        graph for every length)."""
        first = int(slots[0])
        if first + slots.shape[0] > self.context:
            raise ValueError(f"slots up to {first + slots.shape[0]} do not fit {self.context} slots")
        past = self.past(first, int(slots.shape[0]))
        if dynamic:
            torch._dynamo.mark_dynamic(past, 3, min=MIN_VIEW, max=max(self.context, MIN_VIEW + 1))
        out = fn(ids, positions, slots, starts, past, logit_index)
        if isinstance(out, tuple):
            logits, new = out
            self.write(slots, new)
            return logits
        return out
