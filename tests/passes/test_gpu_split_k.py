"""`gpu-split-k`: a matrix product with few output tiles and a long reduction becomes the
partial products over parts of k (a GEMM with one more batch loop) and their sum with the
product's epilogue; on the GPU engine the result equals eager's."""
from __future__ import annotations

import pytest
import torch

from torchburn.ir.parser import parse_program
from torchburn.ir.printer import print_program
from torchburn.passes.base import PassError
from torchburn.passes.gpu.split_k import GpuSplitK

from tests.gpu.conftest import check_gpu, gpu  # noqa: F401  (the fixture)

PRODUCT = """program @f(%a: f32[8, {k}] strides [{k}, 1], %b: f32[{k}, 8] strides [8, 1]) -> (%out0: f32[8, 8] strides [8, 1]) {{
  call @k0(%a, %b, %out0)
}}
kernel @k0(%a: f32[8, {k}] strides [{k}, 1], %b: f32[{k}, 8] strides [8, 1], %out0: f32[8, 8] strides [8, 1]) {{
  for i0 in 0..8 {{
    for i1 in 0..8 {{
      alloc %acc: f32[1] local
      %acc[0] = 0.0:f32
      for k2 in 0..{k} {{
        let x3 = %a[i0, k2]
        let x4 = %b[k2, i1]
        %acc[0] = %acc[0] + x3 * x4
      }}
      let t5 = %acc[0]
      %out0[i0, i1] = max(t5, 0.0:f32)
    }}
  }}
}}
"""


def test_split_in_two_parts_and_their_sum() -> None:
    out = GpuSplitK(splits=2).run(parse_program(PRODUCT.format(k=64), "f"))
    text = print_program(out)
    assert "call @k0_part(%a, %b, %k0_part)\n  call @k0_sum(%k0_part, %out0)" in text, text
    assert "temp %k0_part: f32[2, 8, 8] strides [64, 8, 1]" in text, text
    assert "let x3 = %a[i0, ks0 * 32 + k2]" in text and "for k2 in 0..32 {" in text, text
    part, total = text.split("kernel @k0_sum")
    assert "max(" in total and "max(" not in part, text  # the epilogue runs once, on the sum
    assert parse_program(text, "f") == out


def test_auto_splits_long_reductions_of_few_tiles_only() -> None:
    assert GpuSplitK().run(parse_program(PRODUCT.format(k=64), "f")).calls[0].kernel == "k0"  # short k
    long = GpuSplitK().run(parse_program(PRODUCT.format(k=2048), "f"))  # one 64x64 tile, 2048 deep
    assert [c.kernel for c in long.calls] == ["k0_part", "k0_sum"]
    assert int(long.temps[0].shape[0].value) == 8
    assert GpuSplitK(splits=1).run(parse_program(PRODUCT.format(k=2048), "f")).calls[0].kernel == "k0"
    assert GpuSplitK(splits=3).run(parse_program(PRODUCT.format(k=64), "f")).calls[0].kernel == "k0"  # uneven


def test_options_are_checked() -> None:
    with pytest.raises(PassError):
        GpuSplitK(splits=-1)


def test_split_product_on_the_gpu(gpu) -> None:  # type: ignore[no-untyped-def]
    """A bias and a ReLU after a 1024-deep product of 96 x 80 outputs (4 tiles): 4 parts."""
    x, w, b = torch.randn(96, 1024), torch.randn(1024, 80), torch.randn(80)
    reports = check_gpu(lambda p, q, r: torch.relu(p @ q + r), x, w, b, rtol=1e-4, atol=1e-4)
    kernels = [k for r in reports for s in r.subgraphs for k in s.kernels]
    assert any("_part: gemm" in k for k in kernels), kernels
    # the sum is straight-line code: an elementwise kernel with vec4 loads and stores
    assert any("_sum: threads/vec4" in k for k in kernels), kernels


def test_split_projection_of_attention_heads_reads_vec4(gpu) -> None:  # type: ignore[no-untyped-def]
    """The heads of an attention output read by a projection (`k // 64`, `k % 64`) stay `vec4`
    loads in the parts of a split reduction (`(ks * 256 + k) // 64`, `(ks * 256 + k) % 64`)."""
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)
    proj = nn.Linear(512, 48)

    def f(q, k, v):  # type: ignore[no-untyped-def]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return proj(y.transpose(1, 2).contiguous().view(2, 12, 512))

    q, k, v = (torch.randn(2, 8, 12, 64) for _ in range(3))
    reports = check_gpu(f, q, k, v, rtol=1e-4, atol=1e-5)
    kernels = [k for r in reports for s in r.subgraphs for k in s.kernels]
    assert any("_part: gemm" in k and "A:k4" in k for k in kernels), kernels
