"""The GPU engine (WGSL through wgpu) against PyTorch CUDA, in one process.

    TORCHBURN_WGPU_BACKEND=vulkan python benchmarks/bench_gpu.py [--quick] [--json F] [--md F]

Workloads (f32, TF32 off for PyTorch):
- GEMM 4096^3 (`a @ b`), TFLOP/s, for several tiles of `gpu-map{gemm_tile=...}`;
- elementwise chains over 64M elements, GB/s counting the bytes of inputs and outputs once
  (`a*1.5 + b` is 12 bytes an element whatever the number of kernels);
- softmax over the rows of 8192 x 4096, GB/s the same way;
- the README MLP (batch 32) and a GPT decoder block, latency per call.

"kernels" times are the GPU engine's dispatches alone, inputs resident on the device (one
submission of many runs, `GpuLauncher.benchmark`); "end to end" times are whole calls with CPU
tensors in and out (copies to and from the device included). PyTorch CUDA times are CUDA-event
times of its kernels on CUDA tensors, or wall-clock with a synchronize for latencies.
`--quick` shrinks every size (for a software adapter).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

os.environ.setdefault("TORCHBURN_DEVICE", "gpu")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchburn  # noqa: E402
from torchburn.backend import gpu_launcher  # noqa: E402
from torchburn.backend.entry import torchburn_backend  # noqa: E402

TILES = ("128x128x16/8x8", "128x128x8/8x8", "128x64x16/8x4", "64x64x16/4x4")


class Block(nn.Module):
    """A GPT decoder block (pre-norm, causal attention, GELU MLP)."""

    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.h = heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


# ---- timing ---------------------------------------------------------------------------------------

def wall(fn: Callable[[], Any], min_s: float = 0.3, warmup: int = 2) -> float:
    """Median seconds per call over rounds of about 50 ms."""
    for _ in range(warmup):
        fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-6)
    n = max(1, int(0.05 / one))
    rounds = max(3, int(min_s / (n * one)))
    samples = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n)
    return statistics.median(samples)


def cuda_kernels(fn: Callable[..., Any], args: Sequence[Any], iters: int) -> Optional[float]:
    """Seconds per call of a PyTorch function on CUDA tensors, by CUDA events."""
    if not torch.cuda.is_available():
        return None
    dev = [a.cuda() if isinstance(a, torch.Tensor) else a for a in args]
    for _ in range(3):
        fn(*dev)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn(*dev)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def ours(fn: Callable[..., Any], args: Sequence[Any], options: Optional[dict[str, Any]] = None
         ) -> tuple[Callable[..., Any], list[gpu_launcher.GpuLauncher], Any]:
    """Compile with the GPU engine, call once; (compiled, its launchers, first result)."""
    torch._dynamo.reset()
    before = set(map(id, gpu_launcher.recent_launchers()))
    gpu_launcher.GpuLauncher.record_args = True
    compiled = torch.compile(fn, backend=torchburn_backend, options=options)
    with torch.no_grad():
        out = compiled(*args)
    launchers = [x for x in gpu_launcher.recent_launchers() if id(x) not in before]
    return compiled, launchers, out


def kernel_time(launchers: list[gpu_launcher.GpuLauncher], iters: int) -> float:
    return sum(x.benchmark(*x.last_args, iters=iters) for x in launchers)


def fmt(v: Optional[float], unit: str) -> str:
    if v is None:
        return "n/a"
    return f"{v:,.1f} {unit}" if unit in ("GB/s", "us", "ms") else f"{v:.2f} {unit}"


# ---- workloads --------------------------------------------------------------------------------------

def bench_gemm(n: int, rows: list[list[str]], record: dict[str, Any]) -> None:
    a, b = torch.randn(n, n), torch.randn(n, n)
    flops = 2.0 * n ** 3
    ref = cuda_kernels(torch.mm, (a, b), 10)
    best = None
    for tile in TILES:
        opts = {"passes": {"before-codegen": [f"gpu-map{{gemm_tile={tile}}}"]}}
        _, launchers, out = ours(lambda x, y: x @ y, (a, b), opts)
        if not launchers:
            rows.append([f"GEMM {n}^3 f32, tile {tile}", "did not run on the GPU", "", ""])
            continue
        t = kernel_time(launchers, 10)
        err = float((out - (a.cuda() @ b.cuda()).cpu()).abs().max()) if torch.cuda.is_available() else float("nan")
        record[f"gemm_{tile}"] = {"seconds": t, "tflops": flops / t / 1e12, "max_abs_err": err,
                                  "kernels": launchers[0].compiled.kernel_summary()}
        rows.append([f"GEMM {n}^3 f32, tile {tile}", fmt(flops / t / 1e12, "TFLOP/s"),
                     fmt(flops / ref / 1e12 if ref else None, "TFLOP/s"), f"{ref / t:.2f}" if ref else ""])
        best = t if best is None else min(best, t)
    record["gemm_best_tflops"] = flops / best / 1e12 if best else None
    record["gemm_torch_tflops"] = flops / ref / 1e12 if ref else None


def bench_elementwise(n: int, rows: list[list[str]], record: dict[str, Any]) -> None:
    a, b, c = torch.randn(n), torch.randn(n), torch.randn(n)
    chains: list[tuple[str, Callable[..., Any], tuple[Any, ...], int]] = [
        ("a*1.5 + b", lambda x, y: x * 1.5 + y, (a, b), 3),
        ("relu(a*1.5 + b) * c - a", lambda x, y, z: torch.relu(x * 1.5 + y) * z - x, (a, b, c), 4),
        ("tanh(a) * sigmoid(b) + c", lambda x, y, z: torch.tanh(x) * torch.sigmoid(y) + z, (a, b, c), 4),
    ]
    for name, fn, args, tensors in chains:
        nbytes = 4.0 * n * tensors
        _, launchers, out = ours(fn, args)
        t = kernel_time(launchers, 30)
        ref = cuda_kernels(fn, args, 30)
        torch.testing.assert_close(out, fn(*args), rtol=1e-5, atol=1e-5)
        record[f"elementwise {name}"] = {"seconds": t, "gbps": nbytes / t / 1e9,
                                         "torch_gbps": nbytes / ref / 1e9 if ref else None}
        rows.append([f"elementwise `{name}`, {n // (1 << 20)}M f32", fmt(nbytes / t / 1e9, "GB/s"),
                     fmt(nbytes / ref / 1e9 if ref else None, "GB/s"), f"{ref / t:.2f}" if ref else ""])


def bench_softmax(m: int, n: int, rows: list[list[str]], record: dict[str, Any]) -> None:
    x = torch.randn(m, n)
    fn = lambda t: torch.softmax(t, -1)  # noqa: E731
    _, launchers, out = ours(fn, (x,))
    torch.testing.assert_close(out, fn(x), rtol=1e-5, atol=1e-6)
    t = kernel_time(launchers, 20)
    ref = cuda_kernels(fn, (x,), 20)
    nbytes = 8.0 * m * n
    record["softmax"] = {"seconds": t, "gbps": nbytes / t / 1e9, "torch_gbps": nbytes / ref / 1e9 if ref else None,
                         "kernels": [k for x in launchers for k in x.compiled.kernel_summary()]}
    rows.append([f"softmax rows of {m}x{n} f32", fmt(nbytes / t / 1e9, "GB/s"),
                 fmt(nbytes / ref / 1e9 if ref else None, "GB/s"), f"{ref / t:.2f}" if ref else ""])


def bench_model(name: str, model: nn.Module, x: torch.Tensor, rows: list[list[str]], record: dict[str, Any]) -> None:
    model.eval()
    compiled, launchers, out = ours(model, (x,))
    with torch.no_grad():
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
        e2e = wall(lambda: compiled(x))
        kern = kernel_time(launchers, 50) if launchers else None
        ref = None
        if torch.cuda.is_available():
            mc, xc = model.cuda(), x.cuda()

            def step() -> None:
                mc(xc)
                torch.cuda.synchronize()

            ref = wall(step)
            model.cpu()
    record[name] = {"end_to_end_s": e2e, "kernels_s": kern, "torch_cuda_s": ref,
                    "subgraphs_on_gpu": len(launchers)}
    rows.append([f"{name}, end to end (CPU tensors in and out)", fmt(e2e * 1e6, "us"),
                 fmt(ref * 1e6 if ref else None, "us"), f"{ref / e2e:.2f}" if ref else ""])
    if kern is not None:
        rows.append([f"{name}, kernels only", fmt(kern * 1e6, "us"), fmt(ref * 1e6 if ref else None, "us"),
                     f"{ref / kern:.2f}" if ref else ""])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (software adapters)")
    ap.add_argument("--json", help="write the figures as JSON here")
    ap.add_argument("--md", help="write the table as Markdown here")
    ap.add_argument("--only", default="gemm,elementwise,softmax,mlp,block")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    info = torchburn.gpu_info()
    if info is None or torchburn.active_engine() != "wgpu":
        sys.exit("no WebGPU adapter: nothing to benchmark")
    record: dict[str, Any] = {"adapter": info, "torch": torch.__version__,
                              "cuda_device": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    rows: list[list[str]] = []
    only = set(args.only.split(","))
    q = args.quick
    if "gemm" in only:
        bench_gemm(256 if q else 4096, rows, record)
    if "elementwise" in only:
        bench_elementwise((1 << 16) if q else (64 << 20), rows, record)
    if "softmax" in only:
        bench_softmax(*((64, 256) if q else (8192, 4096)), rows, record)
    if "mlp" in only:
        torch.manual_seed(0)
        mlp = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 256))
        bench_model("README MLP, batch 32", mlp, torch.randn(32, 512), rows, record)
    if "block" in only:
        torch.manual_seed(0)
        d, heads, T = (64, 4, 16) if q else (768, 12, 128)
        bench_model(f"GPT block d={d} T={T} batch 4", Block(d, heads), torch.randn(4, T, d), rows, record)
    head = ["workload", "TorchBurn wgpu", "PyTorch CUDA", "TorchBurn / PyTorch"]
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    md += ["| " + " | ".join(r) + " |" for r in rows]
    text = "\n".join(md)
    print(f"adapter: {info['name']} ({info['backend']}, {info['device_type']}, shader-f16 {info['shader_f16']}); "
          f"torch {torch.__version__}, CUDA device {record['cuda_device']}")
    print(text)
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
