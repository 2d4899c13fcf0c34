"""Loading real-sized GGUF files: load time, resident memory and decode speed.

    python tools/make_gguf_models.py --out /work/models          # the files (random weights)
    python benchmarks/bench_gguf_load.py /work/models/*-q4_k_m.gguf --threads 1 [--json PATH]

Per file, each measurement a fresh process, after one unreported process that compiles the
steps into the disk cache (a compile is not a load, and its memory is the compiler's):

* ``first``: the file's pages dropped from the page cache (``posix_fadvise(DONTNEED)``, this
  file only) and its weight cache entry deleted: the load converts what it must, writes the
  entry and maps the model back from it (compiled programs may be cached: a compile is not a
  load);
* ``warm`` (``--warm`` runs): page cache and weight cache hot.

Each process reports: seconds of `LLM.from_pretrained` (wall and CPU), RSS (``VmRSS``, with
its anonymous part) just before the load and after it, the peak (``VmHWM``) during the load
and, reset after it, during a decode of ``--tokens`` tokens after a short prompt; the decode's tokens/s (steps after the first, which holds the prefill);
the file's size and the KV cache's (``max_context`` slots, mapped lazily: only written slots
become resident). The bound checked is llama.cpp's: peak minus RSS before the load within
file size + KV cache + 15%.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, re, sys, time
from pathlib import Path

def status():
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(k + r":\s+(\d+) kB", text).group(1)) * 1024
            for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}

path, threads, tokens, max_context = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
import torch
from torchburn.llm import LLM
from torchburn.llm.runtime.sampling import SamplingParams
from torchburn.llm.model import weight_cache as wc
Path("/proc/self/clear_refs").write_text("5")   # reset VmHWM
before = status()
t0, c0 = time.perf_counter(), time.process_time()
llm = LLM.from_pretrained(path, device="cpu", threads=threads, max_context=max_context)
load_s, load_cpu = time.perf_counter() - t0, time.process_time() - c0
loaded = status()
Path("/proc/self/clear_refs").write_text("5")   # the decode's own peak from here
ids = llm.encode_prompt("Write a short story about a lighthouse keeper.")
times = []
t = time.perf_counter()
got = 0
for step in llm.generate_ids([ids], tokens + 1, SamplingParams(temperature=0.0)):
    now = time.perf_counter()
    times.append(now - t)
    t = now
    got += step[0] is not None
ran = status()
cache = llm.model.new_cache(1, llm.max_context)
kv = cache.tensor.numel() * cache.tensor.element_size()
decode = times[1:]
print(json.dumps({"load_s": load_s, "load_cpu_s": load_cpu, "before": before, "loaded": loaded, "ran": ran,
                  "load_peak": loaded["VmHWM"],
                  "first_step_s": times[0], "decode_tok_s": len(decode) / sum(decode) if decode else 0.0,
                  "tokens": got, "kv_bytes": kv, "hits": wc.STATS.hits, "stores": wc.STATS.stores}))
"""


def evict(path: Path) -> None:
    """Drop ``path``'s pages from the page cache (those no process maps)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def drop_weight_entry(path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    from torchburn.llm.model import weight_cache as wc

    where = wc.cache_path(wc.source_key(path, None))
    if where is not None:
        where.unlink(missing_ok=True)


def measure(path: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS=str(args.threads))
    done = subprocess.run([sys.executable, "-c", CHILD, str(path), str(args.threads), str(args.tokens),
                           str(args.max_context)], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{path.name}: the measuring process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def row(name: str, kind: str, size: int, r: dict[str, Any]) -> str:
    mb = 1e6
    before, loaded, ran = r["before"], r["loaded"], r["ran"]
    peak = ran["VmHWM"] - before["VmRSS"]
    bound = 1.15 * (size + r["kv_bytes"])
    return (f"| {name} | {kind} | {size / mb:.0f} | {r['load_s']:.2f} ({r['load_cpu_s']:.2f}) | "
            f"{before['VmRSS'] / mb:.0f} | {r['load_peak'] / mb:.0f} | "
            f"{loaded['VmRSS'] / mb:.0f} ({loaded['RssAnon'] / mb:.0f}) | "
            f"{ran['VmHWM'] / mb:.0f} | {peak / mb:.0f} / {bound / mb:.0f} | {r['decode_tok_s']:.2f} |")


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--max-context", type=int, default=4096)
    ap.add_argument("--warm", type=int, default=2, help="warm runs per file")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')}, load {os.getloadavg()[0]:.1f}, --threads {args.threads}, "
          f"--tokens {args.tokens}, --max-context {args.max_context}")
    print("| file | run | MB | load s (CPU s) | RSS before | peak loading | after load (anon) | peak decoding "
          "| decoding peak - before / bound | decode tok/s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    out = []
    for path in args.files:
        size = path.stat().st_size
        measure(path, args)  # compiles the prefill and decode steps (kept in the disk cache)
        drop_weight_entry(path)
        evict(path)
        runs = [("first", measure(path, args))]
        print(row(path.name, "first", size, runs[0][1]), flush=True)
        for i in range(args.warm):
            runs.append(("warm", measure(path, args)))
            print(row(path.name, "warm", size, runs[-1][1]), flush=True)
        out.append({"file": str(path), "size": size, "runs": runs, "load": os.getloadavg()[0]})
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
