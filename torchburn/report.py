"""What the compiler did, as data: subgraphs, fallbacks and why, kernels, cache hits, timings.

`backend.py` records one `GraphReport` per graph AOTAutograd hands us (forward or backward);
`explain()` collects them for a call and prints them readably.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Optional


@dataclass
class SubgraphReport:
    name: str
    ops: list[str]
    kernels: list[str] = field(default_factory=list)
    cache_hit: bool = False
    compiled: bool = True
    #: Why it runs in PyTorch instead, when `compiled` is False.
    reason: Optional[str] = None
    timings: dict[str, float] = field(default_factory=dict)
    pass_times: list[tuple[str, float]] = field(default_factory=list)
    #: The engine that runs it: "cpu" (LLVM) or "wgpu".
    engine: str = "cpu"
    #: Why it runs on the CPU engine although the GPU engine was asked for.
    engine_note: Optional[str] = None


@dataclass
class GraphReport:
    kind: str  # "forward", "backward" or "inference"
    subgraphs: list[SubgraphReport] = field(default_factory=list)
    fallbacks: list[tuple[str, str]] = field(default_factory=list)
    import_seconds: float = 0.0

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


def record(report: GraphReport) -> None:
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
