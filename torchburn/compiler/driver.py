"""The compile driver: one tensor-IR graph -> passes -> code for a target, with caching.

This is the middle of the path in DESIGN.md, the same for every engine:

    target (TORCHBURN_TARGET, or given)  -> its engine (`engines.py`: llvm, wgpu, ...)
    key = graph's structural hash + pipeline (user passes by `uuid()`) + target + versions
    memory cache (LRU) -> disk cache (engines that keep one) -> dump the tensor IR
    -> the engine's pipeline, run with the target in the pass context -> loop IR
    -> the engine's build (LLVM IR -> object -> loaded; or WGSL -> compute pipelines)
    -> memory cache, disk cache

Code for a CPU other than this one (`TORCHBURN_TARGET=neon` on x86) is compiled to object
code and assembly and never cached on disk; calling it raises `TargetError`.
"""
from __future__ import annotations

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Optional

from .. import __version__
from ..runtime.config import get_config
from ..runtime.disk_cache import CacheEntry, DiskCache, disk_cache, source_digest
from ..runtime.frame_stack import run_on_deep_stack
from ..runtime.gc_pause import gc_paused
from ..runtime.switch_interval import short_switch_interval

if TYPE_CHECKING:  # the IR, the passes, codegen and LLVM load on first compilation, not on cache hits
    from ..runtime import jit
    from .dump import DumpFolder
    from .engines import Build, Engine
    from ..ir.loop import Program
    from ..ir.target import Target
    from ..ir.tensor import Graph
    from ..passes.pipeline import Pipeline

log = logging.getLogger("torchburn")

@dataclass
class CompiledProgram:
    """A program and its loaded native code."""

    key: str
    #: The final loop IR. Loaded from the disk cache, None until `signature()` parses its
    #: signature (buffers, symbols, workspace, calls: what a launcher is generated from) or
    #: `full_program()` the whole text; a launcher stored in the FX-graph cache needs neither.
    program: Optional["Program"]
    native: Any
    entry: Any
    #: Seconds per stage ("passes", "codegen", "llvm", "load") and per pass.
    timings: dict[str, float] = field(default_factory=dict)
    pass_times: list[tuple[str, float]] = field(default_factory=list)
    llvm_ir: str = ""
    #: "compiled" (passes, codegen and LLVM ran in this process) or "disk" (loaded from the
    #: disk cache).
    origin: str = "compiled"
    #: The printed program, kept for entries loaded from disk (see `full_program`).
    program_text: str = ""
    #: `(kernel name, origin)` of each kernel.
    kernels: tuple[tuple[str, str], ...] = ()
    #: The target the code is for (None: loaded from the disk cache, the host's).
    target: Optional["Target"] = None
    #: The engine that runs it: "llvm", "wgsl" or "reference" (interpreted, no native code).
    engine: str = "llvm"
    #: The object code (LLVM engine; None when loaded from disk).
    object: Any = None

    def assembly(self) -> str:
        """The program's assembly for its target (LLVM engine, compiled in this process)."""
        if not self.llvm_ir or self.target is None:
            raise ValueError(f"program {self.key[:16]} has no LLVM IR here (loaded from disk, or not LLVM)")
        from ..runtime import jit

        return jit.assembly(self.llvm_ir, self.target)

    def code_key(self) -> str:
        """A digest of the final program's text: two programs with the same key run the same
        kernels (the tuner measures such candidates once)."""
        from ..ir.hashing import hash_key

        if self.program_text:
            return hash_key(self.program_text)
        from ..ir.printer import print_program

        return hash_key(print_program(self.full_program()))

    def kernel_summary(self) -> list[str]:
        """`name: origin` of each kernel, as `explain()` lists them."""
        return [f"{name}: {origin}" for name, origin in self.kernels]

    def kept_summary(self) -> Optional[str]:
        """What the program keeps in its workspace between calls (`Program.kept`, made by
        `keep-constant-prep`: packed or folded weights), as `explain()` prints it, or None."""
        from ..ir.expr import Const

        program = self.signature()
        if not program.kept:
            return None
        kept = [program.buffer(n) for n in program.kept]
        nbytes = 0
        for b in kept:  # kept temporaries have constant shapes (`keep-constant-prep`)
            n = b.dtype.itemsize
            for d in b.shape:
                n *= d.value if isinstance(d, Const) else 0
            nbytes += n
        temps = f"{len(kept)} temporar{'y' if len(kept) == 1 else 'ies'}"
        froms = f"{len(program.kept_from)} constant input{'' if len(program.kept_from) == 1 else 's'}"
        return (f"kept across calls: {temps} ({_size_text(nbytes)}) computed from {froms} (parameters or "
                "buffers), computed again only when one of them changes (torchburn.forget_kept() forces it)")

    def signature(self) -> "Program":
        """The program's buffers, symbols, workspace and calls (its kernels' bodies only if
        they are at hand already)."""
        if self.program is None:
            from ..ir.parser import parse_program

            end = self.program_text.find("\nkernel @")
            text = self.program_text if end < 0 else self.program_text[:end + 1]
            self.program = parse_program(text, f"<disk cache {self.key[:16]}>")
        return self.program

    def full_program(self) -> "Program":
        """The whole program, kernels included (parsed from the disk cache's text if needed)."""
        program = self.signature()
        if program.kernels or not self.program_text:
            return program
        from ..ir.parser import parse_program

        self.program = parse_program(self.program_text, f"<disk cache {self.key[:16]}>")
        return self.program


