"""The GPU engine's side of the backend: compile a subgraph to WGSL and call it with tensors.

Compiling is the one compile driver's (`compiler/driver.py`, engine `wgpu`: its pipeline,
cache and dumps); this module is the torch-facing part. `compile_subgraph` is the one hook
`backend/entry.py` calls when the wgpu engine is active
(`TORCHBURN_DEVICE=gpu`, or `auto` with an adapter). It returns a `GpuLauncher`, or None when
the GPU engine cannot run the subgraph (an f64 or i64 tensor, an op without a WGSL form, a
device limit); the backend then compiles it for the CPU engine and `explain()` reports why.

The launcher checks inputs against the compiled sizes and strides (as the CPU launcher does),
binds the symbols, copies inputs to the device (converting dtypes the device stores
differently, see `codegen/wgsl/types.py`), and copies outputs back. An input tensor is
uploaded again only when it is a different tensor object or its `_version` (bumped by every
in-place change) or data pointer changed, so parameters stay resident on the device.

Most inputs go through `gpu_resident.py` instead: one device copy per host storage, kept
across calls, symbol values and programs (a KV cache whose filled length grows each step is not
uploaded again). An input the program writes in place (a KV cache's new slots,
`frontend/inplace_writes.py`) is read back in the same submission and written into the host
tensor, unless the device owns it (`gpu_resident.keep_on_gpu`): then nothing comes down and
`gpu_resident.to_host` brings it back. The launcher counts the bytes that cross the device
boundary (`transfers`: of the last call, in all, and the resident copies it binds), which
`explain()` prints per GPU subgraph.
"""
from __future__ import annotations

import ctypes
import logging
import operator
import warnings
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from . import gpu_resident
from . import report as rep
from ..codegen.wgsl import WgslUnsupported, host_dtype, storage_itemsize
from ..compiler.driver import CompiledProgram, compile_graph
from ..frontend.dtypes import to_torch
from ..ir import expr as ex
from ..ir import loop as lp
from ..ir.expr import Const, Var
from ..ir.tensor import Graph, Value
from ..passes.pipeline import Pipeline
from ..runtime.config import get_config
from ..runtime.gpu import (GpuError, GpuFault, GpuProgram, gpu_available, gpu_unavailable_reason, span_elements,
                           wants_gpu)

#: Whether a GPU run that failed (a lost or failing adapter) has been warned about.
_run_failure_warned = False
log = logging.getLogger("torchburn")


def compile_graph_gpu(graph: Graph, pipeline: Optional[Pipeline] = None) -> tuple[CompiledProgram, bool]:
    """`compile_graph` for the wgpu engine (the GPU variant of `pipeline`, keyed by the device),
    for the device's storage-buffer and loop-iteration limits (`gpu-split-wide` and
    `gpu-chunk-serial` split only past them). Raises
    `WgslUnsupported` or `GpuError`."""
    from ..codegen.target import gpu_target
    from ..runtime.gpu import get_device

    caps = get_device().caps
    target = gpu_target(storage_buffers=caps.max_storage_buffers, loop_iterations=caps.loop_iterations)
    return compile_graph(graph, pipeline, target=target)


@dataclass
class _Input:
    position: int
    value: Value
    torch_dtype: torch.dtype
    #: dtype the device stores (None: upload as is).
    upload_dtype: Optional[torch.dtype]
    itemsize: int
    buffer: lp.Buffer
    #: The sizes and, for dims above 1, the strides when all are constants (the fast check).
    static: Optional[tuple[tuple[int, ...], tuple[tuple[int, int], ...]]] = None
    #: Whether the program writes it in place.
    written: bool = False


def _static_layout(v: Value) -> Optional[tuple[tuple[int, ...], tuple[tuple[int, int], ...]]]:
    """(sizes, (dim, stride) of the dims above 1) when `v`'s shape and layout are constants."""
    shape, layout = v.shape, v.layout()
    if not all(isinstance(e, Const) for e in (*shape, *layout)):
        return None
    sizes = tuple(int(e.value) for e in shape)  # type: ignore[attr-defined]
    return sizes, tuple((k, int(st.value)) for k, (n, st) in enumerate(zip(sizes, layout)) if n > 1)  # type: ignore[attr-defined]


