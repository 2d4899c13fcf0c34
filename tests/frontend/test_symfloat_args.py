"""A SymFloat operand of tensor arithmetic (`frontend/symfloat_args.py`): passed as a 0-d
tensor of the other operand's dtype, the op compiles, with eager's values bit for bit; where
that would change the result's dtype or rounding (integer and half tensors, an `alpha`) the op
is left as it was."""
from __future__ import annotations

import pytest

import torch

from tests.helpers import check, run_compiled


def scaled(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    return x * (n / (n - 1)) + 1.0 / n - x / (n * 0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_factor_computed_from_a_symbolic_size_compiles(dtype: torch.dtype) -> None:
    for n in (5, 7, 11):
        check(scaled, torch.randn(n, 300, dtype=dtype), rtol=0, atol=0, dynamic=True)


def with_alpha(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[0]
    return torch.sub(x, n / (n - 1), alpha=0.7)


@pytest.mark.parametrize("fn", [with_alpha])
@pytest.mark.parametrize("dtype", [torch.int32, torch.float16, torch.float32])
def test_other_forms_keep_eager_values(fn, dtype: torch.dtype) -> None:  # type: ignore[no-untyped-def]
    """An int32 tensor times a Python float is float32 in eager (a 0-d int32 factor would
    truncate it); float16 computes in float32 with the factor unrounded; `x - alpha * other`
    is one fma in eager. These keep the SymFloat (the op stays in PyTorch)."""
    for n in (5, 7):
        x = (torch.randn(n, 300) * 10).to(dtype)
        for f in (fn, scaled):
            out, _ = run_compiled(f, x, dynamic=True)
            want = f(x)
            assert out.dtype == want.dtype
            # float16 chains fused around the op keep float32 between ops (and `scaled` cancels):
            # a float16 ulp or two
            exact = {"rtol": 4e-3, "atol": 1e-3} if dtype is torch.float16 else {"rtol": 0, "atol": 0}
            torch.testing.assert_close(out, want, equal_nan=True, **exact)


def test_the_rewrite_names_its_wrap_and_reuses_it() -> None:
    """Two users of one SymFloat share one `scalar_tensor`, placed before the first."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.symfloat_args import is_symfloat_wrap, wrap_symfloat_operands

    def fn(x: torch.Tensor) -> torch.Tensor:
        f = x.shape[0] / (x.shape[0] - 1)
        return x * f - x.sum(0) * f

    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(5, 3))
    assert wrap_symfloat_operands(gm) == 2
    wraps = [n for n in gm.graph.nodes if n.op == "call_function" and is_symfloat_wrap(n)]
    assert len(wraps) == 1 and len(wraps[0].users) == 2 and wraps[0].kwargs["dtype"] is torch.float32
    gm.graph.lint()
    x = torch.randn(6, 3)
    torch.testing.assert_close(gm(x), fn(x), rtol=0, atol=0)
