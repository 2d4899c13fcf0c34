"""Attention on the GPU engine (llvmpipe in CI): each `attention` op is one flash-attention
kernel (`codegen/wgsl/attention.py`): the prefill form (a workgroup per block of query rows,
K/V tiles in workgroup memory) or the decode form (a workgroup per row, its keys split across
the invocations). Results equal eager's for causal, masked (bool, additive) and unmasked
attention, grouped-query heads, ragged lengths, odd head dims, f16, and decode steps on a
partially filled KV cache; what the kernel does not cover is expanded (`expand-attention`).
Sizes are small: llvmpipe is a software GPU."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from torchburn.frontend.attention_op import attention
from tests.gpu.conftest import check_gpu


def _attention_kernels(reports: list) -> list[str]:
    return [k for r in reports for s in r.subgraphs for k in s.kernels if "torchburn.attention" in k]


def _one_kernel(reports: list, form: str) -> str:
    """The graph's attention is exactly one kernel, of the given form ("flash" or "decode")."""
    kernels = _attention_kernels(reports)
    assert len(kernels) == 1, kernels
    assert f": attention/{form}" in kernels[0], kernels
    return kernels[0]


def test_sdpa_graph_is_one_attention_kernel(gpu) -> None:  # type: ignore[no-untyped-def]
    """Causal prefill at a ragged length (37 rows: not a multiple of the row block or the key
    tile) with head dim 64."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 37, 64, generator=g) for _ in range(3))
    reports = check_gpu(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v,
                        rtol=1e-5, atol=1e-5)
    _one_kernel(reports, "flash")


@pytest.mark.parametrize("tile,b,h,t,d,causal", [
    ("64x32/4x4", 1, 2, 37, 64, True),   # D=64 on a 32 KiB device: P and the row reductions in K's memory
    ("32x64/4x4/s2", 2, 1, 140, 12, True),  # 16 lanes per row (subgroups of 8 reduce through memory),
                                            # keys prefetched into registers, 5 blocks paired
    ("16x32/8x4", 1, 3, 29, 20, False),  # 8 rows per invocation, Dv/4 = 5 columns over 8 lanes
    ("16x16/4x16", 1, 1, 70, 8, True),   # one lane per row: nothing to reduce across lanes
    ("rows", 1, 2, 21, 16, True),        # the one-invocation-per-row schedule
])
def test_prefill_tiles(gpu, tile: str, b: int, h: int, t: int, d: int, causal: bool) -> None:  # type: ignore[no-untyped-def]
    """Each tile form of the cooperative prefill kernel (`attention_tiled.py`) at ragged sizes:
    rows and keys not multiples of the tile, head dims not multiples of the lanes."""
    from torchburn.backend import report as rep
    from torchburn.backend.entry import torchburn_backend

    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(b, h, t, d, generator=g) for _ in range(3))
    fn = lambda a, b_, c: F.scaled_dot_product_attention(a, b_, c, is_causal=causal)  # noqa: E731
    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        out = torch.compile(fn, backend=torchburn_backend,
                            options={"passes": {"before-codegen": [f"gpu-map{{attention_tile={tile}}}"]}})(q, k, v)
    finally:
        rep.stop_recording()
    torch.testing.assert_close(out, fn(q, k, v), rtol=1e-5, atol=1e-5)
    kernel = _one_kernel(records, "flash")
    assert (": attention/flash-rows" in kernel) == (tile == "rows"), kernel
    if tile != "rows":
        assert f"flash {tile}" in kernel, kernel


def test_hand_written_attention_is_one_kernel(gpu) -> None:  # type: ignore[no-untyped-def]
    """`softmax(q @ k^T / sqrt(d) + mask) @ v` written out (`form-attention` makes it the op)."""
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(2, 2, 13, 8, generator=g) for _ in range(3))
    m = torch.randn(2, 1, 13, 13, generator=g)

    def by_hand(a, b, c, d):  # type: ignore[no-untyped-def]
        return torch.softmax(a @ b.transpose(-2, -1) / 8 ** 0.5 + d, dim=-1) @ c

    reports = check_gpu(by_hand, q, k, v, m, rtol=1e-5, atol=1e-5)
    (kernel,) = [k for r in reports for s in r.subgraphs for k in s.kernels]  # the matmuls and softmax gone
    assert ": attention/flash" in kernel, kernel


def test_no_mask_odd_head_dims_more_keys_than_rows(gpu) -> None:  # type: ignore[no-untyped-def]
    """Head dims 7 (q, k) and 5 (v): the vec4 lanes past them are padding, never loaded."""
    g = torch.Generator().manual_seed(1)
    q, k, v = torch.randn(2, 1, 20, 7, generator=g), torch.randn(2, 1, 45, 7, generator=g), torch.randn(2, 1, 45, 5, generator=g)
    reports = check_gpu(lambda a, b, c: attention(a, [b], [c], [None], 0.3, False), q, k, v, rtol=1e-5, atol=1e-5)
    _one_kernel(reports, "flash")


def test_causal_gqa_fewer_rows_than_keys(gpu) -> None:  # type: ignore[no-untyped-def]
    """Six query heads over two key/value heads; causal aligned top-left (key j <= row i)."""
    g = torch.Generator().manual_seed(2)
    q, k, v = torch.randn(1, 6, 11, 8, generator=g), torch.randn(1, 2, 19, 8, generator=g), torch.randn(1, 2, 19, 8, generator=g)
    expected = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 1), v.repeat_interleave(3, 1), is_causal=True)
    reports = check_gpu(lambda a, b, c: attention(a, [b], [c], [None], 8 ** -0.5, True), q, k, v, rtol=1e-5, atol=1e-5)
    _one_kernel(reports, "flash")
    with torch.no_grad():
        torch.testing.assert_close(attention(q, [k], [v], [None], 8 ** -0.5, True), expected, rtol=1e-5, atol=1e-5)


def test_bool_mask_prefill(gpu) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(1, 2, 12, 8, generator=g), torch.randn(1, 2, 21, 8, generator=g), torch.randn(1, 2, 21, 8, generator=g)
    m = torch.rand(12, 21, generator=g) > 0.5
    m[:, 0] = True
    reports = check_gpu(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, attn_mask=m), q, k, v,
                        rtol=1e-5, atol=1e-5)
    _one_kernel(reports, "flash")


def test_additive_mask_prefill(gpu) -> None:  # type: ignore[no-untyped-def]
    g = torch.Generator().manual_seed(4)
    q, k, v = torch.randn(3, 1, 10, 6, generator=g), torch.randn(3, 1, 9, 6, generator=g), torch.randn(3, 1, 9, 5, generator=g)
    m = torch.randn(3, 1, 10, 9, generator=g)
    reports = check_gpu(lambda a, b, c, d: attention(a, [b], [c], [d], 0.4, False), q, k, v, m,
                        rtol=1e-5, atol=1e-5)
    _one_kernel(reports, "flash")


def test_decode_two_segments_gqa(gpu) -> None:  # type: ignore[no-untyped-def]
    """As `llm/model/decoder.py` calls it: the cache and the step's key as two segments, with masks."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(1, 4, 1, 16, generator=g)
    kp, vp = torch.randn(1, 2, 13, 16, generator=g), torch.randn(1, 2, 13, 16, generator=g)
    kn, vn = torch.randn(1, 2, 1, 16, generator=g), torch.randn(1, 2, 1, 16, generator=g)
    mp = torch.where(torch.rand(1, 1, 1, 13, generator=g) > 0.3, 0.0, torch.finfo(torch.float32).min)
    mn = torch.zeros(1, 1, 1, 1)
    reports = check_gpu(lambda *a: attention(a[0], [a[1], a[3]], [a[2], a[4]], [a[5], a[6]], 0.25, False),
                        q, kp, vp, kn, vn, mp, mn, rtol=1e-5, atol=1e-5)
    _one_kernel(reports, "decode")