@dataclass
class _Bound:
    """The last `gpu_resident.bind` of an input the program only reads: still valid while the
    same tensor has the same version and its resident entry was not dropped."""

    ref: "weakref.ref[torch.Tensor]"
    version: int
    entry: gpu_resident.Resident


@dataclass
class _Pinned:
    """The pinned inputs of a launcher (`GpuLauncher.pin`) as their first call bound them: the
    same tensor objects, at their versions then, with their resident entries still live, need
    no check of sizes, strides or dtype and no residency lookup again."""

    positions: list[int]
    tensors: list[torch.Tensor]
    versions: list[int]
    entries: list[gpu_resident.Resident]
    #: Their resident buffers by input buffer name, and the bytes those hold.
    bound: dict[str, Any]
    resident: int
    #: Indices into `GpuLauncher.inputs` of the inputs still checked and bound per call.
    free: list[int]
    #: `_specs`'s list with None at the pinned inputs, copied per call.
    specs: list[Any]

    def holds(self, args: tuple[Any, ...]) -> bool:
        """Whether `args` still hold the pinned tensors, unchanged and resident (C-level loops:
        tens of microseconds for a 30-layer model's ~270 weights)."""
        return (all(map(operator.is_, map(args.__getitem__, self.positions), self.tensors))
                and list(map(_VERSION, self.tensors)) == self.versions
                and not any(map(_DROPPED, self.entries)))


_VERSION = operator.attrgetter("_version")
_DROPPED = operator.attrgetter("dropped")
_recent: "list[weakref.ref[GpuLauncher]]" = []


def recent_launchers() -> list["GpuLauncher"]:
    """Live launchers, oldest first (benchmarks find the kernels of a compiled function here)."""
    return [x for x in (r() for r in _recent) if x is not None]


