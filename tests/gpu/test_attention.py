"""The attention kernel on the GPU engine (llvmpipe in CI): one kernel per op, results equal
eager's for decode with two key segments and grouped-query heads, causal prefill at odd sizes,
and a boolean mask."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from torchburn.frontend.attention_op import attention
from tests.gpu.conftest import check_gpu


def _attention_kernels(reports: list) -> list[str]:
    return [k for r in reports for s in r.subgraphs for k in s.kernels if "torchburn.attention" in k]


def test_decode_two_segments_gqa(gpu) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 16, generator=g)
    kp, vp = torch.randn(1, 2, 13, 16, generator=g), torch.randn(1, 2, 13, 16, generator=g)
    kn, vn = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g)
    mp = torch.where(torch.rand(1, 1, 1, 13, generator=g) > 0.3, 0.0, torch.finfo(torch.float32).min)
    mn = torch.zeros(1, 1, 1, 1)
    reports = check_gpu(lambda *a: attention(a[0], [a[1], a[3]], [a[2], a[4]], [a[5], a[6]], 0.25, False),
                        q, kp, vp, kn, vn, mp, mn, rtol=1e-5, atol=1e-5)
    assert len(_attention_kernels(reports)) == 1


def test_causal_prefill_odd_sizes(gpu) -> None:  # type: ignore[no-untyped-def]
    q, k, v = (torch.randn(2, 3, 19, 8) for _ in range(3))
    reports = check_gpu(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v,
                        rtol=1e-5, atol=1e-5)
    assert len(_attention_kernels(reports)) == 1


def test_bool_mask(gpu) -> None:  # type: ignore[no-untyped-def]
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    m = torch.rand(5, 7) > 0.5
    m[:, 0] = True
    check_gpu(lambda a, b, c: attention(a, [b], [c], [m], 0.3, False), q, k, v, rtol=1e-5, atol=1e-5)
