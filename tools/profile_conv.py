"""Where a convolution model's step spends its time: eager's ATen ops against TorchBurn's kernels.

    python tools/profile_conv.py --model unet --mode training --batch 1 --steps 5
    python tools/profile_conv.py --model resnet18 --mode inference --size tiny --top 20
    TORCHBURN_TUNE=off python tools/profile_conv.py --model resnet50 --threads 1 --clock cpu

Eager is profiled with `torch.profiler` (self CPU time per ATen op). The TorchBurn step is
compiled, then each compiled graph's native call is swapped for its kernels called one by one
and timed (`torchburn.llm.cli.profile.StepProfiler`: the same code on the same memory, ~2 us of
ctypes added per kernel); `torch.profiler` over the compiled step shows what ran outside our
kernels (ops left to PyTorch, autograd's own work). Kernels are named by the ATen ops fused
into them; the totals by op group say which family (convolution forward, its input and
weight gradients, normalization, ...) dominates.
"""
from __future__ import annotations

import argparse
import copy
import os
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _eager_profile(step: Callable[[], Any], steps: int, top: int) -> str:
    import torch.profiler as tp

    step()
    with tp.profile(activities=[tp.ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def _group(what: str) -> str:
    """A kernel's family, from the ATen ops fused into it (the first that computes)."""
    ops = [o.strip() for o in what.split(",")]
    for key in ("convolution_backward", "convolution", "native_group_norm_backward", "native_group_norm",
                "native_batch_norm_backward", "_native_batch_norm_legit", "max_pool2d_with_indices_backward",
                "max_pool2d_with_indices", "upsample_nearest2d_backward", "upsample_nearest2d", "mm", "addmm",
                "cat"):
        for o in ops:
            if o.split(".")[0] == key:
                return key
    return ops[0] if ops and ops[0] else "?"


def _family(what: str, kernel: Any) -> str:
    """`_group`, and for convolutions the loop nest they got: the `conv` attribute the
    convolution builders set (form, lanes, blocking), or the element-by-element nest."""
    group = _group(what)
    if not group.startswith("convolution"):
        return group
    form = dict(kernel.attrs).get("conv")
    return f"{group} [{form.split(' lanes')[0] if form else 'element-by-element nest'}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="unet")
    parser.add_argument("--mode", choices=("inference", "training"), default="training")
    parser.add_argument("--size", choices=("full", "tiny"), default="full")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5, help="steps profiled")
    parser.add_argument("--top", type=int, default=25, help="rows per table")
    parser.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave it)")
    parser.add_argument("--ir", type=int, default=0, metavar="N", help="print the loop IR of the N slowest kernels")
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                        help="each kernel's wall time, or the calling thread's CPU time (steadier on a loaded "
                             "machine; with one thread)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCHBURN_CACHE_DIR", "off")
    import torch
    import torch.profiler as tp

    from benchmarks.bench_models import _step
    from tests.models import conv_zoo
    from torchburn.llm.cli.profile import StepProfiler, capture_launchers

    if args.threads:
        torch.set_num_threads(args.threads)
    case = conv_zoo.CASES[args.model]
    eager = conv_zoo.build(args.model, args.size).train(args.mode == "training")
    kw = conv_zoo.inputs(args.model, args.size, args.batch)
    mode = "forward" if args.mode == "inference" else "training"
    eager_step = _step(eager, case, kw, mode)
    model = copy.deepcopy(eager)
    ours_step = _step(torch.compile(model, backend="torchburn"), case, kw, mode)
    t0 = time.perf_counter()
    with capture_launchers() as launchers:
        ours_step()
    print(f"# {args.model} {args.size} batch {args.batch} {args.mode}: compiled in {time.perf_counter() - t0:.1f} s, "
          f"{len(launchers)} launcher(s); {torch.get_num_threads()} threads")

    def timed(step: Callable[[], Any]) -> float:
        step()
        t = time.perf_counter()
        for _ in range(args.steps):
            step()
        return (time.perf_counter() - t) / args.steps

    print(f"step: eager {timed(eager_step) * 1e3:.1f} ms, torchburn {timed(ours_step) * 1e3:.1f} ms "
          f"(mean of {args.steps})\n")
    print("## eager: ATen ops by self CPU time\n")
    print(_eager_profile(eager_step, args.steps, args.top))
    print("\n## torchburn: the compiled step under torch.profiler (our native calls and what ran outside)\n")
    print(_eager_profile(ours_step, args.steps, args.top))

    profilers = [StepProfiler(launcher, model) for launcher in launchers]

    def spent(k: Any) -> float:
        return k.cpu_seconds if args.clock == "cpu" else k.seconds

    import contextlib

    with contextlib.ExitStack() as stack:
        for p in profilers:
            stack.enter_context(p.active())
        for _ in range(args.steps):
            ours_step()
    by_group: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    total = 0.0
    for index, (launcher, p) in enumerate(zip(launchers, profilers)):
        n = max(p.calls, 1)
        seconds = sum(spent(k) for k in p.kernels) / n
        total += seconds
        print(f"\n## torchburn graph {index} ({launcher.name}): {seconds * 1e3:.1f} ms in {len(p.kernels)} kernel calls "
              f"(mean of {n} calls)\n")
        print("| kernel | ms/step | share | what (ATen ops fused) | module |\n|---|---:|---:|---|---|")
        for k in sorted(p.kernels, key=lambda k: -spent(k))[:args.top]:
            form = dict(p.program.kernel(k.kernel).attrs).get("conv", "").split(" lanes")[0]
            print(f"| {k.kernel} | {spent(k) / n * 1e3:.2f} | {100 * spent(k) / n / max(seconds, 1e-12):.1f}% | "
                  f"{k.what[:90]}{' [' + form + ']' if form else ''} | "
                  f"{k.where.split(' (')[0]} |")
        for k in p.kernels:
            g = by_group[_family(k.what, p.program.kernel(k.kernel))]
            g[0] += spent(k) / n
            g[1] += 1
    slowest = sorted(((spent(k) / max(p.calls, 1), k.kernel, p) for p in profilers for k in p.kernels),
                     key=lambda x: -x[0])[:args.ir]
    for seconds, name, p in slowest:
        from torchburn.ir.printer import print_kernel

        print(f"\n## kernel {name} ({seconds * 1e3:.2f} ms per step)\n")
        print(print_kernel(p.program.kernel(name)))
    print(f"\n## torchburn kernels by op family (all graphs: {total * 1e3:.1f} ms per step)\n")
    print("| family | ms/step | share | kernels |\n|---|---:|---:|---:|")
    for name, (s, count) in sorted(by_group.items(), key=lambda x: -x[1][0]):
        print(f"| {name} | {s * 1e3:.2f} | {100 * s / max(total, 1e-12):.1f}% | {count} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
