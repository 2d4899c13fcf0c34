"""Training step (forward and backward) of single layers: eager vs TorchBurn, CPU time.

One layer compiled alone shows which backward kernels cost more than eager's ops (issue 12);
the fixed cost of a compiled training step (Dynamo guard, AOTAutograd's wrappers, two native
calls: ~0.3 ms here) dominates the smallest rows. One thread, CPU time of the process,
rounds of 5 steps interleaved, medians.

    python benchmarks/bench_train_layers.py [SUBSTRING ...]   # only rows whose name matches
    MODE=x (input gradient only) or MODE=w (weight gradient only)
"""
from __future__ import annotations

import os
import statistics
import sys
import time
from typing import Iterator

import torch
import torch.nn as nn

import torchburn  # noqa: F401  (registers the backend)


def cases() -> Iterator[tuple[str, nn.Module, tuple[int, ...]]]:
    yield "bn2d train c32 32x32 b8", nn.BatchNorm2d(32), (8, 32, 32, 32)
    yield "relu b8 c32 32x32", nn.ReLU(), (8, 32, 32, 32)
    yield "bn+relu b8 c32 32x32", nn.Sequential(nn.BatchNorm2d(32), nn.ReLU()), (8, 32, 32, 32)
    yield "conv3x3s1 c16 16x16", nn.Conv2d(16, 16, 3, 1, 1, bias=False), (2, 16, 16, 16)
    yield "conv3x3s2 c16->32 16x16", nn.Conv2d(16, 32, 3, 2, 1, bias=False), (2, 16, 16, 16)
    yield "conv1x1s2 c16->32", nn.Conv2d(16, 32, 1, 2, bias=False), (2, 16, 16, 16)
    yield "dw3x3s2 c48 16x16", nn.Conv2d(48, 48, 3, 2, 1, groups=48, bias=False), (2, 48, 16, 16)
    yield "conv1d k3s2 c32 L160", nn.Conv1d(32, 32, 3, 2, bias=False), (2, 32, 160)
    yield "conv1d k3s1 c32 L80", nn.Conv1d(32, 32, 3, 1, bias=False), (2, 32, 80)
    yield "conv1d k1 bias c32->64", nn.Conv1d(32, 64, 1), (2, 32, 40)


def main() -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    mode = os.environ.get("MODE", "both")
    sel = sys.argv[1:]
    for name, m, shape in cases():
        if sel and not any(s in name for s in sel):
            continue
        x = torch.randn(shape, requires_grad=(mode != "w"))
        if mode == "x":
            for q in m.parameters():
                q.requires_grad_(False)
        c = torch.compile(m, backend="torchburn")

        def step(f: nn.Module) -> None:
            f(x).sum().backward()

        t0 = time.perf_counter()
        step(c)
        compile_s = time.perf_counter() - t0
        te: list[float] = []
        tc: list[float] = []
        for _ in range(15):
            for f, acc in ((m, te), (c, tc)):
                t = time.process_time()
                for _ in range(5):
                    step(f)
                acc.append((time.process_time() - t) / 5 * 1e3)
        me, mc = statistics.median(te), statistics.median(tc)
        print(f"{name:28s} eager {me:7.3f} ms  ours {mc:7.3f} ms  ours/eager {mc / me:5.2f}  "
              f"(compile {compile_s:.1f} s)", flush=True)


if __name__ == "__main__":
    main()
