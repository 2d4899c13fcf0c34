"""The wgpu engine: device selection, compute pipelines, buffers, and running a program.

Device selection reads `TORCHBURN_DEVICE` (cpu, gpu, auto), `TORCHBURN_ENGINE` (wgpu asks for
the GPU too) and `TORCHBURN_WGPU_BACKEND` (vulkan, metal, dx12, gl) through `get_config()`.
Among the adapters wgpu enumerates (restricted to the requested backend), a discrete GPU is
preferred over an integrated or virtual one, and those over a software (CPU) adapter; native
APIs over OpenGL.

The device is requested with the adapter's own limits (`REQUESTED_LIMITS`: WebGPU's defaults
allow 8 storage buffers per stage; real GPUs far more), and the storage-buffer limit reaches
the compiler through the target (`gpu-split-wide` splits only kernels past it), as does the
loop-iteration limit of a software adapter (`loop_limit`; `gpu-chunk-serial`).

A `GpuProgram` holds one compiled program on the device: a compute pipeline per kernel
(cached by the hash of its WGSL source, so kernels shared between programs compile once),
its own buffers, a bind group per kernel call and a staging buffer, all kept across runs and
symbol values (a buffer sized by a symbol grows to the next power of two when a run needs
more), so a warm run creates no wgpu object. One run is: write the inputs that changed, write
the symbols into the uniform buffer, encode every dispatch (through wgpu-native's C calls,
`GpuDevice.raw_pass`) and the copies of the outputs into one command buffer, submit it once,
map the staging buffer, read. `runtime/gpu_calls.py` counts the wgpu calls of a block.

Inputs may instead be bound to buffers the caller keeps (`bound`: the resident copies of whole
host storages, `backend/gpu_resident.py`): those persist across symbol values and programs,
so a KV cache or a weight is uploaded once even as a dynamic length changes.
An input a kernel writes (an in-place write, `lp.written_inputs`) can be read back in the same
submission (`read_back`).

This module knows bytes, not torch: the launcher (`torchburn/backend/gpu_launcher.py`) turns tensors
into bytes and back.
"""
from __future__ import annotations

import logging
import statistics
import struct
import threading
import time
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Hashable, Optional, Sequence

from blake3 import blake3

from ..codegen.wgsl import Caps, KernelShader, program_caps, storage_itemsize
from . import gpu_calls
from .gpu_async import RawQueue
from .gpu_encode import Batch, NativeEncoder
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


class GpuFault(RuntimeError):
    """A run's kernel met an index out of range (`checked_index`): its results are not to be
    used; the launcher runs the call in PyTorch, which raises eager's error."""


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
  b[lid] = subgroupAdd(b[lid]) + subgroupShuffleXor(b[lid], 1u) + f32(n);
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


#: Mesa's gallivm (llvmpipe, and lavapipe on Vulkan) ends every loop of a shader invocation
#: once this many iterations have run, all loops counted together (`LP_MAX_TGSI_LOOP_ITERATIONS`):
#: a scatter of 65,000 elements lost its last 466 updates there, silently.
LLVMPIPE_LOOP_ITERATIONS = 65535


def loop_limit(info: Any) -> int:
    """Loop iterations an invocation may run on the adapter `info` describes (0: no limit
    known): llvmpipe's and lavapipe's `LLVMPIPE_LOOP_ITERATIONS`."""
    text = f"{info.get('device', '')} {info.get('description', '')}".lower()
    return LLVMPIPE_LOOP_ITERATIONS if ("llvmpipe" in text or "lavapipe" in text) else 0


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
    return get_config().wants_gpu


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


