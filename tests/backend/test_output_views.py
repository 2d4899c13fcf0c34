"""Graph outputs that reshape another kernel's result are that kernel's output buffer, viewed
(`Program.result_views`, `lower-to-loops`): no kernel copies them, on every engine, at static
and symbolic sizes, and a training step's GEMM weight gradient is one."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch

from tests.helpers import assert_fully_compiled, engine, run_compiled


def _gemm_as_weight(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a @ b).reshape(a.shape[0], -1, 3, 3)


def _kernels(reports: list[Any]) -> int:
    return sum(len(s.kernels) for r in reports for s in r.subgraphs if s.compiled)


def _check(fn: Callable[..., Any], *args: torch.Tensor, dynamic: bool = False) -> list[Any]:
    expected = fn(*args)
    out, reports = run_compiled(fn, *args, dynamic=dynamic)
    assert_fully_compiled(reports)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-4)
    assert out.shape == expected.shape and out.is_contiguous()
    return reports


@pytest.mark.parametrize("name", ["llvm", "reference"])
def test_a_gemm_returned_reshaped_is_one_kernel(name: str) -> None:
    a, b = torch.randn(16, 40), torch.randn(40, 36)
    with engine(name):
        reports = _check(_gemm_as_weight, a, b)
    assert _kernels(reports) == 1, [s.kernels for r in reports for s in r.subgraphs]


@pytest.mark.parametrize("name", ["llvm", "reference"])
def test_scalar_and_one_dim_views(name: str) -> None:
    """A 0-d result (a dot product, `[1, 1]` viewed `[]`) and a 1-d one."""
    x, y = torch.randn(37), torch.randn(37)
    with engine(name):
        for fn in (torch.dot, torch.inner, lambda a, b: (a[:, None] @ b[None, :]).reshape(-1)):
            out, reports = run_compiled(fn, x, y)
            assert_fully_compiled(reports)
            torch.testing.assert_close(out, fn(x, y), rtol=1e-5, atol=1e-4)
            assert out.shape == fn(x, y).shape


def test_symbolic_sizes_view_the_output_buffer() -> None:
    w = torch.randn(7, 6)

    def fn(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return (x @ w).reshape(x.shape[0], 5, 3, 2), torch.relu(x @ w).sum(-1).reshape(-1)

    for n in (4, 9):
        expected = fn(torch.randn(n, 5, 7))
        x = torch.randn(n, 5, 7)
        out, reports = run_compiled(fn, x, dynamic=True)
        assert_fully_compiled(reports)
        torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-4)
        assert [t.shape for t in out] == [e.shape for e in expected]


def test_a_reshaped_output_that_aliases_nothing_else() -> None:
    """Two reshapes of one product, and a reshape of a product also returned as is: each
    result is its own tensor, as eager's are (no two results share memory here)."""
    a, b = torch.randn(8, 5), torch.randn(5, 12)

    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, ...]:
        p = x @ y
        return p.reshape(8, 2, 6), p.reshape(96), (x @ y * 2).reshape(4, 24)

    out, reports = run_compiled(fn, a, b)
    assert_fully_compiled(reports)
    torch.testing.assert_close(out, fn(a, b), rtol=1e-5, atol=1e-4)
    out[0].fill_(0)
    assert out[1].abs().sum() > 0


def test_conv_weight_gradient_through_the_gemm_is_stored_in_place() -> None:
    """A 3x3 convolution's weight gradient as a GEMM (`[Cout, C*9]`) is the `[Cout, C, 3, 3]`
    gradient itself: the backward has no kernel that only copies it."""
    conv = torch.nn.Conv2d(64, 64, 3, padding=1, bias=False)
    x = torch.randn(1, 64, 14, 14)

    def step(inp: torch.Tensor) -> torch.Tensor:
        conv(inp).square().sum().backward()
        return conv.weight.grad

    conv.weight.grad = None
    expected = step(x).clone()
    conv.weight.grad = None
    torch._dynamo.reset()
    from torchburn.backend import report as rep

    records = rep.start_recording()
    try:
        compiled = torch.compile(conv, backend="torchburn")
        compiled(x).square().sum().backward()
    finally:
        rep.stop_recording()
    torch.testing.assert_close(conv.weight.grad, expected, rtol=1e-4, atol=1e-3)
    backward = [s for r in records if r.kind == "backward" for s in r.subgraphs if s.compiled]
    assert backward, [r.kind for r in records]
    kernels = [k for s in backward for k in s.kernels]
    assert len(kernels) <= 2, kernels  # the columns (im2col) and the GEMM; there was a third, the copy
