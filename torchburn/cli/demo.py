"""`python -m torchburn demo`: compile the README's MLP, check it against eager, time both,
split the first call's time by stage (Dynamo and AOTAutograd; our passes, code generation,
LLVM), explain what ran where (``--html``: also as a web page), and show the IR of every stage.

Honest by construction: timings are medians over interleaved repetitions with their spread,
a busy machine or a software GPU adapter is said out loud (both make the figures
meaningless as a measure of the compiler), and the dump folder is described from the files
actually written, so the GPU engine's folder is said to hold WGSL, not LLVM IR.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

#: Adapter names of software rasterizers: a "GPU" that is really the CPU.
SOFTWARE_ADAPTERS = ("llvmpipe", "lavapipe", "swiftshader", "softpipe", "warp")


@dataclass
class Timing:
    """Seconds per call, one figure per repetition."""

    samples: list[float]

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def describe(self) -> str:
        us = [s * 1e6 for s in self.samples]
        return (f"{statistics.median(us):9.1f} us/call (median of {len(us)}; "
                f"min..max {min(us):.1f}..{max(us):.1f})")


def time_interleaved(fns: list[Callable[[], object]], repeats: int, inner: int) -> list[Timing]:
    """Time each of `fns` `repeats` times, alternating between them every repetition so that
    a change of machine load hits all of them alike rather than only the last one timed."""
    samples: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for fn, out in zip(fns, samples):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            out.append((time.perf_counter() - t0) / inner)
    return [Timing(s) for s in samples]


def cpu_count() -> int:
    """CPUs this process may run on (the affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def load_average() -> Optional[float]:
    """The 1-minute load average; None on an OS without one."""
    try:
        return os.getloadavg()[0]
    except (AttributeError, OSError):
        return None


def busy_warning(load: Optional[float], cpus: Optional[int] = None) -> Optional[str]:
    """A warning when the 1-minute load average is at least half the CPU count: other work then
    takes cores from the timed runs and the speed-up swings from run to run."""
    if load is None:
        return None
    cpus = cpus or cpu_count()
    if load < 0.5 * cpus:
        return None
    return (f"warning: the machine is busy (load average {load:.1f} on {cpus} CPU(s)); "
            "the timings below measure the load as much as the compiler")


def software_adapter_warning(info: Optional[dict[str, Any]]) -> Optional[str]:
    """A warning when the GPU adapter is a software rasterizer (llvmpipe, lavapipe,
    SwiftShader...): the GPU engine then runs on the CPU, slowly."""
    if not info:
        return None
    text = f"{info.get('name', '')} {info.get('description', '')}".lower()
    if info.get("device_type") != "CPU" and not any(s in text for s in SOFTWARE_ADAPTERS):
        return None
    return (f"warning: the GPU adapter '{info.get('name', '?')}' ({info.get('backend', '?')}) is a "
            "software renderer running on the CPU; GPU timings here say nothing about a real GPU")


#: (file name test, what it is), in pipeline order.
_STAGES: list[tuple[Callable[[str], bool], str]] = [
    (lambda n: n == "00_fx_graph.py", "the FX graph (00_fx_graph.py)"),
    (lambda n: n == "01_tensor_ir.tbir", "the tensor IR (01_tensor_ir.tbir)"),
    (lambda n: "_after_" in n and n.endswith(".tbir"), "the IR after each pass (NN_after_<pass>.tbir)"),
    (lambda n: n == "program.tbir", "the loop IR (program.tbir)"),
    (lambda n: n.endswith(".ll"), "LLVM IR (module.ll)"),
    (lambda n: n.endswith(".s"), "assembly (module.s)"),
    (lambda n: n.endswith(".wgsl"), "WGSL compute shaders (kernel_<name>.wgsl)"),
]


def describe_dump(folder: Path) -> str:
    """What `folder` holds, from the files written there (one subfolder per compiled graph)."""
    graphs = sorted(p for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []
    names = {f.name for g in graphs for f in g.iterdir()}
    kinds = [what for test, what in _STAGES if any(test(n) for n in names)]
    if not kinds:
        return f"nothing was written to {folder}"
    return f"{len(graphs)} compiled graph(s), each with " + ", ".join(kinds)


@dataclass
class CompileSplit:
    """Where the first call's seconds went: Dynamo's side (tracing, AOTAutograd, and the call
    itself) and ours, by stage (as bench_compile.py splits a cold compile)."""

    total: float
    ours: float
    #: Summed over the compiled subgraphs: "passes" (tensor and loop passes), "codegen"
    #: (LLVM IR or WGSL), "llvm" (LLVM's optimization and object code), "load".
    stages: dict[str, float]

    @property
    def dynamo(self) -> float:
        return max(self.total - self.ours, 0.0)

    def lines(self) -> list[str]:
        ms = lambda v: f"{v * 1e3:.0f} ms"  # noqa: E731
        named = {"passes": "our passes", "codegen": "code generation", "llvm": "LLVM",
                 "load": "loading the object code"}
        parts = [f"{named.get(k, k)} {ms(v)}" for k, v in self.stages.items() if v > 0]
        rest = self.ours - sum(self.stages.values())
        if rest > 0:
            parts.append(f"the rest (partition, import to IR, caches, launchers, set-up) {ms(rest)}")
        return [f"    Dynamo and AOTAutograd (importing, tracing, decompositions; the call itself): {ms(self.dynamo)}",
                f"    TorchBurn: {ms(self.ours)}: " + ", ".join(parts)]


def compile_split(total: float, records: list[Any], setup: float) -> CompileSplit:
    """`CompileSplit` of a first call of ``total`` seconds, from the backend's reports of it
    (`backend.report`) and the backend's set-up seconds spent in it."""
    stages = {"passes": 0.0, "codegen": 0.0, "llvm": 0.0, "load": 0.0}
    for r in records:
        for sub in r.subgraphs:
            for k, v in sub.timings.items():
                key = "load" if k == "disk_load" else k
                stages[key] = stages.get(key, 0.0) + v
    return CompileSplit(total, sum(r.import_seconds for r in records) + setup, stages)


def resolve_dump(arg: Optional[str]) -> tuple[Path, bool]:
    """(folder, whether we created it as a temporary one): `--dump`, else `TORCHBURN_DUMP`,
    else a new temporary folder."""
    chosen = arg or os.environ.get("TORCHBURN_DUMP", "").strip()
    if chosen:
        return Path(chosen), False
    return Path(tempfile.mkdtemp(prefix="torchburn-dump-")), True


def demo(args: argparse.Namespace) -> int:
    dump, temporary = resolve_dump(args.dump)
    os.environ["TORCHBURN_DUMP"] = str(dump)
    try:
        return _run(args, dump, temporary)
    finally:
        if temporary and not args.keep_dump:
            shutil.rmtree(dump, ignore_errors=True)


def _run(args: argparse.Namespace, dump: Path, temporary: bool) -> int:
    import torch

    from ..backend import report as rep
    from ..backend.explainer import explain
    from ..runtime import config, gpu

    config.reload_config()
    load_before = load_average()
    warnings: list[Optional[str]] = []
    engine = gpu.active_engine()
    if gpu.wants_gpu():
        warnings.append(software_adapter_warning(gpu.gpu_info()) if engine == "wgpu" else
                        f"note: the GPU engine was asked for but is not available ({gpu.gpu_unavailable_reason()}); "
                        "running on the CPU engine")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    x = torch.randn(args.batch, 512)
    print(f"MLP Linear(512,1024) -> GELU -> Linear(1024,256), batch {args.batch}, engine {engine}")
    print("  compiling it (the first call), then timing it against eager ...", flush=True)
    setup0 = rep.backend_setup_seconds
    records = rep.start_recording()
    t0 = time.perf_counter()
    compiled = torch.compile(model, backend="torchburn")
    with torch.no_grad():
        try:
            y = compiled(x)
        finally:
            rep.stop_recording()
        cold = time.perf_counter() - t0
        split = compile_split(cold, list(records), rep.backend_setup_seconds - setup0)
        expected = model(x)
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
        eager, ours = time_interleaved([lambda: model(x), lambda: compiled(x)], args.repeats, args.inner)
    loads = [v for v in (load_before, load_average()) if v is not None]  # before and during the timed runs
    warnings.insert(0, busy_warning(max(loads)) if loads else None)
    err = (y - expected).abs().max().item()
    ratios = sorted(e / o for e, o in zip(eager.samples, ours.samples))
    for line in warnings:
        if line:
            print(line)
    print(f"  result matches eager (max abs error {err:.2e})")
    print(f"  first call (compile + run): {cold * 1e3:.0f} ms")
    for line in split.lines():
        print(line)
    print(f"    the IR of every stage of it is written to {dump}")
    print(f"  eager:     {eager.describe()}")
    print(f"  torchburn: {ours.describe()}")
    print(f"  speed-up:  {eager.median / ours.median:.2f}x eager (ratio of medians; "
          f"per repetition {ratios[0]:.2f}x..{ratios[-1]:.2f}x)")
    with torch.no_grad():
        report = explain(model, x, html=args.html)
    print()
    print(report)
    if args.html:
        print(f"\nthe report as a web page: {Path(args.html).resolve()}")
    print()
    print(f"IR of every stage in {dump}: {describe_dump(dump)}")
    if temporary and not args.keep_dump:
        print("  (a temporary folder, removed on exit: --keep-dump keeps it, "
              "--dump DIR or TORCHBURN_DUMP=DIR writes elsewhere)")
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--dump", help="folder for the IR dumps (default: TORCHBURN_DUMP, else a "
                                       "temporary folder removed on exit)")
    parser.add_argument("--keep-dump", action="store_true", help="keep the temporary dump folder")
    parser.add_argument("--html", metavar="PATH", default=None,
                        help="also write explain()'s report as a web page (FX graph, kernels and their times)")
    parser.add_argument("--repeats", type=int, default=15, help="timed repetitions of each side")
    parser.add_argument("--inner", type=int, default=20, help="calls per timed repetition")
