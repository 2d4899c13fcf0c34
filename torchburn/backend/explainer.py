"""`torchburn.explain(fn, *args)`: compile and run `fn` once, then report what happened.

Three sources, so that nothing that ran in PyTorch goes unsaid:

- our backend's `GraphReport`s: per ATen graph, the compiled subgraphs, their kernels and the
  ops that stayed in PyTorch inside the graph;
- Dynamo's graph breaks (`torch._dynamo.utils.graph_break_reasons`, the list
  `torch._dynamo.explain` reads): where Dynamo split the function, why, at which user line;
- the ops that ran in PyTorch *between* Dynamo's graphs (the code at each break), counted with
  the profiler: ATen ops outside our compiled graphs and outside compilation.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Union

from . import report as rep
from ..compiler.engines import INT8_ACTIVATIONS_TAG

#: Marks the profiler ranges whose ATen ops are not "between graphs".
_RANGE = "torchburn.explain:"

#: Profiler events counted as ops run in PyTorch between graphs: ATen ops, and torch.distributed's
#: collectives (FSDP2's all-gathers and reduce-scatters run between the graphs of its modules).
_EAGER_PREFIXES = ("aten::", "c10d::")

#: A gloss for Dynamo's terser reasons.
_GLOSS = {"generic_jump": "a Python branch (`if`/`while`) on a tensor's value"}

INT8_NOTE = ("numerics: x is quantized to int8 per group (byte dot products), so results differ from "
             "eager's f32 activations (about 0.6% relative, docs/quantization.md); "
             "TORCHBURN_QLINEAR_ACTIVATIONS=f32 keeps f32 activations")


@dataclass
class GraphBreak:
    """Where Dynamo split the function: its reason and the user's source line."""

    reason: str
    #: `file:line` of the user's code (the innermost frame outside torch and torchburn).
    location: str
    #: The text of that line.
    source: str = ""

    def __str__(self) -> str:
        code = f" `{self.source}`" if self.source else ""
        return f"{self.location}{code}: {self.reason}"


@dataclass
class ExplainReport:
    """The graphs compiled for one call, as data (`graphs`) and as text (`str(report)`)."""

    graphs: list[rep.GraphReport]
    graph_breaks: list[GraphBreak] = field(default_factory=list)
    #: Dynamo graphs handed to the backend (graph breaks split a function into several).
    dynamo_graphs: int = 0
    #: ATen op -> calls that ran in PyTorch between Dynamo's graphs; None when not counted
    #: (a profiler was already running).
    eager_ops: Optional[dict[str, int]] = None
    #: The Dynamo graph (1-based) each entry of `graphs` belongs to.
    graph_index: list[int] = field(default_factory=list)
    #: The code of each Dynamo graph handed to the backend (`GraphModule.print_readable`).
    fx_graphs: list[str] = field(default_factory=list)
    #: Compiled subgraphs found compiled (memory, disk or FX-graph cache) / compiled now:
    #: counted from `graphs`, so the header cannot disagree with the body.
    cache_hits: int = field(init=False, default=0)
    cache_misses: int = field(init=False, default=0)

    def __post_init__(self) -> None:
        compiled = self.compiled_subgraphs
        self.cache_hits = sum(s.cache_hit for s in compiled)
        self.cache_misses = len(compiled) - self.cache_hits

    @property
    def fallback_ops(self) -> list[str]:
        """Ops that ran in PyTorch inside the compiled graphs."""
        return [op for g in self.graphs for op in g.fallback_ops]

    @property
    def internal_errors(self) -> list[rep.SubgraphReport]:
        """Subgraphs left to PyTorch by a compiler bug (not by a missing lowering)."""
        return [s for g in self.graphs for s in g.internal_errors]

    @property
    def compiled_subgraphs(self) -> list[rep.SubgraphReport]:
        return [s for g in self.graphs for s in g.subgraphs if s.compiled]

    @property
    def eager_op_count(self) -> int:
        return sum((self.eager_ops or {}).values())

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def _header(self) -> str:
        between = ("not counted (a profiler was running)" if self.eager_ops is None
                   else f"{self.eager_op_count}")
        breaks = f" ({len(self.graph_breaks)} graph break(s))" if self.graph_breaks else ""
        return (f"torchburn explain: {self.dynamo_graphs or len(self.graphs)} Dynamo graph(s){breaks}, "
                f"{len(self.graphs)} ATen graph(s), {len(self.compiled_subgraphs)} compiled subgraph(s); "
                f"op(s) in PyTorch: {len(self.fallback_ops)} inside graphs, {between} between graphs; "
                f"cache {self.cache_hits} hit(s), {self.cache_misses} miss(es)")

    def __str__(self) -> str:
        lines = [self._header()]
        errors = self.internal_errors
        if errors:  # a compiler bug: first and loud, not one reason among the fallbacks
            lines.append(f"!! {len(errors)} INTERNAL COMPILER ERROR(S): a torchburn bug, not a missing "
                         f"lowering; {sum(len(s.ops) for s in errors)} op(s) ran in PyTorch because of it "
                         f"(TORCHBURN_STRICT=1 raises it; please report it)")
            for s in errors:
                lines.append(f"!!   {s.name}: {s.internal_error}" + (f" (at {s.error_where})" if s.error_where else ""))
        if self.graph_breaks:
            lines.append("graph breaks (Dynamo ends a graph there; the code at the break runs in PyTorch):")
            lines.extend(f"  {b}" for b in self.graph_breaks)
        if self.eager_ops:
            ops = ", ".join(f"{op} x{n}" for op, n in sorted(self.eager_ops.items()))
            lines.append(f"ran in PyTorch between graphs: {ops}")
        many = (self.dynamo_graphs or 1) > 1
        for i, g in enumerate(self.graphs):
            index = self.graph_index[i] if i < len(self.graph_index) else 0
            lines.append(f"[graph {index}: {g.kind}]" if many and index else f"[{g.kind} graph]")
            lines.extend(_graph_lines(g))
        return "\n".join(lines)


