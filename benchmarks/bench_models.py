"""The model suite (`tests/models/zoo.py`): eager vs torch.compile(inductor) vs torchburn.

    python benchmarks/bench_models.py                        # every model, forward and training
    python benchmarks/bench_models.py --models resnet18,mobilenetv3 --modes forward --rounds 11
    python benchmarks/bench_models.py --conv --json out.json # the convolutional models, figures as JSON

A full run compiles every model four times per mode (cold and warm, Inductor and ours):
expect minutes per model on a busy 2-core machine. Each row is printed as soon as it is
measured (`--rounds` defaults to 7), so an interrupted run still reports what it finished.

Per model and mode:
- `forward`: `eval()` under `torch.no_grad()`, the model's default input (batch 2; sequence
  16, no attention mask; images 32x32; 800 audio samples);
- `training`: `train()`, forward, `(out * w).sum().backward()` with gradients reset to None
  before each step (no optimizer step: weights stay fixed, so every call does the same work).

Each compiled contender is checked against eager first. Times are medians of interleaved
rounds (`benchmarks/common.py`), with the interquartile range as the spread; wall time, or
with `--clock cpu` the CPU time of the whole process (all threads), which a loaded machine
disturbs less (one thread: the time the step ran; more threads: OpenMP's spinning counts). Compile time:
`cold` is the first call after `torch._dynamo.reset()` with torchburn's caches empty
(memory; the disk cache is off unless `--disk-cache`) and Inductor's cache folder fresh
(`TORCHINDUCTOR_CACHE_DIR` is a new temporary folder for each cold compile, and Inductor's
in-memory caches are cleared; so are TorchBurn's kernel cache and tuning records); `ours` is torchburn's own share of it (every
graph's `import_seconds`, see `benchmarks/bench_compile.py`), split into passes, codegen (LLVM
IR), LLVM (optimization, object code) and the rest of ours (partition, import, loading);
`dynamo+aot` is the cold first call less ours (Dynamo's tracing, AOTAutograd's, and the first
run itself; the JSON also has each cold call's CPU seconds); `warm` is the first call after
another `torch._dynamo.reset()`, caches kept. Ratios are contender / eager (< 1 is faster).
"""
from __future__ import annotations

import argparse
import copy
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CONTENDERS = ("eager", "inductor", "torchburn")
MODES = ("forward", "training")
#: The models whose time goes to convolutions (`--conv`).
CONV_MODELS = ("resnet18", "mobilenetv3", "audio1d", "vit")


def _clear_compile_caches() -> None:
    """Fresh caches for a cold compile, for both compilers: Dynamo's, TorchBurn's program and
    kernel caches, and Inductor's in-memory code cache and its cache folder (a new one per
    cold compile: its FX-graph cache on disk would otherwise hand a later model the kernels
    of an earlier one with the same graphs, as Mistral's repeat the Llama's)."""
    import torch

    from torchburn.compiler.driver import memory_cache
    from torchburn.compiler.kernel_cache import kernel_cache
    from torchburn.runtime.tuner import records

    torch._dynamo.reset()
    memory_cache().clear()
    kernel_cache().clear()
    records().clear()  # a cold compile measures its tuning choices again
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-bench-models-")
    try:
        from torch._inductor.codecache import PyCodeCache

        PyCodeCache.cache_clear(purge=True)
    except Exception:  # noqa: BLE001 - a torch without it: Inductor's memory cache stays
        pass


def _step(model: Any, case: Any, kw: dict[str, Any], mode: str) -> Callable[[], Any]:
    import torch

    if mode == "forward":
        def forward() -> Any:
            with torch.no_grad():
                return case.pick(model(**kw))
        return forward
    params = [p for p in model.parameters() if p.requires_grad]
    proj: list[torch.Tensor] = []

    def training() -> Any:
        for p in params:
            p.grad = None
        out = case.pick(model(**kw))
        if not proj:
            proj.append(torch.randn(out.shape, generator=torch.Generator().manual_seed(7)))
        (out * proj[0]).sum().backward()
        return out
    return training


