"""The loop passes once per distinct kernel: within a graph, and across the graphs of a process.

After `lower-to-loops` and `dedup-kernels` a program holds each distinct kernel once. The
loop passes (`simplify`, `tile`, `vectorize`, `unroll`, ...) map each kernel on its own, so
their result for a kernel depends only on that kernel, the passes' options and the target:

    key(kernel) = BLAKE3(structural hash of the kernel, the program symbols it takes by name,
                         each loop pass's uuid() (options, version, a user pass's source),
                         every field of the target, torchburn's version and source digest)

`run_loop_phase` looks each kernel up in an in-memory LRU under that key, runs the passes
only on the kernels it misses (one program of just those, through the pass manager and its
instruments), and stores what they became. The prefill graph's kernels thus serve the decode
graph where they are equal, and a second compile of the same shapes runs no loop pass.

A pipeline with a loop pass that is not `per_kernel` (a user pass reading the calls) runs
whole, uncached, as before.
"""
from __future__ import annotations

import dataclasses
from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

if TYPE_CHECKING:
    from ..ir import loop as lp
    from ..ir.target import Target
    from ..passes.base import Instrument, Pass, PassManager


@dataclass
class KernelCacheStats:
    """What the kernel cache did in this process (tests count compiles of distinct kernels)."""

    #: Kernels the loop passes ran on.
    compiled: int = 0
    #: Kernels whose loop passes' result came from the cache.
    hits: int = 0


class KernelCache:
    """In-memory LRU: kernel key -> the kernel after the loop passes."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.entries: OrderedDict[str, "lp.Kernel"] = OrderedDict()
        self.stats = KernelCacheStats()

    def get(self, key: str) -> Optional["lp.Kernel"]:
        hit = self.entries.get(key)
        if hit is not None:
            self.entries.move_to_end(key)
        return hit

    def put(self, key: str, kernel: "lp.Kernel") -> None:
        self.entries[key] = kernel
        self.entries.move_to_end(key)
        while len(self.entries) > self.capacity:
            self.entries.popitem(last=False)

    def clear(self) -> None:
        self.entries.clear()
        self.stats = KernelCacheStats()


#: Kernels kept per program the module cache keeps (`TORCHBURN_CACHE_SIZE`).
KERNELS_PER_PROGRAM = 16
_cache: Optional[KernelCache] = None


def kernel_cache() -> KernelCache:
    """The process's kernel cache (`KERNELS_PER_PROGRAM` x `TORCHBURN_CACHE_SIZE` kernels)."""
    global _cache
    if _cache is None:
        from ..runtime.config import get_config

        _cache = KernelCache(KERNELS_PER_PROGRAM * get_config().cache_size)
    return _cache


def target_key(target: "Target") -> str:
    """Every field of the target that can change code (its `name` is for messages only)."""
    return repr(dataclasses.astuple(replace(target, name="")))


def loop_phase_key(passes: Sequence["Pass"], target: "Target") -> str:
    """The part of a kernel's key that is the same for every kernel of one compile."""
    from .. import __version__
    from ..ir.hashing import hash_key
    from ..runtime.disk_cache import source_digest

    return hash_key(*(p.uuid() for p in passes), target_key(target), f"torchburn={__version__}", source_digest())


def kernel_key(kernel: "lp.Kernel", phase_key: str) -> str:
    """The key of one kernel's loop-pass result (see the module docstring)."""
    from ..ir.hashing import hash_key
    from ..passes.loop.dedup_kernels import kernel_identity

    structure, symbols = kernel_identity(kernel)
    return hash_key(structure, ",".join(symbols), phase_key)


def cacheable(passes: Sequence["Pass"]) -> bool:
    """Whether every pass maps kernels on their own (`Pass.per_kernel`)."""
    return all(p.per_kernel for p in passes)