class GpuLauncher:
    """Callable for one compiled subgraph on the GPU engine: `launcher(*args) -> tuple`."""

    #: Installed in place of an AOTAutograd write-back (`entry._drop_writebacks`): AOTAutograd
    #: bumps the version of each input written in place once per call, before the call.
    aot_bumps_written = False
    #: In a graph that also runs CPU-engine or PyTorch code (`entry._guard_gpu_state`): read
    #: back every in-place write, even of a tensor the GPU owns.
    write_back_always = False
    #: Keep the arguments of the last call in `last_args` (for benchmarks).
    record_args = False
    last_args: tuple[Any, ...] = ()

    def __init__(self, graph: Graph, compiled: CompiledProgram, eager: Callable[..., Any]) -> None:
        self.graph = graph
        self.compiled = compiled
        assert compiled.program is not None and isinstance(compiled.native, GpuProgram)
        #: The compiled program's compute pipelines and buffers on the device.
        self.gpu: GpuProgram = compiled.native
        self.program = compiled.program
        self.eager = eager
        self.calls = 0
        self.eager_fallbacks = 0
        self.uploads = 0
        caps = self.gpu.caps
        self.inputs: list[_Input] = []
        tensor_inputs = [v for v in graph.inputs if isinstance(v, Value)]
        for b, v in zip(self.program.inputs, tensor_inputs):
            hd = host_dtype(v.dtype, caps)
            self.inputs.append(_Input(graph.inputs.index(v), v, to_torch(v.dtype),
                                      None if hd == v.dtype else to_torch(hd), storage_itemsize(v.dtype, caps), b))
        self.outputs = [(b, to_torch(b.dtype), to_torch(host_dtype(b.dtype, caps))) for b in self.program.outputs]
        #: int64 inputs, stored as int32 on the device: their values are range-checked per call.
        self.wide = [inp for inp in self.inputs if inp.torch_dtype is torch.int64]
        #: (kernel, loop iterations per invocation) where the device limits them and the count
        #: depends on the sizes (`gpu-chunk-serial`): checked per call.
        self.loop_counts = [(s.name, s.iterations) for s in self.gpu.shaders if s.iterations is not None]
        written = lp.written_inputs(self.program)
        #: The inputs the program writes in place (`frontend/inplace_writes.py`).
        self.written = [inp for inp in self.inputs if inp.buffer.name in written]
        for inp in self.inputs:
            inp.static = _static_layout(inp.value)
            inp.written = inp.buffer.name in written
        #: Inputs that are symbols: (argument position, name).
        self._symbol_args = [(i, v.name) for i, v in enumerate(graph.inputs)
                             if isinstance(v, Var) and not v.name.startswith("_")]
        #: Per input, its last resident binding (`_Bound`), for the inputs the program only reads.
        self._bound: list[Optional[_Bound]] = [None] * len(self.inputs)
        #: Per input, the resident buffer bound last (a new tensor in its place, as the token
        #: ids of each decode step, takes it over when free: the bind groups stay valid).
        self._last_buffer: list[Any] = [None] * len(self.inputs)
        #: Graph result index -> argument position, for the results that are in-place writes.
        #: Results returned viewed in another shape (`Program.result_views`), by position.
        self._result_views = dict(self.program.result_views)
        self.inplace_results = {k: inp.position for k, name in enumerate(self.program.result_names())
                                for inp in self.written if inp.buffer.name == name}
        #: Bytes across the device boundary (of the last call, in all, resident), shared with
        #: the subgraph's report for `explain()`.
        self.transfers = rep.Transfers()
        #: Argument positions the caller passes the same tensor at on every call (`pin`), and
        #: their state once a call has bound them (`_Pinned`); None: every input checked per call.
        self._pin_positions: frozenset[int] = frozenset()
        self._pinned: Optional[_Pinned] = None
        #: Calls that took the pinned path, and calls whose result fed an argument (`submit`).
        self.pinned_calls = 0
        self.fed_calls = 0

        def launch(*args: Any) -> tuple[Any, ...]:
            return self(*args)

        #: A plain function, as the backend installs it in the graph (`output_strides.py` knows
        #: it by `gpu_launcher` and lays its results out from `result_kinds` on fake tensors).
        self.launch = launch
        launch.gpu_launcher = self  # type: ignore[attr-defined]
        _recent.append(weakref.ref(self))
        del _recent[:-64]

    # ---- binding -----------------------------------------------------------------------------------
    def _bind(self, args: tuple[Any, ...], pinned: Optional[_Pinned] = None) -> Optional[dict[str, int]]:
        """The symbol values of a call, or None when the arguments do not fit the compiled
        sizes, strides, dtypes (inputs of constant layout are checked without expressions;
        `pinned` ones, not at all)."""
        env = {name: int(args[i]) for i, name in self._symbol_args}
        checks: list[tuple[ex.Expr, int]] = []
        for inp in self.inputs if pinned is None else [self.inputs[k] for k in pinned.free]:
            t = args[inp.position]
            v = inp.value
            if not isinstance(t, torch.Tensor) or t.dtype is not inp.torch_dtype or t.dim() != v.type.rank or not t.is_cpu:
                return None
            if inp.static is not None:
                sizes, strides = inp.static
                if t.shape != sizes:
                    return None
                actual = t.stride()
                if any(actual[k] != st for k, st in strides):
                    return None
                continue
            for size, actual in zip(v.shape, t.shape):
                if isinstance(size, Var) and size.name not in env:
                    env[size.name] = int(actual)
                else:
                    checks.append((size, int(actual)))
            for size, stride, actual, n in zip(v.shape, v.layout(), t.stride(), t.shape):
                if size == Const(1) or n <= 1:
                    continue
                if isinstance(stride, Var) and stride.name not in env:
                    env[stride.name] = int(actual)
                else:
                    checks.append((stride, int(actual)))
        try:
            if any(ex.evaluate_index(e, env) != actual for e, actual in checks):
                return None
        except KeyError:
            return None
        if any(s.name not in env for s in self.program.symbols):
            return None
        return env

    # ---- the call ----------------------------------------------------------------------------------
    def _specs(self, args: tuple[Any, ...], env: dict[str, int], bound: Optional[dict[str, Any]] = None,
               pinned: Optional[_Pinned] = None) -> list[Any]:
        """Per input (owner, stamp, bytes) for `GpuProgram.run_copy`; None for a `bound` one."""
        specs: list[Any] = [None] * len(self.inputs) if pinned is None else list(pinned.specs)
        for k in range(len(self.inputs)) if pinned is None else pinned.free:
            inp = self.inputs[k]
            if bound and inp.buffer.name in bound:
                continue
            t = args[inp.position]
            try:
                stamp: Any = (t._version, t.data_ptr(), tuple(t.shape), t.stride())
            except RuntimeError:  # inference tensors have no version counter: always upload
                stamp = None
            specs[k] = (t, stamp, _uploader(t, inp, env))
        return specs

    def pin(self, positions: "frozenset[int] | set[int]") -> None:
        """Declare that the caller passes the same tensor at these argument positions on every
        call (a bound step's weights, `llm/runtime/step_cache.bind_gpu`). After the next call
        binds them, later calls check only that the same objects come, at the same versions,
        with their resident copies live (C-level loops), instead of each one's sizes, strides,
        dtype and residency in Python: ~700 of a decode step's ~4000 host microseconds for a
        30-layer model's ~270 weights on the H100. As for the CPU engine's pinned launchers
        (`pinned_launch.py`), a pinned tensor's dtype, sizes and strides are taken as fixed;
        an in-place write (a version bump) or a different object unpins them for that call,
        which then checks everything and pins again."""
        self._pin_positions = frozenset(positions)
        self._pinned = None

    def _arm(self, args: tuple[Any, ...], bound: dict[str, Any]) -> None:
        """After a fully checked call: pin the pinned positions' inputs that it bound resident,
        read-only, of constant layout and not int64 (range-checked per call)."""
        pos, tensors, versions, entries, names = [], [], [], [], {}
        free = []
        for k, inp in enumerate(self.inputs):
            last = self._bound[k]
            if (inp.position in self._pin_positions and inp.static is not None and not inp.written
                    and inp.torch_dtype is not torch.int64 and last is not None and inp.buffer.name in bound
                    and last.ref() is args[inp.position]):
                pos.append(inp.position)
                tensors.append(args[inp.position])
                versions.append(last.version)
                entries.append(last.entry)
                names[inp.buffer.name] = bound[inp.buffer.name]
            else:
                free.append(k)
        if not tensors:
            return
        self._pinned = _Pinned(pos, tensors, versions, entries, names, sum(e.nbytes for e in entries), free,
                               [None] * len(self.inputs))

    def _resident(self, args: tuple[Any, ...], pinned: Optional[_Pinned] = None) -> tuple[dict[str, Any], int]:
        """Bind the inputs that can be resident (`gpu_resident.py`); (bound buffers, bytes
        uploaded for them). The `pinned` ones are bound as their first call bound them."""
        bound: dict[str, Any] = {} if pinned is None else dict(pinned.bound)
        up = 0
        resident = 0 if pinned is None else pinned.resident
        dev = self.gpu.dev
        for k in range(len(self.inputs)) if pinned is None else pinned.free:
            inp = self.inputs[k]
            t = args[inp.position]
            last = self._bound[k]
            if last is not None and last.ref() is t and last.version == t._version and not last.entry.dropped:
                bound[inp.buffer.name] = last.entry.buffer  # unchanged since it was bound
                resident += last.entry.nbytes
                continue
            written = inp.written
            if not gpu_resident.eligible(t, inp.upload_dtype, written, dev.max_binding):
                self._bound[k] = None
                continue
            buf, n = gpu_resident.bind(t, dev, int(self.aot_bumps_written and written), inp.upload_dtype,
                                       self._last_buffer[k])
            self._last_buffer[k] = buf
            bound[inp.buffer.name] = buf
            up += n
            e = gpu_resident.entry(t, inp.upload_dtype)
            resident += 0 if e is None else e.nbytes
            # only inputs the program reads: a written one's version moves with every call
            self._bound[k] = None if written or e is None else _Bound(weakref.ref(t), t._version, e)
        self.transfers.resident = resident
        return bound, up

    def benchmark(self, *args: Any, iters: int = 20) -> float:
        """Seconds per run of the kernels alone on `args` (inputs resident, no copies)."""
        env = self._bind(args)
        if env is None:
            raise GpuError("arguments differ from the compiled ones")
        bound, _ = self._resident(args)
        return self.gpu.benchmark(env, self._specs(args, env, bound), iters, bound)

    def benchmark_kernels(self, *args: Any, iters: int = 20) -> list[tuple[str, str, float]]:
        """(kernel, summary, seconds) of each dispatch alone on `args` (inputs resident)."""
        env = self._bind(args)
        if env is None:
            raise GpuError("arguments differ from the compiled ones")
        bound, _ = self._resident(args)
        return self.gpu.benchmark_kernels(env, self._specs(args, env, bound), iters, bound)

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        return self.submit(*args).result()

    def submit(self, *args: Any, feed: Optional[tuple[int, int]] = None) -> "PendingCall":
        """Bind, upload and submit a call; its `result()` waits for the results. Until then
        the host may submit more calls (`GpuProgram.run_copy(defer=True)`): a decode loop
        submits step t+1 before it reads step t's token.

        `feed = (k, p)`: after the kernels, result `k` (a computed output) is also copied on
        the device into the resident copy of argument `p`, a tensor of the same dtype and
        size that the GPU owns (`gpu_resident.keep_on_gpu`): the next call reads it there
        (the token a greedy decode step picked is the next step's input, and the host only
        reads it). A call that cannot feed so (the arguments do not fit, the input is not
        resident) raises `GpuError`; nothing runs in PyTorch silently in its place."""
        pinned = self._pinned
        if pinned is not None and not pinned.holds(args):
            self._pinned = pinned = None  # checked in full, then pinned again (`_arm`)
        env = self._bind(args, pinned)
        if env is None:
            return self._done_slow(args, "sizes, strides, dtype or device differ from the compiled ones", feed)
        for inp in self.wide:
            t = args[inp.position]
            if t.numel() and not _fits_int32(t):
                return self._done_slow(args, "an int64 input holds values past 32 bits (the GPU stores int64 as "
                                       "int32)", feed)
        for name, count in self.loop_counts:
            n, limit = ex.evaluate_index(count, env), self.gpu.caps.loop_iterations
            if n > limit:
                return self._done_slow(args, f"kernel @{name} would run {n:,} loop iterations in one invocation at "
                                       f"these sizes; the adapter ends an invocation's loops after {limit:,} "
                                       "(llvmpipe)", feed)
        if self.record_args:
            self.last_args = args
        try:
            bound, up = self._resident(args, pinned)
            specs = self._specs(args, env, bound, pinned)
            back = [inp for inp in self.written if inp.buffer.name not in bound or self.write_back_always
                    or not gpu_resident.is_owned(args[inp.position])]
            feeds = () if feed is None else (self._feed(args, bound, feed),)
            pending = self.gpu.run_copy(env, specs, bound, [inp.buffer.name for inp in back], feeds, defer=True)
        except gpu_resident.GpuStateError:
            raise
        except GpuError as err:  # the adapter failed or was lost: PyTorch runs it, one warning
            if feed is not None:
                raise
            self._warn_failure(err)
            return PendingCall(self, args, done=self._slow(args, str(err)))
        if pinned is not None:
            self.pinned_calls += 1
        elif self._pin_positions:
            self._arm(args, bound)
        for inp in self.written:
            if inp.buffer.name in bound and inp not in back:
                gpu_resident.written(args[inp.position], None)  # the device keeps it (keep_on_gpu)
        if feed is not None:
            gpu_resident.written(args[feed[1]], None)  # the device holds its new values
            self.fed_calls += 1
        return PendingCall(self, args, env=env, bound=bound, back=back, pending=pending, fed=feed is not None,
                           up=up + self.gpu.last_uploaded)

    def _feed(self, args: tuple[Any, ...], bound: dict[str, Any], feed: tuple[int, int]) -> tuple[str, Any]:
        """(output buffer name, the resident buffer of the fed argument) of `submit`'s `feed`."""
        k, p = feed
        names = self.program.result_names()
        computed = {b.name: (b, stored) for b, _, stored in self.outputs}
        if not 0 <= k < len(names) or names[k] not in computed:
            raise GpuError(f"result {k} is not an output the program computes; it cannot be fed")
        target = next((inp for inp in self.inputs if inp.position == p), None)
        if target is None or target.buffer.name not in bound or target.upload_dtype is not None:
            raise GpuError(f"argument {p} has no resident copy stored as is; it cannot be fed")
        t = args[p]
        if not gpu_resident.is_owned(t):
            raise GpuError(f"argument {p} is not owned by the GPU (gpu_resident.keep_on_gpu); it cannot be fed")
        b, stored = computed[names[k]]
        if stored is not t.dtype or tuple(int(d.value) for d in b.shape if isinstance(d, Const)) != tuple(t.shape):
            raise GpuError(f"result {k} and argument {p} differ in dtype or shape; it cannot be fed")
        return names[k], bound[target.buffer.name]

    def _warn_failure(self, err: Exception) -> None:
        global _run_failure_warned
        if not _run_failure_warned:
            _run_failure_warned = True
            warnings.warn(f"torchburn: {self.program.name} could not run on the GPU ({err}); calls that "
                          "fail on the GPU run in PyTorch (warned once per process)", RuntimeWarning, stacklevel=3)

    def _done_slow(self, args: tuple[Any, ...], why: str, feed: Optional[tuple[int, int]]) -> "PendingCall":
        if feed is not None:
            raise GpuError(f"{self.program.name}: a fed call cannot run on the GPU engine: {why}")
        return PendingCall(self, args, done=self._slow(args, why))

    def _finish(self, call: "PendingCall") -> tuple[Any, ...]:
        """The results of a submitted call (`PendingCall.result`)."""
        args, env, bound, back = call.args, call.env, call.bound, call.back
        assert env is not None and bound is not None and call.pending is not None
        try:
            views = call.pending.views()
        except GpuFault as err:  # an index out of range: PyTorch raises eager's error
            if call.fed:  # the next call may already have read what this one fed: no rerun
                raise GpuError(f"{self.program.name}: {err} in a call whose output fed the next one") from err
            return self._slow(args, str(err))
        except GpuError as err:
            if call.fed:
                raise
            self._warn_failure(err)
            return self._slow(args, str(err))
        self.calls += 1  # ran on the GPU (a call whose index check failed ran in PyTorch)
        n_out = len(self.outputs)
        for inp, view in zip(back, views[n_out:]):
            t = args[inp.position]
            if inp.buffer.name in bound:
                gpu_resident.written(t, view)
            else:
                _write_span(t, inp, env, view)
        tr = self.transfers
        tr.calls += 1
        tr.last_up = call.up
        tr.last_down = sum(len(v) for v in views)
        tr.bytes_up += tr.last_up
        tr.bytes_down += tr.last_down
        outs = []
        for (b, final, stored), view in zip(self.outputs, views[:n_out]):
            shape = tuple(ex.evaluate_index(d, env) for d in b.shape)
            n = 1
            for s in shape:
                n *= s
            t = torch.frombuffer(view, dtype=stored, count=n) if n else torch.empty(0, dtype=stored)
            t = t.reshape(shape)
            outs.append(t if stored is final else t.to(final))
        return self._results(args, outs, env)

    @property
    def result_kinds(self) -> tuple[str, ...]:
        """Where each result comes from, as `LauncherSpec.results` says it: `"new"` (a new
        contiguous tensor), `"input i"` (argument i, written in place) or `"copy i"` (a clone
        of argument i); `output_strides.py` lays the results out from this on fake tensors."""
        inputs = {inp.buffer.name: inp.position for inp in self.inputs}
        computed = {b.name for b, _, _ in self.outputs}
        kinds = []
        for k, name in enumerate(self.program.result_names()):
            if name in computed:
                kinds.append("new")
            elif k in self.inplace_results:
                kinds.append(f"input {self.inplace_results[k]}")
            else:
                kinds.append(f"copy {inputs[name]}")
        return tuple(kinds)

    def _results(self, args: tuple[Any, ...], outs: list[torch.Tensor], env: dict[str, int]) -> tuple[Any, ...]:
        # as the program says, not `self.graph.outputs` (see `Program.results`)
        inputs = {inp.buffer.name: inp.position for inp in self.inputs}
        computed = {b.name: out for (b, _, _), out in zip(self.outputs, outs)}
        results: list[Any] = []
        for k, name in enumerate(self.program.result_names()):
            view = self._result_views.get(k)
            if name in computed and view is not None:  # its buffer in the output's shape
                results.append(computed[name].view(tuple(ex.evaluate_index(d, env) for d in view)))
            elif name in computed:
                results.append(computed[name])
            elif k in self.inplace_results:
                results.append(args[inputs[name]])  # written in place: the input itself
            else:
                results.append(args[inputs[name]].clone())
        return tuple(results)

    def _slow(self, args: tuple[Any, ...], why: str) -> tuple[Any, ...]:
        self.eager_fallbacks += 1
        log.info("torchburn: %s on the GPU engine: %s; running this call in PyTorch", self.program.name, why)
        for a in args:  # PyTorch reads the host copies: bring back what the GPU owns
            if isinstance(a, torch.Tensor) and gpu_resident.is_stale(a):
                gpu_resident.to_host(a)
        with torch.no_grad():
            out = self.eager(*args)
        out = tuple(out) if isinstance(out, (list, tuple)) else (out,)
        for k, pos in self.inplace_results.items():  # the write-back `copy_` was taken out (entry._install)
            args[pos].copy_(out[k])
            out = out[:k] + (args[pos],) + out[k + 1:]
        return out


