"""The engine-specific stages of the compile driver: which pipeline, what joins the cache key,
and how a finished loop program becomes something to call.

The driver (`driver.py`) owns everything the engines share (cache key, memory and disk
caches, dumps, running the pipeline with the target in the pass context); an engine is:

| engine | pipeline | key | build | disk cache |
|---|---|---|---|---|
| `llvm` | the pipeline as given | triple, CPU, features, llvmlite and LLVM | LLVM IR (a module per kernel, emitted as soon as the kernel's loop passes finish (`KernelStream`), optimized and emitted to an object in a second thread while the passes run on the next) -> the objects loaded one by one (and linked into a shared library for the disk cache; for a CPU that is not this one, objects and assembly only) | yes |
| `wgpu` | `gpu_pipeline` of it | the device (adapter, backend, limits) | WGSL shaders -> compute pipelines | no |

| `reference` | `reference_pipeline` of it (`reference.py`: plain nests, no CPU loop passes) | nothing (the interpreter is torchburn's own source) | none: the NumPy interpreter runs the loop program | no |
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Protocol

if TYPE_CHECKING:
    from ..ir.loop import Program
    from ..ir.target import Target
    from ..passes.pipeline import Pipeline
    from .dump import DumpFolder


@dataclass
class Build:
    """What an engine made of a program: the loaded code (`native`), the callable entry, and
    its stages' seconds; for LLVM also the LLVM IR and the object code."""

    native: Any
    entry: Any
    timings: dict[str, float] = field(default_factory=dict)
    #: `(kernel name, description)` of each kernel, as `explain()` lists them.
    kernels: tuple[tuple[str, str], ...] = ()
    llvm_ir: str = ""
    object: Any = None


class Engine(Protocol):
    """The stages of the compile driver that differ between engines."""

    #: Whether compiled programs go to the disk cache (object code a later process loads).
    disk: bool
    #: Whether its launchers pass `refresh` and keep temporaries between calls
    #: (`Program.kept`): only then does the driver run `keep-constant-prep`.
    keeps_constants: bool

    def pipeline(self, pipeline: "Pipeline") -> "Pipeline":
        """The pipeline this engine runs, given the user's (default or with user passes)."""

    def key_parts(self, target: "Target") -> tuple[str, ...]:
        """What besides graph, pipeline and torchburn's version changes this engine's code."""

    def build(self, program: "Program", target: "Target", dump: Optional["DumpFolder"], shared: bool) -> Build:
        """Native code for `program` (`shared`: also a shared library for the disk cache)."""

    def stream(self, target: "Target", shared: bool) -> Optional["KernelStream"]:
        """Where the driver hands each kernel as its loop passes finish, so the engine's work
        on it starts then (`build_streamed` finishes it); None: the engine builds whole."""


#: Appended to a kernel's origin when it quantizes x to int8 (numerics differ from eager).
INT8_ACTIVATIONS_TAG = " [int8 activations]"
#: Appended to a kernel's origin when it multiplies by AMX tile products (`tile_dot_u8i8`:
#: the `qlinear` tile form, `passes/quant/qlinear_tiles.py`).
TILES_TAG = " [AMX tiles]"
#: The custom ops whose kernels may quantize x (origins name them: `torchburn.linear_int4.default`).
QUANTIZED_LINEAR_OPS = ("linear_int4", "linear_int8", "linear_blocks")


def kernel_origins(program: "Program") -> tuple[tuple[str, str], ...]:
    """`(name, origin)` of each kernel; a quantized linear computing with int8 activations
    says so (`INT8_ACTIVATIONS_TAG`), since its result then differs from eager's, and one
    whose products are AMX tile products too (`TILES_TAG`)."""
    out = []
    for k in program.kernels:
        origin = dict(k.attrs).get("origin", "")
        calls = _byte_products(k, origin)
        tags = (INT8_ACTIVATIONS_TAG if calls else "") + (TILES_TAG if any(c.startswith("tile_") for c in calls) else "")
        out.append((k.name, origin + tags))
    return tuple(out)


def _byte_products(kernel: Any, origin: str) -> frozenset[str]:
    """The byte-product calls (`dot4_u8i8_acc` ..., `tile_dot_u8i8` ...) the kernel makes: it
    multiplies int8-quantized x (walked only for quantized linears)."""
    from ..ir import expr as ex
    from ..ir import loop as lp

    if not any(op in origin for op in QUANTIZED_LINEAR_OPS):
        return frozenset()
    names = ex.DOT4_CALLS | ex.TILE_DOT_CALLS
    return frozenset(e.name for s in lp.walk_stmts(kernel.body) for root in lp.stmt_exprs(s) for e in ex.walk(root)
                     if isinstance(e, ex.Call) and e.name in names)


