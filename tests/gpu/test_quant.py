"""Quantized linears (`torchburn::linear_int8` / `linear_int4`) on the wgpu engine: the
`qlinear` op lowered by `lower-to-loops-gpu` to one output element per invocation, the
weight dequantized in the loop over k, bias fused; equal to the ops' eager reference."""
from __future__ import annotations

from typing import Optional

import pytest
import torch

from tests.gpu.conftest import check_gpu
from torchburn.quant import QuantizedLinear


@pytest.mark.parametrize("quant_type,group,symmetric", [
    ("int8", None, True), ("int8", 32, True), ("int4", 32, True), ("int4", 16, False),
])
def test_quantized_linear_on_gpu(gpu, quant_type: str, group: Optional[int], symmetric: bool) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    lin = torch.nn.Linear(64, 24)
    layer = QuantizedLinear.from_float(lin, quant_type, group, symmetric, torch.float16)
    check_gpu(layer, torch.randn(3, 64), rtol=1e-4, atol=1e-4)
