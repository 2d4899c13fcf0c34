"""A launcher's pinned inputs (`GpuLauncher.pin`, used by the LLM step cache for the model's
weights): checked once, then only identity and version per call; a different object or an
in-place write is still seen, the result always equals eager's."""
from __future__ import annotations

import torch

from torchburn.backend import gpu_launcher as gl


def _launcher(w: torch.Tensor, b: torch.Tensor) -> "gl.GpuLauncher":
    torch._dynamo.reset()

    def f(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ w + b)

    fast = torch.compile(f, backend="torchburn")
    x = torch.randn(2, 16)
    torch.testing.assert_close(fast(x, w, b), f(x, w, b))
    launcher = gl.recent_launchers()[-1]
    assert launcher.calls == 1 and launcher.eager_fallbacks == 0
    return launcher


def _args(launcher: "gl.GpuLauncher", x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
    """The launcher's arguments in its order (graph inputs: x, w, b, in some order)."""
    by_shape = {tuple(x.shape): x, tuple(w.shape): w, tuple(b.shape): b}
    return [by_shape[tuple(inp.value.shape[i].value for i in range(inp.value.type.rank))]  # type: ignore[attr-defined]
            for inp in sorted(launcher.inputs, key=lambda i: i.position)]


def test_pinned_weights_skip_checks_and_still_see_changes(gpu) -> None:  # type: ignore[no-untyped-def]
    w, b = torch.randn(16, 8), torch.randn(8)
    launcher = _launcher(w, b)
    weights = {i.position for i in launcher.inputs if i.value.type.rank != 2 or i.value.shape[0].value == 16}  # type: ignore[attr-defined]
    assert len(weights) == 2
    launcher.pin(weights)

    def call(x: torch.Tensor) -> torch.Tensor:
        (out,) = launcher(*_args(launcher, x, w, b))
        return out

    for _ in range(3):
        x = torch.randn(2, 16)
        torch.testing.assert_close(call(x), torch.relu(x @ w + b))
    assert launcher.pinned_calls == 2  # the first call bound them, the next two were pinned
    assert launcher._pinned is not None and len(launcher._pinned.tensors) == 2
    # an in-place write to a pinned weight: that call checks all, uploads it, pins again
    with torch.no_grad():
        w.mul_(-1.0)
    x = torch.randn(2, 16)
    torch.testing.assert_close(call(x), torch.relu(x @ w + b))
    assert launcher.pinned_calls == 2
    torch.testing.assert_close(call(x), torch.relu(x @ w + b))
    assert launcher.pinned_calls == 3
    # a different object at a pinned position: checked in full, its values used
    b = torch.randn(8)
    torch.testing.assert_close(call(x), torch.relu(x @ w + b))
    assert launcher.eager_fallbacks == 0


def test_unpinned_launcher_takes_the_full_path(gpu) -> None:  # type: ignore[no-untyped-def]
    w, b = torch.randn(16, 8), torch.randn(8)
    launcher = _launcher(w, b)
    for _ in range(2):
        x = torch.randn(2, 16)
        (out,) = launcher(*_args(launcher, x, w, b))
        torch.testing.assert_close(out, torch.relu(x @ w + b))
    assert launcher.pinned_calls == 0 and launcher._pinned is None
