"""Cold and warm compile time of the README MLP, each in a fresh process.

    python benchmarks/bench_compile.py [--batch 32] [--runs 3] [--cache-dir DIR] [--json]

Run 1 starts with an empty disk cache (cold: passes, codegen and LLVM run); the following runs
find the program in the disk cache (warm: parse the stored program, load its object code).
Every run is a new Python process, so nothing is shared in memory.

Reported per run:
- first call: `compiled(x)`'s first call, everything included (Dynamo tracing, AOTAutograd,
  our backend, the run itself);
- ours: the time spent in torchburn's own code, `import torchburn` plus our backend's work on
  each graph (partition, import to IR, cache look-up, passes, codegen, LLVM, loading, launcher),
  Dynamo and AOTAutograd excluded;
- the stages of ours, as `driver.compile_graph` records them.

The target is a warm `ours` under 50 ms.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(batch: int) -> dict[str, object]:
    """One measurement, in this (fresh) process."""
    t0 = time.perf_counter()
    import torch
    # What torch.compile itself imports (Dynamo, AOTAutograd): torch's cost, not ours.
    import torch._dynamo  # noqa: F401
    from torch._dynamo.backends.common import aot_autograd  # noqa: F401
    from functorch.compile import make_boxed_func  # noqa: F401

    t1 = time.perf_counter()
    import torchburn
    import torchburn.backend  # what torch.compile(backend="torchburn") imports
    from torchburn import driver
    from torchburn import report as rep

    t2 = time.perf_counter()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    x = torch.randn(batch, 512)
    records = rep.start_recording()
    # The backend itself rather than its name: works without `pip install` of torchburn.
    compiled = torch.compile(model, backend=torchburn.backend.torchburn_backend)
    t3 = time.perf_counter()
    with torch.no_grad():
        y = compiled(x)
    t4 = time.perf_counter()
    rep.stop_recording()
    with torch.no_grad():
        torch.testing.assert_close(y, model(x), rtol=1e-4, atol=1e-4)
    backend = sum(r.import_seconds for r in records)
    stages: dict[str, float] = {}
    for r in records:
        for s in r.subgraphs:
            for k, v in s.timings.items():
                stages[k] = stages.get(k, 0.0) + v
    return {
        "import_torch_ms": (t1 - t0) * 1e3,
        "import_torchburn_ms": (t2 - t1) * 1e3,
        "first_call_ms": (t4 - t3) * 1e3,
        "backend_ms": backend * 1e3,
        "ours_ms": (t2 - t1 + backend) * 1e3,
        "stages_ms": {k: v * 1e3 for k, v in stages.items()},
        "compiled": driver.STATS.compiled,
        "disk_hits": driver.STATS.disk_hits,
        "torchburn": torchburn.__version__,
    }


def run_child(cache_dir: Path, batch: int) -> dict[str, object]:
    env = dict(os.environ, TORCHBURN_CACHE_DIR=str(cache_dir))
    env.pop("TORCHBURN_DUMP", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, __file__, "--child", "--batch", str(batch)], env=env,
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"benchmark process failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3, help="warm runs after the cold one")
    ap.add_argument("--cache-dir", help="disk cache folder to use (default: a new temporary one)")
    ap.add_argument("--json", action="store_true", help="print the raw measurements as JSON")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.batch)))
        return 0
    cache_dir = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="torchburn-bench-"))
    shutil.rmtree(cache_dir / "v1", ignore_errors=True)
    try:
        cold = run_child(cache_dir, args.batch)
        warm = [run_child(cache_dir, args.batch) for _ in range(args.runs)]
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    if args.json:
        print(json.dumps({"cold": cold, "warm": warm}, indent=2))
        return 0
    assert cold["compiled"] and not cold["disk_hits"], cold
    assert all(w["disk_hits"] and not w["compiled"] for w in warm), warm

    def row(name: str, r: dict[str, object]) -> str:
        stages = ", ".join(f"{k} {v:.1f}" for k, v in r["stages_ms"].items())  # type: ignore[union-attr]
        return (f"{name:<6} first call {r['first_call_ms']:8.1f} ms | ours {r['ours_ms']:7.1f} ms "
                f"(import torchburn {r['import_torchburn_ms']:.1f} + backend {r['backend_ms']:.1f}; {stages})")

    print(f"README MLP Linear(512,1024) -> GELU -> Linear(1024,256), batch {args.batch}, fresh process each")
    print(row("cold", cold))
    for w in warm:
        print(row("warm", w))
    med = statistics.median(float(w["ours_ms"]) for w in warm)  # type: ignore[arg-type]
    first = statistics.median(float(w["first_call_ms"]) for w in warm)  # type: ignore[arg-type]
    print(f"warm median: ours {med:.1f} ms (target < 50 ms), first call {first:.1f} ms; "
          f"cold: ours {cold['ours_ms']:.1f} ms, first call {cold['first_call_ms']:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
