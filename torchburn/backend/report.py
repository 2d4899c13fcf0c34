"""What the compiler did, as data: subgraphs, fallbacks and why, kernels, cache hits, timings.

`backend.py` records one `GraphReport` per graph AOTAutograd hands us (forward or backward);
`explain()` collects them for a call and prints them readably.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class Transfers:
    """Bytes a GPU subgraph moved across the device boundary (its launcher keeps this current):
    of the last call, in all, and the bytes of the host storages it keeps resident."""

    calls: int = 0
    last_up: int = 0
    last_down: int = 0
    bytes_up: int = 0
    bytes_down: int = 0
    resident: int = 0

    def line(self) -> str:
        if not self.calls:
            return "device boundary: not called yet"
        return (f"device boundary: last call {self.last_up} B up, {self.last_down} B down; "
                f"{self.calls} call(s) {self.bytes_up} B up, {self.bytes_down} B down; {self.resident} B resident")


@dataclass
class SubgraphReport:
    name: str
    ops: list[str]
    kernels: list[str] = field(default_factory=list)
    cache_hit: bool = False
    compiled: bool = True
    #: Why it runs in PyTorch instead, when `compiled` is False.
    reason: Optional[str] = None
    #: When it runs in PyTorch because the compiler failed (a bug, not a missing lowering):
    #: the error as "Type: message", and where it was raised ("path:line in function").
    internal_error: Optional[str] = None
    error_where: Optional[str] = None
    timings: dict[str, float] = field(default_factory=dict)
    pass_times: list[tuple[str, float]] = field(default_factory=list)
    #: The engine that runs it: "cpu" (LLVM), "wgpu" or "reference" (the NumPy interpreter).
    engine: str = "cpu"
    #: Why it runs on the CPU engine although the GPU engine was asked for.
    engine_note: Optional[str] = None
    #: On the GPU engine: the bytes its calls moved to and from the device.
    transfers: Optional[Transfers] = None
    #: What its program keeps in the workspace between calls (weights packed or folded once
    #: in inference, `keep-constant-prep`), as `explain()` prints it; None when nothing.
    kept: Optional[str] = None


@dataclass
class GraphReport:
    kind: str  # "forward", "backward" or "inference"
    subgraphs: list[SubgraphReport] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    #: Seconds of all our work on this graph (the name is historical: partition, import to IR,
    #: caches, passes, codegen, LLVM, loading, launchers).
    import_seconds: float = 0.0
    #: Seconds per graph-level stage: "graph_key", "graph_cache_load" (FX-graph cache), and on a
    #: miss "partition" and "subgraphs" (import, compile or program-cache load of each).
    stages: dict[str, float] = field(default_factory=dict)
    #: Whether the whole graph came from the FX-graph cache.
    graph_cache_hit: bool = False
    #: Nodes run as library calls (ATen) because the tuner measured them faster than ours:
    #: (op name, the tuner's line). Not fallbacks.
    library_calls: list[tuple[str, str]] = field(default_factory=list)
    #: Every choice the tuner made for this graph, as `explain()` prints it.
    tuning: list[str] = field(default_factory=list)
    #: Seconds the tuner spent measuring (part of `import_seconds`).
    tuning_seconds: float = 0.0

    @property
    def internal_errors(self) -> list[SubgraphReport]:
        """The subgraphs left to PyTorch by an internal compiler error."""
        return [s for s in self.subgraphs if s.internal_error is not None]

    @property
    def fallback_ops(self) -> list[str]:
        ops = [op for op, _ in self.fallbacks]
        for s in self.subgraphs:
            if not s.compiled:
                ops.extend(s.ops)
        return ops


class _Recorder(threading.local):
    reports: Optional[list[GraphReport]] = None


_recorder = _Recorder()
_all_reports: list[GraphReport] = []
#: Reports recorded in this process (`mark`, `since`).
_recorded = 0
#: Seconds spent in the backend's entry before AOTAutograd runs (options, decomposition
#: table), summed over the process; benchmarks add it to our time.
backend_setup_seconds = 0.0


def add_backend_setup(seconds: float) -> None:
    global backend_setup_seconds
    backend_setup_seconds += seconds


def record(report: GraphReport) -> None:
    global _recorded
    _recorded += 1
    _all_reports.append(report)
    del _all_reports[:-256]
    if _recorder.reports is not None:
        _recorder.reports.append(report)


def start_recording() -> list[GraphReport]:
    _recorder.reports = []
    return _recorder.reports


def stop_recording() -> None:
    _recorder.reports = None


def recent_reports() -> list[GraphReport]:
    return list(_all_reports)


def mark() -> int:
    """A point in the process's reports, for `since`."""
    return _recorded


def since(point: int) -> list[GraphReport]:
    """The reports recorded after `mark` returned ``point`` (the last 256 at most)."""
    n = min(_recorded - point, len(_all_reports))
    return list(_all_reports[-n:]) if n > 0 else []
