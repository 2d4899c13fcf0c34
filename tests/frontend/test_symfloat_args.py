"""A SymFloat operand of tensor arithmetic (`frontend/symfloat_args.py`): passed as a 0-d
float64 tensor, the op compiles, with eager's values; where that would change the result's
dtype or rounding (integer and half tensors) the op is left as it was."""
from __future__ import annotations

import pytest

import torch

from tests.helpers import check, run_compiled


def scaled(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    return x * (n / (n - 1)) + 1.0 / n - x / (n * 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_factor_computed_from_a_symbolic_size_compiles(dtype: torch.dtype) -> None:
    for n in (5, 7):
        check(scaled, torch.randn(n, 3, dtype=dtype), dynamic=True)


@pytest.mark.parametrize("dtype", [torch.int32, torch.float16])
def test_other_dtypes_keep_eager_values(dtype: torch.dtype) -> None:
    """An int32 tensor times a Python float is float32 in eager, times a 0-d float64 tensor it
    would be float64; these keep the SymFloat (and stay in PyTorch where it is one)."""
    for n in (5, 7):
        x = (torch.randn(n, 3) * 10).to(dtype)
        out, _ = run_compiled(scaled, x, dynamic=True)
        want = scaled(x)
        assert out.dtype == want.dtype
        torch.testing.assert_close(out, want, equal_nan=True)


def test_the_rewrite_names_its_wrap_and_reuses_it() -> None:
    """Two users of one SymFloat share one `scalar_tensor`, placed before the first."""
    import torch.fx
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.symfloat_args import is_symfloat_wrap, wrap_symfloat_operands

    def fn(x: torch.Tensor) -> torch.Tensor:
        f = x.shape[0] / (x.shape[0] - 1)
        return x * f - x.sum(0) * f

    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(5, 3))
    assert wrap_symfloat_operands(gm) == 2
    wraps = [n for n in gm.graph.nodes if n.op == "call_function" and is_symfloat_wrap(n)]
    assert len(wraps) == 1 and len(wraps[0].users) == 2
    gm.graph.lint()
    x = torch.randn(6, 3)
    torch.testing.assert_close(gm(x), fn(x))
