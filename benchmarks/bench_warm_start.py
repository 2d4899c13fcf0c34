"""Process start to first token of the LLM engine, cold once and then warm, each a new process.

    python benchmarks/bench_warm_start.py [--runs 5] [--model PATH] [--threads 1] [--no-pyc]
                                          [--cache-dir DIR] [--profile DIR] [--json PATH]

Run 1 uses an empty `TORCHBURN_CACHE_DIR` (a fresh temporary folder unless `--cache-dir` names
one that already holds entries, then the cold run is skipped): Dynamo, AOTAutograd and the
compiler run, and the step cache, the program files and the weight cache are written. Runs
2.. are warm: new processes that find all of it on disk. Every run is

    python -m torchburn.llm generate PROMPT --tokens 1 --stream [--model ...] [--threads ...]

in a subprocess (the CLI a user runs), timed from just before the `Popen` to
- first token: the first byte the process writes to stdout (the token, streamed), and
- exit: the process gone (teardown included);
with its CPU time (user + system, all its threads) from `resource.getrusage(RUSAGE_CHILDREN)`
around it. On a shared machine CPU time says more than wall time about our own work: the
1-minute load average is printed before and after.

An installed package imports from bytecode caches; this checkout is imported from source, and
the development environment sets `PYTHONDONTWRITEBYTECODE=1` (every module compiled on every
import: ~0.5 s of CPU of a warm start here). So by default the processes share bytecode in
`<cache folder>/../pyc` (`PYTHONPYCACHEPREFIX`; the cold run writes it), as a user's would;
`--no-pyc` keeps the environment as it is.

`--profile DIR` adds one more warm process run under `python -X importtime -m cProfile`,
writing `importtime.txt` and `profile.pstats` there and printing the top of both (where a warm
start goes: imports, tokenizer, weights, program load, the first step).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Optional, Sequence

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Run:
    """One process: seconds to its first stdout byte and to its exit, and its CPU seconds."""

    kind: str
    first_token_s: float
    exit_s: float
    cpu_s: float
    max_rss_mb: float
    output: str


def _cpu_children() -> tuple[float, float]:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime, r.ru_maxrss / 1024.0


def command(args: argparse.Namespace, python: Sequence[str] = (sys.executable,)) -> list[str]:
    cmd = [*python, "-m", "torchburn.llm", "generate", args.prompt, "--tokens", "1", "--stream"]
    if args.model:
        cmd += ["--model", args.model]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    return cmd


def environment(cache_dir: Path, pyc: bool = True) -> dict[str, str]:
    env = dict(os.environ)
    env["TORCHBURN_CACHE_DIR"] = str(cache_dir)
    if pyc:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(cache_dir.parent / "pyc")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_once(kind: str, cmd: list[str], env: dict[str, str]) -> Run:
    """Time one process (see the module docstring)."""
    cpu0, _ = _cpu_children()
    t0 = time.perf_counter()
    # unbuffered: the byte read here must not take more of the output into a buffer that
    # communicate() then never sees
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            bufsize=0)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    t_first = time.perf_counter() - t0
    rest, err = proc.communicate()
    t_exit = time.perf_counter() - t0
    cpu1, rss = _cpu_children()
    if proc.returncode != 0:
        raise SystemExit(f"{kind} run failed ({proc.returncode}):\n{err.decode(errors='replace')[-3000:]}")
    if not first:
        t_first = t_exit
    return Run(kind, t_first, t_exit, cpu1 - cpu0, rss, (first + rest).decode(errors="replace").strip())


def summary(runs: list[Run]) -> dict[str, float]:
    def stats(values: list[float], name: str) -> dict[str, float]:
        return {f"{name}_median": statistics.median(values), f"{name}_min": min(values),
                f"{name}_max": max(values)}

    out: dict[str, float] = {"runs": len(runs)}
    for name in ("first_token_s", "exit_s", "cpu_s"):
        out.update(stats([getattr(r, name) for r in runs], name))
    return out


def profile(args: argparse.Namespace, env: dict[str, str], folder: Path) -> None:
    """One warm process under -X importtime and cProfile; prints the top of both."""
    import pstats

    folder.mkdir(parents=True, exist_ok=True)
    stats_path = folder / "profile.pstats"
    cmd = command(args, (sys.executable, "-X", "importtime", "-m", "cProfile", "-o", str(stats_path)))
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    (folder / "importtime.txt").write_text(proc.stderr)
    if proc.returncode != 0:
        raise SystemExit(f"profiled run failed:\n{proc.stderr[-3000:]}")
    rows = []
    for line in proc.stderr.splitlines():
        parts = line.split("|")
        if len(parts) == 3 and parts[0].startswith("import time:") and parts[1].strip().isdigit():
            rows.append((int(parts[1]), parts[2].rstrip()))
    print("\nslowest imports (cumulative us, -X importtime):")
    for us, name in sorted(rows, reverse=True)[:25]:
        print(f"  {us / 1e3:9.1f} ms {name}")
    print(f"\ncProfile of the warm process (cumulative, {stats_path}):")
    pstats.Stats(str(stats_path)).sort_stats("cumulative").print_stats(40)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5, help="warm processes (default 5)")
    p.add_argument("--model", default=None, help="model (default: the engine's default GGUF)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--prompt", default="Hi")
    p.add_argument("--cache-dir", default=None,
                   help="cache folder to use (kept); when it already holds entries, no cold run")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="also profile one warm process, writing importtime.txt and profile.pstats")
    p.add_argument("--json", default=None, metavar="PATH")
    p.add_argument("--no-pyc", action="store_true",
                   help="keep the environment's bytecode setting (default: share bytecode caches)")
    args = p.parse_args(argv)

    temp = None
    if args.cache_dir:
        cache_dir = Path(args.cache_dir)
    else:
        temp = tempfile.mkdtemp(prefix="torchburn-warm-")
        cache_dir = Path(temp) / "cache"
    env = environment(cache_dir, not args.no_pyc)
    cmd = command(args)
    load_before = os.getloadavg()[0]
    print(f"command: {' '.join(cmd)}\nTORCHBURN_CACHE_DIR={cache_dir}\nload average (1 min) before: "
          f"{load_before:.2f}, {os.cpu_count()} CPUs")
    try:
        runs: list[Run] = []
        has_entries = cache_dir.is_dir() and any(cache_dir.rglob("*.tbc"))
        if not has_entries:
            runs.append(run_once("cold", cmd, env))
            print(_row(runs[-1]))
        for _ in range(args.runs):
            runs.append(run_once("warm", cmd, env))
            print(_row(runs[-1]))
        outputs = {r.output for r in runs}
        if len(outputs) != 1:
            print(f"WARNING: the runs printed different tokens: {sorted(outputs)}")
        warm = [r for r in runs if r.kind == "warm"]
        result = {"command": cmd, "load_before": load_before, "load_after": os.getloadavg()[0],
                  "cpus": os.cpu_count(), "runs": [asdict(r) for r in runs]}
        if warm:
            result["warm"] = summary(warm)
            s = result["warm"]
            print(f"warm x{len(warm)}: first token median {s['first_token_s_median']:.2f} s "
                  f"[{s['first_token_s_min']:.2f}, {s['first_token_s_max']:.2f}], exit median "
                  f"{s['exit_s_median']:.2f} s, CPU median {s['cpu_s_median']:.2f} s "
                  f"[{s['cpu_s_min']:.2f}, {s['cpu_s_max']:.2f}]")
        print(f"load average (1 min) after: {result['load_after']:.2f}")
        if args.profile:
            profile(args, env, Path(args.profile))
        if args.json:
            Path(args.json).write_text(json.dumps(result, indent=2))
    finally:
        if temp is not None:
            shutil.rmtree(temp, ignore_errors=True)
    return 0


def _row(r: Run) -> str:
    return (f"{r.kind:5s} first token {r.first_token_s:7.2f} s  exit {r.exit_s:7.2f} s  "
            f"CPU {r.cpu_s:6.2f} s  max RSS (children so far) {r.max_rss_mb:6.0f} MB  -> {r.output!r}")


if __name__ == "__main__":
    raise SystemExit(main())
