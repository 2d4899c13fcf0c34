"""Encoding the next run while the GPU works (`GpuProgram.encode_ahead`): a warm program's
runs submit commands encoded after the run before was submitted, with eager's results; commands
encoded for dispatches the next run does not have (a new length, new buffers) are dropped."""
from __future__ import annotations

import pytest
import torch

from torchburn.backend import gpu_launcher as gl
from torchburn.runtime.gpu import GpuProgram


def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x @ w, dim=-1) * 2.0 + x


@pytest.mark.parametrize("ahead", [True, False])
def test_warm_runs_submit_commands_encoded_ahead(gpu, monkeypatch, ahead: bool) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(GpuProgram, "encode_ahead", ahead)
    torch._dynamo.reset()
    fast = torch.compile(f, backend="torchburn")
    w = torch.randn(24, 24)
    with torch.no_grad():
        x = torch.randn(3, 24)
        torch.testing.assert_close(fast(x, w), f(x, w), rtol=1e-4, atol=1e-4)
        prog = gl.recent_launchers()[-1].gpu
        before, dispatches = prog.ahead_runs, prog.dispatches
        for _ in range(5):  # new inputs each run: written before the submission, seen by it
            x = torch.randn(3, 24)
            torch.testing.assert_close(fast(x, w), f(x, w), rtol=1e-4, atol=1e-4)
    # the first run had no run before it, the second had one but nothing encoded for it yet
    assert prog.ahead_runs - before == (4 if ahead else 0)
    assert prog.dispatches - dispatches == 5 * len([c for c in prog.calls])
    assert (prog._ahead is not None) == ahead


def test_a_new_length_drops_the_commands_encoded_ahead(gpu) -> None:  # type: ignore[no-untyped-def]
    """A dynamic length that grows past the buffers: new buffers and bind groups, so the
    commands encoded for the old ones are not submitted; results stay eager's throughout."""
    def g(x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 3.0, dim=-1) + 1.0

    torch._dynamo.reset()
    fast = torch.compile(g, backend="torchburn", dynamic=True)
    with torch.no_grad():
        fast(torch.randn(2, 5))
        fast(torch.randn(2, 6))
        prog = gl.recent_launchers()[-1].gpu
        ran = []
        for n in (7, 7, 7, 300, 300, 300, 9, 9):
            x = torch.randn(2, n)
            before = prog.ahead_runs
            torch.testing.assert_close(fast(x), g(x))
            ran.append(prog.ahead_runs - before)
    # 300 needs bigger buffers: its first run cannot use what was encoded for length 7's
    assert ran[3] == 0 and ran[5] == 1 and ran[2] == 1
