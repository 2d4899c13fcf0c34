"""The tiny transformer the distributed tests train, and what a rank reports back."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn as nn
import torch.nn.functional as F

#: A large vocabulary makes the head alone fill a DDP bucket of 1 MB (the rest makes a second), so
#: DDPOptimizer splits the graph; the compute stays tiny.
VOCAB, DIM, HEADS, SEQ, BATCH = 8192, 32, 4, 8, 2


class Block(nn.Module):
    def __init__(self, dim: int = DIM, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2)
                   for z in self.qkv(self.ln1(x)).chunk(3, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class TinyLM(nn.Module):
    """Embedding, one pre-norm transformer block, head; returns the cross-entropy loss."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.block = Block()
        self.ln = nn.LayerNorm(DIM)
        self.head = nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.ln(self.block(self.emb(idx))))
        return F.cross_entropy(logits.view(-1, VOCAB), target.view(-1))


def batches(rank: int, steps: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each rank's own data (DDP averages the gradients of different batches)."""
    g = torch.Generator().manual_seed(100 + rank)
    return [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=g),
             torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)) for _ in range(steps)]


def report_summary(reports: list[Any]) -> list[dict[str, Any]]:
    """Our GraphReports as plain data (picklable across the process boundary)."""
    return [{"kind": r.kind, "fallbacks": list(r.fallbacks),
             "compiled": [s.name for s in r.subgraphs if s.compiled],
             "not_compiled": [(s.name, s.reason) for s in r.subgraphs if not s.compiled],
             "internal_errors": [s.internal_error for s in r.internal_errors]} for r in reports]


#: Calls a compiled subgraph ran in PyTorch at run time (its inputs did not fit what it was
#: compiled for), with the reason; filled while `watch_slow_paths()` is installed.
SLOW_PATHS: list[str] = []


def watch_slow_paths() -> None:
    """Note every run-time fallback of a launcher in SLOW_PATHS (launchers made after this)."""
    from torchburn.backend.launcher import Launcher

    if getattr(Launcher._slow, "_watched", False):
        return
    slow = Launcher._slow

    def watched(self: Any, *args: Any, why: str) -> Any:
        shapes = [(tuple(a.shape), a.stride()) for a in args if isinstance(a, torch.Tensor)]
        SLOW_PATHS.append(f"{self.name}: {why}: {shapes}")
        return slow(self, *args, why=why)

    watched._watched = True  # type: ignore[attr-defined]
    Launcher._slow = watched  # type: ignore[method-assign]
