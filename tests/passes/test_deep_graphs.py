"""Graphs of 5,000 fused elementwise ops compile and run (no recursion limit on the way).

One kernel computes the whole chain: the loop lowering (`loopgen/kernel_builder.py`), the
loop passes, LLVM codegen and the launcher each see 5,000 ops in one loop body.
"""
from __future__ import annotations

import sys

import torch

from torchburn.backend.launcher import Launcher
from torchburn.backend.launcher_gen import launcher_spec
from torchburn.compiler.driver import compile_graph
from torchburn.ir.parser import parse_graph

N_OPS = 5_000
#: The chain's ops, in turn: binary ones take `%y`; the mix keeps values bounded.
CYCLE = ("add", "neg", "sub", "abs", "mul", "add")


def chain_text(n: int) -> str:
    lines = ["graph @chain(%x: f32[4, 8], %y: f32[4, 8]) {"]
    prev = "x"
    for i in range(n):
        op = CYCLE[i % len(CYCLE)]
        args = f"%{prev}" if op in ("neg", "abs") else f"%{prev}, %y"
        lines.append(f"  %v{i} = {op}({args}) : f32[4, 8]")
        prev = f"v{i}"
    lines += [f"  return %{prev}", "}"]
    return "\n".join(lines)


def chain_eager(x: torch.Tensor, y: torch.Tensor, n: int) -> torch.Tensor:
    for i in range(n):
        op = CYCLE[i % len(CYCLE)]
        x = getattr(torch, op)(x) if op in ("neg", "abs") else getattr(torch, op)(x, y)
    return x


def test_5000_fused_ops_compile_into_one_kernel_and_run() -> None:
    assert sys.getrecursionlimit() < N_OPS
    graph = parse_graph(chain_text(N_OPS))
    compiled, _ = compile_graph(graph)
    assert len(compiled.program.kernels) == 1
    x = torch.randn(4, 8)
    y = torch.rand(4, 8) * 0.5 + 0.5  # |mul| shrinks nothing to 0 nor grows past f32
    launcher = Launcher(launcher_spec(graph, compiled.signature()), compiled.entry,
                        lambda a, b: (chain_eager(a, b, N_OPS),), keepalive=compiled)
    (out,) = launcher(x, y)
    assert launcher.stats.eager_fallbacks == 0
    torch.testing.assert_close(out, chain_eager(x, y, N_OPS))
