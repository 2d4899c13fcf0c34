"""Resident state on the GPU engine: host tensors whose copy lives on the device across calls.

Every input a GPU program reads through here has one device buffer per host *storage* (the
whole storage, so every view of it at offset 0 binds the same buffer, whatever its length):
weights, a KV cache, a module buffer. That copy outlives the program's per-size buffer sets,
so a dynamic length (the KV cache's filled slots) does not upload anything again.

When host and device agree is tracked with the tensor's version counter (shared by all views of
a storage; every in-place PyTorch write bumps it):

- An input whose version moved since the device copy was made is uploaded again before the
  call: host-side writes between calls are seen by the next call.
- An input the program writes (an in-place write, `frontend/inplace_writes.py`) is, by
  default, read back in the same submission and written into the host tensor, so the host
  is never stale; only its bytes cross down, and nothing goes up at the next call.
- `keep_on_gpu(t)` makes the device own `t`'s values: after a call writes it, nothing comes
  back, and the host copy is stale until `to_host(t)` (or `release(t)`) copies it down. A host
  write into a stale tensor raises `GpuStateError` at the next GPU call that reads it (never a
  silent mix of old and new values); call `to_host(t)` before writing it on the host. PyTorch
  code reading a stale tensor sees old values: that is the contract of `keep_on_gpu`. The LLM
  engine keeps its KV cache this way (it never reads the cache on the host).

An input the device stores in another dtype (int8/uint8 codes of a quantized weight as i32,
f16 scales as f32 without `shader-f16`) is resident too, converted once at upload, unless the
program writes it. Not resident (the program's own per-size buffers, uploaded when the stamp
changes): inputs at a nonzero storage offset, converted inputs a program writes, inference
tensors (no version counter), storages over the device's binding limit.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any, Optional

import torch
from torch.multiprocessing.reductions import StorageWeakRef


class GpuStateError(RuntimeError):
    """A tensor the GPU owns (`keep_on_gpu`) was written on the host while stale."""


@dataclass
class Resident:
    """The device copy of one host storage."""

    buffer: Any
    nbytes: int
    ref: StorageWeakRef
    #: The tensor version when host and device last agreed (or the device took over).
    version: int
    #: The device holds values the host does not have (`keep_on_gpu` and a call wrote it).
    device_newer: bool = False
    #: The device object holding `buffer` (`runtime.gpu.GpuDevice`).
    dev: Any = None
    #: No longer the storage's entry (released, expired or replaced): a launcher's remembered
    #: binding of it is void (`GpuLauncher._resident`).
    dropped: bool = False


_lock = threading.RLock()
_entries: dict[Any, Resident] = {}
_owned: dict[int, StorageWeakRef] = {}
#: Buffers of expired small entries, per device, for the next new storage: a decode step's
#: token ids and positions are new tensors every step (a dynamic length makes them new sizes
#: too), and a new buffer for each would also need new bind groups (`runtime/gpu.py` keeps
#: them per buffer object). Small entries get buffers of a power-of-two size, so one fits the
#: next tensor of a similar size.
_free: dict[int, list[Any]] = {}
#: Entries up to this size have such buffers, recycled; at most `_FREE_KEPT` kept per device,
#: the most recently freed.
_FREE_MAX_BYTES = 1 << 16
_FREE_KEPT = 32


def _size_class(nbytes: int) -> int:
    if nbytes > _FREE_MAX_BYTES:
        return nbytes
    size = 16
    while size < nbytes:
        size *= 2
    return size


#: Keys of the entries up to `_FREE_MAX_BYTES` (where per-step tensors are), and how many
#: entries were made (`_purge`).
_small: set[Any] = set()
_made = 0


def _expired(e: Resident) -> None:
    """`e` was dropped because its storage is gone: keep a small buffer for reuse."""
    e.dropped = True
    if e.nbytes <= _FREE_MAX_BYTES and e.dev is not None:
        pool = _free.setdefault(id(e.dev), [])
        pool.append(e.buffer)
        if len(pool) > _FREE_KEPT:
            # the oldest goes: a pool kept full of an earlier workload's sizes would turn away
            # every buffer of the current one, and each step would make new buffers (and bind
            # groups) again
            del pool[0]


def _new_buffer(dev: Any, nbytes: int, prefer: Any = None) -> Any:
    """A buffer for a new entry of `nbytes`: `prefer` (the buffer the caller bound last time at
    this place) when it is free and large enough, else the oldest free one of its size class,
    else a new one. Handing each per-step tensor its predecessor's buffer keeps the caller's
    bind groups valid. (The buffer may be larger than the storage: kernels index within it.)"""
    pool = _free.get(id(dev))
    want = _size_class(nbytes)
    if pool:
        for k, buf in enumerate(pool):
            if buf is prefer and buf.size >= nbytes:
                return pool.pop(k)
        for k, buf in enumerate(pool):
            if buf.size == want:
                return pool.pop(k)
    return dev.storage_buffer(want, label="resident")


def _key(t: torch.Tensor, upload: Optional[torch.dtype] = None) -> Any:
    ptr = t.untyped_storage().data_ptr()
    return ptr if upload is None else (ptr, upload)


def _live(key: Any) -> Optional[Resident]:
    e = _entries.get(key)
    if e is not None and e.ref.expired():
        del _entries[key]
        _expired(e)
        _drop_expired_owner(key)
        return None
    return e


def _drop_expired_owner(key: Any) -> None:
    """Forget the ownership mark at `key` only when its own storage is gone: a freed storage's
    address is reused by new tensors (a new KV cache marked `keep_on_gpu` at the address of an
    old one whose entry expires later must stay owned)."""
    ref = _owned.get(key)
    if ref is not None and ref.expired():
        del _owned[key]


def eligible(t: torch.Tensor, upload: Optional[torch.dtype], written: bool, max_binding: int) -> bool:
    """Whether `t` can be bound through a resident whole-storage buffer (stored as `upload`
    on the device, None: as is; `written`: the program writes it)."""
    size = t.untyped_storage().nbytes()
    if upload is not None:
        if written:
            return False
        size = size // t.element_size() * torch.empty(0, dtype=upload).element_size()
    if not t.is_cpu or t.storage_offset() != 0 or size > max_binding:
        return False
    try:
        t._version
    except RuntimeError:  # an inference tensor: no version counter to trust
        return False
    return t.untyped_storage().nbytes() > 0


def _purge(full: bool = True) -> None:
    """Drop the entries whose storage is gone: all of them, or (`full=False`) the small ones,
    where the per-step tensors are (their buffers are then free for the next step's; a pass
    over hundreds of weights per step would cost more than the rest of the step's binding)."""
    keys = list(_entries) if full else list(_small)
    for key in keys:
        e = _entries.get(key)
        if e is not None and e.ref.expired():
            _expired(_entries.pop(key))
        if e is None or key not in _entries:
            _small.discard(key)
        if isinstance(key, int):
            _drop_expired_owner(key)


def _host_bytes(t: torch.Tensor, nbytes: int) -> torch.Tensor:
    """The first `nbytes` bytes of `t`'s storage as a uint8 tensor (no copy)."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage(), 0, (nbytes,))


def bind(t: torch.Tensor, dev: Any, bump: int = 0, upload: Optional[torch.dtype] = None,
         prefer: Any = None) -> tuple[Any, int]:
    """The device buffer holding `t`'s storage, uploaded first when the host changed; returns
    (buffer, bytes uploaded). `bump`: version steps the caller made without changing the
    values (AOTAutograd bumps an input the graph mutates once per call, before it). Raises
    `GpuStateError` for a stale tensor written on the host. `upload`: the dtype the device
    stores (the storage is converted; such an input is never written by the program).
    `prefer`: the buffer to take for a new entry if it is free (`_new_buffer`)."""
    global _made
    with _lock:
        key = _key(t, upload)
        e = _live(key)
        nbytes = t.untyped_storage().nbytes()
        if upload is not None:
            nbytes = nbytes // t.element_size() * torch.empty(0, dtype=upload).element_size()
        if e is not None and (e.dev is not dev or e.nbytes != nbytes):
            if e.device_newer:
                raise GpuStateError("torchburn: a tensor the GPU owns (keep_on_gpu) changed size or device; "
                                    "call torchburn.backend.gpu_resident.to_host(t) first")
            e.dropped = True
            e = None
        if e is None:
            _made += 1
            _purge(full=_made % 256 == 0)
            if nbytes <= _FREE_MAX_BYTES:
                _small.add(key)
            e = Resident(_new_buffer(dev, nbytes, prefer), nbytes, StorageWeakRef(t.untyped_storage()),
                         version=-1, dev=dev)
            _entries[key] = e
        if e.version >= 0 and e.version + bump == t._version:
            e.version = t._version
            return e.buffer, 0
        if e.device_newer:
            raise GpuStateError("torchburn: a tensor whose current values live on the GPU (keep_on_gpu) was written "
                                "on the host; call torchburn.backend.gpu_resident.to_host(t) before writing it")
        if upload is None:
            data = _host_bytes(t, nbytes).numpy()
        else:
            n = t.untyped_storage().nbytes() // t.element_size()
            data = torch.as_strided(t, (n,), (1,), 0).to(upload).view(torch.uint8).numpy()
        dev.queue.write_buffer(e.buffer, 0, memoryview(data) if nbytes % 4 == 0 else data.tobytes() + b"\0" * (-nbytes % 4))
        e.version = t._version
        return e.buffer, nbytes


def written(t: torch.Tensor, data: Optional[memoryview]) -> None:
    """A GPU call wrote `t`'s device copy. `data` (the written span's bytes, read back in the
    same submission) is copied into the host tensor; None means the device keeps it (the
    tensor must be `keep_on_gpu`)."""
    with _lock:
        e = _live(_key(t))
        if e is None:
            return
        if data is None:
            e.device_newer = True
            e.version = t._version
            return
        _write_host(t, data)
        e.version = t._version
        e.device_newer = False


def _write_host(t: torch.Tensor, data: memoryview) -> None:
    """Copy `data` (bytes from the start of `t`'s storage) into it, through a view of `t`, so
    its version counter moves and every other cache of its values sees the write."""
    n = len(data) // t.element_size()
    if not n:
        return
    src = torch.frombuffer(bytearray(data[: n * t.element_size()]), dtype=t.dtype)
    with torch.no_grad():
        torch.as_strided(t, (n,), (1,), 0).copy_(src)


def keep_on_gpu(t: torch.Tensor) -> torch.Tensor:
    """Let the GPU own `t`'s values: GPU calls that write it leave the host copy stale until
    `to_host(t)` (module docstring). Returns `t`."""
    with _lock:
        _owned[_key(t)] = StorageWeakRef(t.untyped_storage())
    return t


def is_owned(t: torch.Tensor) -> bool:
    with _lock:
        ref = _owned.get(_key(t))
        return ref is not None and not ref.expired()


def is_stale(t: torch.Tensor) -> bool:
    """Whether the GPU holds values of `t` that the host copy lacks."""
    with _lock:
        e = _live(_key(t))
        return e is not None and e.device_newer


def to_host(t: torch.Tensor) -> torch.Tensor:
    """Copy the GPU's values of `t` into the host tensor when they are newer; returns `t`."""
    with _lock:
        e = _live(_key(t))
        if e is None or not e.device_newer:
            return t
        _write_host(t, e.dev.read_buffer(e.buffer, e.nbytes)[: e.nbytes])
        e.device_newer = False
        e.version = t._version
        return t


def discard_device_values(t: torch.Tensor) -> torch.Tensor:
    """Forget that the GPU holds newer values of `t` without reading them back: the host's
    values count again, and the next call that reads `t` uploads them (for a tensor the host
    overwrites whole next, as a decode loop's first token id). Returns `t`."""
    with _lock:
        e = _live(_key(t))
        if e is not None and e.device_newer:
            e.device_newer = False
            e.version = -1  # uploaded again at the next bind
        return t


def to_host_all(args: Any) -> None:
    """`to_host` every stale tensor among `args` (cheap when the GPU owns nothing)."""
    if not _owned:
        return
    for a in args:
        if isinstance(a, torch.Tensor) and is_stale(a):
            to_host(a)


def release(t: torch.Tensor) -> torch.Tensor:
    """`to_host(t)`, then stop owning it and drop its device copy."""
    with _lock:
        to_host(t)
        key = _key(t)
        _owned.pop(key, None)
        e = _entries.pop(key, None)
        if e is not None:
            e.dropped = True
        return t


def resident_bytes(dev: Any = None) -> int:
    """Bytes of host storages held on the device (all, or those of `dev`)."""
    with _lock:
        _purge()
        return sum(e.nbytes for e in _entries.values() if dev is None or e.dev is dev)


def entry(t: torch.Tensor, upload: Optional[torch.dtype] = None) -> Optional[Resident]:
    """`t`'s resident entry (stored as `upload`), None when it has none."""
    with _lock:
        return _live(_key(t, upload))


def resident_size(t: torch.Tensor, upload: Optional[torch.dtype] = None) -> int:
    """Bytes of `t`'s resident copy (0 when it has none)."""
    with _lock:
        e = _live(_key(t, upload))
        return 0 if e is None else e.nbytes
