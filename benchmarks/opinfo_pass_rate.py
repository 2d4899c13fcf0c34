"""OpInfo forward pass rate of TorchBurn and of Inductor, measured by one procedure.

    python benchmarks/opinfo_pass_rate.py                     # both backends, float32, 2 samples/op
    python benchmarks/opinfo_pass_rate.py --samples 1 --summary docs/opinfo_vs_inductor.json

Every OpInfo of `op_db` that supports the dtype on CPU is run on its first `--samples`
samples through `tests/opinfo_harness.py` (see its docstring for the procedure: one graph per
sample, same seeds, OpInfo tolerances). An op passes when all of its samples pass; for
TorchBurn a sample passes only when nothing outside `NOT_COMPILED` ran in PyTorch, while
Inductor, which has no such report, passes whenever its result is right. Ops run in worker
processes (`--workers`), so a crash costs one op, not the run.
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _ops(dtype: Any, only: str = "") -> list[Any]:
    from tests.opinfo_harness import op_database, op_name

    wanted = set(filter(None, only.split(",")))
    return [op for op in op_database() if op.supports_dtype(dtype, "cpu")
            and (not wanted or op_name(op) in wanted or op.name in wanted)]


def _worker(args: argparse.Namespace) -> None:
    """Run shard `k/n` of the ops, appending one JSON line per sample to `args.out`."""
    import torch

    from tests.opinfo_harness import op_name, run_op

    dtype = getattr(torch, args.dtype)
    k, n = (int(x) for x in args.shard.split("/"))
    done = _done_ops(Path(args.out))
    with open(args.out, "a") as f:
        for i, op in enumerate(_ops(dtype, args.only)):
            if i % n != k or op_name(op) in done:
                continue
            f.write(json.dumps({"start": op_name(op)}) + "\n")
            f.flush()
            for r in run_op(op, dtype, args.samples, args.backend):
                f.write(json.dumps(r.as_dict()) + "\n")
            f.write(json.dumps({"end": op_name(op)}) + "\n")
            f.flush()


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _done_ops(path: Path) -> set[str]:
    """Ops finished or crashed (started in a worker that died) in a shard file."""
    done: set[str] = set()
    for rec in _read(path):
        if "end" in rec:
            done.add(rec["end"])
        elif "start" in rec:
            done.add(rec["start"])  # if it never ends, the worker crashed on it
    return done


def run_backend(backend: str, dtype: str, samples: int, workers: int, workdir: Path,
                only: str = "") -> list[dict[str, Any]]:
    """Results of every sample (dicts of `SampleResult`) of every op supporting `dtype`, run in
    `workers` processes; a worker that crashes is restarted after the op it crashed on."""
    args = argparse.Namespace(backend=backend, dtype=dtype, samples=samples, workers=workers, only=only)
    workdir.mkdir(parents=True, exist_ok=True)
    files = [workdir / f"{backend}-{dtype}-{k}.jsonl" for k in range(args.workers)]
    for f in files:
        f.unlink(missing_ok=True)
    env = dict(os.environ, TORCHINDUCTOR_COMPILE_THREADS="1", OMP_NUM_THREADS="1",
               PYTHONWARNINGS="ignore")
    procs: dict[int, subprocess.Popen[bytes]] = {}

    def start(k: int) -> None:
        cmd = [sys.executable, __file__, "--worker", "--backend", backend, "--dtype", args.dtype,
               "--samples", str(args.samples), "--only", args.only,
               "--shard", f"{k}/{args.workers}", "--out", str(files[k])]
        procs[k] = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    for k in range(args.workers):
        start(k)
    while procs:
        time.sleep(1.0)
        for k, p in list(procs.items()):
            rc = p.poll()
            if rc is None:
                continue
            del procs[k]
            if rc != 0:
                recs = _read(files[k])
                last = next((r["start"] for r in reversed(recs) if "start" in r), None)
                ended = any(r.get("end") == last for r in recs)
                if last is not None and not ended:
                    with open(files[k], "a") as f:
                        f.write(json.dumps({"op": last, "dtype": args.dtype, "index": -1, "status": "error",
                                            "detail": f"worker crashed (exit {rc})", "fallbacks": [],
                                            "seconds": 0.0}) + "\n")
                        f.write(json.dumps({"end": last}) + "\n")
                start(k)
    results = [r for f in files for r in _read(f) if "status" in r]
    return sorted(results, key=lambda r: (r["op"], r["index"]))


def summarize(results: list[dict[str, Any]]) -> dict[str, Any]:
    passing = ("pass", "expected_fallback")
    by_op: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in results:
        by_op[r["op"]].append(r)
    ops_passed = sorted(op for op, rs in by_op.items() if all(r["status"] in passing for r in rs))
    samples_passed = sum(r["status"] in passing for r in results)
    return {
        "ops": len(by_op), "ops_passed": len(ops_passed),
        "op_rate": len(ops_passed) / max(len(by_op), 1),
        "samples": len(results), "samples_passed": samples_passed,
        "sample_rate": samples_passed / max(len(results), 1),
        "statuses": dict(collections.Counter(r["status"] for r in results)),
        "failing_ops": sorted(set(by_op) - set(ops_passed)),
    }


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="both", choices=["torchburn", "inductor", "both"])
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--samples", type=int, default=2, help="samples per op (the first N)")
    ap.add_argument("--workers", type=int, default=max(1, min(4, os.cpu_count() or 1)))
    ap.add_argument("--json", help="write per-sample results and the summary here")
    ap.add_argument("--summary", help="write the summaries alone here (docs/opinfo_vs_inductor.json, "
                    "which tools/gen_ops_coverage.py shows on docs/ops_coverage.md)")
    ap.add_argument("--workdir", default=str(Path(tempfile.gettempdir()) / "torchburn_opinfo"))
    ap.add_argument("--only", default="", help="comma-separated OpInfo names (debugging)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--shard", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        _worker(args)
        return 0
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    backends = ["torchburn", "inductor"] if args.backend == "both" else [args.backend]
    report: dict[str, Any] = {"dtype": args.dtype, "samples_per_op": args.samples}
    for backend in backends:
        t0 = time.time()
        results = run_backend(backend, args.dtype, args.samples, args.workers, workdir, args.only)
        summary = summarize(results)
        summary["seconds"] = round(time.time() - t0, 1)
        report[backend] = {"summary": summary, "results": results}
        print(f"{backend:10s} ops {summary['ops_passed']}/{summary['ops']} = {summary['op_rate']:.1%}   "
              f"samples {summary['samples_passed']}/{summary['samples']} = {summary['sample_rate']:.1%}   "
              f"{summary['statuses']}   ({summary['seconds']} s)", flush=True)
    if len(backends) == 2:
        ours, theirs = (set(report[b]["summary"]["failing_ops"]) for b in backends)
        print(f"fail only with torchburn ({len(ours - theirs)}): {', '.join(sorted(ours - theirs))}")
        print(f"fail only with inductor ({len(theirs - ours)}): {', '.join(sorted(theirs - ours))}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1, sort_keys=True) + "\n")
    if args.summary:
        import torch

        slim = {"torch": torch.__version__, "dtype": args.dtype, "samples_per_op": args.samples,
                **{b: {k: v for k, v in report[b]["summary"].items() if k != "seconds"} for b in backends}}
        Path(args.summary).write_text(json.dumps(slim, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