#: The limits the device is requested with at the adapter's values (WebGPU's defaults are far
#: lower than real GPUs offer: 8 storage buffers per stage, 128 MiB bindings). The storage-buffer
#: count reaches the compiler through the target (`gpu-split-wide`), the rest through `Caps`.
REQUESTED_LIMITS = ("max-storage-buffers-per-shader-stage", "max-storage-buffer-binding-size", "max-buffer-size",
                    "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup",
                    "max-compute-workgroup-size-x", "max-compute-workgroup-size-y",
                    "max-compute-workgroup-size-z", "max-compute-workgroups-per-dimension", "max-bind-groups",
                    "max-uniform-buffer-binding-size")


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
        #: The limits asked for: the adapter's own (`REQUESTED_LIMITS`).
        self.requested_limits = {k: adapter.limits[k] for k in REQUESTED_LIMITS if k in adapter.limits}
        try:
            self.device = adapter.request_device_sync(required_features=features,
                                                      required_limits=self.requested_limits)
        except Exception as err:  # noqa: BLE001 - a driver refusing its own limits: WebGPU's defaults
            log.info("torchburn: the adapter refused its own limits (%s); using WebGPU's defaults", err)
            self.requested_limits = {}
            self.device = adapter.request_device_sync(required_features=features)
        self.queue = self.device.queue
        lim = self.device.limits
        self.caps = Caps(
            f16="shader-f16" in features,
            subgroups="subgroup" in features and _subgroups_compile(self.device),
            max_storage_buffers=int(lim["max-storage-buffers-per-shader-stage"]),
            max_invocations=min(int(lim["max-compute-invocations-per-workgroup"]),
                                int(lim["max-compute-workgroup-size-x"])),
            max_workgroup_storage=int(lim["max-compute-workgroup-storage-size"]),
            loop_iterations=loop_limit(adapter.info),
        )
        self.max_binding = int(lim["max-storage-buffer-binding-size"])
        self.max_buffer = int(lim.get("max-buffer-size", self.max_binding))
        self.max_groups = int(lim["max-compute-workgroups-per-dimension"])
        self._pipelines: dict[str, _Pipeline] = {}
        #: wgpu-native's compute-pass C functions (set pipeline, set bind group, dispatch, NULL),
        #: or None: the public methods wrap each call in Python checks (an empty dynamic-offset
        #: array allocated per `set_bind_group`), 4-5x the cost of the call itself, paid per
        #: dispatch, hundreds per decode step. Encoding errors still surface at `finish()`.
        self.raw_pass = _raw_pass()
        #: wgpu-native's shader module call without runtime checks (`_shader_module`), or None.
        self.raw_module = _raw_module()
        self.pipeline_hits = 0
        self._fence: Optional[tuple[Any, Any]] = None
        #: Whether compute passes can write timestamps (`GpuProgram.time_gpu`).
        self.timestamps = "timestamp-query" in features
        self._period: Optional[float] = None

    def timestamp_period(self) -> float:
        """Nanoseconds per timestamp tick (wgpu-native resolves raw ticks)."""
        if self._period is None:
            try:
                from wgpu.backends.wgpu_native._ffi import lib

                self._period = float(lib.wgpuQueueGetTimestampPeriod(self.queue._internal))
            except (ImportError, AttributeError):
                self._period = 1.0
        return self._period

    def cache_tag(self) -> str:
        """What the device contributes to compile-cache keys."""
        info = self.adapter.info
        return f"{info.get('device')}|{info.get('backend_type')}|{self.caps}"

    def pipeline(self, shader: KernelShader) -> _Pipeline:
        """The compute pipeline of a shader, compiled once per distinct source."""
        checked = self.raw_module is None or get_config().bounds_check
        key = blake3(shader.source.encode()).hexdigest() + ("/checked" if checked else "")
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
        if shader.fault:  # the fault flag (`checked_index`), after the kernel's buffers
            entries.append({"binding": len(shader.bindings) + 1, "visibility": wgpu.ShaderStage.COMPUTE,
                            "buffer": {"type": wgpu.BufferBindingType.storage}})
        layout = self.device.create_bind_group_layout(entries=entries)
        module = self._shader_module(shader, checked)
        pipe = self.device.create_compute_pipeline(
            layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": "main"}, label=shader.name)
        entry = _Pipeline(pipe, layout)
        self._pipelines[key] = entry
        return entry

    def _shader_module(self, shader: KernelShader, checked: bool) -> Any:
        """The shader module of a kernel, without wgpu's runtime checks where wgpu-native offers
        that (`wgpuDeviceCreateShaderModuleTrusted`).

        By default naga, translating WGSL for the driver, clamps every index into a
        fixed-size array (workgroup tiles, vector lanes: a `min` before each access, which also
        keeps the driver from folding a constant offset into the load) and gives every loop a
        64-bit iteration counter that breaks out after 2^64 trips (an extra exit the driver
        cannot reason about: no unrolling by trip count). Our shaders need neither: codegen
        keeps every index in range (loads and stores are guarded by the extents, tile indices
        are in range by construction) and every loop has a trip count. `TORCHBURN_DEBUG=bounds`
        keeps wgpu's checks (a kernel whose result changes with it reads out of bounds)."""
        if checked or self.raw_module is None:
            return self.device.create_shader_module(code=shader.source, label=shader.name)
        ffi, lib, create, new_struct_p, to_view, module_type = self.raw_module
        source = new_struct_p("WGPUShaderSourceWGSL *", code=to_view(shader.source))
        source[0].chain.next = ffi.NULL
        source[0].chain.sType = lib.WGPUSType_ShaderSourceWGSL
        desc = new_struct_p("WGPUShaderModuleDescriptor *", nextInChain=ffi.cast("WGPUChainedStruct *", source),
                            label=to_view(shader.name))
        gpu_calls.note("create_shader_module")
        handle = create(self.device._internal, desc, 0)  # 0: no runtime checks
        if handle == ffi.NULL:
            raise GpuError(f"shader module creation failed for kernel {shader.name}")
        return module_type(shader.name, handle, self.device)

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


def _raw_pass() -> Optional[tuple[Any, Any, Any, Any]]:
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
    except (ImportError, AttributeError):  # another wgpu backend or version: the public methods
        return None


def _raw_module() -> Optional[tuple[Any, Any, Any, Any, Any, Any]]:
    try:
        from wgpu.backends.wgpu_native._api import GPUShaderModule, libf, new_struct_p, to_c_string_view
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        # libf: the calls that raise wgpu's validation errors (a shader the WGSL front end rejects)
        return ffi, lib, libf.wgpuDeviceCreateShaderModuleTrusted, new_struct_p, to_c_string_view, GPUShaderModule
    except (ImportError, AttributeError):  # another wgpu backend or version: the checked call
        return None


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
class _Plan:
    """What one set of symbol values decides, without any wgpu object: the bytes each buffer
    needs, each call's workgroup counts, and where the outputs go in the staging buffer."""

    sizes: dict[str, int]
    groups: list[tuple[int, int, int]]
    out_offsets: list[tuple[int, int]]


#: (owner, stamp, bytes) of an input; None for one bound to the caller's buffer.
InputSpec = Optional[tuple[Any, Hashable, Callable[[], Any]]]


@dataclass
class RunTimes:
    """Where a program's runs spent host time: `submit_s` until the submission returned,
    `wait_s` mapping and reading the results (mostly the GPU working; llvmpipe's OpenGL path
    runs the kernels inside `submit`)."""

    runs: int = 0
    submit_s: float = 0.0
    wait_s: float = 0.0
    #: The part of `submit_s` before `submit` is called (buffers, writes, encoding).
    encode_s: float = 0.0
    #: The GPU's own time of the runs timed with timestamps (`GpuProgram.time_gpu`): from the
    #: compute pass's start to its end, as the device's clock says.
    gpu_s: float = 0.0
    gpu_runs: int = 0
    #: Host time encoding the next run's commands after a submission, while the GPU works
    #: (`GpuProgram.encode_ahead`): host work, not waiting, so not in `wait_s`.
    ahead_s: float = 0.0

    def add(self, encode_s: float, submit_s: float, wait_s: float, ahead_s: float = 0.0) -> None:
        self.runs += 1
        self.encode_s += encode_s
        self.submit_s += submit_s
        self.wait_s += wait_s
        self.ahead_s += ahead_s


@dataclass
class _Ahead:
    """A run's commands encoded before it was asked for (`GpuProgram.encode_ahead`), and what
    they were encoded from: used while a run has the same dispatches (the same list object:
    pipelines, bind groups, workgroup counts), copies, staging buffer and timestamp queries."""

    dispatches: list[tuple[Any, Any, tuple[int, int, int]]]
    copies: list[tuple[Any, int]]
    staging: Any
    stamps: Optional[tuple[Any, Any]]
    commands: Any
    offsets: list[tuple[int, int]]
    end: int
    native: bool
    feeds: Sequence[tuple[Any, Any, int]] = ()

    def fits(self, dispatches: list[Any], copies: list[tuple[Any, int]], staging: Any,
             stamps: Optional[tuple[Any, Any]], feeds: Sequence[tuple[Any, Any, int]] = ()) -> bool:
        return (self.dispatches is dispatches and self.staging is staging and self.stamps is stamps
                and len(self.copies) == len(copies)
                and all(a is b and m == n for (a, m), (b, n) in zip(self.copies, copies))
                and len(self.feeds) == len(feeds)
                and all(a is c and b is d and m == n for (a, b, m), (c, d, n) in zip(self.feeds, feeds)))


class PendingRun:
    """A submitted run whose results the host has not read yet (`GpuProgram.run_copy` with
    `defer=True`): `views()` waits for that submission alone (`runtime/gpu_async.py`), so runs
    submitted after it may still be on the GPU, and returns what `run_copy` returns. It owns
    one of the program's two staging buffers until then; a third run that needs that buffer
    reads this one's results first (they are kept for `views()`)."""

    def __init__(self, program: "GpuProgram", staging: Any, offsets: list[tuple[int, int]], end: int,
                 index: Optional[int], stamps: Optional[tuple[Any, Any]], times: tuple[float, float, float]) -> None:
        self.program = program
        self.staging = staging
        self.offsets = offsets
        self.end = end
        self.index = index
        self.stamps = stamps
        self.times = times
        self._views: Optional[list[memoryview]] = None
        self._error: Optional[BaseException] = None

    @property
    def done(self) -> bool:
        return self._views is not None or self._error is not None

    def views(self) -> list[memoryview]:
        if not self.done:
            with self.program._lock:
                if not self.done:
                    self.program._collect(self)
        if self._error is not None:
            raise self._error
        assert self._views is not None
        return self._views


def _grown(need: int, limit: int) -> int:
    """The size of a buffer that must hold `need` bytes and may grow again: the next power of
    two (so a length that grows one step at a time reallocates log2 times), within `limit`."""
    size = 16
    while size < need:
        size *= 2
    return min(size, max(limit // 16 * 16, _round16(need)))


class GpuProgram:
    """A compiled program on a device (module docstring).

    The steady state creates no wgpu object: the program's own buffers (inputs not bound by the
    caller, outputs, temporaries) are kept across runs and symbol values, one per name; a buffer
    whose size depends on a symbol grows to the next power of two when a run needs more (and
    binds its whole size: kernels index by the symbols, which the uniform buffer carries). A
    call's bind group is kept while the buffers it binds are the same objects, so a decode step
    whose length grows by one reuses every bind group. Per run: the uniforms and the changed
    inputs are written, one command encoder encodes every dispatch and the output copies, one
    submission, one map of the staging buffer (kept too)."""

    #: Symbol-value plans kept (small: sizes and workgroup counts, no device memory).
    PLANS = 64
    #: Time every run's compute pass on the device (timestamp queries, where the adapter has
    #: them) into `times.gpu_s`: a resolve and 16 bytes more per run (benchmarks turn it on).
    time_gpu = False
    #: Once a run had the same dispatches as the run before it (a warm decode step), encode the
    #: next run's command buffer right after submitting this one, while the GPU works: the next
    #: run then only writes its inputs and symbols (queue writes, ordered before its submission)
    #: and submits. A command buffer is single-use, so each run still encodes one, but off the
    #: critical path: on the H100 a 135M decode step's 308 dispatches took ~700 us to encode
    #: against ~1900 us of GPU time. One that the next run cannot use (other dispatches, copies or
    #: staging buffer) is dropped unsubmitted.
    encode_ahead = True

    def __init__(self, device: GpuDevice, program: lp.Program, shaders: Sequence[KernelShader]) -> None:
        self.dev = device
        self.program = program
        #: The device's caps as this program's buffers use them (`program_caps`: packed bytes).
        self.caps = program_caps(program, device.caps)
        self.shaders = list(shaders)
        self.pipelines = [device.pipeline(s) for s in self.shaders]
        index = {s.name: k for k, s in enumerate(self.shaders)}
        if any(off is not None for c in program.calls for off in c.offsets):
            raise GpuError("a call passes a view at an offset, which the wgpu engine does not bind "
                           "(its lowering, lower-to-loops-gpu, makes none)")
        self.calls = [(index[c.kernel], c.args) for c in program.calls]
        self.buffers = {b.name: b for b in (*program.inputs, *program.outputs, *program.temps)}
        #: Calls whose workgroup counts depend on a symbol.
        self._dynamic_grids = [i for i, (k, _) in enumerate(self.calls)
                               if any(ex.free_vars(e) for e in self.shaders[k].grid.groups)]
        #: Buffers whose span does not depend on a symbol (sized exactly, never grown).
        self._static = {name for name, b in self.buffers.items()
                        if not any(ex.free_vars(d) for d in (*b.shape, *b.strides))}
        usage = device.wgpu.BufferUsage
        self.uniform = device.device.create_buffer(size=_round16(4 * len(program.symbols)),
                                                   usage=usage.UNIFORM | usage.COPY_DST)
        self._uniform_env: Optional[tuple[int, ...]] = None
        self._plans: OrderedDict[tuple[int, ...], _Plan] = OrderedDict()
        self._own: dict[str, Any] = {}
        self._slots: dict[str, _Slot] = {}
        #: Per call: (the buffers bound, the bind group), kept while the buffers are the same.
        self._groups: list[Optional[tuple[tuple[Any, ...], Any]]] = [None] * len(self.calls)
        #: Two staging buffers, used in turn, so that a run can be submitted while the last
        #: one's results are not read yet (`PendingRun`); the run that holds each.
        self._stagings: list[Any] = [None, None]
        self._holders: list[Optional[PendingRun]] = [None, None]
        self._turn = 0
        #: The fault flag of the kernels that check indices (one u32, zero until an index is out
        #: of range; read back with the results), or None when no kernel checks one.
        self.fault = (device.device.create_buffer(size=16, usage=usage.STORAGE | usage.COPY_SRC | usage.COPY_DST)
                      if any(self.shaders[k].fault for k, _ in self.calls) else None)
        #: Runs whose fault flag was set.
        self.faults = 0
        self._last_dispatches: Optional[tuple[_Plan, list[Any], list[tuple[Any, Any, tuple[int, int, int]]]]] = None
        #: (dispatches, their C arrays) of the last native encoding (`_native_batch`).
        self._batch: Optional[tuple[list[tuple[Any, Any, tuple[int, int, int]]], Batch]] = None
        #: (query set, resolve buffer) of the pass timestamps, made on the first timed run.
        self._stamps: Optional[tuple[Any, Any]] = None
        #: Runs submitted that the native loop (`runtime/gpu_encode.py`) encoded, so far.
        self.native_encodes = 0
        #: Dispatches submitted (or timed, by `benchmark`) so far.
        self.dispatches = 0
        #: The commands encoded ahead for the next run (`encode_ahead`), the dispatches of the
        #: last run, and the runs that submitted commands encoded ahead.
        self._ahead: Optional[_Ahead] = None
        self._prev_dispatches: Optional[list[Any]] = None
        self.ahead_runs = 0
        #: The most runs submitted and not yet read back at once (2: a run was submitted while
        #: the one before it was still out, as a pipelined decode does).
        self.most_in_flight = 0
        #: (bound buffers, all buffers, bind groups, own buffers sized by symbols) of the last run.
        self._kept: Optional[tuple[tuple[tuple[str, Any], ...], dict[str, Any], list[Any], tuple[str, ...]]] = None
        self._call_pipelines = [self.pipelines[k].pipeline for k, _ in self.calls]
        self._lock = threading.RLock()
        #: Input uploads so far (resident inputs are not uploaded again).
        self.uploads = 0
        #: Bytes the last run uploaded through its own buffers (not `bound` ones).
        self.last_uploaded = 0
        #: Host seconds of all `run_copy` calls: up to the submission returning (buffers, writes,
        #: encoding, submit) and then waiting for the results (map and read).
        self.times = RunTimes()

    # ---- sizes and buffers ---------------------------------------------------------------------------
    def nbytes(self, name: str, env: dict[str, int]) -> int:
        b = self.buffers[name]
        n = span_elements(b, env)
        if n > _I32_MAX:
            raise GpuError(f"%{name} spans {n} elements; WGSL indexes with 32-bit integers")
        size = n * storage_itemsize(b.dtype, self.caps)
        size += -size % 4  # packed bytes (`Caps.packed_bytes`) in whole words
        if size > self.dev.max_binding:
            raise GpuError(f"%{name} needs {size} bytes; the device binds at most {self.dev.max_binding}")
        return size

    def _dims(self, shader: KernelShader, env: dict[str, int]) -> tuple[int, int, int]:
        gx, gy, gz = (ex.evaluate_index(e, env) for e in shader.grid.groups)
        limit = self.dev.max_groups
        if gx > limit and gy == 1 and shader.grid.mode != "gemm":
            gy = -(-gx // limit)
            gx = -(-gx // gy)
        if max(gx, gy, gz) > limit:
            raise GpuError(f"kernel @{shader.name} needs {gx}x{gy}x{gz} workgroups; the limit is {limit} per dimension")
        return gx, gy, gz

    def _plan(self, env: dict[str, int]) -> _Plan:
        """The sizes and workgroup counts of a set of symbol values (cached; the static parts
        of the first plan are shared by all)."""
        key = tuple(env[s.name] for s in self.program.symbols)
        found = self._plans.get(key)
        if found is not None:
            self._plans.move_to_end(key)
            return found
        for v in key:
            if not -_I32_MAX <= v <= _I32_MAX:
                raise GpuError(f"symbol value {v} does not fit in 32 bits")
        first = next(iter(self._plans.values()), None)
        sizes = {name: first.sizes[name] if first is not None and name in self._static else self.nbytes(name, env)
                 for name in self.buffers}
        if first is None:
            groups = [self._dims(self.shaders[k], env) for k, _ in self.calls]
        else:  # only the calls whose grid depends on a symbol are evaluated again
            groups = list(first.groups)
            for i in self._dynamic_grids:
                groups[i] = self._dims(self.shaders[self.calls[i][0]], env)
        offsets = []
        total = 0
        for b in self.program.outputs:
            offsets.append((total, sizes[b.name]))
            total += _round16(sizes[b.name])
        plan = _Plan(sizes, groups, offsets)
        self._plans[key] = plan
        while len(self._plans) > self.PLANS:
            self._plans.popitem(last=False)
        return plan

    def _buffer(self, name: str, need: int) -> Any:
        """The program's own buffer for `name`, holding at least `need` bytes (made or grown
        when it does not: its old contents and upload stamp are then gone)."""
        buf = self._own.get(name)
        if buf is not None and buf.size >= need:
            return buf
        size = _round16(need) if name in self._static else _grown(need, self.dev.max_binding)
        buf = self.dev.storage_buffer(size, label=name)
        self._own[name] = buf
        self._slots[name] = _Slot()
        return buf

    def _resources(self, plan: _Plan, bound: Optional[dict[str, Any]]) -> tuple[dict[str, Any], list[Any]]:
        """The buffer of every name and the bind group of every call for a run. Kept from the
        last run while the caller binds the same buffers and the program's own buffers whose
        size depends on a symbol are still large enough: a warm step is a few comparisons."""
        bound = bound or {}
        key = tuple(bound.items())
        kept = self._kept
        if kept is not None and kept[0] == key and all(kept[1][n].size >= plan.sizes[n] for n in kept[3]):
            return kept[1], kept[2]
        bufs = {name: bound[name] if name in bound else self._buffer(name, n) for name, n in plan.sizes.items()}
        groups = [self._bind_group(i, tuple(bufs[a] for a in args)) for i, (_, args) in enumerate(self.calls)]
        dynamic = tuple(n for n in bufs if n not in bound and n not in self._static)
        self._kept = (key, bufs, groups, dynamic)
        return bufs, groups

    def _bind_group(self, i: int, bufs: tuple[Any, ...]) -> Any:
        """Call `i`'s bind group for these buffers: the kept one while they are the same objects."""
        kept = self._groups[i]
        if kept is not None and len(kept[0]) == len(bufs) and all(a is b for a, b in zip(kept[0], bufs)):
            return kept[1]
        entries = [{"binding": 0, "resource": {"buffer": self.uniform, "offset": 0, "size": self.uniform.size}}]
        for j, buf in enumerate(bufs):
            entries.append({"binding": j + 1, "resource": {"buffer": buf, "offset": 0, "size": buf.size}})
        if self.shaders[self.calls[i][0]].fault:
            entries.append({"binding": len(bufs) + 1, "resource": {"buffer": self.fault, "offset": 0, "size": 16}})
        group = self.dev.device.create_bind_group(layout=self.pipelines[self.calls[i][0]].layout, entries=entries)
        self._groups[i] = (bufs, group)  # holding the buffers keeps their ids from being reused
        return group

    def _dispatches(self, plan: _Plan, groups: list[Any]) -> list[tuple[Any, Any, tuple[int, int, int]]]:
        """(pipeline, bind group, workgroup counts) of each non-empty call: the same list
        object while the bind groups and the workgroup counts are the same (`_native_batch`
        keys on it; a decode step's plan is new per filled length, its counts are not)."""
        last = self._last_dispatches
        if last is not None and last[1] is groups and (last[0] is plan or last[0].groups == plan.groups):
            return last[2]
        found = [(pipe, group, dims) for pipe, group, dims in zip(self._call_pipelines, groups, plan.groups)
                 if 0 not in dims]
        self._last_dispatches = (plan, groups, found)
        return found

    def _staging_for(self, nbytes: int, turn: int) -> Any:
        """Staging buffer `turn` (0 or 1), grown to hold `nbytes`."""
        buf = self._stagings[turn]
        if buf is None or buf.size < nbytes:
            usage = self.dev.wgpu.BufferUsage
            buf = self.dev.device.create_buffer(size=_grown(nbytes, self.dev.max_buffer),
                                                usage=usage.MAP_READ | usage.COPY_DST)
            self._stagings[turn] = buf
        return buf

    # ---- running ------------------------------------------------------------------------------------
    def _write_inputs(self, plan: _Plan, bufs: dict[str, Any], inputs: Sequence[InputSpec],
                      bound: Optional[dict[str, Any]] = None) -> int:
        """Upload the inputs that changed; returns the bytes written (inputs in `bound` are the
        caller's to keep current)."""
        uploaded = 0
        for b, spec in zip(self.program.inputs, inputs):
            if bound and b.name in bound:
                continue
            owner, stamp, data_fn = spec
            slot = self._slots[b.name]
            if slot.owner is not None and slot.owner() is owner and slot.stamp == stamp and stamp is not None:
                continue  # resident: the same tensor, unchanged since it was uploaded
            if plan.sizes[b.name]:
                data = data_fn()
                self.dev.queue.write_buffer(bufs[b.name], 0, data)
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
        self.dev.queue.write_buffer(self.uniform, 0, struct.pack(f"<{len(values)}i", *values))
        self._uniform_env = values

    def _native_batch(self, native: NativeEncoder, dispatches: list[tuple[Any, Any, tuple[int, int, int]]]) -> Batch:
        """The C arrays of `dispatches` (`runtime/gpu_encode.py`), kept while the same
        pipelines, bind groups and workgroup counts come again (a warm decode step: always)."""
        kept = self._batch
        if kept is not None and kept[0] is dispatches:
            return kept[1]
        batch = native.prepare(dispatches)
        self._batch = (dispatches, batch)  # holding the objects keeps their handles alive
        return batch

    def _timestamps(self, always: bool = False) -> Optional[tuple[Any, Any]]:
        """The query set and resolve buffer of a timed run, or None (`time_gpu` off unless
        `always`, or the device has no timestamp queries)."""
        if not ((always or GpuProgram.time_gpu) and self.dev.timestamps):
            return None
        if self._stamps is None:
            wgpu = self.dev.wgpu
            self._stamps = (self.dev.device.create_query_set(type=wgpu.QueryType.timestamp, count=2),
                            self.dev.device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                                          | wgpu.BufferUsage.COPY_SRC))
        return self._stamps

    def _encode(self, encoder: Any, dispatches: list[tuple[Any, Any, tuple[int, int, int]]], repeat: int = 1,
                stamps: Optional[tuple[Any, Any]] = None) -> bool:
        """One compute pass of every dispatch (a pipeline or bind group equal to the previous
        one is not set again): in one native call where LLVM and wgpu-native's C functions are
        there (`runtime/gpu_encode.py`), else from Python through those C functions
        (`_raw_pass`), or through wgpu's public methods while `gpu_calls` counts them. Returns
        whether the native loop encoded it."""
        if stamps is not None:  # the pass's start and end on the device's clock
            cp = encoder.begin_compute_pass(timestamp_writes={"query_set": stamps[0], "beginning_of_pass_write_index": 0,
                                                              "end_of_pass_write_index": 1})
        else:
            cp = encoder.begin_compute_pass()
        raw = None if gpu_calls.counting() else self.dev.raw_pass
        native = None if raw is None else NativeEncoder.get()
        last_pipe = last_group = None
        used_native = False
        if native is not None and dispatches:
            batch = self._native_batch(native, dispatches)
            for _ in range(repeat):
                native.encode(cp._internal, batch)
            used_native = True
        elif raw is not None:
            set_pipeline, set_bind_group, dispatch, null = raw
            handle = cp._internal
            for _ in range(repeat):
                for pipe, group, (gx, gy, gz) in dispatches:
                    if pipe is not last_pipe:
                        set_pipeline(handle, pipe._internal)
                        last_pipe = pipe
                    if group is not last_group:
                        set_bind_group(handle, 0, group._internal, 0, null)
                        last_group = group
                    dispatch(handle, gx, gy, gz)
        else:
            for _ in range(repeat):
                for pipe, group, (gx, gy, gz) in dispatches:
                    if pipe is not last_pipe:
                        cp.set_pipeline(pipe)
                        last_pipe = pipe
                    if group is not last_group:
                        cp.set_bind_group(0, group)
                        last_group = group
                    cp.dispatch_workgroups(gx, gy, gz)
        cp.end()
        return used_native

    def _record(self, dispatches: list[tuple[Any, Any, tuple[int, int, int]]], copies: list[tuple[Any, int]],
                staging: Any, stamps: Optional[tuple[Any, Any]],
                feeds: Sequence[tuple[Any, Any, int]] = ()) -> _Ahead:
        """A run's command buffer: the compute pass, the timestamps' resolve, the `feeds`
        (buffer-to-buffer copies on the device: source, destination, bytes) and the copies of
        `copies` into `staging` (each at a 16-byte aligned offset)."""
        encoder = self.dev.device.create_command_encoder()
        native = self._encode(encoder, dispatches, stamps=stamps)
        if stamps is not None:
            encoder.resolve_query_set(stamps[0], 0, 2, stamps[1], 0)
        for src, dst, size in feeds:
            encoder.copy_buffer_to_buffer(src, 0, dst, 0, _round4(size))
        offsets = []
        off = 0
        for buf, size in copies:
            offsets.append((off, size))
            if size:
                encoder.copy_buffer_to_buffer(buf, 0, staging, off, _round4(size))
            off += _round16(size)
        return _Ahead(dispatches, copies, staging, stamps, encoder.finish(), offsets, off, native, tuple(feeds))

    def run_copy(self, env: dict[str, int], inputs: Sequence[InputSpec], bound: Optional[dict[str, Any]] = None,
                 read_back: Sequence[str] = (), feeds: Sequence[tuple[str, Any]] = (),
                 defer: bool = False) -> Any:
        """Upload what changed, run every kernel in one submission, and return a copy of each
        output's bytes, then of each input named in `read_back` (its span). `inputs[i]` is
        (owner, stamp, data_fn): the upload is skipped while `owner` is the object last uploaded
        to that slot and its stamp is equal. Inputs in `bound` use the caller's buffers.

        `feeds`: (output name, device buffer) pairs: after the kernels, the output's bytes are
        also copied into that buffer on the device (the next run of a decode loop reads its
        token there, and nothing waits for the host). `defer`: return a `PendingRun` right
        after the submission instead of waiting; its `views()` gives the copies."""
        with self._lock:
            pending = self._submit(env, inputs, bound, read_back, feeds)
        return pending if defer else pending.views()

    def _submit(self, env: dict[str, int], inputs: Sequence[InputSpec], bound: Optional[dict[str, Any]],
                read_back: Sequence[str], feeds: Sequence[tuple[str, Any]]) -> PendingRun:
        t0 = time.perf_counter()
        plan = self._plan(env)
        bufs, groups = self._resources(plan, bound)
        self.last_uploaded = self._write_inputs(plan, bufs, inputs, bound)
        self._write_symbols(env)
        stamps = self._timestamps()
        dispatches = self._dispatches(plan, groups)
        copies = [(bufs[b.name], size) for b, (_, size) in zip(self.program.outputs, plan.out_offsets)]
        copies += [(bufs[name], plan.sizes[name]) for name in read_back]
        if self.fault is not None:
            copies.append((self.fault, 4))
        if stamps is not None:
            copies.append((stamps[1], 16))
        fed = [(bufs[name], dst, plan.sizes[name]) for name, dst in feeds]
        if any(dst.size < _round4(n) for _, dst, n in fed):
            raise GpuError("a fed buffer is smaller than the output copied into it")
        nbytes = max(16, sum(_round16(size) for _, size in copies))
        turn = self._turn
        self._turn ^= 1
        holder = self._holders[turn]
        if holder is not None and not holder.done:
            self._collect(holder)  # its staging buffer is needed: read its results now
        staging = self._staging_for(nbytes, turn)
        ahead, self._ahead = self._ahead, None
        if ahead is not None and ahead.fits(dispatches, copies, staging, stamps, fed):
            run = ahead
            self.ahead_runs += 1
        else:  # none encoded ahead, or for other dispatches: dropped unsubmitted
            run = self._record(dispatches, copies, staging, stamps, fed)
        te = time.perf_counter()
        raw = None if gpu_calls.counting() else RawQueue.get()
        index = None
        if raw is not None:
            index = raw.submit(self.dev.queue, [run.commands])
        else:
            self.dev.queue.submit([run.commands])
        t1 = time.perf_counter()
        self.dispatches += len(dispatches)
        self.native_encodes += run.native
        if self.encode_ahead and dispatches is self._prev_dispatches:
            self._ahead = self._record(dispatches, copies, self._staging_for(nbytes, self._turn), stamps, fed)
        self._prev_dispatches = dispatches
        ta = time.perf_counter()
        pending = PendingRun(self, staging, run.offsets, run.end, index, stamps, (te - t0, t1 - t0, ta - t1))
        self._holders[turn] = pending
        other = self._holders[turn ^ 1]
        self.most_in_flight = max(self.most_in_flight, 1 + (other is not None and not other.done))
        return pending

    def _collect(self, pending: PendingRun) -> None:
        """Wait for `pending`'s submission and keep its copies (or its error) in it."""
        tw = time.perf_counter()
        offsets, off, stamps = pending.offsets, pending.end, pending.stamps
        try:
            if not any(size for _, size in offsets):
                pending._views = [memoryview(b"") for _ in offsets]
                return
            raw = RawQueue.get() if pending.index is not None else None
            if raw is not None:
                whole = raw.read_mapped(self.dev.device, pending.staging, _round16(off), pending.index)
            else:
                staging = pending.staging
                staging.map_sync(self.dev.wgpu.MapMode.READ, 0, _round16(off))
                try:  # one read of the whole range (a call each costs a few us), then slices
                    whole = staging.read_mapped(0, _round4(off), copy=True)
                finally:
                    staging.unmap()
            views = [whole[o:o + _round4(size)] if size else memoryview(bytearray()) for o, size in offsets]
            if stamps is not None:
                start, end = struct.unpack("<QQ", bytes(views.pop()))
                self.times.gpu_s += max(0, end - start) * self.dev.timestamp_period() * 1e-9
                self.times.gpu_runs += 1
            if self.fault is not None:
                if bytes(views.pop()) != b"\0\0\0\0":
                    self.faults += 1
                    self.dev.queue.write_buffer(self.fault, 0, bytes(16))
                    raise GpuFault(f"{self.program.name}: an index out of range")
            pending._views = views
        except BaseException as err:  # kept for `views()`, which raises it
            pending._error = err
        finally:
            encode_s, submit_s, ahead_s = pending.times
            self.times.add(encode_s, submit_s, time.perf_counter() - tw, ahead_s)

    def read_buffer(self, buffer: Any, nbytes: int) -> memoryview:
        """A copy of the first `nbytes` of a device buffer (for resident inputs)."""
        with self._lock:
            return self.dev.read_buffer(buffer, nbytes)

    def benchmark(self, env: dict[str, int], inputs: Sequence[InputSpec], iters: int = 20,
                  bound: Optional[dict[str, Any]] = None) -> float:
        """Seconds per run of all kernels, inputs resident, no copies (one submission of
        `iters` runs, after a warm-up)."""
        with self._lock:
            dispatches = self._prepare(env, inputs, bound)
            return self._time(dispatches, iters)

    def benchmark_kernels(self, env: dict[str, int], inputs: Sequence[InputSpec], iters: int = 20,
                          bound: Optional[dict[str, Any]] = None) -> list[tuple[str, str, float]]:
        """(kernel, summary, seconds) per dispatch of a run: each dispatch alone, `iters`
        times in one submission (inputs resident; a kernel reads what the run before left)."""
        with self._lock:
            dispatches = self._prepare(env, inputs, bound)
            plan = self._plan(env)
            calls = [k for (k, _), dims in zip(self.calls, plan.groups) if 0 not in dims]
            return [(self.shaders[k].name, self.shaders[k].summary, self._time([d], iters))
                    for k, d in zip(calls, dispatches)]

    def _prepare(self, env: dict[str, int], inputs: Sequence[InputSpec],
                 bound: Optional[dict[str, Any]]) -> list[tuple[Any, Any, tuple[int, int, int]]]:
        plan = self._plan(env)
        bufs, groups = self._resources(plan, bound)
        self._write_inputs(plan, bufs, inputs, bound)
        self._write_symbols(env)
        return self._dispatches(plan, groups)

    def _time(self, dispatches: list[tuple[Any, Any, tuple[int, int, int]]], iters: int, rounds: int = 5) -> float:
        """Seconds per run: the median of `rounds` submissions of `iters` runs each, after one
        run to warm up (one submission alone moved by 5-10% between runs on the H200). Where
        the device has timestamp queries, the pass's own start and end on the device's clock;
        else host-measured, submit to done, so a submission's fixed cost (tens of
        microseconds on a real GPU) is in it, divided by `iters`."""
        wgpu = self.dev.wgpu
        stamps = self._timestamps(always=True)
        clock = None if stamps is None else (*stamps, self.dev.device.create_buffer(
            size=16, usage=wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST))
        samples = []
        for repeat in (1, *[iters] * rounds):
            encoder = self.dev.device.create_command_encoder()
            self._encode(encoder, dispatches, repeat, stamps=None if clock is None else clock[:2])
            if clock is not None:
                encoder.resolve_query_set(clock[0], 0, 2, clock[1], 0)
                encoder.copy_buffer_to_buffer(clock[1], 0, clock[2], 0, 16)
            self.dispatches += repeat * len(dispatches)
            t0 = time.perf_counter()
            self.dev.queue.submit([encoder.finish()])
            self.dev.wait()
            seconds = time.perf_counter() - t0
            if clock is not None:
                clock[2].map_sync(wgpu.MapMode.READ, 0, 16)
                try:
                    start, end = struct.unpack("<QQ", bytes(clock[2].read_mapped(0, 16, copy=True)))
                finally:
                    clock[2].unmap()
                seconds = max(0, end - start) * self.dev.timestamp_period() * 1e-9
            samples.append(seconds / repeat)
        return statistics.median(samples[1:])


def _round4(n: int) -> int:
    return (n + 3) // 4 * 4