def test_decode_long_cache_more_keys_than_invocations(gpu) -> None:  # type: ignore[no-untyped-def]
    """300 keys: each invocation of the decode workgroup takes several."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 1, 8, generator=g)
    k, v = torch.randn(2, 2, 300, 8, generator=g), torch.randn(2, 2, 300, 8, generator=g)
    m = torch.where(torch.rand(2, 1, 1, 300, generator=g) > 0.2, 0.0, torch.finfo(torch.float32).min)
    reports = check_gpu(lambda a, b, c, d: attention(a, [b], [c], [d], 0.125, False), q, k, v, m,
                        rtol=1e-5, atol=1e-5)
    _one_kernel(reports, "decode")


class _KvStep(nn.Module):
    """A decode step on a KV cache held as buffers of 32 slots: the step's key and value are
    written at `pos`, the query attends to the filled slots `0..pos` only."""

    def __init__(self, pos: int) -> None:
        super().__init__()
        self.pos = pos
        g = torch.Generator().manual_seed(7)
        self.register_buffer("k", torch.randn(1, 2, 32, 16, generator=g))
        self.register_buffer("v", torch.randn(1, 2, 32, 16, generator=g))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.pos
        self.k[:, :, p:p + 1] = k
        self.v[:, :, p:p + 1] = v
        return F.scaled_dot_product_attention(q, self.k[:, :, :p + 1], self.v[:, :, :p + 1])


def test_decode_partially_filled_cache(gpu) -> None:  # type: ignore[no-untyped-def]
    from tests.helpers import run_compiled

    g = torch.Generator().manual_seed(8)
    step = [torch.randn(1, 2, 1, 16, generator=g) for _ in range(3)]
    eager, compiled = _KvStep(10), _KvStep(10)
    with torch.no_grad():
        expected = eager(*step)
        out, reports = run_compiled(compiled, *step)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(compiled.k, eager.k)
    _one_kernel(reports, "decode")


def test_decode_symbolic_cache_length(gpu) -> None:  # type: ignore[no-untyped-def]
    """The cache segment's length is a dynamic dimension (its mask built from it), as in the
    LLM's decode step: the kernel reads the keys up to that symbol."""
    q = torch.randn(1, 4, 1, 8)
    kp, vp = torch.randn(1, 2, 9, 8), torch.randn(1, 2, 9, 8)
    kn, vn = torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)
    for t in (kp, vp):
        torch._dynamo.mark_dynamic(t, 2)

    def fn(q, kp, vp, kn, vn):  # type: ignore[no-untyped-def]
        mp = torch.where(torch.arange(kp.shape[2]) == 3, torch.finfo(torch.float32).min, 0.0).view(1, 1, 1, -1)
        return attention(q, [kp, kn], [vp, vn], [mp, torch.zeros(1, 1, 1, 1)], 0.35, False)

    reports = check_gpu(fn, q, kp, vp, kn, vn, rtol=1e-5, atol=1e-5, dynamic=None)
    _one_kernel(reports, "decode")