class LlvmEngine:
    """CPUs, through LLVM: the host, or another CPU (compiled, not run: see `runs_here`)."""

    disk = True
    keeps_constants = True

    def pipeline(self, pipeline: "Pipeline") -> "Pipeline":
        return pipeline

    def key_parts(self, target: "Target") -> tuple[str, ...]:
        from ..runtime.config import get_config
        from ..runtime.disk_cache import llvm_version

        checks = ("bounds",) if get_config().bounds_check else ()
        return (target.triple, target.cpu, target.features, llvm_version(), *checks)

    def stream(self, target: "Target", shared: bool) -> "KernelStream":
        from ..codegen.target import runs_here
        from ..runtime.config import get_config

        return KernelStream(target, get_config().bounds_check, shared and runs_here(target))

    def build(self, program: "Program", target: "Target", dump: Optional["DumpFolder"], shared: bool) -> Build:
        from ..codegen.target import runs_here
        from ..runtime.config import get_config

        t0 = time.perf_counter()
        # In parts: LLVM optimizes each kernel in a second thread while the next is emitted.
        llvm_ir, obj, t1 = compile_in_parts(program, target, get_config().bounds_check, shared and runs_here(target))
        return self._finish(program, target, dump, llvm_ir, obj, t1 - t0, t1)

    def build_streamed(self, program: "Program", target: "Target", stream: "KernelStream") -> Build:
        """`build` for a program whose kernels went to `stream` as their passes finished
        (or, where the final passes changed a kernel, built whole: `build`)."""
        if not stream.covers(program):
            stream.close()
            return self.build(program, target, None, stream.shared)
        t0 = time.perf_counter()
        llvm_ir, obj, t1 = stream.finish(program)
        return self._finish(program, target, None, llvm_ir, obj, stream.codegen_seconds + t1 - t0, t1)

    def _finish(self, program: "Program", target: "Target", dump: Optional["DumpFolder"], llvm_ir: str, obj: Any,
                codegen: float, t1: float) -> Build:
        """Dump, load, and the entry (LLVM's object for `program` is `obj`; `t1`: when codegen ended)."""
        from ..codegen.llvm.module import entry_name
        from ..codegen.target import runs_here
        from ..runtime import jit

        runnable = runs_here(target)
        t2 = time.perf_counter()
        if dump is not None:
            dump.write("module.ll", llvm_ir)
            dump.write("module.s", jit.assembly(llvm_ir, target))
        if not runnable:
            return Build(None, _not_here(target), {"codegen": codegen, "llvm": t2 - t1},
                         kernel_origins(program), llvm_ir, obj)
        native = jit.load_native(obj)
        entry = native.entry(entry_name(program))
        t3 = time.perf_counter()
        return Build(native, entry, {"codegen": codegen, "llvm": t2 - t1, "load": t3 - t2},
                     kernel_origins(program), llvm_ir, obj)


def compile_in_parts(program: "Program", target: "Target", bounds_check: bool, shared: bool,
                     phases: Optional[dict[str, float]] = None) -> tuple[str, Any, float]:
    """The program's LLVM IR (its modules joined, `jit.join_modules`), its object code (an
    object per module), and when (`time.perf_counter`) the last module was emitted: each module
    is handed to LLVM's thread as soon as it is emitted (`jit.ModuleParts`)."""
    from ..codegen.llvm.module import emit_program_parts
    from ..runtime import jit

    parts = jit.ModuleParts(target, phases=phases, shared=shared)
    try:
        for text in emit_program_parts(program, target, bounds_check):
            parts.add(text)
        emitted = time.perf_counter()
        obj = parts.finish()
    finally:
        parts.close()
    return jit.join_modules(parts.texts), obj, emitted


class KernelStream:
    """LLVM's side of a compile that hands each kernel over as its loop passes finish (the
    driver: `kernel_cache.run_loop_phase`'s `on_kernel`): the kernel's module is emitted
    (`codegen.llvm.module.PartEmitter`) and queued for LLVM's thread (`jit.ModuleParts`) at
    once, so LLVM optimizes the first kernels while the passes still run on the later ones.

        stream = engine.stream(target, shared)
        on_kernel = stream.start(program)        # the program after the loop-level lowering
        ... on_kernel(kernel) per kernel ...
        build = engine.build_streamed(final_program, target, stream)
        stream.close()                           # always (a failed compile drops the queue)
    """

    def __init__(self, target: "Target", bounds_check: bool, shared: bool) -> None:
        from ..runtime import jit

        self.target, self.bounds_check, self.shared = target, bounds_check, shared
        self.parts = jit.ModuleParts(target, shared=shared)
        self.emitter: Any = None
        #: Seconds spent emitting kernels' modules (in the loop phase's time: the driver moves them).
        self.codegen_seconds = 0.0

    def start(self, program: "Program") -> Callable[[Any], None]:
        """Begin with the program the loop passes run on; returns the per-kernel callback."""
        from ..codegen.llvm.module import PartEmitter

        self.emitter = PartEmitter(program, self.target, self.bounds_check)
        return self.kernel

    def kernel(self, kernel: Any) -> None:
        """One kernel after its loop passes: emitted and queued for LLVM."""
        t0 = time.perf_counter()
        text = self.emitter.kernel(kernel)
        if text is not None:
            self.parts.add(text)
        self.codegen_seconds += time.perf_counter() - t0

    def covers(self, program: "Program") -> bool:
        """Whether every kernel of the final `program` went through `kernel` unchanged."""
        return self.emitter is not None and self.emitter.covers(program)

    def finish(self, program: "Program") -> tuple[str, Any, float]:
        """The entry's module emitted, then LLVM IR, object and when codegen ended, as
        `compile_in_parts` returns them."""
        from ..runtime import jit

        for text in self.emitter.entry(program):
            self.parts.add(text)
        emitted = time.perf_counter()
        obj = self.parts.finish()
        return jit.join_modules(self.parts.texts), obj, emitted

    def close(self) -> None:
        self.parts.close()


