"""Waiting for one submission, not for the whole queue: what lets the host run ahead of the GPU.

wgpu-py's `GPUBuffer.map_sync` first submits an empty command buffer, then its poll thread
calls ``wgpuDevicePoll(wait=true)`` with no submission index, which waits for *every*
submission so far. When a decode step `t+1` is already submitted while the host waits for
step `t`'s token, that wait would last until step `t+1` is done too, and the host and the GPU
would take turns again. This module makes the same native calls itself:

    index = submit(queue, [commands])          # wgpuQueueSubmitForIndex
    data = read_mapped(device, staging, n, index)
        # wgpuBufferMapAsync, then wgpuDevicePoll(wait=true, &index): until that
        # submission is done (later ones may still run), then the mapped bytes, copied

`RawQueue.get()` is None where wgpu-native's C functions are not there (another wgpu backend
or version); `runtime/gpu.py` then uses wgpu-py's public calls.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Optional


class RawQueue:
    """wgpu-native's submit-for-index, map and poll, through wgpu-py's cffi handles."""

    _instance: Optional["RawQueue"] = None
    _tried = False

    def __init__(self) -> None:
        from wgpu.backends.wgpu_native._api import libf, new_struct
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        self.ffi, self.lib, self.libf, self.new_struct = ffi, lib, libf, new_struct
        # fail here, not at the first run, where a function is missing
        for name in ("wgpuQueueSubmitForIndex", "wgpuDevicePoll", "wgpuBufferMapAsync",
                     "wgpuBufferGetConstMappedRange", "wgpuBufferUnmap"):
            getattr(lib, name)
        self.success = lib.WGPUMapAsyncStatus_Success
        self.mode = lib.WGPUCallbackMode_AllowProcessEvents
        #: Map requests in flight: request id -> status (None until the callback ran).
        self._status: dict[int, Optional[int]] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        status = self._status

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def on_mapped(code: int, _message: Any, user1: Any, _user2: Any) -> None:
            status[int(ffi.cast("intptr_t", user1))] = int(code)

        self._on_mapped = on_mapped  # kept alive as long as this object

    @classmethod
    def get(cls) -> Optional["RawQueue"]:
        """The shared instance, or None without wgpu-native's C functions."""
        if not cls._tried:
            cls._tried = True
            try:
                cls._instance = cls()
            except (ImportError, AttributeError):
                cls._instance = None
        return cls._instance

    def submit(self, queue: Any, commands: list[Any]) -> int:
        """Submit command buffers; returns the submission's index (for `read_mapped`)."""
        handles = self.ffi.new("WGPUCommandBuffer[]", [c._internal for c in commands])
        return int(self.libf.wgpuQueueSubmitForIndex(queue._internal, len(commands), handles))

    def read_mapped(self, device: Any, buffer: Any, nbytes: int, index: int) -> memoryview:
        """A copy of the first `nbytes` of a MAP_READ `buffer` that submission `index` wrote,
        waiting for that submission only. Raises RuntimeError when the map fails."""
        ffi, lib = self.ffi, self.lib
        with self._lock:
            key = next(self._ids)
            self._status[key] = None
        info = self.new_struct("WGPUBufferMapCallbackInfo", mode=self.mode, callback=self._on_mapped,
                               userdata1=ffi.cast("void *", key), userdata2=ffi.NULL)
        try:
            self.libf.wgpuBufferMapAsync(buffer._internal, lib.WGPUMapMode_Read, 0, nbytes, info)
            wanted = ffi.new("WGPUSubmissionIndex *", index)
            dev = device._internal
            for _ in range(1000):
                if self._status[key] is not None:
                    break
                # blocks until submission `index` is done, then fires the callbacks due
                lib.wgpuDevicePoll(dev, True, wanted)
            code = self._status[key]
        finally:
            with self._lock:
                self._status.pop(key, None)
        if code != self.success:
            raise RuntimeError(f"could not map a staging buffer (status {code})")
        try:
            ptr = lib.wgpuBufferGetConstMappedRange(buffer._internal, 0, nbytes)
            return memoryview(bytearray(ffi.buffer(ptr, nbytes)))
        finally:
            lib.wgpuBufferUnmap(buffer._internal)
