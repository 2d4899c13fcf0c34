"""CPU time of the engine's compiled batched decode step (what `torchburn serve` runs per token
for its running requests) at B rows, one thread.

    python benchmarks/bench_batched_step.py --batches 1,4,8,16 --filled 64

Loads the default model (or `--model`), compiles the decode step for each batch size (the
server's buckets) and times `--steps` steps at `--filled` cached slots per row (the same
position each step): the median and quartiles of the calling thread's CPU time, so a shared
machine's load shows less than in wall time. The tuner is off by default (`--tune search` to
let it choose the quantized linears' forms as a server's warm-up does): off, every kernel is
the compiler's own choice and two source trees compare kernel for kernel. Tokens per CPU
second at B rows against one row is what bounds "16 clients >= 4x one client"
(docs/benchmarks.md, "Serving"). `--prefill 64,256` also times one-row prefill chunks of
those tokens (a row's CPU ms per token in the third column); run it with
TORCHBURN_QLINEAR_INVARIANT=1 and =0 to see what the server's batch-invariant quantized
linears cost (docs/benchmarks.md, "Batch-invariant quantized linears").
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="a GGUF file or model folder (default: the default model)")
    p.add_argument("--batches", default="1,4,8,16")
    p.add_argument("--filled", type=int, default=64, help="cached slots per row")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--tune", choices=("off", "cached", "search"), default="off")
    p.add_argument("--prefill", default="", help="also one-row prefill chunks of these tokens (e.g. 64,256)")
    args = p.parse_args(argv)
    os.environ["TORCHBURN_THREADS"] = "1"
    os.environ["TORCHBURN_TUNE"] = args.tune
    import torch

    from torchburn.llm.runtime.engine import LLM

    torch.set_num_threads(1)
    llm = LLM.from_pretrained(args.model, threads=1)
    one_row = None
    print("| rows | step CPU ms, median (q1-q3) | CPU ms a row | tokens per CPU s vs 1 row | compile s |")
    print("|---:|---|---:|---:|---:|")
    for b in (int(v) for v in args.batches.split(",")):
        t0 = time.perf_counter()
        cache = llm.cache_for(b)
        starts = torch.zeros(b, dtype=torch.long)
        ids = torch.full((b, 1), 100, dtype=torch.long)
        with torch.no_grad():
            llm.run_step(cache, ids, args.filled, starts)
            compile_s = time.perf_counter() - t0
            times = []
            for _ in range(args.steps):
                c0 = time.thread_time()
                llm.run_step(cache, ids, args.filled, starts)
                times.append(time.thread_time() - c0)
        times.sort()
        med = statistics.median(times)
        per_row = med / b
        one_row = per_row if b == 1 else one_row
        ratio = f"{one_row / per_row:.2f}x" if one_row else ""
        print(f"| {b} | {med * 1e3:.2f} ({times[len(times) // 4] * 1e3:.2f}-{times[3 * len(times) // 4] * 1e3:.2f}) | "
              f"{per_row * 1e3:.2f} | {ratio} | {compile_s:.0f} |", flush=True)
    for t in (int(v) for v in args.prefill.split(",") if v):
        cache = llm.cache_for(1)
        ids = torch.full((1, t), 100, dtype=torch.long)
        starts = torch.zeros(1, dtype=torch.long)
        with torch.no_grad():
            llm.run_step(cache, ids, 0, starts)
            times = []
            for _ in range(max(args.steps // 5, 3)):
                c0 = time.thread_time()
                llm.run_step(cache, ids, 0, starts)
                times.append(time.thread_time() - c0)
        llm.release_cache(cache)
        times.sort()
        med = statistics.median(times)
        print(f"| prefill {t} | {med * 1e3:.2f} ({times[len(times) // 4] * 1e3:.2f}-{times[3 * len(times) // 4] * 1e3:.2f}) | "
              f"{med / t * 1e3:.2f} | | |", flush=True)
    print(f"one thread, thread CPU time, {args.steps} steps at {args.filled} filled slots, tune {args.tune}, "
          f"TORCHBURN_QLINEAR_INVARIANT={os.environ.get('TORCHBURN_QLINEAR_INVARIANT', '0')}; "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
