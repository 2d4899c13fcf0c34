"""Write `docs/ops_coverage.md`: every ATen op TorchBurn lowers, the dtypes it was seen compiled
in, and how the OpInfos exercising it fare; plus the ops left to PyTorch by design.

    python tools/gen_ops_coverage.py          # rewrite the page from the registry and the JSON
    python tools/gen_ops_coverage.py --run    # first rerun OpInfo (every op, every dtype below,
                                              # one sample) into docs/opinfo_results.json

The op list comes from the lowering registry (`frontend/registry.LOWERINGS`), so the page
can never list an op the code does not lower; `tests/test_docs_current.py` fails when the page
and the registry disagree. Dtypes and statuses come from `docs/opinfo_results.json`, which
only `--run` rewrites (about half an hour on two cores).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RESULTS = ROOT / "docs" / "opinfo_results.json"
#: Float32 pass rate of TorchBurn and Inductor on one sample (`benchmarks/opinfo_pass_rate.py --summary`).
VERSUS = ROOT / "docs" / "opinfo_vs_inductor.json"
PAGE = ROOT / "docs" / "ops_coverage.md"
#: The dtypes OpInfo runs in, in the order the page shows them.
DTYPES = ("float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool")
SHORT = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16", "int8": "i8",
         "int16": "i16", "int32": "i32", "int64": "i64", "uint8": "u8", "bool": "bool"}
PASSING = ("pass", "expected_fallback")


# ---- running OpInfo -----------------------------------------------------------------------------

def run_opinfo(workers: int, samples: int) -> dict[str, Any]:
    """Every op in every dtype of DTYPES it supports, `samples` samples each: for each
    (OpInfo, dtype), the worst status, the first problem, and the ATen ops compiled."""
    import tempfile

    import torch

    from benchmarks.opinfo_pass_rate import run_backend

    table: dict[str, dict[str, Any]] = collections.defaultdict(dict)
    for dtype in DTYPES:
        workdir = Path(tempfile.gettempdir()) / "torchburn_coverage"
        for r in run_backend("torchburn", dtype, samples, workers, workdir):
            entry = table[r["op"]].setdefault(dtype, {"status": "pass", "detail": "", "compiled": []})
            if r["status"] not in PASSING and entry["status"] in PASSING:
                entry["status"] = r["status"]
                entry["detail"] = (r["detail"] or "; ".join(r["fallbacks"]))[:160]
            entry["compiled"] = sorted(set(entry["compiled"]) | set(r.get("compiled_ops", [])))
        print(f"{dtype}: done", flush=True)
    return {"torch": torch.__version__, "samples_per_op": samples,
            "results": {op: dict(sorted(v.items())) for op, v in sorted(table.items())}}


def dump_results(results: dict[str, Any]) -> str:
    """The JSON with one line per OpInfo (readable diffs); `detail` and `compiled` only when
    they say something."""
    lines = ["{", f' "torch": {json.dumps(results["torch"])},',
             f' "samples_per_op": {json.dumps(results["samples_per_op"])},', ' "results": {']
    items = sorted(results["results"].items())
    for k, (op, by_dtype) in enumerate(items):
        slim = {d: {key: v for key, v in e.items() if v or key == "status"} for d, e in by_dtype.items()}
        sep = "," if k < len(items) - 1 else ""
        lines.append(f"  {json.dumps(op)}: {json.dumps(slim, sort_keys=True, separators=(',', ':'))}{sep}")
    return "\n".join(lines + [" }", "}"]) + "\n"


# ---- the page -------------------------------------------------------------------------------------

def _op_label(op: Any) -> str:
    return str(op) if hasattr(op, "_schema") else f"operator.{getattr(op, '__name__', op)}"


def lowered_ops() -> list[tuple[str, str]]:
    """(ATen op, lowering family) for every registered lowering, sorted by op."""
    from torchburn.frontend import lowerings  # noqa: F401  (registers lowerings)
    import torchburn.quant  # noqa: F401  (registers the quantized linears' lowering)
    from torchburn.frontend.registry import LOWERINGS

    rows = []
    for op, lw in LOWERINGS.items():
        if not _returns_tensor(op):
            continue
        module = getattr(lw.fn, "__module__", "")
        family = module.rsplit(".", 1)[-1] if ".lowerings." in module else module.split(".")[1]
        rows.append((_op_label(op), family))
    return sorted(rows)


def _returns_tensor(op: Any) -> bool:
    """Overloads on Python scalars (`aten.add.int`, `aten.acos.float`) come along when a
    lowering registers a whole op; they never reach a lowering, so the page leaves them out."""
    schema = getattr(op, "_schema", None)
    return schema is None or any("Tensor" in str(r.type) for r in schema.returns)


def _versus_inductor(versus: dict[str, Any]) -> list[str]:
    """The section comparing our OpInfo pass rate with Inductor's on the same sample."""
    if not versus:
        return []
    ours, theirs = versus["torchburn"], versus["inductor"]
    lines = [
        "", "## Against Inductor", "",
        f"Same procedure, same sample (torch {versus['torch']}, {versus['dtype']}, the first "
        f"{versus['samples_per_op']} sample of each OpInfo), measured by "
        "`python benchmarks/opinfo_pass_rate.py --samples 1 --summary docs/opinfo_vs_inductor.json`. "
        "Inductor passes a sample when its result equals eager's; TorchBurn also needs nothing "
        "outside `NOT_COMPILED` to have run in PyTorch (a sample whose only fallbacks are in "
        "`NOT_COMPILED` counts as `expected_fallback`).", "",
        "| backend | OpInfos passing | statuses |", "|---|---|---|",
    ]
    for name, s in (("torchburn", ours), ("inductor", theirs)):
        statuses = ", ".join(f"{k} {v}" for k, v in sorted(s["statuses"].items()))
        lines.append(f"| {name} | {s['ops_passed']} / {s['ops']} ({s['op_rate']:.1%}) | {statuses} |")
    only_ours = sorted(set(ours["failing_ops"]) - set(theirs["failing_ops"]))
    only_theirs = sorted(set(theirs["failing_ops"]) - set(ours["failing_ops"]))
    lines += ["", f"Failing with TorchBurn only ({len(only_ours)}): {', '.join(only_ours) or 'none'}.", "",
              f"Failing with Inductor only ({len(only_theirs)}): {', '.join(only_theirs) or 'none'}."]
    random = [op for op in only_theirs if op.startswith(RANDOM_OPINFOS)]
    if random:
        lines += ["", f"Of these, {len(random)} ({', '.join(random)}) draw random numbers: Inductor's "
                  "generated code draws other numbers than eager's generator from the same seed (valid "
                  "samples, unequal values), where TorchBurn leaves the draw to PyTorch (`NOT_COMPILED`)."]
    return lines


