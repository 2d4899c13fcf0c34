"""CPU performance table: PyTorch eager, torch.compile(inductor) and torch.compile(torchburn).

    python benchmarks/bench_cpu.py                          # every row, table on stdout
    python benchmarks/bench_cpu.py --json out.json          # also write the figures as JSON
    python benchmarks/bench_cpu.py --cases softmax,layernorm --rounds 51
    python benchmarks/bench_cpu.py --no-compile-row         # skip the cold-compile child processes
    python benchmarks/bench_cpu.py --threads 1 --cpu-time   # one thread, timed by its CPU time

Rows (f32, inference under `torch.no_grad`):

- `gemm1024`, `gemm256`: `a @ b`, n x n x n
- `gelu`: `F.gelu(x)`, x 1024 x 1024
- `sdpa`: `F.scaled_dot_product_attention(q, k, v)`, B=4 H=8 T=128 D=64
- `linear_gelu`: `gelu(linear(x, W, b))`, x 128 x 512, W 1024 x 512
- `softmax`: `torch.softmax(x, -1)`, x 2048 x 2048
- `mlp`: the README MLP, `Linear(512,1024) -> GELU -> Linear(1024,256)`, batch 32
- `layernorm`: `F.layer_norm` with weight and bias, 4096 x 1024
- `gpt_b1`, `gpt_b8`: a GPT decoder block (d=512, 8 heads, SiLU-gated MLP of 1376, T=128) at
  batch 1 and 8 (`benchmarks/workloads.py`)
- `overhead`: per-call time of a cached tiny graph, `x + 1` on a 1-element tensor
- cold compile of the MLP: a fresh process with an empty disk cache
  (`benchmarks/bench_compile.py`), first call and TorchBurn's own share

All three contenders live in one process; each is checked against eager before it is timed,
warmed up, and timed in interleaved rounds, summarized by the median
(`benchmarks/common.py`). Ratios are other / torchburn: above 1.0 torchburn is faster.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import (add_plot_argument, compare, format_table, machine_info,  # noqa: E402
                               plot_panels, plot_path, speedup_panel, write_json)
from benchmarks.workloads import GptBlock, readme_mlp  # noqa: E402

CONTENDERS = ("eager", "inductor", "torchburn")


@dataclass
class Case:
    """One row: a function, its inputs, and how close the compiled results must be."""

    name: str
    what: str
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    tol: float = 1e-3


def _mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def _gelu(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


def _linear_gelu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b))


def _softmax(x: torch.Tensor) -> torch.Tensor:
    return torch.softmax(x, dim=-1)


def _layer_norm(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), w, b)


def _add_one(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def cases() -> dict[str, Case]:
    """Every row, with seeded inputs."""
    torch.manual_seed(0)
    out: dict[str, Case] = {}
    for n in (1024, 256):
        out[f"gemm{n}"] = Case(f"gemm{n}", f"a @ b, {n}^3", _mm, (torch.randn(n, n), torch.randn(n, n)))
    out["gelu"] = Case("gelu", "gelu(x), 1024x1024", _gelu, (torch.randn(1024, 1024),))
    qkv = tuple(torch.randn(4, 8, 128, 64) for _ in range(3))
    out["sdpa"] = Case("sdpa", "sdpa B=4 H=8 T=128 D=64", _sdpa, qkv)
    m, k, n = 128, 512, 1024
    out["linear_gelu"] = Case("linear_gelu", f"gelu(x W^T + b), {m}x{k} -> {n}", _linear_gelu,
                              (torch.randn(m, k), torch.randn(n, k) / k ** 0.5, torch.randn(n)))
    out["softmax"] = Case("softmax", "softmax(x, -1), 2048x2048", _softmax, (torch.randn(2048, 2048),))
    out["mlp"] = Case("mlp", "README MLP, batch 32", readme_mlp(), (torch.randn(32, 512),))
    out["layernorm"] = Case("layernorm", "layer_norm 4096x1024 (+w, b)", _layer_norm,
                            (torch.randn(4096, 1024), 1.0 + 0.1 * torch.randn(1024), 0.1 * torch.randn(1024)))
    block = GptBlock().eval()
    out["gpt_b1"] = Case("gpt_b1", "GPT block d=512 T=128, batch 1", block, (torch.randn(1, 128, 512),), 2e-3)
    out["gpt_b8"] = Case("gpt_b8", "GPT block d=512 T=128, batch 8", block, (torch.randn(8, 128, 512),), 2e-3)
    out["overhead"] = Case("overhead", "x + 1, 1 element (per-call overhead)", _add_one, (torch.randn(1),))
    return out


def contenders(case: Case, which: list[str]) -> dict[str, Callable[..., Any]]:
    """The eager function and its compiled versions, each compiled on its own."""
    fns: dict[str, Callable[..., Any]] = {}
    for name in which:
        if name == "eager":
            fns[name] = case.fn
        elif name == "inductor":
            fns[name] = torch.compile(case.fn, backend="inductor")
        elif name == "torchburn":
            # The backend itself rather than its name: works without `pip install` of torchburn.
            from torchburn.backend.entry import torchburn_backend

            fns[name] = torch.compile(case.fn, backend=torchburn_backend)
        else:
            raise SystemExit(f"unknown contender {name!r}; known: {', '.join(CONTENDERS)}")
    return fns


def run_case(case: Case, which: list[str], rounds: int, clock: Callable[[], float] = time.perf_counter) -> dict[str, Any]:
    """Check every contender against eager, then time them interleaved."""
    torch._dynamo.reset()
    with torch.no_grad():
        expected = case.fn(*case.args)
        fns = contenders(case, which)
        first_call_s: dict[str, float] = {}
        for name, fn in fns.items():
            t0 = time.perf_counter()
            got = fn(*case.args)
            first_call_s[name] = time.perf_counter() - t0
            torch.testing.assert_close(got, expected, rtol=case.tol, atol=case.tol)
        timings = compare(fns, case.args, rounds=rounds, clock=clock)
    return {"case": case.name, "what": case.what, "first_call_s": first_call_s, "timings": timings}


def cold_compile(runs: int) -> dict[str, Any]:
    """Cold compile of the README MLP: fresh processes, each with an empty disk cache."""
    from benchmarks.bench_compile import run_child

    results = []
    for _ in range(runs):
        with tempfile.TemporaryDirectory(prefix="torchburn-cold-") as d:
            results.append(run_child(Path(d), 32))
    return {
        "runs": results,
        "first_call_ms_median": statistics.median(float(r["first_call_ms"]) for r in results),
        "ours_ms_median": statistics.median(float(r["ours_ms"]) for r in results),
    }


def _fmt_time(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def table(results: list[dict[str, Any]], which: list[str]) -> str:
    headers = ["case"] + list(which)
    ratio_of = [w for w in which if w != "torchburn"] if "torchburn" in which else []
    headers += [f"{w}/torchburn" for w in ratio_of]
    rows = []
    for r in results:
        t = r["timings"]
        row: list[Any] = [r["case"]] + [_fmt_time(t[w].median_s) for w in which]
        row += [f"{t[w].median_s / t['torchburn'].median_s:.2f}x" for w in ratio_of]
        rows.append(row)
    return format_table(headers, rows)


def main(argv: list[str] | None = None) -> int:
    all_names = list(cases())
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", default=",".join(all_names), help="comma-separated rows to run")
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--rounds", type=int, default=31, help="interleaved timing rounds per row")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    parser.add_argument("--compile-runs", type=int, default=3, help="fresh processes for the cold-compile row")
    parser.add_argument("--no-compile-row", action="store_true", help="skip the cold-compile row")
    parser.add_argument("--json", default="", help="write the results to this file")
    add_plot_argument(parser)
    parser.add_argument("--disk-cache", action="store_true",
                        help="use TorchBurn's on-disk compile cache (off by default: its key does not "
                             "see changes to the compiler's own code)")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time by this thread's CPU time (needs --threads 1; on a loaded machine "
                             "it leaves out the time other processes held the core)")
    args = parser.parse_args(argv)
    if args.cpu_time and args.threads != 1:
        parser.error("--cpu-time needs --threads 1 (other threads' CPU time would not be counted)")
    if args.cpu_time:
        os.environ["TORCHBURN_NUM_THREADS"] = "1"
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
        results.append(run_case(all_cases[name], which, args.rounds,
                                time.thread_time if args.cpu_time else time.perf_counter))
        print(f"  done {name}", file=sys.stderr, flush=True)
    compile_row = None if args.no_compile_row else cold_compile(args.compile_runs)

    info = machine_info()
    print(f"# {info['cpu']}, {info['torch_threads']} threads, torch {info['torch']}, "
          f"load {info['loadavg_1m']:.2f}; median of {args.rounds} interleaved rounds"
          + (", thread CPU time" if args.cpu_time else ""))
    print(table(results, which))
    if compile_row is not None:
        print(f"cold compile of the README MLP (fresh process, empty cache, median of {args.compile_runs}): "
              f"first call {compile_row['first_call_ms_median']:.1f} ms, "
              f"torchburn's own share {compile_row['ours_ms_median']:.1f} ms")
    write_json(args.json, {"machine": info, "rounds": args.rounds, "results": results,
                           "cold_compile_mlp": compile_row})
    rows = [(r["case"], {w: r["timings"][w].median_s for w in which}) for r in results]
    plotted = plot_panels(plot_path(args.json, args.plot),
                          f"bench_cpu.py: {info['cpu']}, {info['torch_threads']} threads, load "
                          f"{info['loadavg_1m']:.1f}, median of {args.rounds} rounds",
                          [speedup_panel("steady-state call", rows, which)])
    if plotted:
        print(f"plot: {plotted}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