#: `--clock`: wall time, or the CPU time of the whole process (every thread's; on a loaded
#: machine it leaves out the time other processes held the cores, but counts OpenMP's spinning).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def run_model(name: str, mode: str, which: list[str], rounds: int, clock: str = "wall") -> dict[str, Any]:
    import torch

    from benchmarks.common import compare
    from tests.models import zoo
    from torchburn.backend import report as rep

    case = zoo.CASES[name]
    eager = zoo.build(name).train(mode == "training")
    batch, seq = case.shape
    kw = case.inputs(eager, batch, seq, False)
    fns: dict[str, Callable[[], Any]] = {}
    compile_s: dict[str, dict[str, float]] = {}
    expected = _step(copy.deepcopy(eager), case, kw, mode)()
    for who in which:
        model = copy.deepcopy(eager)
        if who == "eager":
            fns[who] = _step(model, case, kw, mode)
            continue
        backend = "inductor" if who == "inductor" else "torchburn"
        _clear_compile_caches()
        fn = _step(torch.compile(model, backend=backend), case, kw, mode)
        records = rep.start_recording()
        t0, c0 = time.perf_counter(), time.process_time()
        got = fn()
        cold, cold_cpu = time.perf_counter() - t0, time.process_time() - c0
        rep.stop_recording()
        ours = sum(r.import_seconds for r in records)
        torch.testing.assert_close(got, expected, rtol=1e-3, atol=1e-4)
        torch._dynamo.reset()
        fn = _step(torch.compile(model, backend=backend), case, kw, mode)
        t0 = time.perf_counter()
        fn()
        warm = time.perf_counter() - t0
        compile_s[who] = {"cold_s": cold, "cold_cpu_s": cold_cpu, "warm_s": warm}
        if who == "torchburn":
            compile_s[who]["ours_cold_s"] = ours
            compile_s[who].update(compile_split(records))
            # Dynamo's tracing and AOTAutograd's (with our decompositions), and the first run
            compile_s[who]["dynamo_aot_s"] = cold - ours
            internal = [s.name for r in records for s in r.internal_errors]
            fallback = [op for r in records for op in r.fallback_ops]
            compile_s[who]["fallback_ops"] = len(fallback)  # type: ignore[assignment]
            if internal:
                raise SystemExit(f"{name} {mode}: internal compiler error in {internal}")
        fns[who] = fn
    timings = compare({k: (lambda f=f: f()) for k, f in fns.items()}, (), rounds=rounds, clock=CLOCKS[clock])
    return {"model": name, "mode": mode, "timings": timings, "compile": compile_s}


def compile_split(records: list[Any]) -> dict[str, float]:
    """Our cold compile by stage, summed over the graphs: `passes` (tensor and loop passes),
    `codegen` (LLVM IR), `llvm` (optimization and object code), `other_ours` (partition,
    import to IR, caches, loading, launchers)."""
    split = {"passes_s": 0.0, "codegen_s": 0.0, "llvm_s": 0.0}
    for r in records:
        for s in r.subgraphs:
            for stage in ("passes", "codegen", "llvm"):
                split[f"{stage}_s"] += s.timings.get(stage, 0.0)
    split["other_ours_s"] = sum(r.import_seconds for r in records) - sum(split.values())
    return split


def _ms(s: float) -> str:
    return f"{s * 1e3:.2f}"


def table(results: list[dict[str, Any]], which: list[str]) -> str:
    from benchmarks.common import format_table

    others = [w for w in which if w != "eager"]
    headers = ["model", "mode"] + [f"{w} ms (iqr)" for w in which] + [f"{w}/eager" for w in others]
    headers += [f"{w} cold s" for w in others]
    if "torchburn" in which:
        headers += ["ours cold s (passes/codegen/llvm/other)", "dynamo+aot s", "ours warm s"]
    rows = []
    for r in results:
        t, c = r["timings"], r["compile"]
        row: list[Any] = [r["model"], r["mode"]]
        row += [f"{_ms(t[w].median_s)} ({_ms(t[w].iqr_s)})" for w in which]
        row += [f"{t[w].median_s / t['eager'].median_s:.2f}" for w in others] if "eager" in which else []
        row += [f"{c[w]['cold_s']:.1f}" for w in others]
        if "torchburn" in which:
            tb = c["torchburn"]
            row += [f"{tb['ours_cold_s']:.1f} ({tb['passes_s']:.1f}/{tb['codegen_s']:.1f}/{tb['llvm_s']:.1f}/"
                    f"{tb['other_ours_s']:.1f})", f"{tb['dynamo_aot_s']:.1f}", f"{tb['warm_s']:.2f}"]
        rows.append(row)
    return format_table(headers, rows)


