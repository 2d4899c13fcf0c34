"""Timing helpers shared by the benchmark scripts.

Measurements on a shared, noisy machine: every contender is warmed up, then the contenders
are run in turns (interleaved rounds), so a burst of background load hurts them alike, and
each is summarized by the median of its rounds. A round times a batch of calls long enough
(`min_round_s`) for the clock's resolution not to matter.

    results = compare({"eager": f, "torchburn": g}, args, rounds=31)
    results["torchburn"].median_s
"""
from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Mapping, Optional, Sequence


@dataclass
class Timing:
    """Seconds per call of one contender: the median and spread over rounds."""

    name: str
    median_s: float
    min_s: float
    max_s: float
    rounds: int
    calls_per_round: int
    samples_s: list[float] = field(default_factory=list, repr=False)

    @property
    def iqr_s(self) -> float:
        """Interquartile range of the per-round times (how noisy the measurement was)."""
        if len(self.samples_s) < 4:
            return self.max_s - self.min_s
        q = statistics.quantiles(self.samples_s, n=4)
        return q[2] - q[0]


def _calls_for(fn: Callable[[], Any], min_round_s: float) -> int:
    """How many calls make a round of at least `min_round_s`."""
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_round_s or n >= 1 << 20:
            return n
        n = max(n * 2, int(n * min_round_s / max(dt, 1e-9)) + 1)


def compare(fns: Mapping[str, Callable[..., Any]], args: Sequence[Any] = (), *, rounds: int = 31,
            warmup: int = 3, min_round_s: float = 0.02,
            clock: Callable[[], float] = time.perf_counter) -> dict[str, Timing]:
    """Time each function on `args`: warm-up calls, then `rounds` interleaved rounds. `clock`
    may be `time.thread_time` (CPU time of this thread: on a loaded machine it leaves out the
    time other processes held the core, for work that runs on the calling thread only)."""
    bound = {name: (lambda f=f: f(*args)) for name, f in fns.items()}
    for f in bound.values():
        for _ in range(warmup):
            f()
    calls = {name: _calls_for(f, min_round_s) for name, f in bound.items()}
    samples: dict[str, list[float]] = {name: [] for name in bound}
    for r in range(rounds):
        names = list(bound) if r % 2 == 0 else list(reversed(bound))
        for name in names:
            f, n = bound[name], calls[name]
            t0 = clock()
            for _ in range(n):
                f()
            samples[name].append((clock() - t0) / n)
    return {name: Timing(name, statistics.median(s), min(s), max(s), rounds, calls[name], s)
            for name, s in samples.items()}


def time_fn(fn: Callable[..., Any], args: Sequence[Any] = (), **kw: Any) -> Timing:
    """One contender alone (see `compare`)."""
    return compare({"fn": fn}, args, **kw)["fn"]


def machine_info() -> dict[str, Any]:
    """What the figures depend on: CPU, threads, versions, load when measured."""
    import platform

    import torch

    info: dict[str, Any] = {
        "cpu": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "loadavg_1m": os.getloadavg()[0] if hasattr(os, "getloadavg") else None,
    }
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return info


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A plain text table with right-aligned columns after the first."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for k, row in enumerate(cells):
        parts = [row[0].ljust(widths[0])] + [c.rjust(w) for c, w in zip(row[1:], widths[1:])]
        lines.append("  ".join(parts))
        if k == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_json(path: Optional[str], payload: Mapping[str, Any]) -> None:
    """Write results as JSON (Timing objects become dicts, without their raw samples)."""
    if not path:
        return

    def encode(o: Any) -> Any:
        if isinstance(o, Timing):
            d = asdict(o)
            d.pop("samples_s", None)
            d["iqr_s"] = o.iqr_s
            return d
        raise TypeError(f"cannot encode {type(o).__name__}")

    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(payload, f, indent=2, default=encode)
        f.write("\n")
