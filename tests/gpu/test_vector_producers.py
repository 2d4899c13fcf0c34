"""The decode step's kernels on the GPU engine (llvmpipe in CI): with the GPU pipeline's
`fuse{vector_producers}`, SwiGLU's `silu(gate) * up` inside a one-row down projection and a
rotary embedding inside the decode attention kernel compute eager's numbers, with the dispatches
they save gone; a cache write at a tensor position is one invocation per element (`gpu/map.py`)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.gpu.conftest import check_gpu


def _kernels(reports: list) -> list[str]:
    return [k for r in reports for s in r.subgraphs for k in s.kernels]


def test_one_row_swiglu_is_two_kernels(gpu) -> None:  # type: ignore[no-untyped-def]
    def f(x: torch.Tensor, wgu: torch.Tensor, wd: torch.Tensor) -> torch.Tensor:
        g, u = (x @ wgu).chunk(2, dim=-1)
        return (F.silu(g) * u) @ wd

    gen = torch.Generator().manual_seed(0)
    args = (torch.randn(1, 64, generator=gen), torch.randn(64, 96, generator=gen) / 8,
            torch.randn(48, 32, generator=gen) / 7)
    reports = check_gpu(f, *args, rtol=1e-4, atol=1e-5)
    assert len(_kernels(reports)) == 2, _kernels(reports)


def test_rotary_query_and_key_inside_decode_attention(gpu) -> None:  # type: ignore[no-untyped-def]
    """One query row, rotated q and new key (rotate-half form) beside a cache segment: one kernel."""
    from torchburn.frontend.attention_op import attention

    def rot(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        a, b = x.chunk(2, dim=-1)
        return x * cos + torch.cat((-b, a), dim=-1) * sin

    def f(q, k, v, kc, vc, cos, sin):  # type: ignore[no-untyped-def]
        return attention(rot(q, cos, sin), [kc, rot(k, cos, sin)], [vc, v], [], 0.25, False)

    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 1, 16, generator=gen)
    k, v = (torch.randn(1, 2, 1, 16, generator=gen) for _ in range(2))
    kc, vc = (torch.randn(1, 2, 37, 16, generator=gen) for _ in range(2))
    ang = torch.randn(1, 1, 1, 16, generator=gen)
    reports = check_gpu(f, q, k, v, kc, vc, ang.cos(), ang.sin(), rtol=1e-5, atol=1e-5)
    assert len(_kernels(reports)) == 1, _kernels(reports)


def test_cache_write_at_a_tensor_position_is_one_invocation_per_element(gpu) -> None:  # type: ignore[no-untyped-def]
    """`index_copy_` of a decode step's key into the cache at a position read from a tensor:
    the loop over that one position runs nothing concurrently, so the head-dim loop inside it
    joins the grid (`vec4` lanes) instead of running serially in each invocation (`gpu/map.py`;
    the 30-layer KV write took 137 us on the H200 that way)."""
    def f(cache: torch.Tensor, pos: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        cache.index_copy_(2, pos, k)
        return cache

    gen = torch.Generator().manual_seed(2)
    cache, k, pos = torch.zeros(4, 3, 32, 64), torch.randn(4, 3, 1, 64, generator=gen), torch.tensor([5])
    reports = check_gpu(f, cache, pos, k)
    kernels = _kernels(reports)
    assert len(kernels) == 1 and ": threads/vec4" in kernels[0], kernels