def geomeans(results: list[dict[str, Any]], which: list[str]) -> dict[str, dict[str, float]]:
    """Per mode, the geometric mean over models of each contender's time / eager's."""
    out: dict[str, dict[str, float]] = {}
    for mode in MODES:
        rs = [r for r in results if r["mode"] == mode]
        if not rs or "eager" not in which:
            continue
        out[mode] = {w: math.exp(sum(math.log(r["timings"][w].median_s / r["timings"]["eager"].median_s) for r in rs)
                                 / len(rs)) for w in which if w != "eager"}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="", help="comma-separated models (default: all)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--contenders", default=",".join(CONTENDERS))
    parser.add_argument("--conv", action="store_true", help="only the convolutional models (" + ", ".join(CONV_MODELS) + ")")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds per row")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="wall time, or the process's CPU time (all threads): steadier on a loaded machine")
    parser.add_argument("--json", default="", help="write the results to this file")
    parser.add_argument("--disk-cache", action="store_true", help="use TorchBurn's on-disk compile cache")
    from benchmarks.common import add_plot_argument  # no torch import: TORCHBURN_CACHE_DIR is set below

    add_plot_argument(parser)
    args = parser.parse_args(argv)
    if not args.disk_cache:
        os.environ["TORCHBURN_CACHE_DIR"] = "off"
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-bench-models-")
    import torch

    from benchmarks.common import machine_info, plot_path, write_json
    from tests.models import zoo

    if args.threads:
        torch.set_num_threads(args.threads)
    which = [c for c in args.contenders.split(",") if c]
    names = [m for m in args.models.split(",") if m] or (list(CONV_MODELS) if args.conv else list(zoo.CASES))
    load_before = os.getloadavg()[0]
    results = []
    for name in names:
        if name not in zoo.CASES:
            raise SystemExit(f"unknown model {name!r}; known: {', '.join(zoo.CASES)}")
        for mode in [m for m in args.modes.split(",") if m]:
            results.append(run_model(name, mode, which, args.rounds, args.clock))
            print(table(results[-1:], which).splitlines()[-1], file=sys.stderr, flush=True)
    info = machine_info()
    info["loadavg_1m_before"] = load_before
    print(f"# {info['cpu']}, {info['torch_threads']} threads, torch {info['torch']}, load "
          f"{load_before:.2f} before / {info['loadavg_1m']:.2f} after; median of {args.rounds} interleaved rounds, "
          f"{args.clock} time")
    print(table(results, which))
    means = geomeans(results, which)
    for mode, m in means.items():
        print(f"geomean {mode}: " + ", ".join(f"{w}/eager {v:.2f}" for w, v in m.items()))
    write_json(args.json, {"machine": info, "rounds": args.rounds, "clock": args.clock, "results": results,
                           "geomean_vs_eager": means})
    plotted = plot(plot_path(args.json, args.plot), results, which, info, args)
    if plotted:
        print(f"plot: {plotted}")
    return 0


def plot(path: Optional[str], results: list[dict[str, Any]], which: list[str], info: dict[str, Any],
         args: argparse.Namespace) -> Optional[str]:
    """Speed-up over eager per model and mode, and the cold compile of the compiled contenders."""
    from benchmarks.common import plot_steps_and_compile

    rows = [(f"{r['model']} {r['mode']}", {w: r["timings"][w].median_s for w in which}) for r in results]
    cold = {w: [r["compile"].get(w, {}).get("cold_s") for r in results] for w in which if w != "eager"}
    return plot_steps_and_compile(path, "bench_models.py", info, args.clock, args.rounds, rows, cold, which)


if __name__ == "__main__":
    sys.exit(main())
