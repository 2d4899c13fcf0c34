"""Per-kernel time of a compiled subgraph, for `explain(..., html=...)` and the LLM engine's
``--profile`` (`llm/cli/profile.py`).

A compiled subgraph is one native call that runs its kernels in order. To time them one by
one, each kernel call of its program is built again as a program of its own (same buffers,
symbols and workspace layout, one call), and the launcher's native entry is swapped for a
function that calls those one-kernel programs in turn with the same pointers, timing each. The
results are the same (the same code runs in the same order on the same memory); each kernel's
time includes the ~2 us of its ctypes call. Each kernel gets its wall time and the calling
thread's CPU time (`time.thread_time`). Only CPU (LLVM) launchers can be timed so.
"""
from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Callable, Iterator, Optional


@dataclasses.dataclass
class KernelTime:
    """One kernel call of a program: what it is, where it came from, its seconds in all."""

    index: int
    kernel: str
    what: str = ""
    where: str = ""
    seconds: float = 0.0
    cpu_seconds: float = 0.0


@contextlib.contextmanager
def capture_launchers(on_new: Optional[Callable[[Any], None]] = None) -> Iterator[list[Any]]:
    """The launchers built while the block runs (the graphs compiled or loaded in it);
    ``on_new(launcher)`` runs as each is made."""
    from .launcher import Launcher

    made: list[Any] = []
    init = Launcher.__init__

    def spy(self: Any, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        made.append(self)
        if on_new is not None:
            on_new(self)

    Launcher.__init__ = spy  # type: ignore[method-assign]
    try:
        yield made
    finally:
        Launcher.__init__ = init  # type: ignore[method-assign]


def one_call_programs(program: Any) -> list[Any]:
    """For each call of ``program``, the program doing only that call."""
    return [dataclasses.replace(program, name=f"{program.name}_prof{i}", calls=(call,),
                                kernels=(program.kernel(call.kernel),))
            for i, call in enumerate(program.calls)]


def build_entries(programs: list[Any]) -> list[Callable[..., None]]:
    """The native entries of ``programs`` built for the configured CPU target."""
    from ..codegen.llvm.module import entry_name
    from ..compiler.driver import configured_target
    from ..compiler.engines import engine_for

    target = configured_target()
    engine = engine_for(target)
    entries = []
    for p in programs:
        built = engine.build(p, target, None, shared=False)
        entries.append(built.native.entry(entry_name(p)))  # keeps its module alive
    return entries


class KernelTimer:
    """Swaps the native entry of a CPU launcher for per-kernel timed calls (`active`, or
    `start` and `stop`)."""

    def __init__(self, launcher: Any) -> None:
        compiled = launcher.keepalive
        if compiled is None or not hasattr(compiled, "full_program"):
            raise ValueError(f"launcher {launcher.name} has no native CPU program to time")
        if getattr(compiled, "engine", "") == "reference":
            raise ValueError(f"launcher {launcher.name} runs on the reference engine (interpreted)")
        self.launcher = launcher
        self.program = compiled.full_program()
        self.entries = build_entries(one_call_programs(self.program))
        self.kernels = [KernelTime(i, c.kernel) for i, c in enumerate(self.program.calls)]
        self.calls = 0
        self._native: Optional[Callable[..., None]] = None

    def _entry(self, buffers: Any, symbols: Any, workspace: Any) -> None:
        clock, cpu = time.perf_counter, time.thread_time
        for k, entry in zip(self.kernels, self.entries):
            t0, c0 = clock(), cpu()
            entry(buffers, symbols, workspace)
            k.seconds += clock() - t0
            k.cpu_seconds += cpu() - c0
        self.calls += 1

    def start(self) -> None:
        g = self.launcher.launch.__globals__
        if self._native is None:
            self._native = g["_entry"]
        g["_entry"] = self._entry

    def stop(self) -> None:
        if self._native is not None:
            self.launcher.launch.__globals__["_entry"] = self._native
            self._native = None

    @contextlib.contextmanager
    def active(self) -> Iterator["KernelTimer"]:
        self.start()
        try:
            yield self
        finally:
            self.stop()
