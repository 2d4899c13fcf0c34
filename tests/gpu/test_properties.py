"""Property tests on the GPU engine: random shapes (odd ones included, so vec4 and scalar
paths, tile edges and short and long reductions all occur) match eager PyTorch.

Few examples each: every new shape compiles anew, and CI's software adapter is slow."""
from __future__ import annotations

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.gpu.conftest import check_gpu

#: The `gpu` fixture only sets the engine; it is the same for every example.
SETTINGS = settings(max_examples=6, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture])
dims = st.integers(1, 70)


@SETTINGS
@given(rows=dims, cols=dims, scale=st.floats(0.1, 4.0))
def test_elementwise_chain(gpu, rows: int, cols: int, scale: float) -> None:  # type: ignore[no-untyped-def]
    a, b = torch.randn(rows, cols), torch.randn(cols)
    check_gpu(lambda x, y: torch.tanh(x * scale + y) * torch.sigmoid(x) - y, a, b, rtol=1e-5, atol=1e-5)


@SETTINGS
@given(shape=st.lists(st.integers(1, 40), min_size=1, max_size=3), dim=st.integers(0, 2), keep=st.booleans())
def test_reductions(gpu, shape: list[int], dim: int, keep: bool) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(*shape) * 10
    d = dim % len(shape)
    check_gpu(lambda t: (t.sum(d, keepdim=keep), t.amax(d, keepdim=keep)), x, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(m=st.integers(1, 150), n=st.integers(1, 150), k=st.integers(1, 150), transposed=st.booleans())
def test_matmul(gpu, m: int, n: int, k: int, transposed: bool) -> None:  # type: ignore[no-untyped-def]
    a = torch.randn(m, k)
    b = torch.randn(n, k) if transposed else torch.randn(k, n)
    fn = (lambda x, y: x @ y.t()) if transposed else (lambda x, y: x @ y)
    check_gpu(fn, a, b, rtol=1e-4, atol=1e-4)


@SETTINGS
@given(rows=st.integers(1, 20), cols=st.integers(1, 300))
def test_softmax(gpu, rows: int, cols: int) -> None:  # type: ignore[no-untyped-def]
    check_gpu(lambda t: torch.softmax(t, -1), torch.randn(rows, cols) * 5, rtol=1e-5, atol=1e-6)
