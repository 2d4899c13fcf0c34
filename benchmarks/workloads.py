"""The models the CPU benchmark runs, kept apart from the timing script so that other scripts
(and a profiler session) can import them without running anything.

- `readme_mlp()`: the MLP of README.md, `Linear(512,1024) -> GELU -> Linear(1024,256)`.
- `GptBlock`: a pre-norm decoder block in the Llama style (RMSNorm, rotary position
  embeddings, causal `scaled_dot_product_attention`, SiLU-gated MLP), the shape of block an
  LLM engine runs, so its row measures what a real model would see.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F


def readme_mlp() -> nn.Module:
    """The README's demo MLP, in eval mode."""
    return nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 256)).eval()


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned scale (no mean subtraction, no bias)."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of the head dimension by the position's angles."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class GptBlock(nn.Module):
    """One decoder block: `x + attn(norm(x))`, then `x + mlp(norm(x))`.

    The rotary tables are buffers computed once (as a model would cache them), so the
    compiled graph holds the block's work and not the table's.
    """

    def __init__(self, dim: int = 512, heads: int = 8, hidden: int = 1376, max_len: int = 128) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)
        hd = dim // heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        hd = d // self.heads
        cos, sin = self.cos[:n], self.sin[:n]
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, n, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, n, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))
