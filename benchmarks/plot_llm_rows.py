"""One figure of `torchburn benchmark` rows: tokens/s per file, ours beside llama.cpp and ik_llama.cpp.

`python -m torchburn.llm benchmark --model FILE --peers --json ROW.json` writes one file's
llama-bench rows (pp512, tg128; each engine's tokens/s per repeat). This draws several such
runs as one PNG, a panel per test, a group of bars per file (mean tokens/s; the spread over
repeats is in the JSON and the table beside the plot):

    python benchmarks/plot_llm_rows.py ROW.json [ROW.json ...] --plot docs/img/llm_rows.png

It also prints the rows as a Markdown table with each test's ratio to the faster peer.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import Panel, plot_panels  # noqa: E402

OURS = "torchburn"


def _engine(name: str) -> str:
    """``torchburn cpu`` -> ``torchburn`` (one colour for ours whatever the device)."""
    return OURS if name.startswith(OURS) else name


def _label(run: dict[str, Any]) -> str:
    """The file's name, without the layer count, with the quantization where it is not the file's."""
    name = str(run["model"]).split(" (")[0]
    quant = run.get("quant", "as stored")
    return name if quant == "as stored" else f"{name}, {quant}"


def load_rows(paths: list[str]) -> tuple[list[str], dict[str, dict[str, dict[str, list[float]]]]]:
    """(file labels in order, test -> engine -> label -> tokens/s per repeat)."""
    labels: list[str] = []
    tests: dict[str, dict[str, dict[str, list[float]]]] = {}
    for path in paths:
        run = json.loads(Path(path).read_text())
        label = _label(run)
        labels.append(label)
        for r in run["results"]:
            tests.setdefault(r["test"], {})
            tests[r["test"]].setdefault(_engine(r["engine"]), {})[label] = list(r["tokens_per_s"])
    return labels, tests


def table(labels: list[str], tests: dict[str, dict[str, dict[str, list[float]]]]) -> str:
    """Markdown: per file and test, each engine's mean +- std and ours over the faster peer."""
    engines = sorted({e for t in tests.values() for e in t}, key=lambda e: (e != OURS, e))
    lines = ["| file | test | " + " | ".join(engines) + " | ours / faster peer |",
             "|---|---|" + "---:|" * (len(engines) + 1)]
    for label in labels:
        for test, by_engine in tests.items():
            cells, means = [], {}
            for e in engines:
                values = by_engine.get(e, {}).get(label)
                if not values:
                    cells.append("-")
                    continue
                means[e] = statistics.fmean(values)
                spread = statistics.stdev(values) if len(values) > 1 else 0.0
                cells.append(f"{means[e]:.2f} +- {spread:.2f}")
            peers = [v for e, v in means.items() if e != OURS]
            ratio = f"{means[OURS] / max(peers):.2f}x" if OURS in means and peers else "-"
            lines.append(f"| {label} | {test} | " + " | ".join(cells) + f" | {ratio} |")
    return "\n".join(lines)


def panels(labels: list[str], tests: dict[str, dict[str, dict[str, list[float]]]]) -> list[Panel]:
    out = []
    for test, by_engine in tests.items():
        engines = sorted(by_engine, key=lambda e: (e != OURS, e))
        series: dict[str, list[Optional[float]]] = {
            e: [statistics.fmean(v) if (v := by_engine[e].get(label)) else None for label in labels]
            for e in engines}
        out.append(Panel(title=test, groups=labels, series=series, xlabel="tokens/s (higher is better)",
                         log=True))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("rows", nargs="+", help="JSON files written by `torchburn benchmark --json`")
    p.add_argument("--plot", default=None, help="PNG to draw (default: no plot, the table only)")
    p.add_argument("--title", default="torchburn benchmark: tokens/s per file (2 threads)")
    args = p.parse_args()
    labels, tests = load_rows(args.rows)
    print(table(labels, tests))
    drawn = plot_panels(args.plot, args.title, panels(labels, tests))
    if drawn:
        print(f"plot: {drawn}")


if __name__ == "__main__":
    main()