def _graph_lines(g: rep.GraphReport) -> list[str]:
    lines = []
    for s in g.subgraphs:
        if s.compiled:
            status = "cache hit" if s.cache_hit else "compiled " + ", ".join(
                f"{k} {v * 1e3:.1f} ms" for k, v in s.timings.items())
            lines.append(f"  {s.name}: {len(s.ops)} ops -> {len(s.kernels)} kernel(s) on {s.engine} ({status})")
            if s.engine_note:
                lines.append(f"    note: {s.engine_note}")
            if s.transfers is not None:
                lines.append(f"    {s.transfers.line()}")
            if s.kept:
                lines.append(f"    {s.kept}")
            if any(INT8_ACTIVATIONS_TAG in k for k in s.kernels):
                lines.append(f"    {INT8_NOTE}")
            for k in s.kernels:
                lines.append(f"    {k}")
        elif s.internal_error is not None:
            lines.append(f"  {s.name}: {len(s.ops)} ops run in PyTorch after an INTERNAL COMPILER "
                         f"ERROR: {s.internal_error}")
        else:
            lines.append(f"  {s.name}: {len(s.ops)} ops run in PyTorch: {s.reason}")
    for op, why in g.fallbacks:
        lines.append(f"  fallback {op}: {why}")
    for op, why in g.library_calls:
        lines.append(f"  library call {op} (chosen by the tuner): {why}")
    if g.tuning:
        spent = f", {g.tuning_seconds:.2f} s" if g.tuning_seconds >= 0.005 else ""
        lines.append(f"  tuner ({len(g.tuning)} choice(s){spent}):")
        lines.extend(f"    {t}" for t in g.tuning)
    return lines


