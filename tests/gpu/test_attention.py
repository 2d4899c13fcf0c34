"""Attention on the GPU engine (llvmpipe in CI): `expand-attention` turns the fused op into
matrix products around one row softmax, so no kernel is a single invocation or a serial loop
per query row, the kernel count stays small, and results equal eager's for decode with two
key segments and grouped-query heads (as `llm/model.py` calls it), causal prefill at odd sizes
(with and without GQA), boolean and additive masks."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from torchburn.frontend.attention_op import attention
from tests.gpu.conftest import check_gpu


def _attention_kernels(reports: list) -> list[str]:
    return [k for r in reports for s in r.subgraphs for k in s.kernels if "torchburn.attention" in k]


def _check_kernels(reports: list, most: int) -> list[str]:
    kernels = _attention_kernels(reports)
    assert 0 < len(kernels) <= most and not any(": single" in k for k in kernels), kernels
    return kernels


def test_decode_two_segments_gqa(gpu) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 1, 16, generator=g)
    kp, vp = torch.randn(1, 2, 13, 16, generator=g), torch.randn(1, 2, 13, 16, generator=g)
    kn, vn = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g)
    mp = torch.where(torch.rand(1, 1, 1, 13, generator=g) > 0.3, 0.0, torch.finfo(torch.float32).min)
    mn = torch.zeros(1, 1, 1, 1)
    reports = check_gpu(lambda *a: attention(a[0], [a[1], a[3]], [a[2], a[4]], [a[5], a[6]], 0.25, False),
                        q, kp, vp, kn, vn, mp, mn, rtol=1e-5, atol=1e-5)
    # scores and values per segment, the softmax, the sum of the two segments' products
    _check_kernels(reports, 6)


def test_decode_long_cache_uses_row_kernels(gpu) -> None:  # type: ignore[no-untyped-def]
    """A cache longer than one workgroup's reach: the softmax gets a workgroup per row."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 1, 8, generator=g)
    kp, vp = torch.randn(2, 2, 300, 8, generator=g), torch.randn(2, 2, 300, 8, generator=g)
    kn, vn = torch.randn(2, 2, 1, 8, generator=g), torch.randn(2, 2, 1, 8, generator=g)
    mp = torch.where(torch.rand(2, 1, 1, 300, generator=g) > 0.2, 0.0, torch.finfo(torch.float32).min)
    mn = torch.zeros(2, 1, 1, 1)
    reports = check_gpu(lambda *a: attention(a[0], [a[1], a[3]], [a[2], a[4]], [a[5], a[6]], 0.125, False),
                        q, kp, vp, kn, vn, mp, mn, rtol=1e-5, atol=1e-5)
    assert any(": rows" in k for k in _check_kernels(reports, 6))


def test_causal_prefill_odd_sizes(gpu) -> None:  # type: ignore[no-untyped-def]
    q, k, v = (torch.randn(2, 3, 19, 8) for _ in range(3))
    reports = check_gpu(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v,
                        rtol=1e-5, atol=1e-5)
    assert any(": gemm" in k for k in _check_kernels(reports, 4))


def test_causal_prefill_gqa(gpu) -> None:  # type: ignore[no-untyped-def]
    q, k, v = torch.randn(1, 6, 11, 8), torch.randn(1, 2, 11, 8), torch.randn(1, 2, 11, 8)
    reports = check_gpu(lambda a, b, c: attention(a, [b], [c], [None], 0.4, True), q, k, v, rtol=1e-5, atol=1e-5)
    _check_kernels(reports, 4)


def test_bool_mask(gpu) -> None:  # type: ignore[no-untyped-def]
    q, k, v = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 7, 8), torch.randn(1, 2, 7, 8)
    m = torch.rand(5, 7) > 0.5
    m[:, 0] = True
    reports = check_gpu(lambda a, b, c: attention(a, [b], [c], [m], 0.3, False), q, k, v, rtol=1e-5, atol=1e-5)
    _check_kernels(reports, 4)


def test_additive_mask_odd_value_dim(gpu) -> None:  # type: ignore[no-untyped-def]
    q, k, v = torch.randn(3, 1, 4, 6), torch.randn(3, 1, 9, 6), torch.randn(3, 1, 9, 5)
    m = torch.randn(3, 1, 4, 9)
    check_gpu(lambda a, b, c, d: F.scaled_dot_product_attention(a, b, c, attn_mask=d), q, k, v, m,
              rtol=1e-5, atol=1e-5)


def test_decode_symbolic_cache_length(gpu) -> None:  # type: ignore[no-untyped-def]
    """The cache segment's length is a dynamic dimension (its mask built from it), as in the
    LLM's decode step."""
    q = torch.randn(1, 4, 1, 8)
    kp, vp = torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    kn, vn = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    for t in (kp, vp):
        torch._dynamo.mark_dynamic(t, 2)

    def fn(q, kp, vp, kn, vn):  # type: ignore[no-untyped-def]
        mp = torch.where(torch.arange(kp.shape[2]) == 3, torch.finfo(torch.float32).min, 0.0).view(1, 1, 1, -1)
        return attention(q, [kp, kn], [vp, vn], [mp, torch.zeros(1, 1, 1, 1)], 0.35, False)

    reports = check_gpu(fn, q, kp, vp, kn, vn, rtol=1e-5, atol=1e-5, dynamic=None)
    assert any(s.symbols for r in reports for s in r.subgraphs) if hasattr(reports[0].subgraphs[0], "symbols") else True
    _check_kernels(reports, 6)
