"""Encoding a program's dispatches in one native call instead of a Python loop.

WebGPU command buffers are single-use and compute passes have no render bundles, so each run
of a program encodes its dispatches again: per dispatch a set-pipeline, a set-bind-group and a
dispatch call into wgpu-native. From Python (cffi) that costs 3-4 us per dispatch on a fast
host (the H200 run: 1,670 us for the 457 dispatches of a SmolLM2 decode step), more than the
GPU spends on most of these kernels. This module JIT-compiles (llvmlite, as the CPU engine's
code) one small loop that makes those calls from arrays of handles prepared once per set of
bind groups and workgroup counts, so a run crosses from Python into native code once:

    encoder = NativeEncoder.get()                    # None where wgpu-native's calls are absent
    batch = encoder.prepare(pipelines, groups, dims) # handles (cffi pointers) -> C arrays, once
    encoder.encode(pass_handle, batch)               # one ctypes call: every dispatch

The loop's IR (a pipeline or bind group equal to the previous dispatch's is not set again, as
the Python loop did):

    define void @torchburn_encode(ptr %pass, i64 %n, ptr %pipes, ptr %groups, ptr %dims,
                                  ptr %set_pipeline, ptr %set_bind_group, ptr %dispatch)
      for i in 0..n: if pipes[i] != last: set_pipeline(pass, pipes[i])
                     if groups[i] != last: set_bind_group(pass, 0, groups[i], 0, null)
                     dispatch(pass, dims[3i], dims[3i+1], dims[3i+2])

The function pointers are passed in, so the object calls nothing by name. Setting
`NativeEncoder.enabled = False` keeps the Python loop (benchmarks' A/B timing).
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any, Optional, Sequence

_IR = """
define void @torchburn_encode(ptr %pass, i64 %n, ptr %pipes, ptr %groups, ptr %dims,
                              ptr %set_pipeline, ptr %set_bind_group, ptr %dispatch) {
entry:
  %empty = icmp sle i64 %n, 0
  br i1 %empty, label %exit, label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %disp ]
  %last_p = phi ptr [ null, %entry ], [ %p, %disp ]
  %last_g = phi ptr [ null, %entry ], [ %g, %disp ]
  %pp = getelementptr ptr, ptr %pipes, i64 %i
  %p = load ptr, ptr %pp
  %same_p = icmp eq ptr %p, %last_p
  br i1 %same_p, label %bind, label %set_p
set_p:
  call void %set_pipeline(ptr %pass, ptr %p)
  br label %bind
bind:
  %gp = getelementptr ptr, ptr %groups, i64 %i
  %g = load ptr, ptr %gp
  %same_g = icmp eq ptr %g, %last_g
  br i1 %same_g, label %disp, label %set_g
set_g:
  call void %set_bind_group(ptr %pass, i32 0, ptr %g, i64 0, ptr null)
  br label %disp
disp:
  %k = mul i64 %i, 3
  %xp = getelementptr i32, ptr %dims, i64 %k
  %x = load i32, ptr %xp
  %k1 = add i64 %k, 1
  %yp = getelementptr i32, ptr %dims, i64 %k1
  %y = load i32, ptr %yp
  %k2 = add i64 %k, 2
  %zp = getelementptr i32, ptr %dims, i64 %k2
  %z = load i32, ptr %zp
  call void %dispatch(ptr %pass, i32 %x, i32 %y, i32 %z)
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""

_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p,
                       ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class Batch:
    """The C arrays of one dispatch sequence (kept alive with it)."""

    __slots__ = ("n", "pipes", "groups", "dims")

    def __init__(self, n: int, pipes: Any, groups: Any, dims: Any) -> None:
        self.n, self.pipes, self.groups, self.dims = n, pipes, groups, dims


class NativeEncoder:
    """The JIT-compiled dispatch loop and wgpu-native's compute-pass function pointers."""

    #: False: every program encodes from Python (`GpuProgram._encode`'s loop).
    enabled = True
    _instance: "Optional[NativeEncoder]" = None
    _failed = False
    _lock = threading.Lock()

    def __init__(self) -> None:
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        from ..codegen.target import host_target
        from .jit import compile_and_load

        self.ffi = ffi
        self._native = compile_and_load(_IR, host_target())
        self._fn = _FN(self._native.address("torchburn_encode"))
        addr = lambda f: int(ffi.cast("uintptr_t", f))  # noqa: E731
        self._fps = (addr(lib.wgpuComputePassEncoderSetPipeline), addr(lib.wgpuComputePassEncoderSetBindGroup),
                     addr(lib.wgpuComputePassEncoderDispatchWorkgroups))

    @classmethod
    def get(cls) -> "Optional[NativeEncoder]":
        """The process's encoder, or None (wgpu-native's calls or LLVM unavailable, or
        `enabled` off)."""
        if not cls.enabled:
            return None
        if cls._instance is None and not cls._failed:
            with cls._lock:
                if cls._instance is None and not cls._failed:
                    try:
                        cls._instance = cls()
                    except (ImportError, AttributeError, RuntimeError, OSError):
                        cls._failed = True
        return cls._instance

    def handle(self, obj: Any) -> int:
        """The address of a wgpu object's native handle."""
        return int(self.ffi.cast("uintptr_t", obj._internal))

    def prepare(self, dispatches: Sequence[tuple[Any, Any, tuple[int, int, int]]]) -> Batch:
        """C arrays of (pipeline, bind group, workgroup counts) per dispatch (wgpu objects)."""
        return batch_of([(self.handle(p), self.handle(g), d) for p, g, d in dispatches])

    def encode(self, pass_handle: Any, batch: Batch) -> None:
        """Every dispatch of `batch` into the compute pass `pass_handle` (a cffi pointer)."""
        self.call(int(self.ffi.cast("uintptr_t", pass_handle)), batch, self._fps)

    def call(self, pass_address: int, batch: Batch, fps: tuple[int, int, int]) -> None:
        """The loop with these (set pipeline, set bind group, dispatch) function addresses."""
        sp, sg, dp = fps
        self._fn(pass_address, batch.n, ctypes.addressof(batch.pipes), ctypes.addressof(batch.groups),
                 ctypes.addressof(batch.dims), sp, sg, dp)


def batch_of(dispatches: Sequence[tuple[int, int, tuple[int, int, int]]]) -> Batch:
    """C arrays of (pipeline address, bind group address, workgroup counts) per dispatch."""
    n = len(dispatches)
    pipes = (ctypes.c_void_p * max(n, 1))(*[p for p, _, _ in dispatches])
    groups = (ctypes.c_void_p * max(n, 1))(*[g for _, g, _ in dispatches])
    dims = (ctypes.c_uint32 * max(3 * n, 1))(*[v for _, _, d in dispatches for v in d])
    return Batch(n, pipes, groups, dims)