class PendingCall:
    """A launcher call submitted to the GPU (`GpuLauncher.submit`), or one already done (run in
    PyTorch); `result()` returns what the call returns, waiting for the GPU only the first time."""

    def __init__(self, launcher: GpuLauncher, args: tuple[Any, ...], *, done: Optional[tuple[Any, ...]] = None,
                 env: Optional[dict[str, int]] = None, bound: Optional[dict[str, Any]] = None,
                 back: Optional[list[_Input]] = None, pending: Any = None, fed: bool = False, up: int = 0) -> None:
        self.launcher = launcher
        self.args = args
        self.env, self.bound, self.back, self.pending, self.fed = env, bound, back, pending, fed
        #: Bytes the submission uploaded.
        self.up = up
        self._result = done

    def result(self) -> tuple[Any, ...]:
        if self._result is None:
            self._result = self.launcher._finish(self)
            self.args = ()  # the arguments' tensors are free for the next step's (their buffers too)
        return self._result


def _fits_int32(t: torch.Tensor) -> bool:
    """Whether an int64 tensor's values fit int32: a few values (a decode step's positions
    and slots) through a list, without two reductions' dispatch."""
    if t.numel() <= 64:
        values = t.reshape(-1).tolist()
        return -(1 << 31) <= min(values) and max(values) < 1 << 31
    return -(1 << 31) <= int(t.min()) and int(t.max()) < 1 << 31


