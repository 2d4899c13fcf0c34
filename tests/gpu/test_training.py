"""A training step whose forward runs on the GPU engine: the gradients match eager, and the
forward tells AOTAutograd its outputs' strides (`backend/output_strides.py` lays out the GPU
launcher's results on fake tensors as it does the CPU launcher's)."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from torchburn.backend import output_strides as os_mod
from torchburn.backend import report as rep
from tests.gpu.conftest import engines
from tests.helpers import train_step_like_eager


def _block(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    h = F.gelu(x @ w + b)
    return (h * h.sum(-1, keepdim=True)).transpose(0, 1)  # a transposed view among the outputs


def test_gpu_forward_reports_its_output_strides_and_gradients_match(gpu, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    seen: list[Any] = []
    real = os_mod.output_strides

    def spy(module: Any, example_inputs: Any) -> Any:
        out = real(module, example_inputs)
        seen.append(out)
        return out

    monkeypatch.setattr(os_mod, "output_strides", spy)
    torch._dynamo.reset()
    torch.manual_seed(0)
    x, w, b = (torch.randn(12, 20, requires_grad=True), torch.randn(20, 16, requires_grad=True),
               torch.randn(16, requires_grad=True))
    records = rep.start_recording()
    try:
        fn = torch.compile(_block, backend="torchburn")
        fn(x, w, b).square().sum().backward()
    finally:
        rep.stop_recording()
    grads = [t.grad.clone() for t in (x, w, b)]
    refs = [t.detach().requires_grad_() for t in (x, w, b)]
    _block(*refs).square().sum().backward()
    for got, ref in zip(grads, refs):
        torch.testing.assert_close(got, ref.grad, rtol=1e-4, atol=1e-4)
    assert "wgpu" in [engine for engine, _ in engines(records)], engines(records)
    assert seen and all(s is not None for s in seen), seen  # the forward's strides were known


def test_batch_norm_at_a_symbolic_batch_stays_on_the_gpu(gpu) -> None:  # type: ignore[no-untyped-def]
    """Batch norm's factors at a symbolic batch (`n / (n - 1)`, `1 / n`) reach the subgraph as
    0-d tensors of the activations' dtype (`frontend/symfloat_args.py`): float32, which WGSL
    has, so the forward and backward run on the GPU engine (a float64 factor sent both to the
    CPU engine: "WGSL has no 64-bit floats")."""
    import copy

    from torch import nn

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU()).train()
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="torchburn", dynamic=True)
    for n in (5, 7):
        records = train_step_like_eager(compiled, model, eager, torch.randn(n, 16))
        if records:
            assert not [r.fallback_ops for r in records if r.fallback_ops]
            assert {engine for engine, _ in engines(records)} == {"wgpu"}, engines(records)


def test_gpu_max_pool_gradient_matches_eager(gpu) -> None:  # type: ignore[no-untyped-def]
    """Max pooling's input gradient on the GPU engine (`pool_grad`: the CPU pipeline's scatter
    form is one invocation there, and gave wrong gradients at this size)."""
    import torch.nn.functional as F

    x = torch.randn(1, 32, 56, 56, generator=torch.Generator().manual_seed(0)).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    torch._dynamo.reset()
    torch.compile(lambda a: F.max_pool2d(a, 3, 2, 1), backend="torchburn")(x).sum().backward()
    F.max_pool2d(x2, 3, 2, 1).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