def explain(fn: Callable[..., Any], *args: Any, html: Optional[Union[str, "os.PathLike[str]"]] = None,
            **kwargs: Any) -> ExplainReport:
    """Compile `fn` with the torchburn backend, run it once on `args`, and report.

    Dynamo's caches are reset first so that the report covers a full compilation.
    ``html``: also write the report as an HTML page there (`explain_html.py`), with each
    Dynamo graph's FX code and each CPU kernel's time in the call (each kernel is then built a
    second time, alone, to be timed: compiling takes longer). ``html`` is explain's own
    keyword: it is not passed on to `fn`.
    """
    import torch
    from torch._dynamo import utils as dynamo_utils

    from .entry import torchburn_backend

    if html is not None:
        from .explain_html import require_jinja2

        require_jinja2()
    torch._dynamo.reset()
    records = rep.start_recording()
    graph_index: list[int] = []
    fx_graphs: list[str] = []
    dynamo_graphs = 0

    def backend(gm: torch.fx.GraphModule, example_inputs: Any) -> Callable[..., Any]:
        nonlocal dynamo_graphs
        dynamo_graphs += 1
        fx_graphs.append(_fx_code(gm))
        compiled = torchburn_backend(gm, example_inputs)
        graph_index.extend([dynamo_graphs] * (len(records) - len(graph_index)))

        def run(*a: Any) -> Any:
            with torch.profiler.record_function(_RANGE + " graph"):
                return compiled(*a)

        return run

    eager: Optional[Counter[str]] = None
    timers: list[Any] = []
    notes: list[str] = []
    try:
        with _count_eager_ops() as eager, _timing_kernels(html is not None, timers, notes):
            torch.compile(fn, backend=backend)(*args, **kwargs)
    finally:
        rep.stop_recording()
    graph_index.extend([dynamo_graphs] * (len(records) - len(graph_index)))
    reasons = list(getattr(dynamo_utils, "graph_break_reasons", []))
    report = ExplainReport(list(records), graph_breaks=_graph_breaks(reasons), dynamo_graphs=dynamo_graphs,
                           eager_ops=None if eager is None else dict(eager), graph_index=graph_index,
                           fx_graphs=fx_graphs)
    if html is not None:
        from . import explain_html

        explain_html.write(report, html, _kernel_times(report, timers, notes))
    return report


def _fx_code(gm: Any) -> str:
    """The graph as Python code with shapes (``print_readable``), else its node listing."""
    try:
        return str(gm.print_readable(print_output=False))
    except Exception:  # noqa: BLE001 - a graph that cannot print its code still lists its nodes
        return str(gm.graph)


@contextlib.contextmanager
def _timing_kernels(on: bool, timers: list[Any], notes: list[str]) -> Iterator[None]:
    """While on: each CPU launcher made gets a started `KernelTimer` (None in `timers` where
    one cannot be built, with a note why); all are stopped after the block."""
    if not on:
        yield
        return
    from .kernel_timing import KernelTimer, capture_launchers

    def start(launcher: Any) -> None:
        try:
            timer = KernelTimer(launcher)
        except Exception as err:  # noqa: BLE001 - the report goes on without these times
            timers.append(None)
            notes.append(f"{launcher.name}: not timed ({err}).")
            return
        timer.start()
        timers.append(timer)

    try:
        with capture_launchers(start):
            yield
    finally:
        for t in timers:
            if t is not None:
                t.stop()


def _kernel_times(report: ExplainReport, timers: list[Any], notes: list[str]) -> Any:
    """The timers' seconds by (graph, subgraph): launchers are made in the order of the
    compiled CPU subgraphs; each pairing is checked by the kernel names on both sides."""
    from .explain_html import KernelTimes

    out = KernelTimes(notes=list(notes))
    pending = list(timers)
    for i, g in enumerate(report.graphs):
        for s in g.subgraphs:
            if not s.compiled or s.engine == "wgpu" or not pending:  # the others made a Launcher
                continue
            timer = pending.pop(0)
            if timer is None:
                continue
            names = [k.split(":", 1)[0] for k in s.kernels]
            if sorted(set(names)) != sorted({k.kernel for k in timer.kernels}):
                out.notes.append(f"{s.name}: its launcher could not be matched; not shown.")
                continue
            seconds: dict[str, float] = {}
            for k in timer.kernels:
                seconds[k.kernel] = seconds.get(k.kernel, 0.0) + k.seconds
            out.by_subgraph[(i, s.name)] = seconds
    if any(s.engine == "wgpu" for g in report.graphs for s in g.subgraphs if s.compiled):
        out.notes.append("GPU (wgpu) subgraphs are not timed per kernel.")
    return out


