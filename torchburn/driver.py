"""Compile one tensor-IR graph to native code: passes, codegen, JIT, with caching.

This is the middle of the path in DESIGN.md: tensor IR -> pipeline -> loop IR -> LLVM IR ->
object code -> loaded module. Results are cached by the graph's structural hash combined with
everything else that changes the code (pipeline and user passes, target, versions).
"""
from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Optional

from .codegen.llvm.module import emit_program, entry_name
from .codegen.target import Target
from .config import get_config
from .dump import DumpFolder, make_dump
from .ir.hashing import hash_key, structural_hash
from .ir.loop import Program
from .ir.printer import print_ir
from .ir.tensor import Graph
from .passes.base import PassManager, TimePasses
from .passes.pipeline import Pipeline
from .runtime import jit

VERSION = "0.1.0"


@dataclass
class CompiledProgram:
    """A program and its loaded native code."""

    key: str
    program: Program
    native: Any
    entry: Any
    #: Seconds per stage ("passes", "codegen", "llvm", "load") and per pass.
    timings: dict[str, float] = field(default_factory=dict)
    pass_times: list[tuple[str, float]] = field(default_factory=list)
    llvm_ir: str = ""


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


def cache_key(graph: Graph, pipeline: Pipeline, target: Target) -> str:
    import llvmlite

    return hash_key(structural_hash(graph), pipeline.key(), target.cpu, target.features,
                    f"torchburn={VERSION}", f"llvmlite={llvmlite.__version__}")


def compile_graph(graph: Graph, pipeline: Optional[Pipeline] = None,
                  dump: Optional[DumpFolder] = None) -> tuple[CompiledProgram, bool]:
    """Compile `graph` (or fetch it from the cache). Returns (compiled, cache_hit)."""
    pipeline = pipeline or Pipeline.default()
    target = Target.host()
    key = cache_key(graph, pipeline, target)
    cache = memory_cache()
    hit = cache.get(key)
    if hit is not None:
        return hit, True
    if dump is None:
        dump = make_dump(get_config().dump_dir, key)
    if dump is not None:
        dump.write("01_tensor_ir.tbir", print_ir(graph))
    timer = TimePasses()
    instruments: list[Any] = [timer] + ([dump] if dump is not None else [])
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    program = PassManager(pipeline.passes(), instruments).run(graph)
    t1 = time.perf_counter()
    llvm_ir = emit_program(program, target)
    t2 = time.perf_counter()
    obj = jit.compile_llvm_ir(llvm_ir, target)
    t3 = time.perf_counter()
    native = jit.load_object(obj)
    entry = native.entry(entry_name(program))
    t4 = time.perf_counter()
    timings.update(passes=t1 - t0, codegen=t2 - t1, llvm=t3 - t2, load=t4 - t3)
    if dump is not None:
        dump.write("program.tbir", print_ir(program))
        dump.write("module.ll", llvm_ir)
        dump.write("module.s", jit.assembly(llvm_ir, target))
    compiled = CompiledProgram(key, program, native, entry, timings, timer.times, llvm_ir)
    cache.put(key, compiled)
    return compiled, False