def test_f16_storage_accumulates_in_f32(gpu) -> None:  # type: ignore[no-untyped-def]
    """f16 inputs and output (native f16 storage where the adapter has `shader-f16`), the
    softmax and the products in f32: within f16 rounding of eager's f32 result."""
    g = torch.Generator().manual_seed(9)
    q, k, v = (torch.randn(1, 2, 19, 16, generator=g).half() for _ in range(3))
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    from tests.helpers import run_compiled

    with torch.no_grad():
        out, reports = run_compiled(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True),
                                    q, k, v, dynamic=False)
    assert out.dtype == torch.float16
    torch.testing.assert_close(out.float(), expected, rtol=2e-3, atol=2e-3)
    _one_kernel(reports, "flash")


@pytest.mark.parametrize("d", [320])
def test_head_dim_beyond_registers_is_expanded(gpu, d: int) -> None:  # type: ignore[no-untyped-def]
    """A head dim above the kernel's register budget: `expand-attention` writes products and a
    softmax instead, with the same result."""
    q, k, v = (torch.randn(1, 1, 5, d) for _ in range(3))
    reports = check_gpu(lambda a, b, c: F.scaled_dot_product_attention(a, b, c), q, k, v, rtol=1e-4, atol=1e-5)
    kernels = _attention_kernels(reports)
    assert kernels and not any("attention/" in k for k in kernels), kernels


@pytest.mark.parametrize("layout", ["sdpa", "heads-merged"])
def test_output_through_views_is_one_kernel(gpu, layout: str) -> None:  # type: ignore[no-untyped-def]
    """An attention result the graph returns through permutes and reshapes (SDPA's transposed
    output, or heads merged into `[B, T, H*D]`) is stored at the view's index by the attention
    kernel itself: the graph has no copy kernel (`loopgen/store_views.py`)."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(2, 4, 19, 8, generator=g)
    k, v = (torch.randn(2, 2, 19, 8, generator=g) for _ in range(2))
    if layout == "sdpa":
        fn = lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True, enable_gqa=True)  # noqa: E731
    else:
        fn = lambda a, b, c: attention(a, [b], [c], [], 0.3, True).transpose(1, 2).reshape(2, 19, 32)  # noqa: E731
    reports = check_gpu(fn, q, k, v, rtol=1e-5, atol=1e-5)
    kernels = [k for r in reports for s in r.subgraphs for k in s.kernels]
    assert len(kernels) == 1 and "aten.permute" in kernels[0], kernels
    _one_kernel(reports, "flash")