def _write_span(t: torch.Tensor, inp: _Input, env: dict[str, int], data: memoryview) -> None:
    """Write an in-place input's span, read back from the device, into `t` (its strides)."""
    n = span_elements(inp.buffer, env)
    if not n:
        return
    src = torch.frombuffer(bytearray(data[: n * inp.itemsize]), dtype=inp.upload_dtype or inp.torch_dtype, count=n)
    view = torch.as_strided(src, tuple(t.shape), t.stride(), 0)
    with torch.no_grad():
        t.copy_(view)


def _uploader(t: torch.Tensor, inp: _Input, env: dict[str, int]) -> Callable[[], Any]:
    """The bytes of `t`'s span in the device's storage dtype (strides kept as compiled)."""

    def data() -> Any:
        src = t
        if inp.upload_dtype is not None:
            src = torch.empty_strided(tuple(t.shape), t.stride(), dtype=inp.upload_dtype)
            src.copy_(t)
        n = span_elements(inp.buffer, env) * inp.itemsize
        raw = (ctypes.c_char * n).from_address(src.data_ptr()) if n else b""
        if n % 4:
            return bytes(raw) + b"\0" * (4 - n % 4)
        if src is not t:
            return bytes(raw)  # the converted copy dies with this function
        return memoryview(raw)

    return data


