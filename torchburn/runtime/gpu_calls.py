"""Counting the wgpu calls the GPU engine makes: what a decode step costs on the host.

The host-side cost of a GPU program is its wgpu calls (each crosses into wgpu-native through
cffi, with Python checks around it), and the objects it creates are the expensive ones. This
module wraps the methods of wgpu-native's classes for the duration of a `with` block and counts
the calls, so a benchmark or a test can say "a warm decode step creates no buffer and no bind
group":

    with count_calls() as calls:
        step()
    calls["create_bind_group"] == 0, calls["dispatch_workgroups"] == 42

The counts are per process (every device), not per program.
"""
from __future__ import annotations

import contextlib
import threading
from collections import Counter
from typing import Any, Callable, Iterator

#: class name in wgpu.backends.wgpu_native -> the methods counted.
COUNTED: dict[str, tuple[str, ...]] = {
    "GPUDevice": ("create_buffer", "create_bind_group", "create_command_encoder", "create_compute_pipeline",
                  "create_shader_module", "create_bind_group_layout", "create_pipeline_layout"),
    "GPUQueue": ("write_buffer", "submit"),
    "GPUCommandEncoder": ("begin_compute_pass", "copy_buffer_to_buffer", "finish"),
    "GPUComputePassEncoder": ("set_pipeline", "set_bind_group", "dispatch_workgroups"),
    "GPUBuffer": ("map_sync", "read_mapped", "unmap"),
}

_lock = threading.Lock()
_active = False
_counts: "Counter[str] | None" = None


def counting() -> bool:
    """Whether a `count_calls` block is running: the GPU engine then encodes through wgpu's
    public methods (which it counts), not wgpu-native's C functions (`GpuDevice.raw_pass`)."""
    return _active


def note(name: str) -> None:
    """Count a call the GPU engine makes through wgpu-native's C functions rather than a
    counted method (`create_shader_module` without runtime checks, `runtime/gpu.py`)."""
    if _counts is not None:
        _counts[name] += 1


def _wrap(fn: Callable[..., Any], name: str, counts: Counter[str]) -> Callable[..., Any]:
    def counted(*args: Any, **kwargs: Any) -> Any:
        counts[name] += 1
        return fn(*args, **kwargs)

    counted.__wrapped__ = fn  # type: ignore[attr-defined]
    return counted


@contextlib.contextmanager
def count_calls() -> Iterator[Counter[str]]:
    """Count calls of the methods in `COUNTED` made inside the block (the Counter is filled as
    the block runs; wgpu's classes are restored on exit). One block at a time per process."""
    from wgpu.backends import wgpu_native

    global _active, _counts
    counts: Counter[str] = Counter()
    saved: list[tuple[type, str, Any]] = []
    with _lock:
        _active, _counts = True, counts
        try:
            for cls_name, methods in COUNTED.items():
                cls = getattr(wgpu_native, cls_name)
                for m in methods:
                    original = cls.__dict__.get(m)
                    fn = getattr(cls, m)
                    saved.append((cls, m, original))
                    setattr(cls, m, _wrap(fn, m, counts))
            yield counts
        finally:
            _active, _counts = False, None
            for cls, m, original in reversed(saved):
                if original is None:
                    delattr(cls, m)
                else:
                    setattr(cls, m, original)
