"""`explain(..., html="report.html")`: the report as one self-contained HTML page (no script,
no outside file), rendered with jinja2 (autoescaped: graph text and reasons are shown, never
interpreted).

The page holds what the text report holds (graph breaks, ops in PyTorch between graphs and
inside graphs and why, each subgraph's kernels and compile times), plus each Dynamo graph's FX
code and, for the CPU engine, each kernel's time in the explained call (`kernel_timing.py`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, Union

if TYPE_CHECKING:
    from .explainer import ExplainReport

TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>torchburn explain</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 72em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; border-bottom: 1px solid #ccc; }
pre { background: #f6f6f6; padding: .6em; overflow-x: auto; font-size: .85em; }
table { border-collapse: collapse; margin: .4em 0; } td, th { border: 1px solid #ccc; padding: .2em .5em; }
th { background: #eee; text-align: left; } td.num { text-align: right; font-variant-numeric: tabular-nums; }
.error { color: #a00; font-weight: bold; } .fallback { color: #8a4b00; } .hit { color: #276; }
.bar { display: inline-block; height: .7em; background: #4a7bd0; }
summary { cursor: pointer; }
</style>
</head>
<body>
<h1>torchburn explain</h1>
<p id="summary">{{ header }}</p>
{% if errors %}
<h2>Internal compiler errors</h2>
<p class="error">A torchburn bug, not a missing lowering: these subgraphs ran in PyTorch
(TORCHBURN_STRICT=1 raises the error).</p>
<ul>{% for s in errors %}<li class="error">{{ s.name }}: {{ s.internal_error }}{% if s.error_where %} (at {{ s.error_where }}){% endif %}</li>{% endfor %}</ul>
{% endif %}
<h2>Graph breaks</h2>
{% if breaks %}
<table><tr><th>where</th><th>code</th><th>why Dynamo ended the graph</th></tr>
{% for b in breaks %}<tr><td>{{ b.location }}</td><td><code>{{ b.source }}</code></td><td>{{ b.reason }}</td></tr>{% endfor %}
</table>
{% else %}<p>None: Dynamo captured the function whole.</p>{% endif %}
<h2>Ops that ran in PyTorch between graphs</h2>
{% if eager_ops is none %}<p>Not counted (a profiler was running).</p>
{% elif eager_ops %}<table><tr><th>op</th><th>calls</th></tr>
{% for op, n in eager_ops %}<tr><td>{{ op }}</td><td class="num">{{ n }}</td></tr>{% endfor %}</table>
{% else %}<p>None.</p>{% endif %}
<h2>FX graphs (Dynamo's, as handed to the backend)</h2>
{% for code in fx_graphs %}
<details{% if loop.first %} open{% endif %}><summary>Dynamo graph {{ loop.index }}</summary><pre>{{ code }}</pre></details>
{% else %}<p>No graph was compiled.</p>{% endfor %}
{% for g in graphs %}
<h2>{{ g.title }}</h2>
{% if g.stages %}<p>Stages: {{ g.stages }}</p>{% endif %}
<table>
<tr><th>subgraph</th><th>ops</th><th>result</th><th>kernels</th><th>compile time</th></tr>
{% for s in g.subgraphs %}
<tr><td>{{ s.name }}</td><td class="num">{{ s.ops|length }}</td>
<td class="{{ s.css }}">{{ s.status }}</td><td class="num">{{ s.kernels|length }}</td><td>{{ s.timings }}</td></tr>
{% endfor %}
</table>
{% for s in g.subgraphs %}
<details{% if open_details %} open{% endif %}><summary>{{ s.name }}: {{ s.ops|length }} ops, {{ s.kernels|length }} kernel(s)</summary>
<p>ATen ops: <code>{{ s.ops|join(", ") }}</code></p>
{% if s.note %}<p>{{ s.note }}</p>{% endif %}
{% if s.kernels %}<table><tr><th>kernel: fused ops @ where they came from</th><th>time in the call</th><th></th></tr>
{% for k in s.kernels %}<tr><td><code>{{ k.text }}</code></td><td class="num">{{ k.time }}</td>
<td><span class="bar" style="width: {{ k.width }}px"></span></td></tr>{% endfor %}</table>{% endif %}
{% if s.pass_times %}<p>Passes: {{ s.pass_times }}</p>{% endif %}
</details>
{% endfor %}
{% if g.fallbacks %}<h3>Ops left to PyTorch inside the graph</h3>
<table><tr><th>op</th><th>why</th></tr>
{% for op, why in g.fallbacks %}<tr><td class="fallback">{{ op }}</td><td>{{ why }}</td></tr>{% endfor %}</table>{% endif %}
{% endfor %}
<h2>Kernel times</h2>
<p>{{ timing_note }}</p>
{% if slowest %}<table><tr><th>kernel</th><th>subgraph</th><th>time in the call</th><th></th></tr>
{% for k in slowest %}<tr><td><code>{{ k.text }}</code></td><td>{{ k.subgraph }}</td><td class="num">{{ k.time }}</td>
<td><span class="bar" style="width: {{ k.width }}px"></span></td></tr>{% endfor %}</table>{% endif %}
</body>
</html>
"""