def gpu_requested() -> bool:
    """Whether the configuration asks for the GPU engine (`TORCHBURN_DEVICE=gpu|auto`,
    `TORCHBURN_ENGINE=wgpu`); with `auto`, only when an adapter exists."""
    if not wants_gpu():
        return False
    return get_config().device != "auto" or gpu_available()


def compile_subgraph(sub: torch.fx.GraphModule, name: str, pipeline: Pipeline,
                     report: rep.SubgraphReport) -> Optional[GpuLauncher]:
    """Compile a partition for the GPU engine; None (with `report.engine_note` saying why)
    when it must run on the CPU engine."""
    from ..frontend.importer import import_graph
    from ..frontend.registry import Unsupported

    if not gpu_available():
        report.engine_note = f"GPU engine asked for, CPU engine instead: {gpu_unavailable_reason()}"
        return None
    try:
        graph = import_graph(sub, name=name)
        compiled, hit = compile_graph_gpu(graph, pipeline)
    except Unsupported:
        return None  # the CPU path meets the same reason and reports it
    except (WgslUnsupported, GpuError) as err:
        report.engine_note = f"GPU engine cannot run it, CPU engine instead: {err}"
        log.info("torchburn: %s: %s", name, report.engine_note)
        return None
    report.engine = "wgpu"
    report.cache_hit = hit
    report.kernels = compiled.kernel_summary()
    report.timings = dict(compiled.timings)
    report.pass_times = list(compiled.pass_times)
    launcher = GpuLauncher(graph, compiled, sub.forward)
    report.transfers = launcher.transfers
    return launcher
