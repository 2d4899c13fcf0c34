"""Decode speed on a busy machine: the CPU engine's adaptive thread count
(`llm/runtime/thread_governor.py`) against the configured count held fixed.

    python benchmarks/bench_busy_threads.py [--model SOURCE] [--threads 2] [--tokens 128]
        [--rounds 4] [--busy N]

Alternates, round by round, one greedy generation with the governor (`TORCHBURN_ADAPTIVE_THREADS=1`,
the default) and one with the configured count fixed (`llm.governor = None`), each from a fresh
governor. `--busy N` starts N busy-looping processes for the run (a machine whose cores other
work uses); without it the machine's own load is what it is. Prints tok/s of each, the ratio
adaptive/fixed per round, the medians, and the load average.
"""
from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _spin(stop: "mp.synchronize.Event") -> None:  # type: ignore[name-defined]
    while not stop.is_set():
        sum(range(10000))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="GGUF file, folder or Hub id (default: the default model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--busy", type=int, default=0, help="busy-looping processes to start beside")
    args = ap.parse_args()

    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams
    from torchburn.llm.runtime.thread_governor import ThreadGovernor
    from torchburn.runtime.threads import set_num_threads

    llm = LLM.from_pretrained(args.model, device="cpu", threads=args.threads)
    llm.eos_ids = frozenset()
    ids = llm.encode_prompt([{"role": "user", "content": "Write a short story about a dragon."}])
    greedy = SamplingParams(temperature=0.0)
    list(llm.stream_ids(ids, 4, greedy, None, None))           # compile / load the steps
    stop = mp.Event()
    spinners = [mp.Process(target=_spin, args=(stop,), daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    rates: dict[str, list[float]] = {"fixed": [], "adaptive": []}
    try:
        for rnd in range(args.rounds):
            for mode in ("fixed", "adaptive"):
                llm.governor = ThreadGovernor(args.threads) if mode == "adaptive" else None
                set_num_threads(args.threads)
                t0 = time.perf_counter()
                n = sum(1 for _ in llm.stream_ids(ids, args.tokens, greedy, None, None))
                rates[mode].append(n / (time.perf_counter() - t0))
            print(f"round {rnd}: fixed {rates['fixed'][-1]:.1f} tok/s, adaptive {rates['adaptive'][-1]:.1f} "
                  f"({rates['adaptive'][-1] / rates['fixed'][-1]:.2f}x), load {os.getloadavg()[0]:.1f}", flush=True)
    finally:
        stop.set()
        for p in spinners:
            p.join(5)
    f, a = statistics.median(rates["fixed"]), statistics.median(rates["adaptive"])
    print(f"median: fixed {f:.1f} tok/s ({min(rates['fixed']):.1f}-{max(rates['fixed']):.1f}), adaptive {a:.1f} "
          f"({min(rates['adaptive']):.1f}-{max(rates['adaptive']):.1f}): {a / f:.2f}x; {args.threads} threads, "
          f"{args.busy} busy processes, load {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
