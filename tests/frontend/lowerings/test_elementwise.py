"""Elementwise lowerings whose form matters for speed as well as for the numbers."""
from __future__ import annotations

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from tests.helpers import check
from torchburn.frontend.importer import import_graph

#: Exponents ATen's CPU kernel computes without `pow` (multiplications, sqrt, rsqrt, 1/x).
SPECIAL_EXPONENTS = (2, 3.0, -2, 0.5, -0.5, -1.0)


def _values(dtype: torch.dtype) -> torch.Tensor:
    x = torch.randn(67, generator=torch.Generator().manual_seed(0), dtype=dtype) * 3
    extremes = torch.tensor([0.0, -0.0, 1e-30, -1e-30, 3e18, -3e18, float("inf"), float("-inf"), float("nan")],
                            dtype=dtype)
    return torch.cat([x, extremes])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("exponent", SPECIAL_EXPONENTS)
def test_pow_special_exponents_match_eager(exponent: float, dtype: torch.dtype) -> None:
    # the products and quotients round as eager's do; sqrt is correctly rounded here, and
    # eager's vectorized float sqrt is not always (1 ulp)
    exact = abs(exponent) != 0.5
    check(lambda x: x ** exponent, _values(dtype), rtol=0 if exact else None, atol=0 if exact else None)


@pytest.mark.parametrize("exponent", SPECIAL_EXPONENTS)
def test_pow_special_exponents_lower_without_pow(exponent: float) -> None:
    gm = make_fx(lambda x: torch.ops.aten.pow.Tensor_Scalar(x, exponent), tracing_mode="fake")(torch.randn(4, 8))
    assert "pow" not in [op.name for op in import_graph(gm).ops]


def test_pow_other_exponents_and_integers_keep_pow() -> None:
    check(lambda x: x ** 2.5, _values(torch.float32).abs())
    check(lambda x: x ** 3, torch.arange(-5, 6, dtype=torch.int64), rtol=0, atol=0)
    gm = make_fx(lambda x: x ** 2.5, tracing_mode="fake")(torch.randn(4, 8))
    assert "pow" in [op.name for op in import_graph(gm).ops]


def test_python_float_arithmetic_under_dynamic_shapes() -> None:
    """With `dynamic=True` Dynamo keeps Python floats as 0-d float64 tensors, so `s / math.pi`
    (GELU's `sqrt(2 / pi)` in transformers' Phi and GPT-J) reaches the backend as
    `aten.true_divide.Tensor`, which is `div` without a rounding mode."""
    import math

    check(lambda x, s: x * math.sqrt(s / math.pi), torch.randn(5, 3), 2.0, dynamic=True)
    check(lambda x, y: torch.true_divide(x, y), torch.arange(1, 7), torch.arange(2, 8), dynamic=True)
