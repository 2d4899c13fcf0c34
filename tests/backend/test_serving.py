"""A compiled model in a long-lived server (issue 16): calls from many threads, first compilations
from several threads at once, many calls without growth, and a failing GPU that falls back with
one warning."""
from __future__ import annotations

import gc
import os
import threading
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

import torchburn  # noqa: F401  (registers the backend)


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 16)).eval()


def test_one_compiled_model_called_from_eight_threads() -> None:
    model = _mlp()
    compiled = torch.compile(model, backend="torchburn")
    inputs = [torch.randn(4 + i % 3, 32) for i in range(8)]
    with torch.no_grad():
        expected = [model(x) for x in inputs]
        compiled(inputs[0])  # compiled once, before the threads start
        compiled(inputs[1])  # and for the second batch size (dynamic from here on)
    wrong: list[str] = []
    barrier = threading.Barrier(8)

    def worker(k: int) -> None:
        barrier.wait()
        with torch.no_grad():
            for step in range(40):
                i = (k + step) % 8
                out = compiled(inputs[i])
                if not torch.allclose(out, expected[i], atol=1e-5, rtol=1e-5):
                    wrong.append(f"thread {k} step {step} input {i}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(worker, range(8)))
    assert not wrong, wrong[:5]


def test_first_compilations_from_several_threads_at_once() -> None:
    fns = [lambda x, k=k: torch.sin(x) * (k + 1) + x.sum(-1, keepdim=True) for k in range(4)]
    compiled = [torch.compile(f, backend="torchburn") for f in fns]
    x = torch.randn(8, 16)
    barrier = threading.Barrier(4)

    def first_call(k: int) -> torch.Tensor:
        barrier.wait()
        return compiled[k](x)

    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(first_call, range(4)))
    for f, out in zip(fns, outs):
        torch.testing.assert_close(out, f(x))


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS read from /proc")
def test_ten_thousand_calls_do_not_grow_the_process() -> None:
    """10,000 calls of a cached graph: RSS grows by less than 4 MiB (a leak of one 64-float
    output per call would be 2.4 MiB; of a launcher's call frame, far more)."""
    def rss_mib() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2 ** 20

    f = torch.compile(lambda a, b: torch.relu(a * b + 1).sum(-1), backend="torchburn")
    a, b = torch.randn(8, 8), torch.randn(8, 8)
    for _ in range(500):  # warm-up: allocator pools and caches settle
        f(a, b)
    gc.collect()
    before = rss_mib()
    for _ in range(10_000):
        f(a, b)
    gc.collect()
    assert rss_mib() - before < 4.0


def test_a_failing_gpu_runs_in_pytorch_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    """A lost adapter (every run raises `GpuError`): correct results from PyTorch, one warning
    for the process, however many graphs and calls fail."""
    monkeypatch.setenv("TORCHBURN_DEVICE", "gpu")
    monkeypatch.delenv("TORCHBURN_ENGINE", raising=False)
    from torchburn.runtime.config import reload_config

    reload_config()
    from torchburn.runtime import gpu as engine

    if not engine.gpu_available():
        monkeypatch.undo()
        reload_config()
        pytest.skip(f"no WebGPU adapter: {engine.gpu_unavailable_reason()}")
    from torchburn.backend import gpu_launcher

    def lost(*args: object, **kwargs: object) -> None:
        raise engine.GpuError("the device was lost")

    monkeypatch.setattr(engine.GpuProgram, "run_copy", lost)
    monkeypatch.setattr(gpu_launcher, "_run_failure_warned", False)
    try:
        f = torch.compile(lambda x: torch.exp(x) + 1, backend="torchburn")
        g = torch.compile(lambda x: torch.cos(x) * 2, backend="torchburn")
        x = torch.randn(64)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(3):
                torch.testing.assert_close(f(x), torch.exp(x) + 1)
                torch.testing.assert_close(g(x), torch.cos(x) * 2)
        gpu_warnings = [w for w in seen if "could not run on the GPU" in str(w.message)]
        assert len(gpu_warnings) == 1, [str(w.message) for w in seen]
    finally:
        monkeypatch.undo()
        reload_config()