def _not_here(target: "Target") -> Callable[..., None]:
    """The entry of code compiled for another CPU: calling it says so."""
    from ..codegen.target import TargetError, host_target

    host = host_target()

    def entry(*args: Any) -> None:
        raise TargetError(f"this code is for {target.describe()}, which this machine ({host.cpu}, "
                          f"{host.triple}) cannot run; it is compiled to object code and assembly only "
                          "(TORCHBURN_DUMP writes them). Unset TORCHBURN_TARGET to run on this machine.")

    return entry


class WgslEngine:
    """GPUs, through WGSL compute shaders on wgpu."""

    disk = False
    #: The GPU launcher has no `refresh` key: a kernel guarded by `if refresh != 0` would
    #: also lose its grid mapping (one invocation would run it, every call).
    keeps_constants = False

    def pipeline(self, pipeline: "Pipeline") -> "Pipeline":
        from ..passes.gpu.pipeline import gpu_pipeline

        return gpu_pipeline(pipeline)

    def stream(self, target: "Target", shared: bool) -> None:
        return None

    def key_parts(self, target: "Target") -> tuple[str, ...]:
        from ..runtime.config import get_config
        from ..runtime.gpu import get_device

        checks = ("bounds",) if get_config().bounds_check else ()  # wgpu's runtime checks kept
        return ("wgsl", get_device().cache_tag(), *checks)

    def build(self, program: "Program", target: "Target", dump: Optional["DumpFolder"], shared: bool) -> Build:
        from ..codegen.wgsl import WgslUnsupported, emit_program, refuse_data_divisors
        from ..runtime.gpu import GpuError, GpuProgram, get_device

        dev = get_device()
        t0 = time.perf_counter()
        refuse_data_divisors(program)  # a zero divisor must raise as eager does: the CPU checks
        shaders = emit_program(program, dev.caps)
        t1 = time.perf_counter()
        if dump is not None:
            for s in shaders:
                dump.write(f"kernel_{s.name}.wgsl", s.source)
        try:
            gpu = GpuProgram(dev, program, shaders)
        except Exception as err:  # a shader the WGSL front end rejects: report, run on the CPU
            if isinstance(err, GpuError):
                raise
            raise WgslUnsupported(f"the device rejected a shader: {str(err).strip()[:400]}") from err
        t2 = time.perf_counter()
        kernels = tuple((s.name, f"{s.summary}; {dict(k.attrs).get('origin', '')}")
                        for s, k in zip(shaders, program.kernels))
        return Build(gpu, None, {"wgsl": t1 - t0, "pipelines": t2 - t1}, kernels)


class ReferenceEngine:
    """The golden model: the loop program interpreted on NumPy (`runtime.reference`), called
    exactly as native code is. Nothing here imports llvmlite or wgpu."""

    disk = False
    keeps_constants = True

    def pipeline(self, pipeline: "Pipeline") -> "Pipeline":
        from .reference import reference_pipeline

        return reference_pipeline(pipeline)

    def stream(self, target: "Target", shared: bool) -> None:
        return None

    def key_parts(self, target: "Target") -> tuple[str, ...]:
        return ()

    def build(self, program: "Program", target: "Target", dump: Optional["DumpFolder"], shared: bool) -> Build:
        from ..runtime.reference import ReferenceEntry

        t0 = time.perf_counter()
        entry = ReferenceEntry(program)
        return Build(None, entry, {"interpreter": time.perf_counter() - t0}, kernel_origins(program))


#: Engine name (a target's `engine`) -> its stages.
ENGINES: dict[str, Engine] = {"llvm": LlvmEngine(), "wgpu": WgslEngine(), "reference": ReferenceEngine()}


def engine_for(target: "Target") -> Engine:
    try:
        return ENGINES[target.engine]
    except KeyError:
        raise ValueError(f"no compile engine {target.engine!r}; engines: {', '.join(sorted(ENGINES))}") from None
