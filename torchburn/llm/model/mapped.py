"""Weights as views of a memory-mapped file: the file's own bytes, never a copy in process memory.

A GGUF file's quantized blocks (and its float32 tensors, a safetensors file's float32
tensors) are already in the layout the kernels read, so the loaders make those tensors views
of one map of the file (`MappedFile.tensor`), as llama.cpp does: nothing is read at load
time, the pages come in from the page cache as the first step touches them, they count as
file-backed resident memory (``RssFile``, shared with the page cache and with every other
process mapping the file) and the kernel can drop them under memory pressure and read them
again. Kernels only read weights. The map is copy-on-write (``MAP_PRIVATE``): a stray write
would make a private copy of one page, never change the file.

A tensor the loader must convert (Q/K rows unpermuted, legacy blocks into our INT4/INT8
layouts, F16 widened, sibling projections stacked by `fuse`) is read through the map too;
once converted, `release` hands its pages back (``MADV_DONTNEED``: a clean page of a private
map is dropped from the process and read again from the page cache if touched), so the
source's pages do not stay resident beside the converted copy. What was converted goes to
the weight cache, which maps it back (`weight_cache.py`) and refers to the source file for
the views (`locate`), so a warm load maps both files and copies nothing.

A tensor keeps its map alive (a view holds the array over the map it was cut from); the registry of
maps holds them weakly, so `locate` finds the file a live tensor is a view of.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import mmap
import sys
import threading
import weakref
from pathlib import Path
from typing import Optional

import numpy as np
import torch

#: Live maps: id -> (weak reference to the map, first address, size, resolved path).
_MAPS: dict[int, tuple["weakref.ref[mmap.mmap]", int, int, Path]] = {}
_LOCK = threading.Lock()
PAGE = mmap.PAGESIZE


class MappedFile:
    """A copy-on-write map of ``path``; `tensor` cuts views of it."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path).resolve()
        self.size = self.path.stat().st_size
        self.array: Optional[np.ndarray] = None
        #: The map itself (a buffer: what `torch.frombuffer` and `struct` read); None if empty.
        self.buffer: Optional[mmap.mmap] = None
        self.start = 0
        if self.size:
            with self.path.open("rb") as f:
                # the map lives until the last view of it (the array holds it, each view the array)
                whole = mmap.mmap(f.fileno(), self.size, access=mmap.ACCESS_COPY)
            self.buffer = whole
            self.array = np.frombuffer(whole, dtype=np.uint8)
            self.start = int(self.array.ctypes.data)
            ref = weakref.ref(whole, lambda _, key=id(whole): _forget(key))
            with _LOCK:
                _MAPS[id(whole)] = (ref, self.start, self.size, self.path)

    def tensor(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        """Bytes ``offset:offset + nbytes`` of the file as a tensor of ``dtype`` and ``shape``
        (a view: no read, no copy). The offset must be aligned for ``dtype``."""
        if offset < 0 or offset + nbytes > self.size:
            raise ValueError(f"{self.path.name}: bytes {offset}:{offset + nbytes} lie outside the "
                             f"file ({self.size} bytes)")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if offset % itemsize or nbytes % itemsize:
            raise ValueError(f"{self.path.name}: a {dtype} tensor at offset {offset} is not aligned")
        if nbytes == 0 or self.array is None:
            return torch.empty(shape, dtype=dtype)
        raw = torch.from_numpy(self.array[offset:offset + nbytes])
        return raw.view(dtype).view(shape)


def trim_heap() -> None:
    """Hand the C heap's free memory back to the system (glibc's ``malloc_trim``; nothing
    elsewhere). A load's conversion temporaries are freed, but glibc keeps freed blocks below
    its (self-raising) mmap threshold in the heap: after a first load of a 0.5B GGUF that was
    ~130 MB of anonymous memory, counted in RSS for the life of the process."""
    libc = _libc()
    if libc is not None:
        libc.malloc_trim(0)


@functools.lru_cache(maxsize=1)
def _libc() -> Optional[ctypes.CDLL]:
    name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    return libc if hasattr(libc, "malloc_trim") else None


def _forget(key: int) -> None:
    with _LOCK:
        _MAPS.pop(key, None)


def locate(t: torch.Tensor) -> Optional[tuple[Path, int]]:
    """(file, offset) when ``t`` is a contiguous view of a live map, else None."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
        return None
    first = t.data_ptr()
    end = first + t.numel() * t.element_size()
    with _LOCK:
        maps = list(_MAPS.values())
    for ref, start, size, path in maps:
        if start <= first and end <= start + size and ref() is not None:
            return path, first - start
    return None


def release(t: torch.Tensor) -> None:
    """Drop the resident pages of ``t``'s bytes when ``t`` is a view of a live map (a tensor
    that was converted and will not be read again); nothing otherwise. Only whole pages
    inside ``t`` are dropped; a dropped page is read back from the page cache if touched."""
    if t.device.type != "cpu" or t.numel() == 0 or not hasattr(mmap, "MADV_DONTNEED"):
        return  # (Windows has no madvise: the pages stay until the map goes)
    first = t.data_ptr()
    end = first + t.numel() * t.element_size()
    with _LOCK:
        maps = list(_MAPS.values())
    for ref, start, size, _ in maps:
        if start <= first and end <= start + size:
            whole = ref()
            if whole is None:
                return
            lo = -(-(first - start) // PAGE) * PAGE
            hi = (end - start) // PAGE * PAGE
            if hi > lo:
                whole.madvise(mmap.MADV_DONTNEED, lo, hi - lo)
            return