#: The slowest kernels listed together at the end; subgraphs shown unfolded up to this many.
SLOWEST = 20
OPEN_UP_TO = 4


@dataclass
class KernelTimes:
    """Per-kernel seconds of the explained call, by subgraph, where they could be measured."""

    #: (graph index, subgraph name) -> {kernel name: seconds}.
    by_subgraph: dict[tuple[int, str], dict[str, float]] = field(default_factory=dict)
    #: Why some or all kernels have no time (another engine, a timer that could not be built).
    notes: list[str] = field(default_factory=list)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f} ms"


def _subgraph_view(s: Any, times: Optional[dict[str, float]]) -> dict[str, Any]:
    if s.compiled:
        status = "cache hit" if s.cache_hit else "compiled"
        css = "hit" if s.cache_hit else ""
    elif s.internal_error is not None:
        status, css = f"ran in PyTorch after an INTERNAL COMPILER ERROR: {s.internal_error}", "error"
    else:
        status, css = f"ran in PyTorch: {s.reason}", "fallback"
    longest = max(times.values(), default=0.0) if times else 0.0
    kernels = []
    for text in s.kernels:
        name = text.split(":", 1)[0]
        t = times.get(name) if times else None
        kernels.append({"text": text, "time": _ms(t) if t is not None else "", "seconds": t,
                        "subgraph": s.name,
                        "width": int(200 * t / longest) if t is not None and longest > 0 else 0})
    notes = [n for n in (s.engine_note, s.transfers.line() if s.transfers is not None else None) if n]
    return {"name": s.name, "ops": s.ops, "status": f"{status} on {s.engine}" if s.compiled else status,
            "css": css, "kernels": kernels, "note": "; ".join(notes),
            "timings": "from the cache" if s.cache_hit else ", ".join(f"{k} {_ms(v)}" for k, v in s.timings.items()),
            "pass_times": ", ".join(f"{k} {_ms(v)}" for k, v in s.pass_times)}


def require_jinja2() -> Any:
    """The jinja2 module, or an ImportError that says how to get it (checked before compiling)."""
    try:
        import jinja2
    except ImportError:
        raise ImportError("explain(..., html=...) renders with jinja2: "
                          "pip install jinja2 (it is in torchburn's llm extra)") from None
    return jinja2


def render(report: "ExplainReport", times: Optional[KernelTimes] = None) -> str:
    """The page's text."""
    jinja2 = require_jinja2()
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    many = (report.dynamo_graphs or 1) > 1
    graphs = []
    for i, g in enumerate(report.graphs):
        index = report.graph_index[i] if i < len(report.graph_index) else 0
        title = f"Graph {index}: {g.kind}" if many and index else f"The {g.kind} graph"
        subs = [_subgraph_view(s, (times.by_subgraph.get((i, s.name)) if times else None))
                for s in g.subgraphs]
        stages = ", ".join(f"{k} {_ms(v)}" for k, v in g.stages.items())
        graphs.append({"title": title, "subgraphs": subs, "fallbacks": g.fallbacks, "stages": stages})
    timed = [k for g in graphs for s in g["subgraphs"] for k in s["kernels"] if k["seconds"] is not None]
    slowest = sorted(timed, key=lambda k: -k["seconds"])[:SLOWEST]
    top = slowest[0]["seconds"] if slowest else 0.0
    slowest = [dict(k, width=int(200 * k["seconds"] / top) if top > 0 else 0) for k in slowest]
    if times is None:
        timing_note = "Not measured."
    else:
        timing_note = (f"{len(timed)} kernel(s) timed one by one in the explained call (the first, cold: "
                       f"first touch of memory included; each time includes ~2 us of its ctypes call)."
                       + (" " + " ".join(times.notes) if times.notes else ""))
    return env.from_string(TEMPLATE).render(
        header=report._header(), errors=report.internal_errors, breaks=report.graph_breaks,
        eager_ops=None if report.eager_ops is None else sorted(report.eager_ops.items()),
        fx_graphs=report.fx_graphs, graphs=graphs, timing_note=timing_note, slowest=slowest,
        open_details=sum(len(g["subgraphs"]) for g in graphs) <= OPEN_UP_TO)


def write(report: "ExplainReport", path: Union[str, "os.PathLike[str]"],
          times: Optional[KernelTimes] = None) -> Path:
    """Write the page to ``path``; a folder that cannot be written is a clear error."""
    out = Path(path)
    text = render(report, times)
    try:
        out.write_text(text, encoding="utf-8")
    except OSError as e:
        raise OSError(f"explain(..., html={str(path)!r}): cannot write the report: {e}") from None
    return out


__all__ = ["KernelTimes", "render", "write"]
