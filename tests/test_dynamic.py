"""Dynamic shapes: a model whose batch and sequence dims are symbolic compiles once and then
serves every size, with results equal to eager's."""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from tests.helpers import assert_fully_compiled, check
from torchburn.backend import report as rep
from torchburn.backend.entry import torchburn_backend


class TinyAttention(nn.Module):
    """One attention-like block over [batch, seq, dim]: projections, scaled scores with a
    softmax over the sequence, a residual, layer norm, GELU, and a mean over the sequence."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(self.dim)
        attn = torch.softmax(scores, dim=-1)
        h = self.norm(x + self.out(torch.matmul(attn, v)))
        h = torch.nn.functional.gelu(h)
        return h, h.mean(dim=1)


def test_symbolic_batch_and_sequence_compile_once() -> None:
    torch.manual_seed(0)
    model = TinyAttention().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=torchburn_backend, dynamic=True)
    records = rep.start_recording()
    try:
        with torch.no_grad():
            # 20 lengths. Batch and sequence sizes differ from the first call on, or Dynamo
            # would give them one symbol (and it specializes sizes 0 and 1).
            for i, seq in enumerate(range(5, 45, 2)):
                batch = 2 + i % 3
                x = torch.randn(batch, seq, 16)
                out = compiled(x)
                expected = model(x)
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    finally:
        rep.stop_recording()
    assert len(records) == 1, f"expected one compilation for 20 sequence lengths, got {len(records)}"
    assert_fully_compiled(records)


def test_slices_from_zero_keep_their_traced_length() -> None:
    """`x[:, 0:] * y[:, :x.shape[1]]` with dynamic shapes: both slices have length s0 (Dynamo
    guards s0 <= s1); clamped bounds (`min(s0, s1)`, `max(s0, min(0, s0)) - min(0, s0)`)
    made the broadcast fail with an internal error (transformers' Llama at a dynamic length)."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x[:, 0:] * y[:, :x.shape[1]]

    for n in (5, 7):
        check(fn, torch.randn(3, n), torch.randn(3, n + 2), dynamic=True)