#: OpInfo names of ops that draw random numbers.
RANDOM_OPINFOS = ("bernoulli", "cauchy", "exponential", "geometric", "log_normal", "normal",
                  "nn.functional.rrelu", "nn.functional.dropout", "rand", "multinomial", "uniform")


def render(results: dict[str, Any]) -> str:
    """The page, from the registry, NOT_COMPILED and the OpInfo results."""
    from torchburn.frontend.partition import NOT_COMPILED

    per_op = results.get("results", {})
    # ATen op -> dtypes where a passing sample compiled it; -> OpInfos (passing, all) using it.
    dtypes_seen: dict[str, set[str]] = collections.defaultdict(set)
    users: dict[str, set[str]] = collections.defaultdict(set)
    passing_users: dict[str, set[str]] = collections.defaultdict(set)
    for opinfo, by_dtype in per_op.items():
        for dtype, entry in by_dtype.items():
            for aten in entry.get("compiled", ()):
                users[aten].add(opinfo)
                if entry["status"] in PASSING:
                    dtypes_seen[aten].add(dtype)
                    passing_users[aten].add(opinfo)
    lowered = lowered_ops()
    lines = [
        "# ATen operator coverage",
        "",
        "<!-- Generated by `python tools/gen_ops_coverage.py`; do not edit by hand. -->",
        "",
        f"TorchBurn lowers **{len(lowered)}** ATen op overloads (the registry in "
        "`torchburn/frontend/registry.py`). Ops outside the registry run in PyTorch; "
        "`torchburn.explain()` lists them for a given model.",
        "",
        f"OpInfo results: torch {results.get('torch', '?')}, the first "
        f"{results.get('samples_per_op', '?')} sample(s) of each OpInfo, forward, CPU, by the procedure of "
        "`tests/opinfo_harness.py`. A sample passes when the result equals eager's and nothing "
        "outside `NOT_COMPILED` ran in PyTorch.",
        "",
        "| dtype | OpInfos passing |",
        "|---|---|",
    ]
    for dtype in DTYPES:
        entries = [v[dtype] for v in per_op.values() if dtype in v]
        if entries:
            ok = sum(e["status"] in PASSING for e in entries)
            lines.append(f"| {dtype} | {ok} / {len(entries)} ({ok / len(entries):.0%}) |")
    lines += _versus_inductor(json.loads(VERSUS.read_text()) if VERSUS.exists() else {})
    lines += [
        "",
        "## Lowered ops",
        "",
        "*dtypes*: where a passing OpInfo sample compiled the op. *OpInfos*: passing / all OpInfos "
        "whose compiled graphs contain it (any dtype).",
        "",
        "| ATen op | lowering | dtypes | OpInfos |",
        "|---|---|---|---|",
    ]
    for op, family in lowered:
        seen = " ".join(SHORT[d] for d in DTYPES if d in dtypes_seen.get(op, ()))
        n_all, n_ok = len(users.get(op, ())), len(passing_users.get(op, ()))
        status = f"{n_ok} / {n_all}" if n_all else "not exercised"
        lines.append(f"| `{op}` | {family} | {seen or '-'} | {status} |")
    lines += [
        "",
        "## Left to PyTorch by design",
        "",
        "`NOT_COMPILED` in `torchburn/frontend/partition.py`; tensors of other dtypes (complex, "
        "float8, quantized) and layouts (sparse) stay in PyTorch too. Results equal eager's.",
        "",
        "| ATen op | why |",
        "|---|---|",
    ]
    lines += [f"| `{op}` | {why} |" for op, why in sorted(NOT_COMPILED.items())]
    lines += [
        "",
        "## OpInfo results",
        "",
        "`pass`; `fallback*` (only ops left to PyTorch by design ran there); `graph_break` "
        "(Dynamo cannot capture the sample as one graph, whatever the backend); `fallback`, "
        "`mismatch`, `error` fail. Failures list their first problem below the table.",
        "",
        "| OpInfo | " + " | ".join(SHORT[d] for d in DTYPES) + " |",
        "|---|" + "---|" * len(DTYPES),
    ]
    word = {"pass": "pass", "expected_fallback": "fallback*"}
    failures = []
    for opinfo, by_dtype in per_op.items():
        cells = []
        for dtype in DTYPES:
            entry = by_dtype.get(dtype)
            cells.append("" if entry is None else word.get(entry["status"], f"**{entry['status']}**"))
            if entry is not None and entry["status"] not in PASSING + ("graph_break",):
                failures.append((opinfo, dtype, entry))
        lines.append(f"| {opinfo} | " + " | ".join(cells) + " |")
    lines += ["", "### Failures", ""]
    for opinfo, dtype, entry in failures:
        detail = entry.get("detail", "").replace("|", "\\|").replace("\n", " ")
        lines.append(f"- {opinfo} ({dtype}): {entry['status']}: {detail}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", action="store_true", help="rerun OpInfo into docs/opinfo_results.json first")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--samples", type=int, default=1)
    args = ap.parse_args(argv)
    if args.run:
        RESULTS.write_text(dump_results(run_opinfo(args.workers, args.samples)))
    results = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    PAGE.write_text(render(results))
    print(f"wrote {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