@dataclass
class CompileStats:
    """What `compile_graph` did in this process (tests and benchmarks read it)."""

    compiled: int = 0
    memory_hits: int = 0
    disk_hits: int = 0


STATS = CompileStats()


class ModuleCache:
    """In-memory LRU of compiled programs (`TORCHBURN_CACHE_SIZE` entries)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[str, CompiledProgram] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Optional[CompiledProgram]:
        hit = self.entries.get(key)
        if hit is None:
            self.misses += 1
            return None
        self.entries.move_to_end(key)
        self.hits += 1
        return hit

    def put(self, key: str, value: CompiledProgram) -> None:
        self.entries[key] = value
        self.entries.move_to_end(key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def clear(self) -> None:
        self.entries.clear()
        self.hits = self.misses = 0


_cache: Optional[ModuleCache] = None


def memory_cache() -> ModuleCache:
    global _cache
    if _cache is None:
        _cache = ModuleCache(get_config().cache_size)
    return _cache


def cache_key(graph: "Graph", pipeline: "Pipeline", target: "Target", engine: Optional["Engine"] = None) -> str:
    """Everything that changes the compiled code: the graph's structure, the passes (user
    passes by their `uuid()`), the target and its engine (for LLVM: triple, CPU, features and
    LLVM's version; for wgpu: the device), and torchburn's version and source."""
    from ..ir.hashing import hash_key, structural_hash
    from .engines import engine_for

    engine = engine or engine_for(target)
    from .kernel_cache import target_key

    return hash_key(structural_hash(graph), pipeline.key(), target.engine, *engine.key_parts(target),
                    target_key(target), f"torchburn={__version__}", source_digest())


def configured_target() -> "Target":
    """The target this process compiles for: the reference interpreter under
    `TORCHBURN_ENGINE=reference`, else `TORCHBURN_TARGET` (the host by default)."""
    from ..codegen.target import named_target, reference_target

    config = get_config()
    return reference_target() if config.engine == "reference" else named_target(config.target)


def load_program(key: str) -> Optional[CompiledProgram]:
    """The compiled program of cache key `key` from the memory cache, else from the disk
    cache (loaded, not parsed: an FX-graph cache hit brings its own launcher); None when
    neither has it or the disk entry does not load."""
    cache = memory_cache()
    hit = cache.get(key)
    if hit is not None:
        STATS.memory_hits += 1
        return hit
    disk = disk_cache(get_config().cache_dir)
    if disk is None:
        return None
    loaded = _load_from_disk(disk, key, parse=False)
    if loaded is not None:
        STATS.disk_hits += 1
        cache.put(key, loaded)
    return loaded


def compile_graph(graph: "Graph", pipeline: Optional["Pipeline"] = None,
                  dump: Optional["DumpFolder"] = None,
                  fx_source: Optional[Callable[[], str]] = None,
                  target: Optional["Target"] = None) -> tuple[CompiledProgram, bool]:
    """Compile `graph` for `target` (by default `configured_target()`), or fetch it from the
    memory cache, then the disk cache. Returns (compiled, cache_hit). `fx_source` gives the FX
    graph's code for `TORCHBURN_DUMP`; while dumping, the disk cache is not read (so every
    stage is written) but still filled. Raises what the engine raises (`WgslUnsupported`,
    `GpuError`, `PassError`, `TargetError` for an unknown `TORCHBURN_TARGET`)."""
    from .dump import make_dump
    from .engines import engine_for
    from ..codegen.target import runs_here
    from ..ir.printer import print_ir
    from ..passes.base import TimePasses
    from ..passes.pipeline import Pipeline

    target = target or configured_target()
    engine = engine_for(target)
    pipeline = engine.pipeline(pipeline or Pipeline.default())
    key = cache_key(graph, pipeline, target, engine)
    cache = memory_cache()
    hit = cache.get(key)
    if hit is not None:
        STATS.memory_hits += 1
        return hit, True
    config = get_config()
    disk = disk_cache(config.cache_dir) if engine.disk and runs_here(target) else None
    if dump is None:
        dump = make_dump(config.dump_dir, key)
    if disk is not None and dump is None:
        loaded = _load_from_disk(disk, key)
        if loaded is not None:
            STATS.disk_hits += 1
            cache.put(key, loaded)
            return loaded, True
    if dump is not None:
        if fx_source is not None:
            dump.write("00_fx_graph.py", fx_source())
        dump.write("01_tensor_ir.tbir", print_ir(graph))
    timer = TimePasses()
    instruments: list[Any] = [timer] + ([dump] if dump is not None else [])
    shared = disk is not None  # a later process loads the library
    # Each kernel goes to the engine as its loop passes finish (LLVM works on it meanwhile),
    # unless every stage is dumped as a whole program.
    stream = engine.stream(target, shared) if dump is None else None
    t0 = time.perf_counter()

    def passes_and_build() -> tuple["Program", float, "Build"]:
        program = _run_pipeline(graph, pipeline, instruments, target, use_kernel_cache=dump is None, stream=stream,
                                keep_constants=engine.keeps_constants)
        t1 = time.perf_counter()
        if dump is not None:
            dump.write("program.tbir", print_ir(program))
        if stream is not None:
            return program, t1, engine.build_streamed(program, target, stream)  # type: ignore[attr-defined]
        return program, t1, engine.build(program, target, dump, shared=shared)

    try:
        # the passes and codegen recurse deeply: one frame-stack chunk for them; LLVM's thread
        # gets the GIL back promptly after each call into LLVM (`switch_interval.py`)
        with gc_paused(), short_switch_interval():
            program, t1, built = run_on_deep_stack(passes_and_build)
    finally:
        if stream is not None:
            stream.close()
    streamed = stream.codegen_seconds if stream is not None else 0.0  # codegen inside the loop phase
    timings = {"passes": t1 - t0 - streamed, **built.timings}
    compiled = CompiledProgram(key, program, built.native, built.entry, timings, timer.times, built.llvm_ir,
                               kernels=built.kernels, target=target, object=built.object, engine=target.engine)
    STATS.compiled += 1
    log.debug("torchburn: compiled %s for %s in %.1f ms (%s)", program.name, target.describe(),
              (time.perf_counter() - t0) * 1e3, ", ".join(f"{k} {v * 1e3:.1f}" for k, v in timings.items()))
    cache.put(key, compiled)
    if disk is not None and built.object is not None:
        from ..codegen.llvm.module import entry_name

        _store_to_disk(disk, key, program, built.object, entry_name(program))
    return compiled, False


def _run_pipeline(graph: "Graph", pipeline: "Pipeline", instruments: list[Any], target: "Target",
                  use_kernel_cache: bool, stream: Any = None, keep_constants: bool = True) -> "Program":
    """The pipeline's passes on `graph`: the tensor passes and the lowering on the whole graph,
    `dedup-kernels` and `keep-constant-prep` (both read the calls, so they run on the whole
    program, before the per-kernel phase: a kernel they change is still streamed once; the
    latter only for an engine that `keeps_constants`), then
    the loop passes once per distinct kernel (`kernel_cache.py`: results reused across graphs
    unless `use_kernel_cache` is off), then the final passes. With an engine's `stream`
    (`engines.KernelStream`), each kernel goes to it as its passes finish."""
    from ..ir.loop import Program
    from ..passes.base import PassError, PassManager
    from ..passes.loop.dedup_kernels import DedupKernels
    from ..passes.loop.keep_constant_prep import KeepConstantPrep
    from .kernel_cache import run_loop_phase

    keep = [KeepConstantPrep()] if keep_constants else []  # the engine's launchers pass `refresh`
    front = PassManager([*pipeline.tensor, pipeline.lowering, DedupKernels(), *keep], instruments, target=target)
    program = front.run(graph)
    if not isinstance(program, Program):
        raise PassError(f"the lowering pass gave {type(program).__name__}, not a loop Program")
    on_kernel = stream.start(program) if stream is not None else None
    program = run_loop_phase(program, pipeline.loop, instruments, target, use_kernel_cache, on_kernel)
    program = PassManager(pipeline.final, instruments, target=target).run(program)
    if not isinstance(program, Program):
        raise PassError(f"the pipeline ended with {type(program).__name__}, not a loop Program")
    return program


def _load_from_disk(disk: DiskCache, key: str, parse: bool = True) -> Optional[CompiledProgram]:
    """The program and its object code from the disk cache, loaded: no pass, no codegen. With
    `parse`, the program's signature is parsed (the kernels' bodies are compiled already)."""
    t0 = time.perf_counter()
    entry = disk.load(key)
    if entry is None:
        return None
    compiled = CompiledProgram(key, None, None, None, {}, origin="disk", program_text=entry.program_text,
                               kernels=entry.kernels)
    try:
        if parse:
            compiled.signature()
        compiled.native = _load_native(entry.object)
        compiled.entry = compiled.native.entry(entry.entry_name)
    except Exception as err:  # an entry that passed its digest but does not load
        log.warning("torchburn: disk cache entry %s does not load (%s); compiling again", key[:16], err)
        return None
    compiled.timings["disk_load"] = time.perf_counter() - t0
    log.debug("torchburn: loaded %s from the disk cache in %.1f ms", key[:16], compiled.timings["disk_load"] * 1e3)
    return compiled


def _load_native(obj: "jit.ObjectCode") -> Any:
    """`jit.load_native` without importing LLVM where there is a shared library: the library
    through the dynamic loader (one that does not load fails the entry, which is compiled
    again: its object is position independent, which MCJIT must not link), else the object
    through MCJIT."""
    if obj.shared:
        from ..runtime.shared_lib import load_shared

        return load_shared(obj)
    from ..runtime import jit

    return jit.load_object(obj)


def _store_to_disk(disk: DiskCache, key: str, program: "Program", obj: "jit.ObjectCode", entry_name: str) -> None:
    from .engines import kernel_origins
    from ..ir.parser import parse_program
    from ..ir.printer import print_ir

    text = print_ir(program)
    end = text.find("\nkernel @")
    try:  # the launcher is rebuilt from the signature (the kernels run from the object code)
        same = parse_program(text if end < 0 else text[:end + 1]) == replace(program, kernels=())
    except Exception:
        same = False
    if not same:  # never store what does not round-trip
        log.warning("torchburn: program %s does not survive print and parse; not cached on disk", program.name)
        return
    disk.store(CacheEntry(key, text, obj, entry_name, kernel_origins(program)))


def _size_text(nbytes: int) -> str:
    """`1.5 MiB`, `12.0 KiB` or `640 B`."""
    if nbytes >= 1 << 20:
        return f"{nbytes / (1 << 20):.1f} MiB"
    if nbytes >= 1 << 10:
        return f"{nbytes / (1 << 10):.1f} KiB"
    return f"{nbytes} B"