def _as_named(cached: "lp.Kernel", kernel: "lp.Kernel") -> "lp.Kernel":
    """The cached result under `kernel`'s name and origin (calls name kernels; parameters
    correspond by position and symbols are equal by the key)."""
    attrs = dict(cached.attrs)
    origin = dict(kernel.attrs).get("origin")
    if origin is not None:
        attrs["origin"] = origin
    return replace(cached, name=kernel.name, attrs=tuple(attrs.items()))


def run_loop_phase(program: "lp.Program", passes: Sequence["Pass"], instruments: Sequence["Instrument"],
                   target: "Target", use_cache: bool = True,
                   on_kernel: Optional[Callable[["lp.Kernel"], None]] = None) -> "lp.Program":
    """Run the loop `passes` on `program`, each kernel's result from the kernel cache where it
    is there (see the module docstring). Without `use_cache` (dumping every stage), or with
    a pass that is not per kernel, the passes run on the whole program.

    `on_kernel`, if given, gets each kernel of the result in program order as soon as it is
    final: the passes then run kernel by kernel (all passes on one kernel, then the next), so
    the caller's work on a kernel (codegen, LLVM in its thread) overlaps the passes on the
    next; the result is the same."""
    from ..ir import loop as lp
    from ..passes.base import PassManager

    manager = PassManager(passes, instruments, target=target)
    cache = kernel_cache()
    if not passes:
        for k in program.kernels if on_kernel is not None else ():
            on_kernel(k)
        return program
    if not (use_cache and cacheable(passes)):
        out: Any = manager.run(program)
        cache.stats.compiled += len(program.kernels)
        for k in out.kernels if on_kernel is not None else ():
            on_kernel(k)
        return out  # type: ignore[no-any-return]
    phase = loop_phase_key(passes, target)
    keys = [kernel_key(k, phase) for k in program.kernels]
    if on_kernel is not None:
        return _kernel_by_kernel(program, keys, manager, cache, on_kernel)
    done: dict[str, lp.Kernel] = {}
    missing: list[lp.Kernel] = []
    for k, key in zip(program.kernels, keys):
        hit = cache.get(key)
        if hit is None:
            missing.append(k)
        else:
            done[k.name] = _as_named(hit, k)
    cache.stats.hits += len(done)
    if missing:
        names = {k.name for k in missing}
        cache.stats.compiled += len(missing)
        done.update(_run_on(program, missing, manager))
        for k, key in zip(program.kernels, keys):
            if k.name in names:
                cache.put(key, done[k.name])
    return program.with_kernels(tuple(done[k.name] for k in program.kernels))


def _run_on(program: "lp.Program", kernels: "list[lp.Kernel]", manager: "PassManager") -> "dict[str, lp.Kernel]":
    """The passes of `manager` on `kernels` of `program` (with their calls): name -> result."""
    from ..ir import loop as lp
    from ..passes.base import PassError

    names = {k.name for k in kernels}
    part = replace(program, kernels=tuple(kernels), calls=tuple(c for c in program.calls if c.kernel in names))
    out: Any = manager.run(part)
    if not isinstance(out, lp.Program) or len(out.kernels) != len(kernels):
        raise PassError("a per-kernel loop pass changed the number of kernels; mark it per_kernel = False")
    done = {}
    for before, after in zip(kernels, out.kernels):
        if after.name != before.name:
            raise PassError(f"a per-kernel loop pass renamed kernel @{before.name}; mark it per_kernel = False")
        done[before.name] = after
    return done


def _kernel_by_kernel(program: "lp.Program", keys: "list[str]", manager: "PassManager", cache: KernelCache,
                      on_kernel: Callable[["lp.Kernel"], None]) -> "lp.Program":
    """`run_loop_phase` one kernel at a time, each handed to `on_kernel` when final."""
    done: list[lp.Kernel] = []
    for k, key in zip(program.kernels, keys):
        hit = cache.get(key)
        if hit is not None:
            cache.stats.hits += 1
            after = _as_named(hit, k)
        else:
            cache.stats.compiled += 1
            after = _run_on(program, [k], manager)[k.name]
            cache.put(key, after)
        done.append(after)
        on_kernel(after)
    return program.with_kernels(tuple(done))
