"""The native dispatch loop (`runtime/gpu_encode.py`): one call from Python encodes a run's
dispatches, setting a pipeline or bind group only when it changes, with the same results as
the Python loop."""
from __future__ import annotations

import ctypes

import pytest
import torch

from torchburn.backend import gpu_launcher as gl
from torchburn.runtime.gpu_encode import NativeEncoder, batch_of


def _encoder() -> NativeEncoder:
    pytest.importorskip("wgpu")
    enc = NativeEncoder.get()
    if enc is None:
        pytest.skip("no native encoder (wgpu-native's C functions or LLVM missing)")
    return enc


def test_the_loop_calls_what_the_python_loop_called() -> None:
    """Recording callbacks in place of wgpu-native's functions: the pass handle, each
    pipeline and bind group once per change (group index 0, no dynamic offsets), each
    dispatch's counts in order."""
    enc = _encoder()
    seen: list[tuple[object, ...]] = []
    set_pipeline = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)(
        lambda p, pipe: seen.append(("pipe", p, pipe)))
    set_group = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t,
                                 ctypes.c_void_p)(lambda p, i, g, n, off: seen.append(("group", p, i, g, n, off)))
    dispatch = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_uint32)(
        lambda p, x, y, z: seen.append(("dispatch", p, x, y, z)))
    fps = tuple(ctypes.cast(f, ctypes.c_void_p).value for f in (set_pipeline, set_group, dispatch))
    batch = batch_of([(16, 32, (1, 2, 3)), (16, 48, (4, 1, 1)), (64, 48, (70000, 5, 1)), (64, 48, (1, 1, 1))])
    enc.call(0x1000, batch, fps)  # type: ignore[arg-type]
    assert seen == [("pipe", 0x1000, 16), ("group", 0x1000, 0, 32, 0, None), ("dispatch", 0x1000, 1, 2, 3),
                    ("group", 0x1000, 0, 48, 0, None), ("dispatch", 0x1000, 4, 1, 1),
                    ("pipe", 0x1000, 64), ("dispatch", 0x1000, 70000, 5, 1), ("dispatch", 0x1000, 1, 1, 1)]
    seen.clear()
    enc.call(0x1000, batch_of([]), fps)  # type: ignore[arg-type]
    assert seen == []


def test_runs_encode_natively_with_the_python_loops_results(gpu, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A compiled graph of several kernels, run with the native loop and with the Python loop:
    the same results, eager's; the native loop encoded every run of the first."""
    _encoder()

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        h = torch.softmax(x @ w, dim=-1)
        return torch.rms_norm(h * 2.0 + x, (x.shape[-1],)) @ w.t()

    x, w = torch.randn(3, 40), torch.randn(40, 40)
    expected = f(x, w)
    results = {}
    for native in (True, False):
        monkeypatch.setattr(NativeEncoder, "enabled", native)
        torch._dynamo.reset()
        fast = torch.compile(f, backend="torchburn")
        with torch.no_grad():
            outs = [fast(x, w)]
            launcher = gl.recent_launchers()[-1]
            before = launcher.gpu.native_encodes  # the program may be shared with the first round's
            outs += [fast(x, w) for _ in range(3)]
        assert launcher.calls == 4 and launcher.eager_fallbacks == 0
        assert launcher.gpu.native_encodes - before == (3 if native else 0)
        results[native] = outs
    for a, b in zip(results[True], results[False]):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        torch.testing.assert_close(a, expected, rtol=1e-4, atol=1e-4)


def test_gpu_time_from_timestamps(gpu, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """`GpuProgram.time_gpu`: each run's compute pass is timed on the device's clock (where the
    adapter has timestamp queries), a positive time below the run's wall time; results unchanged."""
    from torchburn.runtime.gpu import GpuProgram, get_device

    if not get_device().timestamps:
        pytest.skip("the adapter has no timestamp queries")
    monkeypatch.setattr(GpuProgram, "time_gpu", True)

    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x @ w, dim=-1) * 3.0

    x, w = torch.randn(64, 64), torch.randn(64, 64)
    torch._dynamo.reset()
    fast = torch.compile(f, backend="torchburn")
    with torch.no_grad():
        fast(x, w)
        launcher = gl.recent_launchers()[-1]
        times = launcher.gpu.times
        runs, gpu_s, wall_s = times.gpu_runs, times.gpu_s, times.submit_s + times.wait_s
        torch.testing.assert_close(fast(x, w), f(x, w), rtol=1e-4, atol=1e-4)
    assert times.gpu_runs == runs + 1
    assert 0 < times.gpu_s - gpu_s < (times.submit_s + times.wait_s) - wall_s
