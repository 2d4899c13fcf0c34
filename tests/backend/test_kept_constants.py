"""Weights packed once (`keep-constant-prep`, `Launcher._fresh`): an inference graph computes
what it derives from its parameters alone on the first call and keeps it; a call whose weights
are other tensors, other memory or at another version computes it again."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
from torch import nn

import torchburn
from torchburn.backend import launcher as launcher_mod


@pytest.fixture
def refreshes(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(refresh, number of keyed tensors) of every call of a program that keeps something."""
    seen: list[tuple[int, int]] = []
    original = launcher_mod.Launcher._fresh

    def spy(self: Any, workspace: int, tensors: tuple[torch.Tensor, ...]) -> int:
        r = original(self, workspace, tensors)
        seen.append((r, len(tensors)))
        return r

    monkeypatch.setattr(launcher_mod.Launcher, "_fresh", spy)
    torch._dynamo.reset()
    return seen


class Encoder(nn.Module):
    """Two strided conv1d layers (wav2vec2's feature encoder in small)."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv1d(8, 32, 3, stride=2, bias=False)
        self.c2 = nn.Conv1d(32, 32, 3, stride=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c2(torch.nn.functional.gelu(self.c1(x)))


def compiled(model: nn.Module) -> Callable[..., Any]:
    return torch.compile(model, backend="torchburn", options={"tune": "off"})


def check(fn: Callable[..., Any], model: nn.Module, x: torch.Tensor) -> None:
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)


def test_the_packed_weight_is_kept_and_an_in_place_update_repacks_it(refreshes: list[tuple[int, int]]) -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    fn = compiled(model)
    x = torch.randn(2, 8, 64)
    check(fn, model, x)
    check(fn, model, x)
    assert [r for r, _ in refreshes] == [1, 0]  # packed on the first call, reused on the second
    assert refreshes[0][1] == 2  # keyed on both conv weights
    with torch.no_grad():
        model.c2.weight.mul_(-2)  # an in-place update moves the version counter
    check(fn, model, x)  # wrong if the old packed weight were used
    check(fn, model, torch.randn(2, 8, 64))  # another input: the weights stay packed
    assert [r for r, _ in refreshes][2:] == [1, 0]
    other = Encoder()
    model.load_state_dict(other.state_dict())  # `copy_` into every parameter
    check(fn, model, x)
    assert refreshes[-1][0] == 1


def test_a_replaced_parameter_or_a_forget_kept_repacks(refreshes: list[tuple[int, int]]) -> None:
    torch.manual_seed(1)
    model = Encoder().eval()
    fn = compiled(model)
    x = torch.randn(1, 8, 64)
    check(fn, model, x)
    model.c1.weight = nn.Parameter(torch.randn_like(model.c1.weight))  # another tensor
    check(fn, model, x)
    with torch.no_grad():
        model.c1.weight.data = torch.randn_like(model.c1.weight)  # same tensor, other memory
    check(fn, model, x)
    assert all(r == 1 for r, _ in refreshes)
    model.c1.weight.data.mul_(3)  # `.data` bypasses the version counter: not seen...
    torchburn.forget_kept()  # ...until told
    check(fn, model, x)
    assert refreshes[-1][0] == 1


def test_batch_norm_folded_into_the_weight_is_kept_with_it(refreshes: list[tuple[int, int]]) -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()).eval()
    with torch.no_grad():
        model[1].running_var.uniform_(0.5, 2.0)
        model[1].running_mean.normal_()
    fn = compiled(model)
    x = torch.randn(1, 8, 16, 16)
    check(fn, model, x)
    check(fn, model, x)
    assert [r for r, _ in refreshes] == [1, 0]
    assert refreshes[0][1] >= 3  # the weight and batch norm's parameters and statistics
    with torch.no_grad():
        model[1].running_var.mul_(4)  # a buffer, not a parameter
    check(fn, model, x)
    assert refreshes[-1][0] == 1


def test_inference_tensors_are_never_kept(refreshes: list[tuple[int, int]]) -> None:
    torch.manual_seed(3)
    with torch.inference_mode():
        model = Encoder().eval()  # parameters without a version counter
        fn = compiled(model)
        x = torch.randn(1, 8, 64)
        for _ in range(3):
            torch.testing.assert_close(fn(x), model(x), rtol=1e-4, atol=1e-4)
    assert refreshes and all(r == 1 for r, _ in refreshes)


def test_training_graphs_keep_nothing(refreshes: list[tuple[int, int]]) -> None:
    torch.manual_seed(4)
    model = Encoder().train()
    fn = compiled(model)
    x = torch.randn(1, 8, 64)
    for _ in range(2):
        out = fn(x)
        out.sum().backward()
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
    assert refreshes == []


def test_explain_says_what_is_kept_and_training_keeps_nothing() -> None:
    torch.manual_seed(0)
    model = Encoder().eval()
    x = torch.randn(2, 8, 64)
    with torch.no_grad():
        text = str(torchburn.explain(model, x))
    # both convolutions' packed weights (32 x 8 x 3 and 32 x 32 x 3 f32), from the two weights
    line = next(ln for ln in text.splitlines() if "kept across calls" in ln)
    assert "2 temporaries" in line and "from 2 constant inputs" in line, line
    size = float(line.split("(")[1].split(" KiB")[0])
    assert size * 1024 >= (32 * 8 * 3 + 32 * 32 * 3) * 4, line
    torch._dynamo.reset()
    text = str(torchburn.explain(model.train(), x.requires_grad_()))
    assert "kept across calls" not in text, text
