"""GEMM benchmark: eager (MKL), inductor and torchburn on matrix products and linear layers.

    python benchmarks/bench_gemm.py                      # all cases, table on stdout
    python benchmarks/bench_gemm.py --json out.json      # also write the figures as JSON
    python benchmarks/bench_gemm.py --cases gemm256,mlp --rounds 51

Cases (f32, inference, `torch.no_grad`):

- `gemm1024`: `a @ b`, 1024 x 1024 x 1024
- `gemm256`:  `a @ b`, 256 x 256 x 256
- `linear_gelu`: `gelu(linear(x, W, b))`, x 128 x 512, W 1024 x 512 (bias and GELU fused)
- `mlp`: `Linear(512, 1024) -> GELU -> Linear(1024, 256)`, batch 32

Every contender is checked against eager before it is timed; timings are medians of
interleaved rounds after warm-up (`benchmarks/common.py`). GFLOP/s count the products'
multiply-adds only (2 M N K).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import compare, format_table, machine_info, write_json


@dataclass
class Case:
    name: str
    what: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    flops: float


def cases() -> dict[str, Case]:
    torch.manual_seed(0)
    out: dict[str, Case] = {}

    def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a @ b

    for n in (1024, 256):
        out[f"gemm{n}"] = Case(f"gemm{n}", f"a @ b, {n}^3", mm, (torch.randn(n, n), torch.randn(n, n)),
                               2.0 * n ** 3)

    def linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, w, b))

    m, k, n = 128, 512, 1024
    out["linear_gelu"] = Case("linear_gelu", f"gelu(x W^T + b), {m}x{k} -> {n}", linear_gelu,
                              (torch.randn(m, k), torch.randn(n, k) / k ** 0.5, torch.randn(n)), 2.0 * m * n * k)
    mlp = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    out["mlp"] = Case("mlp", "Linear(512,1024)-GELU-Linear(1024,256), batch 32", mlp, (torch.randn(32, 512),),
                      2.0 * 32 * (512 * 1024 + 1024 * 256))
    return out


def contenders(case: Case, which: list[str]) -> dict[str, Callable[..., Any]]:
    fns: dict[str, Callable[..., Any]] = {}
    for name in which:
        if name == "eager":
            fns[name] = case.fn
        elif name == "inductor":
            torch._dynamo.reset()
            fns[name] = torch.compile(case.fn)
        elif name == "torchburn":
            fns[name] = torch.compile(case.fn, backend="torchburn")
        else:
            raise SystemExit(f"unknown contender {name!r}")
    return fns


def run_case(case: Case, which: list[str], rounds: int) -> dict[str, Any]:
    with torch.no_grad():
        expected = case.fn(*case.args)
        fns = contenders(case, which)
        compile_s: dict[str, float] = {}
        for name, fn in fns.items():
            t0 = time.perf_counter()
            got = fn(*case.args)  # compile and check
            compile_s[name] = time.perf_counter() - t0
            torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-3)
        timings = compare(fns, case.args, rounds=rounds)
    return {"case": case.name, "what": case.what, "flops": case.flops, "first_call_s": compile_s,
            "timings": timings}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default="gemm1024,gemm256,linear_gelu,mlp")
    parser.add_argument("--contenders", default="eager,inductor,torchburn")
    parser.add_argument("--rounds", type=int, default=31, help="interleaved timing rounds per case")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    parser.add_argument("--json", default="", help="write the results to this file")
    parser.add_argument("--disk-cache", action="store_true",
                        help="use TorchBurn's on-disk compile cache (off by default: its key does not "
                             "see changes to the compiler's own code)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if not args.disk_cache:
        os.environ["TORCHBURN_CACHE_DIR"] = "off"
    import torchburn  # noqa: F401  (registers the backend)

    all_cases = cases()
    which = [c for c in args.contenders.split(",") if c]
    results = []
    for name in [c for c in args.cases.split(",") if c]:
        if name not in all_cases:
            raise SystemExit(f"unknown case {name!r}; known: {', '.join(all_cases)}")
        results.append(run_case(all_cases[name], which, args.rounds))

    headers = ["case"] + [f"{w} ms" for w in which] + [f"{w} GF/s" for w in which]
    if "eager" in which:
        headers += [f"{w}/eager" for w in which if w != "eager"]
    if "torchburn" in which and "inductor" in which:
        headers.append("torchburn/inductor")
    rows = []
    for r in results:
        t = r["timings"]
        row: list[Any] = [r["case"]]
        row += [f"{t[w].median_s * 1e3:.3f}" for w in which]
        row += [f"{r['flops'] / t[w].median_s / 1e9:.1f}" for w in which]
        if "eager" in which:
            # Speed relative to eager: > 1 is faster than eager.
            row += [f"{t['eager'].median_s / t[w].median_s:.2f}x" for w in which if w != "eager"]
        if "torchburn" in which and "inductor" in which:
            row.append(f"{t['inductor'].median_s / t['torchburn'].median_s:.2f}x")
        rows.append(row)
    info = machine_info()
    print(f"# {info['cpu']}, {info['torch_threads']} threads, torch {info['torch']}, "
          f"load {info['loadavg_1m']:.2f}; median of {args.rounds} interleaved rounds")
    print(format_table(headers, rows))
    write_json(args.json, {"machine": info, "rounds": args.rounds, "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
