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


@dataclass
class Panel:
    """One chart of a figure: a bar per contender for each workload (group)."""

    title: str
    groups: list[str]
    #: contender -> one value per group (None: not measured for that group).
    series: dict[str, list[Optional[float]]]
    xlabel: str
    #: A vertical line (e.g. 1.0 on a speed-up over eager) and a logarithmic axis.
    reference: Optional[float] = None
    log: bool = False


#: Contender colours, the same in every plot; ours stands out.
COLOURS = {"torchburn": "#d62728", "eager": "#7f7f7f", "inductor": "#1f77b4", "llama.cpp": "#2ca02c"}


def plot_path(json_path: Optional[str], plot: Optional[str]) -> Optional[str]:
    """Where the PNG goes: ``--plot``, else the JSON's path with ``.png``, else nowhere."""
    if plot:
        return plot
    if json_path:
        return os.path.splitext(json_path)[0] + ".png"
    return None


def add_plot_argument(parser: Any) -> None:
    parser.add_argument("--plot", default="", metavar="PNG",
                        help="write the figures as a PNG plot (default: beside --json, same name, .png; "
                             "needs matplotlib: pip install -e '.[bench]')")


def _colour(name: str, k: int) -> str:
    for key, c in COLOURS.items():
        if name.lower().startswith(key):
            return c
    return f"C{(k + 3) % 10}"


def plot_panels(path: Optional[str], title: str, panels: Sequence[Panel]) -> Optional[str]:
    """Draw ``panels`` side by side (horizontal grouped bars, workloads top to bottom) into
    the PNG ``path``. Returns the path, or None (no path; matplotlib missing: said on stderr)."""
    if not path or not panels:
        return None
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        import sys

        print("no plot: matplotlib is not installed (pip install -e '.[bench]')", file=sys.stderr)
        return None
    rows = max(len(p.groups) for p in panels)
    height = 1.2 + 0.18 * rows * max(len(p.series) for p in panels)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.8 * len(panels), max(height, 2.6)), squeeze=False)
    for ax, panel in zip(axes[0], panels):
        names = list(panel.series)
        colours: list[str] = []
        for k, name in enumerate(names):  # one colour per contender, distinct within a chart
            c = _colour(name, k)
            colours.append(c if c not in colours else f"C{(k + 3) % 10}")
        width = 0.8 / max(len(names), 1)
        for k, name in enumerate(names):
            ys = [i + (k - (len(names) - 1) / 2) * width for i in range(len(panel.groups))]
            vals = panel.series[name]
            keep = [(y, v) for y, v in zip(ys, vals) if v is not None]
            if not keep:
                continue
            bars = ax.barh([y for y, _ in keep], [v for _, v in keep], height=width,
                           label=name, color=colours[k])
            ax.bar_label(bars, labels=[f"{v:.3g}" for _, v in keep], fontsize=7, padding=2)
        ax.set_yticks(range(len(panel.groups)), panel.groups, fontsize=8)
        ax.invert_yaxis()
        if panel.log:
            from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
        if panel.reference is not None:
            ax.axvline(panel.reference, color="black", linewidth=0.8)
        ax.set_xlabel(panel.xlabel)
        ax.set_title(panel.title, fontsize=10)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
        ax.margins(x=0.15)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=90, bbox_inches="tight")  # the legends beside the charts included
    plt.close(fig)
    return path


def speedup_panel(title: str, rows: Sequence[tuple[str, Mapping[str, Optional[float]]]],
                  contenders: Sequence[str], baseline: str = "eager") -> Panel:
    """Speed-up over ``baseline`` (its seconds / each contender's) per workload, from
    ``(workload, {contender: seconds})`` rows; the baseline itself is the line at 1. Without
    the baseline among the contenders: each one's milliseconds."""
    if baseline not in contenders:
        return Panel(title, [name for name, _ in rows],
                     {c: [secs[c] * 1e3 if secs.get(c) else None for _, secs in rows] for c in contenders},
                     "ms (lower is better; log scale)", log=True)
    shown = [c for c in contenders if c != baseline]
    series: dict[str, list[Optional[float]]] = {c: [] for c in shown}
    for _, secs in rows:
        base = secs.get(baseline)
        for c in shown:
            v = secs.get(c)
            series[c].append(base / v if base and v else None)
    return Panel(title, [name for name, _ in rows], series,
                 f"speed-up over {baseline} (x, higher is better; log scale)", reference=1.0, log=True)


def plot_steps_and_compile(path: Optional[str], script: str, info: Mapping[str, Any], clock: str, rounds: int,
                           rows: Sequence[tuple[str, Mapping[str, Optional[float]]]],
                           cold: Mapping[str, Sequence[Optional[float]]], contenders: Sequence[str]) -> Optional[str]:
    """The model benchmarks' figure: speed-up over eager per workload (``rows`` as
    `speedup_panel` takes them) beside each compiled contender's cold compile in seconds."""
    cold_panel = Panel("cold compile (first call)", [name for name, _ in rows], {w: list(v) for w, v in cold.items()},
                       "seconds (lower is better; log scale)", log=True)
    load = f", load {info['loadavg_1m']:.1f}" if info.get("loadavg_1m") is not None else ""
    return plot_panels(path, f"{script}: {info.get('cpu', '?')}, {info.get('torch_threads', '?')} threads, "
                             f"{clock} time, median of {rounds} rounds{load}",
                       [speedup_panel("steady-state step", rows, contenders), cold_panel])