def _graph_breaks(reasons: list[Any]) -> list[GraphBreak]:
    """One `GraphBreak` per distinct (place, reason) Dynamo recorded."""
    out: list[GraphBreak] = []
    seen: set[tuple[str, str]] = set()
    for r in reasons:
        frame = _user_frame(list(getattr(r, "user_stack", []) or []))
        location = f"{frame.filename}:{frame.lineno}" if frame is not None else "<unknown>"
        text = _reason_text(str(getattr(r, "reason", r)))
        if (location, text) in seen:
            continue
        seen.add((location, text))
        out.append(GraphBreak(text, location, (frame.line or "").strip() if frame is not None else ""))
    return out


def _reason_text(reason: str) -> str:
    """Dynamo's reason: its first line and its explanation (the hints and the developer
    context are for Dynamo's developers)."""
    lines = [ln.strip() for ln in reason.strip().splitlines() if ln.strip()]
    if not lines:
        return "(no reason given)"
    head = lines[0]
    for key, gloss in _GLOSS.items():
        if head.startswith(key):
            head = f"{head} ({gloss})"
    explanation = next((ln.removeprefix("Explanation:").strip() for ln in lines[1:]
                        if ln.startswith("Explanation:")), "")
    return f"{head}: {explanation}" if explanation else head


def _user_frame(stack: list[Any]) -> Any:
    """The innermost frame outside torch and torchburn (the user's line), else the innermost."""
    import torch

    libraries = [os.path.dirname(os.path.realpath(m.__file__)) + os.sep
                 for m in (torch,) if getattr(m, "__file__", None)]
    libraries.append(os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep)
    for frame in reversed(stack):
        path = os.path.realpath(frame.filename)
        if not any(path.startswith(lib) for lib in libraries):
            return frame
    return stack[-1] if stack else None


@contextlib.contextmanager
def _count_eager_ops() -> Iterator[Optional[Counter[str]]]:
    """Count the top-level ATen ops run outside our graphs and outside Dynamo's compilation
    (both marked as profiler ranges), i.e. the ops that ran in PyTorch between graphs. Yields
    None, counting nothing, when a profiler is already running (profilers do not nest)."""
    import torch
    from torch._dynamo.callback import callback_handler

    if torch.autograd.profiler._is_profiler_enabled:
        yield None
        return
    ranges: list[Any] = []

    def start(_: Any) -> None:
        r = torch.profiler.record_function(_RANGE + " compiling")
        r.__enter__()
        ranges.append(r)

    def end(_: Any) -> None:
        if ranges:
            ranges.pop().__exit__(None, None, None)

    counts: Counter[str] = Counter()
    prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    callback_handler.register_start_callback(start)
    callback_handler.register_end_callback(end)
    try:
        with _quiet_stderr():  # the profiler logs its own start and stop there
            prof.start()
        try:
            yield counts
        finally:
            with _quiet_stderr():
                prof.stop()
    finally:
        callback_handler.remove_start_callback(start)
        callback_handler.remove_end_callback(end)
    for event in prof.events():
        if event.name.startswith(_EAGER_PREFIXES) and _outside_ranges(event):
            counts[event.name] += 1


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """Process-level stderr (file descriptor 2) to /dev/null for the block: the profiler's
    native code prints a line on start and on stop that is no business of the user's. Where
    descriptor 2 cannot be redirected, nothing is silenced."""
    import sys

    try:
        sys.stderr.flush()
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):
        yield
        return
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _outside_ranges(event: Any) -> bool:
    """A top-level ATen op (its parent is no ATen op) in none of explain's ranges."""
    parent = event.cpu_parent
    if parent is not None and parent.name.startswith("aten::"):
        return False
    while parent is not None:
        if parent.name.startswith(_RANGE):
            return False
        parent = parent.cpu_parent
    return True
