"""The inference fast path (`torchburn/backend/inference_path.py`): the launcher goes straight to Dynamo
only when AOTAutograd's wrapper would do nothing; every other case keeps the wrapper, and
results (aliasing, mutation, gradients) always match eager."""
from __future__ import annotations

from typing import Any, Callable

import torch

import torchburn.backend.entry as be
from torchburn.backend import inference_path


def compile_and_spy(fn: Callable[..., Any], *args: Any) -> tuple[Callable[..., Any], list[bool]]:
    """`torch.compile(fn)` with our backend, and for each graph whether it took the fast path."""
    decisions: list[bool] = []
    original = inference_path.direct_callable

    def spy(*a: Any, **k: Any) -> Any:
        out = original(*a, **k)
        decisions.append(out is not None)
        return out

    torch._dynamo.reset()
    inference_path.direct_callable = spy  # type: ignore[assignment]
    try:
        compiled = torch.compile(fn, backend=be.torchburn_backend, dynamic=False)
        compiled(*args)
    finally:
        inference_path.direct_callable = original  # type: ignore[assignment]
    return compiled, decisions


def test_plain_inference_graph_takes_the_fast_path() -> None:
    x = torch.randn(4, 8)
    compiled, decisions = compile_and_spy(lambda a: torch.sigmoid(a) * 2 + 1, x)
    assert decisions == [True]
    for _ in range(3):
        y = torch.randn(4, 8)
        out = compiled(y)
        torch.testing.assert_close(out, torch.sigmoid(y) * 2 + 1)
        assert not out.requires_grad
    odd = torch.randn(8, 4).t()  # other strides: Dynamo's guards or the launcher's handle it
    torch.testing.assert_close(compiled(odd), torch.sigmoid(odd) * 2 + 1)


def test_no_grad_module_with_parameters_takes_the_fast_path() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4)).eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        compiled, decisions = compile_and_spy(model, x)
        assert decisions == [True]
        out = compiled(x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
        assert not out.requires_grad


def test_views_of_inputs_keep_the_wrapper_and_alias() -> None:
    x = torch.randn(4, 6)
    compiled, decisions = compile_and_spy(lambda a: (a.t(), a, a + 1), x)
    assert decisions == [False]
    t, same, plus = compiled(x)
    assert t.data_ptr() == x.data_ptr() and same is x
    torch.testing.assert_close(plus, x + 1)


def test_input_mutation_keeps_the_wrapper_and_mutates() -> None:
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        a.mul_(2)
        return a + b

    x, y = torch.randn(5), torch.randn(5)
    expected_x = x * 2
    compiled, decisions = compile_and_spy(f, x.clone(), y)
    assert decisions == [False]
    x2 = x.clone()
    out = compiled(x2, y)
    torch.testing.assert_close(x2, expected_x)
    torch.testing.assert_close(out, expected_x + y)


def test_inputs_requiring_grad_keep_autograd() -> None:
    w = torch.randn(6, requires_grad=True)
    compiled, decisions = compile_and_spy(lambda a: (a.exp() * 3).sum(), w)
    assert decisions == [False]
    loss = compiled(w)
    loss.backward()
    torch.testing.assert_close(w.grad, w.detach().exp() * 3)


def test_same_tensor_twice_and_autocast() -> None:
    x, y = torch.randn(7), torch.randn(7)
    compiled, _ = compile_and_spy(lambda a, b: a * b + 1, x, x)  # Dynamo passes `x` once
    torch.testing.assert_close(compiled(x, x), x * x + 1)
    torch.testing.assert_close(compiled(x, y), x * y + 1)  # Dynamo's guard: a new graph
    with torch.autocast("cpu", dtype=torch.bfloat16):
        compiled, decisions = compile_and_spy(lambda a: a.exp() + 1, x)
        assert decisions == [False]
        torch.testing.assert_close(compiled(x), x.exp() + 1)
