"""The wgpu engine: device selection, compute pipelines, buffers, and running a program.

Device selection reads `TORCHBURN_DEVICE` (cpu, gpu, auto), `TORCHBURN_ENGINE` (wgpu asks for
the GPU too) and `TORCHBURN_WGPU_BACKEND` (vulkan, metal, dx12, gl) through `get_config()`.
Among the adapters wgpu enumerates (restricted to the requested backend), a discrete GPU is
preferred over an integrated or virtual one, and those over a software (CPU) adapter; native
APIs over OpenGL.

A `GpuProgram` holds one compiled program on the device: a compute pipeline per kernel
(cached by the hash of its WGSL source, so kernels shared between programs compile once),
the program's buffers for a set of symbol values, and a bind group per kernel call. One run
is: write the inputs that changed, write the symbols, encode every dispatch and the copies
of the outputs into one command buffer, submit it once, map the staging buffer, read.

Inputs may instead be bound to buffers the caller keeps (`bound`: the resident copies of whole
host storages, `backend/gpu_resident.py`): those persist across symbol values and programs,
so a KV cache or a weight is uploaded once even as a dynamic length changes the buffer set.
An input a kernel writes (an in-place write, `lp.written_inputs`) can be read back in the same
submission (`read_back`).

This module knows bytes, not torch: the launcher (`torchburn/backend/gpu_launcher.py`) turns tensors
into bytes and back.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Hashable, Optional, Sequence

from blake3 import blake3

from ..codegen.wgsl import Caps, KernelShader, storage_itemsize
from .config import get_config
from ..ir import expr as ex
from ..ir import loop as lp

log = logging.getLogger("torchburn")

#: `TORCHBURN_WGPU_BACKEND` spelling -> wgpu's `backend_type`.
BACKENDS = {"vulkan": "Vulkan", "metal": "Metal", "dx12": "D3D12", "gl": "OpenGL"}
_TYPE_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "CPU": 3}
_I32_MAX = (1 << 31) - 1


class GpuError(RuntimeError):
    """The GPU engine cannot run this (no adapter, a device limit exceeded at launch)."""


# ---- adapter and device selection ----------------------------------------------------------------

_lock = threading.Lock()
_adapter_state: dict[Optional[str], tuple[Any, str]] = {}
_devices: dict[Optional[str], "GpuDevice"] = {}


def _find_adapter(backend: Optional[str]) -> tuple[Any, str]:
    """(adapter or None, why not). Cached per backend; enumerating adapters is slow."""
    with _lock:
        if backend in _adapter_state:
            return _adapter_state[backend]
        result: tuple[Any, str]
        try:
            import wgpu
        except ImportError:
            result = (None, "wgpu is not installed (pip install wgpu)")
        else:
            try:
                adapters = list(wgpu.gpu.enumerate_adapters_sync())
            except Exception as err:  # a broken driver stack must not break the CPU engine
                adapters = []
                log.info("torchburn: wgpu could not enumerate adapters: %s", err)
            want = BACKENDS.get(backend or "")
            if want:
                adapters = [a for a in adapters if a.info.get("backend_type") == want]
            adapters.sort(key=lambda a: (_TYPE_RANK.get(a.info.get("adapter_type", ""), 4),
                                         a.info.get("backend_type") == "OpenGL"))
            if adapters:
                result = (adapters[0], "")
            else:
                result = (None, "no WebGPU adapter found" + (f" for backend {backend}" if backend else ""))
        _adapter_state[backend] = result
        return result


def gpu_available() -> bool:
    """Whether wgpu finds an adapter (for `TORCHBURN_WGPU_BACKEND`, when set)."""
    return _find_adapter(get_config().wgpu_backend)[0] is not None


def gpu_unavailable_reason() -> str:
    return _find_adapter(get_config().wgpu_backend)[1]


_SUBGROUP_PROBE = """@group(0) @binding(0) var<storage, read_write> b: array<f32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32, @builtin(subgroup_size) n: u32) {
  b[lid] = subgroupAdd(b[lid]) + f32(n);
}
"""


def _subgroups_compile(device: Any) -> bool:
    """Whether the WGSL front end takes the subgroup builtins the row kernels use
    (`codegen/wgsl/rows.py`); where it does not, row reductions use workgroup memory."""
    try:
        device.create_shader_module(code=_SUBGROUP_PROBE)
    except Exception:  # noqa: BLE001 - any rejection means: no subgroups
        return False
    return True


def gpu_info() -> Optional[dict[str, Any]]:
    """The adapter the GPU engine uses: name, backend API, device type, shader-f16; None if none."""
    adapter = _find_adapter(get_config().wgpu_backend)[0]
    if adapter is None:
        return None
    info = adapter.info
    return {
        "name": info.get("device", ""),
        "backend": info.get("backend_type", ""),
        "device_type": info.get("adapter_type", ""),
        "description": info.get("description", ""),
        "vendor_id": info.get("vendor_id", 0),
        "device_id": info.get("device_id", 0),
        "shader_f16": "shader-f16" in adapter.features,
        "subgroups": "subgroup" in adapter.features,
    }


def wants_gpu() -> bool:
    cfg = get_config()
    if cfg.engine == "reference":
        return False
    return cfg.device in ("gpu", "auto") or cfg.engine == "wgpu"


#: The seed README's name of each engine (`active_engine(alias=True)`).
SEED_NAMES = {"llvm": "native_cpu", "wgpu": "burn_wgpu", "reference": "burn_ndarray"}


def active_engine(alias: bool = False) -> str:
    """The engine compiled graphs run on: "reference" when `TORCHBURN_ENGINE` asks for the
    NumPy interpreter, "wgpu" when the configuration asks for the GPU and an adapter exists,
    else "llvm". With `alias=True` the seed README's names: "burn_ndarray", "burn_wgpu",
    "native_cpu"."""
    if get_config().engine == "reference":
        name = "reference"
    elif wants_gpu() and gpu_available():
        name = "wgpu"
    else:
        name = "llvm"
    return SEED_NAMES[name] if alias else name


def get_device() -> "GpuDevice":
    backend = get_config().wgpu_backend
    with _lock:
        dev = _devices.get(backend)
    if dev is not None:
        return dev
    adapter, why = _find_adapter(backend)
    if adapter is None:
        raise GpuError(why)
    dev = GpuDevice(adapter)
    with _lock:
        return _devices.setdefault(backend, dev)


_LIMITS = ("max-storage-buffers-per-shader-stage", "max-storage-buffer-binding-size", "max-buffer-size",
           "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
           "max-compute-workgroup-size-x", "max-compute-workgroups-per-dimension")


@dataclass
class _Pipeline:
    pipeline: Any
    layout: Any


class GpuDevice:
    """A wgpu device with the adapter's limits, and the pipeline cache."""

    def __init__(self, adapter: Any) -> None:
        import wgpu

        self.wgpu = wgpu
        self.adapter = adapter
        features = [f for f in ("shader-f16", "timestamp-query", "subgroup") if f in adapter.features]
        limits = {k: adapter.limits[k] for k in _LIMITS if k in adapter.limits}
        self.device = adapter.request_device_sync(required_features=features, required_limits=limits)
        self.queue = self.device.queue
        lim = self.device.limits
        self.caps = Caps(
            f16="shader-f16" in features,
            subgroups="subgroup" in features and _subgroups_compile(self.device),
            max_storage_buffers=int(lim["max-storage-buffers-per-shader-stage"]),
            max_invocations=min(int(lim["max-compute-invocations-per-workgroup"]),
                                int(lim["max-compute-workgroup-size-x"])),
            max_workgroup_storage=int(lim["max-compute-workgroup-storage-size"]),
        )
        self.max_binding = int(lim["max-storage-buffer-binding-size"])
        self.max_buffer = int(lim.get("max-buffer-size", self.max_binding))
        self.max_groups = int(lim["max-compute-workgroups-per-dimension"])
        self._pipelines: dict[str, _Pipeline] = {}
        self.pipeline_hits = 0
        self._fence: Optional[tuple[Any, Any]] = None

    def cache_tag(self) -> str:
        """What the device contributes to compile-cache keys."""
        info = self.adapter.info
        return f"{info.get('device')}|{info.get('backend_type')}|{self.caps}"

    def pipeline(self, shader: KernelShader) -> _Pipeline:
        """The compute pipeline of a shader, compiled once per distinct source."""
        key = blake3(shader.source.encode()).hexdigest()
        hit = self._pipelines.get(key)
        if hit is not None:
            self.pipeline_hits += 1
            return hit
        wgpu = self.wgpu
        entries = [{"binding": 0, "visibility": wgpu.ShaderStage.COMPUTE,
                    "buffer": {"type": wgpu.BufferBindingType.uniform}}]
        for k, b in enumerate(shader.bindings):
            kind = wgpu.BufferBindingType.storage if b.writable else wgpu.BufferBindingType.read_only_storage
            entries.append({"binding": k + 1, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": kind}})
        layout = self.device.create_bind_group_layout(entries=entries)
        module = self.device.create_shader_module(code=shader.source, label=shader.name)
        pipe = self.device.create_compute_pipeline(
            layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": "main"}, label=shader.name)
        entry = _Pipeline(pipe, layout)
        self._pipelines[key] = entry
        return entry

    def wait(self) -> None:
        """Block until the queue's submitted work is done (a tiny copy and map; wgpu 0.32's
        `on_submitted_work_done_sync` fails)."""
        if self._fence is None:
            usage = self.wgpu.BufferUsage
            self._fence = (self.device.create_buffer(size=16, usage=usage.COPY_SRC),
                           self.device.create_buffer(size=16, usage=usage.MAP_READ | usage.COPY_DST))
        src, dst = self._fence
        encoder = self.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(src, 0, dst, 0, 16)
        self.queue.submit([encoder.finish()])
        dst.map_sync(self.wgpu.MapMode.READ)
        dst.unmap()

    def read_buffer(self, buffer: Any, nbytes: int) -> memoryview:
        """A copy of the first `nbytes` bytes of a device buffer (one copy and map)."""
        usage = self.wgpu.BufferUsage
        n = _round4(nbytes)
        staging = self.device.create_buffer(size=max(16, _round16(n)), usage=usage.MAP_READ | usage.COPY_DST)
        encoder = self.device.create_command_encoder()
        encoder.copy_buffer_to_buffer(buffer, 0, staging, 0, n)
        self.queue.submit([encoder.finish()])
        staging.map_sync(self.wgpu.MapMode.READ)
        try:
            return staging.read_mapped(0, n, copy=True)
        finally:
            staging.unmap()

    def storage_buffer(self, nbytes: int, label: str = "") -> Any:
        usage = self.wgpu.BufferUsage
        return self.device.create_buffer(size=_round16(nbytes), label=label,
                                         usage=usage.STORAGE | usage.COPY_DST | usage.COPY_SRC)


def _round16(n: int) -> int:
    return max(16, (n + 15) // 16 * 16)


def span_elements(b: lp.Buffer, env: dict[str, int]) -> int:
    """Elements a strided buffer spans: 1 + sum((size - 1) * stride), 0 when empty."""
    sizes = [ex.evaluate_index(d, env) for d in b.shape]
    if any(s == 0 for s in sizes):
        return 0
    return 1 + sum((s - 1) * ex.evaluate_index(st, env) for s, st in zip(sizes, b.strides))


# ---- a program on the device ------------------------------------------------------------------------

@dataclass
class _Slot:
    """What an input buffer holds: a weak reference to the tensor it came from and its stamp."""

    owner: Optional[weakref.ref] = None
    stamp: Hashable = None


@dataclass
class _BufferSet:
    """The device buffers, bind groups and dispatch sizes of one set of symbol values."""

    buffers: dict[str, Any]
    bytes: dict[str, int]
    dispatches: list[tuple[int, Any, tuple[int, int, int]]]
    staging: Any
    out_offsets: list[tuple[int, int]]
    slots: list[_Slot] = field(default_factory=list)


InputSpec = tuple[Any, Hashable, Callable[[], Any]]


class GpuProgram:
    """A compiled program on a device (module docstring)."""

    def __init__(self, device: GpuDevice, program: lp.Program, shaders: Sequence[KernelShader]) -> None:
        self.dev = device
        self.program = program
        self.shaders = list(shaders)
        self.pipelines = [device.pipeline(s) for s in self.shaders]
        index = {s.name: k for k, s in enumerate(self.shaders)}
        if any(off is not None for c in program.calls for off in c.offsets):
            raise GpuError("a call passes a view at an offset, which the wgpu engine does not bind "
                           "(its lowering, lower-to-loops-gpu, makes none)")
        self.calls = [(index[c.kernel], c.args) for c in program.calls]
        self.buffers = {b.name: b for b in (*program.inputs, *program.outputs, *program.temps)}
        usage = device.wgpu.BufferUsage
        self.uniform = device.device.create_buffer(size=_round16(4 * len(program.symbols)),
                                                   usage=usage.UNIFORM | usage.COPY_DST)
        self._uniform_env: Optional[tuple[int, ...]] = None
        self._sets: OrderedDict[Any, _BufferSet] = OrderedDict()
        self._lock = threading.Lock()
        #: Input uploads so far (resident inputs are not uploaded again).
        self.uploads = 0
        #: Bytes the last run uploaded through its own buffer set (not `bound` ones).
        self.last_uploaded = 0

    # ---- sizes and buffers ---------------------------------------------------------------------------
    def nbytes(self, name: str, env: dict[str, int]) -> int:
        b = self.buffers[name]
        n = span_elements(b, env)
        if n > _I32_MAX:
            raise GpuError(f"%{name} spans {n} elements; WGSL indexes with 32-bit integers")
        size = n * storage_itemsize(b.dtype, self.dev.caps)
        if size > self.dev.max_binding:
            raise GpuError(f"%{name} needs {size} bytes; the device binds at most {self.dev.max_binding}")
        return size

    def _groups(self, shader: KernelShader, env: dict[str, int]) -> tuple[int, int, int]:
        gx, gy, gz = (ex.evaluate_index(e, env) for e in shader.grid.groups)
        limit = self.dev.max_groups
        if gx > limit and gy == 1 and shader.grid.mode != "gemm":
            gy = -(-gx // limit)
            gx = -(-gx // gy)
        if max(gx, gy, gz) > limit:
            raise GpuError(f"kernel @{shader.name} needs {gx}x{gy}x{gz} workgroups; the limit is {limit} per dimension")
        return gx, gy, gz

    def _buffer_set(self, env: dict[str, int], bound: Optional[dict[str, Any]] = None) -> _BufferSet:
        bound = bound or {}
        key = (tuple(env[s.name] for s in self.program.symbols), tuple((n, id(b)) for n, b in sorted(bound.items())))
        found = self._sets.get(key)
        if found is not None:
            self._sets.move_to_end(key)
            return found
        for v in key[0]:
            if not -_I32_MAX <= v <= _I32_MAX:
                raise GpuError(f"symbol value {v} does not fit in 32 bits")
        dev = self.dev
        sizes = {name: self.nbytes(name, env) for name in self.buffers}
        bufs = {name: bound[name] if name in bound else dev.storage_buffer(n, label=name) for name, n in sizes.items()}
        dispatches = []
        for k, args in self.calls:
            shader, pipe = self.shaders[k], self.pipelines[k]
            groups = self._groups(shader, env)
            if 0 in groups:
                continue
            entries = [{"binding": 0, "resource": {"buffer": self.uniform, "offset": 0, "size": self.uniform.size}}]
            for j, name in enumerate(args):
                buf = bufs[name]
                entries.append({"binding": j + 1, "resource": {"buffer": buf, "offset": 0, "size": buf.size}})
            group = dev.device.create_bind_group(layout=pipe.layout, entries=entries)
            dispatches.append((k, group, groups))
        offsets = []
        total = 0
        for b in self.program.outputs:
            offsets.append((total, sizes[b.name]))
            total += _round16(sizes[b.name])
        usage = dev.wgpu.BufferUsage
        staging = dev.device.create_buffer(size=max(16, total), usage=usage.MAP_READ | usage.COPY_DST)
        bset = _BufferSet(bufs, sizes, dispatches, staging, offsets, [_Slot() for _ in self.program.inputs])
        self._sets[key] = bset
        while len(self._sets) > 4:
            self._sets.popitem(last=False)
        return bset

    # ---- running ------------------------------------------------------------------------------------
    def _write_inputs(self, bset: _BufferSet, inputs: Sequence[InputSpec], bound: Optional[dict[str, Any]] = None) -> int:
        """Upload the inputs that changed; returns the bytes written (inputs in `bound` are the
        caller's to keep current)."""
        uploaded = 0
        for b, slot, (owner, stamp, data_fn) in zip(self.program.inputs, bset.slots, inputs):
            if bound and b.name in bound:
                continue
            if slot.owner is not None and slot.owner() is owner and slot.stamp == stamp and stamp is not None:
                continue  # resident: the same tensor, unchanged since it was uploaded
            if bset.bytes[b.name]:
                data = data_fn()
                self.dev.queue.write_buffer(bset.buffers[b.name], 0, data)
                uploaded += len(data)
                self.uploads += 1
            try:
                slot.owner = weakref.ref(owner) if stamp is not None else None
            except TypeError:
                slot.owner = None
            slot.stamp = stamp
        return uploaded

    def _write_symbols(self, env: dict[str, int]) -> None:
        values = tuple(env[s.name] for s in self.program.symbols)
        if values == self._uniform_env or not values:
            return
        import struct

        self.dev.queue.write_buffer(self.uniform, 0, struct.pack(f"<{len(values)}i", *values))
        self._uniform_env = values

    def _encode(self, encoder: Any, bset: _BufferSet, repeat: int = 1) -> None:
        cp = encoder.begin_compute_pass()
        for _ in range(repeat):
            for k, group, (gx, gy, gz) in bset.dispatches:
                cp.set_pipeline(self.pipelines[k].pipeline)
                cp.set_bind_group(0, group)
                cp.dispatch_workgroups(gx, gy, gz)
        cp.end()

    def run_copy(self, env: dict[str, int], inputs: Sequence[InputSpec], bound: Optional[dict[str, Any]] = None,
                 read_back: Sequence[str] = ()) -> list[memoryview]:
        """Upload what changed, run every kernel in one submission, and return a copy of each
        output's bytes, then of each input named in `read_back` (its span). `inputs[i]` is
        (owner, stamp, data_fn): the upload is skipped while `owner` is the object last uploaded
        to that slot and its stamp is equal. Inputs in `bound` use the caller's buffers."""
        with self._lock:
            bset = self._buffer_set(env, bound)
            self.last_uploaded = self._write_inputs(bset, inputs, bound)
            self._write_symbols(env)
            encoder = self.dev.device.create_command_encoder()
            self._encode(encoder, bset)
            copies = [(bset.buffers[b.name], size) for b, (_, size) in zip(self.program.outputs, bset.out_offsets)]
            copies += [(bset.buffers[name], bset.bytes[name]) for name in read_back]
            staging = bset.staging
            total = sum(_round16(size) for _, size in copies)
            if read_back:
                staging = self.dev.device.create_buffer(size=max(16, total), usage=self.dev.wgpu.BufferUsage.MAP_READ
                                                        | self.dev.wgpu.BufferUsage.COPY_DST)
            offsets = []
            off = 0
            for buf, size in copies:
                offsets.append((off, size))
                if size:
                    encoder.copy_buffer_to_buffer(buf, 0, staging, off, _round4(size))
                off += _round16(size)
            self.dev.queue.submit([encoder.finish()])
            if not any(size for _, size in offsets):
                return [memoryview(b"") for _ in offsets]
            staging.map_sync(self.dev.wgpu.MapMode.READ)
            try:
                return [staging.read_mapped(o, _round4(size), copy=True) if size else memoryview(bytearray())
                        for o, size in offsets]
            finally:
                staging.unmap()

    def read_buffer(self, buffer: Any, nbytes: int) -> memoryview:
        """A copy of the first `nbytes` of a device buffer (for resident inputs)."""
        with self._lock:
            return self.dev.read_buffer(buffer, nbytes)

    def benchmark(self, env: dict[str, int], inputs: Sequence[InputSpec], iters: int = 20,
                  bound: Optional[dict[str, Any]] = None) -> float:
        """Seconds per run of all kernels, inputs resident, no copies (one submission of
        `iters` runs, after a warm-up)."""
        with self._lock:
            bset = self._buffer_set(env, bound)
            self._write_inputs(bset, inputs, bound)
            self._write_symbols(env)
            for repeat in (1, iters):
                encoder = self.dev.device.create_command_encoder()
                self._encode(encoder, bset, repeat)
                t0 = time.perf_counter()
                self.dev.queue.submit([encoder.finish()])
                self.dev.wait()
                dt = time.perf_counter() - t0
            return dt / iters


def _round4(n: int) -> int:
    return (n + 3) // 4 * 4
