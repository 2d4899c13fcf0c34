"""Batch invariance of the server's scheduler on a real model: does a request get the same
greedy text alone and beside others?

Runs `Scheduler` (the engine behind `torchburn serve`) on the default model (SmolLM2-135M
Q4_1) or `--model`: N prompts one at a time, then the same N submitted together (one batched
prefill, then N-row decode steps), then the same N arriving in two waves (the second joining
beside running rows, other slots and starts). Prints how many texts are the same as alone,
and where the others part. `--forms fastest` runs without the invariant linears
(`TORCHBURN_QLINEAR_INVARIANT=0`) and the scheduler without its aligned prefill, as before
batch invariance: the difference is what the invariant mode buys.

    python benchmarks/check_batch_invariance.py [--model SOURCE] [--prompts 16] [--tokens 48]
        [--threads 1] [--forms invariant|fastest]

Not a timing: it prints counts (the texts are deterministic for a given model and machine).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

SUBJECTS = ["lighthouse keeper", "dragon", "robot", "baker", "pirate", "astronaut", "detective",
            "gardener", "wizard", "fisherman", "painter", "librarian", "knight", "inventor",
            "musician", "shepherd", "cat", "clockmaker", "sailor", "teacher"]


def _run(sched, llm, prompts: list[list[int]], tokens: int, waves: int):  # type: ignore[no-untyped-def]
    """The greedy texts of `prompts` submitted in `waves` waves (the next wave after the first
    one's prefill and two decode steps), driven turn by turn."""
    from torchburn.llm.runtime.sampling import SamplingParams
    from torchburn.llm.runtime.scheduler import Request, Text

    texts: dict[int, list[str]] = {i: [] for i in range(len(prompts))}

    def emit(i: int):  # type: ignore[no-untyped-def]
        return lambda event: texts[i].append(event.text) if isinstance(event, Text) else None

    size = -(-len(prompts) // waves)
    for w in range(waves):
        for i in range(w * size, min(len(prompts), (w + 1) * size)):
            sched.submit(Request(prompt_ids=prompts[i], max_tokens=tokens,
                                 params=SamplingParams(temperature=0.0), emit=emit(i)))
        for _ in range(3 if w + 1 < waves else 0):
            sched.step()
    while not sched.idle:
        sched.step()
    return ["".join(texts[i]) for i in range(len(prompts))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="a GGUF file, folder or Hub id (default: the default model)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--forms", choices=["invariant", "fastest"], default="invariant")
    args = ap.parse_args()
    if not 1 <= args.prompts <= len(SUBJECTS):
        ap.error(f"--prompts: 1 to {len(SUBJECTS)}")
    os.environ["TORCHBURN_QLINEAR_INVARIANT"] = "1" if args.forms == "invariant" else "0"

    import torch

    from torchburn.llm import LLM
    from torchburn.llm.runtime.scheduler import Scheduler

    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    llm = LLM.from_pretrained(args.model, device="cpu", threads=args.threads)
    llm.eos_ids = frozenset()     # every text runs its full length
    prompts = [llm.encode_prompt([{"role": "user", "content": f"Write a short story about a {s}."}])
               for s in SUBJECTS[:args.prompts]]
    invariant = args.forms == "invariant"
    make = lambda: Scheduler(llm, parallel=args.prompts, prefix_cache=0, invariant=invariant)  # noqa: E731
    warm = make()
    warm.warm_up()
    print(f"model {args.model or 'default'}, {args.prompts} prompts of {min(map(len, prompts))}-"
          f"{max(map(len, prompts))} tokens, {args.tokens} greedy tokens, {args.threads} thread(s), "
          f"forms {args.forms}; loaded and warmed up in {time.perf_counter() - t0:.0f} s", flush=True)
    alone = [_run(make(), llm, [p], args.tokens, 1)[0] for p in prompts]
    for name, waves in (("together", 1), ("two waves", 2)):
        got = _run(make(), llm, prompts, args.tokens, waves)
        same = sum(a == b for a, b in zip(alone, got))
        parts = [next((k for k, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
                 for a, b in zip(alone, got) if a != b]
        where = f"; the others part after {min(parts)}-{max(parts)} characters" if parts else ""
        print(f"{name}: {same} of {len(prompts)} texts the same as alone{where}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
