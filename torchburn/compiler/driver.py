"""Compile one tensor-IR graph to native code: passes, codegen, JIT, with caching.

This is the middle of the path in DESIGN.md: tensor IR -> pipeline -> loop IR -> LLVM IR ->
object code -> loaded module. Results are cached by the graph's structural hash combined with
everything else that changes the code (pipeline and user passes, target, versions).
"""
from __future__ import annotations

from .. import __version__

import logging
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional

from ..codegen.target import Target
from ..runtime.config import get_config
from ..runtime.disk_cache import CacheEntry, DiskCache, disk_cache, llvm_version, source_digest

if TYPE_CHECKING:  # the IR, the passes, the dumps and LLVM load on first compilation, not on cache hits
    from ..runtime import jit
    from .dump import DumpFolder
    from ..ir.loop import Program
    from ..ir.tensor import Graph
    from ..passes.pipeline import Pipeline

VERSION = __version__

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

    def kernel_summary(self) -> list[str]:
        """`name: origin` of each kernel, as `explain()` lists them."""
        return [f"{name}: {origin}" for name, origin in self.kernels]

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


#: Appended to a kernel's origin when it quantizes x to int8 (numerics differ from eager).
INT8_ACTIVATIONS_TAG = " [int8 activations]"


def kernel_origins(program: "Program") -> tuple[tuple[str, str], ...]:
    """`(name, origin)` of each kernel; a quantized linear computing with int8 activations
    says so (`INT8_ACTIVATIONS_TAG`), since its result then differs from eager's."""
    out = []
    for k in program.kernels:
        origin = dict(k.attrs).get("origin", "")
        out.append((k.name, origin + (INT8_ACTIVATIONS_TAG if _uses_int8_activations(k, origin) else "")))
    return tuple(out)


def _uses_int8_activations(kernel: Any, origin: str) -> bool:
    """Whether the kernel multiplies int8-quantized x (walked only for quantized linears)."""
    from ..ir import expr as ex
    from ..ir import loop as lp

    if "linear_int" not in origin:
        return False
    return any(isinstance(e, ex.Call) and e.name == ex.DOT4_U8I8
               for s in lp.walk_stmts(kernel.body) for root in lp.stmt_exprs(s) for e in ex.walk(root))


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


def cache_key(graph: "Graph", pipeline: "Pipeline", target: Target) -> str:
    """Everything that changes the compiled code: the graph's structure, the passes (user
    passes by their `uuid()`), the target, and the versions of torchburn (and its source),
    llvmlite and LLVM."""
    from ..ir.hashing import hash_key, structural_hash

    return hash_key(structural_hash(graph), pipeline.key(), target.triple, target.cpu, target.features,
                    f"torchburn={VERSION}", source_digest(), llvm_version())


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
                  fx_source: Optional[Callable[[], str]] = None) -> tuple[CompiledProgram, bool]:
    """Compile `graph`, or fetch it from the memory cache, then the disk cache. Returns
    (compiled, cache_hit). `fx_source` gives the FX graph's code for `TORCHBURN_DUMP`; while
    dumping, the disk cache is not read (so every stage is written) but still filled."""
    from .dump import make_dump
    from ..ir.loop import Program
    from ..ir.printer import print_ir
    from ..passes.base import PassError, PassManager, TimePasses
    from ..passes.pipeline import Pipeline
    from ..runtime import jit

    pipeline = pipeline or Pipeline.default()
    target = Target.host()
    key = cache_key(graph, pipeline, target)
    cache = memory_cache()
    hit = cache.get(key)
    if hit is not None:
        STATS.memory_hits += 1
        return hit, True
    config = get_config()
    disk = disk_cache(config.cache_dir)
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
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    program = PassManager(pipeline.passes(), instruments).run(graph)
    if not isinstance(program, Program):
        raise PassError(f"the pipeline ended with {type(program).__name__}, not a loop Program")
    from ..codegen.llvm.module import emit_program, entry_name  # not needed on cache hits
    t1 = time.perf_counter()
    llvm_ir = emit_program(program, target)
    t2 = time.perf_counter()
    obj = jit.compile_llvm_ir(llvm_ir, target, shared=disk is not None)  # a later process loads the library
    t3 = time.perf_counter()
    native = jit.load_object(obj)
    entry = native.entry(entry_name(program))
    t4 = time.perf_counter()
    timings.update(passes=t1 - t0, codegen=t2 - t1, llvm=t3 - t2, load=t4 - t3)
    if dump is not None:
        dump.write("program.tbir", print_ir(program))
        dump.write("module.ll", llvm_ir)
        dump.write("module.s", jit.assembly(llvm_ir, target))
    compiled = CompiledProgram(key, program, native, entry, timings, timer.times, llvm_ir,
                               kernels=kernel_origins(program))
    STATS.compiled += 1
    log.debug("torchburn: compiled %s in %.1f ms (%s)", program.name, (t4 - t0) * 1e3,
              ", ".join(f"{k} {v * 1e3:.1f}" for k, v in timings.items()))
    cache.put(key, compiled)
    if disk is not None:
        _store_to_disk(disk, key, program, obj, entry_name(program))
    return compiled, False


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
    """The shared library through the dynamic loader when there is one (no LLVM needed), else
    the object through MCJIT."""
    if obj.shared:
        from ..runtime.shared_lib import load_shared

        try:
            return load_shared(obj)
        except OSError as err:
            log.debug("torchburn: shared library does not load (%s); linking the object instead", err)
    from ..runtime import jit

    return jit.load_object(obj)


def _store_to_disk(disk: DiskCache, key: str, program: "Program", obj: jit.ObjectCode, entry_name: str) -> None:
    from ..ir.parser import parse_program
    from ..ir.printer import print_ir

    text = print_ir(program)
    try:
        same = parse_program(text) == program
    except Exception:
        same = False
    if not same:  # the launcher is rebuilt from this text: never store what does not round-trip
        log.warning("torchburn: program %s does not survive print and parse; not cached on disk", program.name)
        return
    disk.store(CacheEntry(key, text, obj, entry_name, kernel_origins(program)))
