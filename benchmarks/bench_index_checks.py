"""What checking indices costs (issue 28): an embedding-heavy graph, a gather-heavy graph and
the LLM decode step, timed in this process with this checkout's compiler.

    python benchmarks/bench_index_checks.py --json out.json

Run it once per checkout to compare (the checks are always on; compare a checkout before
them), alternating the two checkouts over a few rounds so background load hurts both alike:

    for r in 1 2 3; do
      PYTHONPATH=/path/before python benchmarks/bench_index_checks.py --json before_$r.json
      PYTHONPATH=$PWD python benchmarks/bench_index_checks.py --json after_$r.json
    done

Rows: `embedding` (F.embedding of [64, 512] ids into a [32000, 256] table, + 1), `gather`
(`x.gather(1, idx)` of a [256, 4096] float tensor by [256, 4096] indices, * 2) and `decode`
(one decode step of a random-weight Llama of 4 layers, hidden 512, vocabulary 32000,
after a 32-token prompt, greedy): the median wall time of a call, and the process's CPU time
per call (all threads). ``--threads`` (default 1: steadier on a shared machine).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F


def _timed(fn: Callable[[], Any], reps: int) -> tuple[float, float]:
    """(median wall seconds, mean CPU seconds) per call over `reps` calls after 3 warm-ups."""
    for _ in range(3):
        fn()
    walls = []
    cpu0 = time.process_time()
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), (time.process_time() - cpu0) / reps


def bench_kernels(reps: int) -> dict[str, tuple[float, float]]:
    from torchburn.backend import torchburn_backend

    g = torch.Generator().manual_seed(0)
    table = torch.randn(32000, 256, generator=g)
    ids = torch.randint(0, 32000, (64, 512), generator=g)
    emb = torch.compile(lambda i, w: F.embedding(i, w) + 1, backend=torchburn_backend, dynamic=False)
    x = torch.randn(256, 4096, generator=g)
    idx = torch.randint(0, 4096, (256, 4096), generator=g)
    gat = torch.compile(lambda a, i: a.gather(1, i) * 2, backend=torchburn_backend, dynamic=False)
    torch.testing.assert_close(emb(ids, table), F.embedding(ids, table) + 1)
    torch.testing.assert_close(gat(x, idx), x.gather(1, idx) * 2)
    return {"embedding": _timed(lambda: emb(ids, table), reps), "gather": _timed(lambda: gat(x, idx), reps)}


def bench_decode(tokens: int, threads: int) -> tuple[float, float]:
    import transformers

    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32000, hidden_size=512, intermediate_size=1408,
                                   num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                                   max_position_embeddings=512)
    folder = Path(tempfile.mkdtemp(prefix="bench_index_checks_"))
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder, safe_serialization=True)
    from tokenizers import Tokenizer, models

    Tokenizer(models.WordLevel({"<unk>": 0}, unk_token="<unk>")).save(str(folder / "tokenizer.json"))
    llm = LLM.from_pretrained(folder, device="cpu", max_context=256, threads=threads)
    llm.eos_ids = frozenset()
    greedy = SamplingParams(temperature=0.0)
    prompt = [[(7 * k) % 32000 for k in range(1, 33)]]
    list(llm.generate_ids(prompt, 4, greedy))  # compiles prefill and decode
    steps = llm.generate_ids(prompt, tokens + 1, greedy)
    next(steps)  # the prefill
    walls = []
    cpu0 = time.process_time()
    for _ in range(tokens):
        t = time.perf_counter()
        next(steps)
        walls.append(time.perf_counter() - t)
    return statistics.median(walls), (time.process_time() - cpu0) / tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=50, help="timed calls of each kernel row")
    ap.add_argument("--tokens", type=int, default=64, help="timed decode steps")
    ap.add_argument("--threads", type=int, default=1, help="threads of our kernels and of PyTorch")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    os.environ["TORCHBURN_NUM_THREADS"] = str(args.threads)
    torch.set_num_threads(args.threads)
    rows = bench_kernels(args.reps)
    rows["decode"] = bench_decode(args.tokens, args.threads)
    for name, (wall, cpu) in rows.items():
        print(f"{name:10s} median {wall * 1e3:8.3f} ms   cpu/call {cpu * 1e3:8.3f} ms")
    if args.json:
        args.json.write_text(json.dumps({k: {"wall_s": w, "cpu_s": c} for k, (w, c) in rows.items()}))


if __name__ == "__main__":
    main()
