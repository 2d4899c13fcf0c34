"""`torchburn tune`: measure the kernel choices of a model's compiled steps once, ahead of use.

Compiling with `TORCHBURN_TUNE=search` measures each tunable kernel's candidates on its real
shapes (`runtime/tuner.py`: quantized linears' forms, convolutions' library calls) within a
budget per compiled graph, and stores the results in the disk cache, where every later process
(in `search` or `cached` mode) applies them without measuring. An ordinary run does the same
within the default budget (`TORCHBURN_TUNE_BUDGET`, 30 s); this command gives the search the
time it needs for every shape of a model's prefill and decode steps, and prints what it chose:

    torchburn tune --model llama-3.2-1b-q4_k_m.gguf --prompt-tokens 512 --budget 120
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any


def tune_model(llm: Any, prompt_tokens: int) -> None:
    """Compile (and so tune) the prefill of `prompt_tokens` tokens and the decode step."""
    from ..runtime.sampling import SamplingParams

    vocab = llm.config.vocab_size
    prompt = [(100 + i * 7919) % vocab for i in range(prompt_tokens)]
    for _ in llm.generate_ids([prompt], 2, SamplingParams(temperature=0.0)):
        pass


def cmd_tune(args: argparse.Namespace, load: Any) -> int:
    """The command: search mode with `--budget` seconds per graph, then the choices."""
    from ...backend import report as rep
    from ...runtime.config import get_config, reload_config

    if args.budget <= 0:
        print(f"error: --budget must be positive seconds, got {args.budget}", file=sys.stderr)
        return 2
    os.environ["TORCHBURN_TUNE"] = "search"
    os.environ["TORCHBURN_TUNE_BUDGET"] = str(args.budget)
    reload_config()
    if get_config().cache_dir is None:
        print("torchburn tune: the disk cache is off (TORCHBURN_CACHE_DIR=off): the choices last only "
              "for this process", file=sys.stderr)
    records = rep.start_recording()
    t0 = time.perf_counter()
    try:
        llm = load(args)
        tune_model(llm, args.prompt_tokens)
    finally:
        rep.stop_recording()
    lines: list[str] = []
    seen: set[str] = set()
    for r in records:
        for line in r.tuning:
            workload = line.split(": ", 1)[0]  # a later graph's reuse of a record is the same choice
            if workload not in seen:
                seen.add(workload)
                lines.append(line)
    spent = sum(r.tuning_seconds or 0.0 for r in records)
    cached = sum(1 for r in records if r.graph_cache_hit)
    print(f"{len(lines)} kernel choices ({spent:.1f} s measuring, {time.perf_counter() - t0:.1f} s in all):")
    if cached:
        print(f"  ({cached} of {len(records)} graphs came from the graph cache: their choices are the ones "
              "made when they were compiled)")
    for line in lines:
        print(f"  {line}")
    if not records:
        print("  (the model's compiled steps came from the disk cache: nothing was compiled, so nothing was "
              "measured; their choices are the ones made when they were compiled. To measure again, run "
              "with an empty TORCHBURN_CACHE_DIR)")
    elif not lines:
        print("  (no tunable kernel with static shapes: nothing to measure)")
    return 0
