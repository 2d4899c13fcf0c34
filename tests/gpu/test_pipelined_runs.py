"""Runs submitted before the last one's results are read (`GpuLauncher.submit`,
`GpuProgram.run_copy(defer=True)`, `runtime/gpu_async.py`): each run's results are its own, a
third run reads the first one's results before it takes its staging buffer back, and a fed
result (`feed=`) is the next run's input on the device, with nothing from the host."""
from __future__ import annotations

import pytest
import torch

from torchburn.backend import gpu_launcher as gl
from torchburn.backend import gpu_resident
from torchburn.runtime.gpu import GpuError


def _launcher(fn, *example):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="torchburn", dynamic=False)
    with torch.no_grad():
        compiled(*example)
    return gl.recent_launchers()[-1]


def test_runs_in_flight_keep_their_own_results(gpu) -> None:  # type: ignore[no-untyped-def]
    launcher = _launcher(lambda x: x * 2.0 + 1.0, torch.zeros(64))
    xs = [torch.full((64,), float(k)) for k in range(5)]
    with torch.no_grad():
        pending = [launcher.submit(x) for x in xs[:2]]
        assert launcher.gpu.most_in_flight == 2
        pending += [launcher.submit(x) for x in xs[2:]]  # each takes a staging buffer still held
        got = [p.result()[0] for p in pending]
    for x, y in zip(xs, got):
        torch.testing.assert_close(y, x * 2.0 + 1.0)
    assert launcher.eager_fallbacks == 0 and launcher.calls == 1 + len(xs)


def test_a_fed_result_is_the_next_runs_input(gpu) -> None:  # type: ignore[no-untyped-def]
    state = gpu_resident.keep_on_gpu(torch.tensor([[1, 2, 3, 4]], dtype=torch.int32))
    launcher = _launcher(lambda t: t * 2 + 1, state)
    with torch.no_grad():
        pending = [launcher.submit(state, feed=(0, 0)) for _ in range(3)]
        got = [p.result()[0].tolist() for p in pending]
    # 1 -> 3 -> 7 -> 15: each run read what the one before it fed, nothing went up in between
    assert got == [[[3, 5, 7, 9]], [[7, 11, 15, 19]], [[15, 23, 31, 39]]]
    assert launcher.fed_calls == 3 and gpu_resident.is_stale(state)
    assert gpu_resident.to_host(state).tolist() == [[15, 23, 31, 39]]


def test_feeding_a_tensor_the_gpu_does_not_own_is_refused(gpu) -> None:  # type: ignore[no-untyped-def]
    state = torch.tensor([[1, 2, 3, 4]], dtype=torch.int32)
    launcher = _launcher(lambda t: t * 2 + 1, state)
    with torch.no_grad(), pytest.raises(GpuError, match="not owned by the GPU"):
        launcher.submit(state, feed=(0, 0))
