"""The server's scheduler in-process, without HTTP: what a burst of requests waits for its
first token, and what one stream decodes beside other Python work.

    python benchmarks/bench_scheduler.py burst --clients 16 --rounds 2
    python benchmarks/bench_scheduler.py side-work --work-us 300 --rounds 4

`burst`: `--clients` requests (bench_serve.py's four prompts in turn, as chat messages) are
submitted `--gap-ms` apart to a warmed-up `Scheduler` running in its own thread, as a server's
HTTP side submits them; per round, every request's time to first token (p50 and max) and the
turns the scheduler took, with what each did (waiting requests, running rows, prefill jobs).
The first round starts with an empty prefix cache; later rounds find the prompts there.

`side-work`: one stream of `--tokens` greedy tokens while another thread does `--work-us` of
pure-Python work after each token (what a server's HTTP thread does to send it): tokens/s
and the team sizes the thread governor chose (`llm/runtime/thread_governor.py`).

Both run on the default model (SmolLM2-135M-Instruct Q4_1) with the server's batch-invariant
linears, `--threads` threads; no answer ends before its `--tokens`.
"""
from __future__ import annotations

import argparse
import collections
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.bench_serve import PROMPTS  # noqa: E402


def _load(threads: int, parallel: int) -> tuple[Any, Any]:
    os.environ.setdefault("TORCHBURN_QLINEAR_INVARIANT", "1")   # as `torchburn serve`
    from torchburn.runtime.config import reload_config

    reload_config()
    from torchburn.llm import LLM
    from torchburn.llm.model.source import default_model
    from torchburn.llm.runtime.scheduler import Scheduler

    llm = LLM.from_pretrained(default_model(), max_context=1024, threads=threads)
    llm.eos_ids = frozenset()     # every answer runs its full length: tokens/s counts them all
    s = Scheduler(llm, parallel=parallel, prefix_cache=4)
    s.warm_up()
    return llm, s


def burst(args: argparse.Namespace) -> None:
    from torchburn.llm.runtime.sampling import SamplingParams
    from torchburn.llm.runtime.scheduler import Request

    llm, s = _load(args.threads, args.parallel)
    turns: list[tuple[float, float, int, int, int]] = []
    real_step = s.step

    def step() -> None:
        t0 = time.perf_counter()
        seen = (len(s.waiting), len(s.running), len(s._jobs))
        real_step()
        turns.append((t0, time.perf_counter() - t0, *seen))

    s.step = step  # type: ignore[method-assign]
    s.start()
    try:
        for r in range(args.rounds):
            turns.clear()
            first: dict[int, float] = {}
            sent: dict[int, float] = {}
            left = [args.clients]
            done = threading.Event()

            def emit_for(i: int) -> Any:
                def emit(event: Any) -> None:
                    first.setdefault(i, time.perf_counter())
                    if type(event).__name__ == "Finish":
                        left[0] -= 1
                        if not left[0]:
                            done.set()
                return emit

            t0 = time.perf_counter()
            for i in range(args.clients):
                ids = llm.encode_prompt([{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}])
                sent[i] = time.perf_counter()
                s.submit(Request(prompt_ids=ids, max_tokens=args.tokens, params=SamplingParams(temperature=0.0),
                                 emit=emit_for(i)))
                time.sleep(args.gap_ms / 1e3)
            done.wait()
            ttft = sorted(1e3 * (first[i] - sent[i]) for i in range(args.clients))
            print(f"round {r}: time to first token p50 {ttft[len(ttft) // 2]:.0f} ms, max {ttft[-1]:.0f} ms")
            for at, took, waiting, running, jobs in turns[:args.show_turns]:
                print(f"  turn at {1e3 * (at - t0):7.1f} ms, {1e3 * took:6.1f} ms: {waiting} waiting, "
                      f"{running} running, {jobs} prefill jobs")
    finally:
        s.stop()


def side_work(args: argparse.Namespace) -> None:
    from torchburn.llm.runtime.sampling import SamplingParams
    from torchburn.llm.runtime.scheduler import Request

    llm, s = _load(args.threads, args.parallel)
    sizes: collections.Counter[int] = collections.Counter()
    if llm.governor is not None:
        apply = llm.governor._apply

        def counted(n: int) -> None:
            sizes[n] += 1
            apply(n)

        llm.governor._apply = counted
    token = threading.Event()
    stop = threading.Event()

    def other_work() -> None:       # Python work after each token, holding the GIL as HTTP code does
        while not stop.is_set():
            if token.wait(0.1):
                token.clear()
                end = time.perf_counter() + args.work_us / 1e6
                while time.perf_counter() < end:
                    pass

    threading.Thread(target=other_work, daemon=True).start()
    s.start()
    ids = llm.encode_prompt([{"role": "user", "content": PROMPTS[0]}])
    try:
        for r in range(args.rounds):
            sizes.clear()
            done = threading.Event()

            def emit(event: Any) -> None:
                token.set()
                if type(event).__name__ == "Finish":
                    done.set()

            t0 = time.perf_counter()
            s.submit(Request(prompt_ids=list(ids), max_tokens=args.tokens, params=SamplingParams(temperature=0.0),
                             emit=emit))
            done.wait()
            rate = args.tokens / (time.perf_counter() - t0)
            print(f"round {r}: {rate:.1f} tok/s, steps per team size {dict(sorted(sizes.items()))}")
    finally:
        stop.set()
        s.stop()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=("burst", "side-work"))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--parallel", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--clients", type=int, default=16, help="burst: requests submitted")
    p.add_argument("--gap-ms", type=float, default=2.0, help="burst: between two submissions")
    p.add_argument("--show-turns", type=int, default=8, help="burst: scheduler turns printed per round")
    p.add_argument("--work-us", type=float, default=300.0, help="side-work: Python work per token")
    p.add_argument("--tokens", type=int, default=None, help="tokens per request (burst 32, side-work 128)")
    args = p.parse_args(argv)
    if args.rounds < 1 or args.clients < 1 or args.threads < 1 or args.parallel < 1:
        p.error("--rounds, --clients, --threads and --parallel must be at least 1")
    if args.tokens is None:
        args.tokens = 32 if args.mode == "burst" else 128
    (burst if args.mode == "burst" else side_work)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
