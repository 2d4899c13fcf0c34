"""Whole models through the backend, forward and backward, against eager with random weights:
a small CNN (conv, batch norm, ReLU, max pool, adaptive average pool, linear), PyTorch's
`TransformerEncoderLayer` (train, eval, and the fused inference path), a GPT-style decoder
block (RMSNorm, rotary embeddings, causal attention, SiLU-gated MLP), and training loops with
SGD and AdamW whose losses must follow eager's. Nothing may fall back to PyTorch.
"""
from __future__ import annotations

import copy
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from torchburn.backend import report as rep
from tests.helpers import assert_fully_compiled, run_compiled

#: Compiled and eager code sum in different orders; these models are shallow and small.
TOL = dict(rtol=1e-4, atol=1e-5)


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class DecoderBlock(nn.Module):
    """Pre-norm GPT block in the Llama style."""

    def __init__(self, dim: int = 32, heads: int = 4, hidden: int = 64) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = RMSNorm(dim), RMSNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.out = nn.Linear(dim, dim, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.up = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        hd = d // self.heads
        inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
        angles = torch.outer(torch.arange(n, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        cos, sin = angles.cos(), angles.sin()
        q, k, v = self.qkv(self.norm1(x)).split(d, dim=-1)
        q, k, v = (t.view(b, n, self.heads, hd).transpose(1, 2) for t in (q, k, v))
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, n, d))
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def compiled_forward_backward(model: nn.Module, *inputs: torch.Tensor) -> tuple[torch.Tensor, list[rep.GraphReport]]:
    """Run `model` compiled with torchburn and backpropagate a loss; return output and reports."""
    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        out = torch.compile(model, backend="torchburn")(*inputs)
        out.pow(2).mean().backward()
    finally:
        rep.stop_recording()
    return out, list(records)


def check_model(make: Callable[[], nn.Module], *inputs: torch.Tensor, train: bool) -> nn.Module:
    """Output, input gradients and parameter gradients of the compiled model equal eager's."""
    torch.manual_seed(0)
    eager = make().train(train)
    model = copy.deepcopy(eager)
    ins = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ref_ins = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    out, records = compiled_forward_backward(model, *ins)
    expected = eager(*ref_ins)
    expected.pow(2).mean().backward()
    torch.testing.assert_close(out, expected, **TOL)
    for a, b in zip(ins, ref_ins):
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, **TOL)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, **TOL, msg=lambda m: f"{name}: {m}")
    for (name, buf), ref in zip(model.named_buffers(), eager.buffers()):
        torch.testing.assert_close(buf, ref, **TOL, msg=lambda m: f"{name}: {m}")
    assert {r.kind for r in records} >= {"forward", "backward"}
    assert_fully_compiled(records)
    return model


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_cnn_forward_backward(train: bool) -> None:
    x = torch.randn(4, 3, 16, 16, generator=torch.Generator().manual_seed(1))
    check_model(SmallCNN, x, train=train)


def encoder(dropout: float = 0.0) -> nn.Module:
    return nn.TransformerEncoderLayer(32, 4, 64, dropout=dropout, batch_first=True)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_transformer_encoder_layer(train: bool) -> None:
    # Dropout draws random numbers in PyTorch by design; training runs use p = 0.
    x = torch.randn(2, 6, 32, generator=torch.Generator().manual_seed(2))
    check_model(lambda: encoder(0.0 if train else 0.1), x, train=train)


def test_transformer_encoder_layer_inference_fast_path() -> None:
    """In eval mode without grad PyTorch takes its fused `_transformer_encoder_layer_fwd`."""
    torch.manual_seed(0)
    model = encoder(0.1).eval()
    x = torch.randn(2, 6, 32)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    with torch.no_grad():
        out, records = run_compiled(lambda a: model(a, src_key_padding_mask=pad), x)
        torch.testing.assert_close(out, model(x, src_key_padding_mask=pad), **TOL)
    assert_fully_compiled(records)


def test_gpt_decoder_block() -> None:
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(3))
    check_model(DecoderBlock, x, train=True)


def _train(model: nn.Module, step: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor],
           opt: torch.optim.Optimizer, data: list[tuple[torch.Tensor, torch.Tensor]]) -> list[float]:
    losses = []
    for x, y in data:
        opt.zero_grad()
        loss = step(model, x, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_training_loop_matches_eager(optimizer: str) -> None:
    torch.manual_seed(0)
    eager = SmallCNN(classes=5)
    model = copy.deepcopy(eager)
    g = torch.Generator().manual_seed(4)
    data = [(torch.randn(4, 3, 12, 12, generator=g), torch.randint(0, 5, (4,), generator=g)) for _ in range(4)]

    def step(m: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(m(x), y, label_smoothing=0.05)

    def make_opt(m: nn.Module) -> Any:
        if optimizer == "sgd":
            return torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)
        return torch.optim.AdamW(m.parameters(), lr=0.01, weight_decay=0.01)

    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        losses = _train(model, torch.compile(step, backend="torchburn"), make_opt(model), data)
    finally:
        rep.stop_recording()
    expected = _train(eager, step, make_opt(eager), data)
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(expected), rtol=1e-4, atol=1e-5)
    assert expected[-1] < expected[0], "the loop should learn something"
    if optimizer == "sgd":
        # (Adam divides by the gradient's magnitude: the first conv's bias, right before batch
        # norm, has a gradient that is zero up to rounding, and Adam turns the rounding noise
        # into steps of +-lr; the losses above are what must agree.)
        for p, q in zip(model.parameters(), eager.parameters()):
            torch.testing.assert_close(p, q, rtol=1e-4, atol=1e-5)
    assert_fully_compiled(records)
