"""The GPU engine (WGSL through wgpu) against PyTorch CUDA, in one process.

    TORCHBURN_WGPU_BACKEND=vulkan python benchmarks/bench_gpu.py [--quick] [--json F] [--md F]

Workloads (f32, TF32 off for PyTorch):
- GEMM 4096^3 (`a @ b`), TFLOP/s, for several tiles of `gpu-map{gemm_tile=...}`;
- elementwise chains over 64M elements, GB/s counting the bytes of inputs and outputs once
  (`a*1.5 + b` is 12 bytes an element whatever the number of kernels);
- softmax over the rows of 8192 x 4096; attention (`F.scaled_dot_product_attention`) causal over
  4 x 12 x 1024 x 64, and one decode step against a 1024-position KV cache held as module buffers;
  the README MLP (batch 32) and a GPT decoder block: each against PyTorch CUDA eager and against
  a CUDA-graph replay of the same eager calls (`torch.cuda.CUDAGraph`), kernels only and end to end.

"kernels" times are the GPU engine's dispatches alone, inputs resident on the device (one
submission of many runs, `GpuLauncher.benchmark`); "end to end" times are whole calls with CPU
tensors in and out (copies to and from the device included). PyTorch CUDA times are CUDA-event
times of its calls on resident CUDA tensors (eager, graph replay), or wall-clock with a
synchronize for the end-to-end eager call. Ratios are PyTorch time / ours (above 1: faster).
Without CUDA only our figures are printed. `--quick` shrinks every size (for a software adapter).
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

TILES = ("128x128x16/8x8/sw/w", "128x128x16/8x8", "64x64x16/4x4/s2/sw/w", "64x64x16/4x4")
#: Print each kernel's time alone for the workloads compared with PyTorch (`--per-kernel`).
PER_KERNEL = False


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

def bench_gemm(n: int, rows: list[list[str]], record: dict[str, Any], tiles: Sequence[str] = TILES) -> None:
    a, b = torch.randn(n, n), torch.randn(n, n)
    flops = 2.0 * n ** 3
    ref = cuda_kernels(torch.mm, (a, b), 10)
    best = None
    for tile in tiles:
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


def cuda_graph(fn: Callable[..., Any], args: Sequence[Any], iters: int) -> Optional[float]:
    """Seconds per replay of a CUDA graph captured from one eager call (CUDA events): PyTorch's
    kernels without its per-op launch cost."""
    if not torch.cuda.is_available():
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn(*args)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(*args)
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def cuda_eager(fn: Callable[..., Any], args: Sequence[Any], iters: int) -> Optional[float]:
    """Seconds per eager call on resident CUDA tensors (CUDA events around `iters` calls)."""
    if not torch.cuda.is_available():
        return None
    for _ in range(3):
        fn(*args)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn(*args)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / iters


def ratio(ref: Optional[float], t: Optional[float]) -> str:
    return f"{ref / t:.2f}" if ref and t else ""


def compare(name: str, make: Callable[[], tuple[Callable[..., Any], tuple[Any, ...]]], rows: list[list[str]],
            record: dict[str, Any], iters: int = 20, rtol: float = 1e-4, atol: float = 1e-4,
            nbytes: Optional[float] = None, options: Optional[dict[str, Any]] = None) -> None:
    """One workload on our GPU engine and on PyTorch CUDA, eager and CUDA-graph replay.

    `make()` returns `(fn, cpu_args)`; a module `fn` is moved to CUDA for the reference (a fresh
    `make()` keeps our copy on the CPU). Ours: kernels only (resident inputs, one submission) and
    end to end (CPU tensors in and out). PyTorch: eager calls and graph replay on CUDA tensors."""
    fn, args = make()
    if isinstance(fn, nn.Module):
        fn.eval()
    try:
        compiled, launchers, out = ours(fn, args, options)
        with torch.no_grad():
            expected = make()[0](*make()[1]) if isinstance(fn, nn.Module) else fn(*args)
            torch.testing.assert_close(out, expected, rtol=rtol, atol=atol)
            e2e = wall(lambda: compiled(*args))
        kern = kernel_time(launchers, iters) if launchers else None
    except Exception as err:  # noqa: BLE001 - a row says what failed, the others still run
        why = " ".join(str(err).split())[:160]
        rows.append([name, f"failed: {type(err).__name__}: {why}", "", "", "", "", "", ""])
        record[name] = {"error": f"{type(err).__name__}: {err}"}
        return
    eager = graph = eager_e2e = None
    if torch.cuda.is_available():
        ref_fn, ref_args = make()
        if isinstance(ref_fn, nn.Module):
            ref_fn = ref_fn.cuda().eval()
        dev = tuple(a.cuda() if isinstance(a, torch.Tensor) else a for a in ref_args)
        with torch.no_grad():
            eager = cuda_eager(ref_fn, dev, iters)
            graph = cuda_graph(ref_fn, dev, iters)

            def step() -> None:
                ref_fn(*dev)
                torch.cuda.synchronize()

            eager_e2e = wall(step)
    kernels = [k for x in launchers for k in x.compiled.kernel_summary()]
    per_kernel = None
    if PER_KERNEL and launchers:
        per_kernel = [(n, s, t) for x in launchers for n, s, t in x.benchmark_kernels(*x.last_args, iters=iters)]
        print(f"{name}: each kernel alone (us):", flush=True)
        for n, s, t in per_kernel:
            print(f"  {t * 1e6:9.1f}  {n}: {s}", flush=True)
    record[name] = {"per_kernel": per_kernel, "kernels_s": kern, "end_to_end_s": e2e, "torch_eager_s": eager,
                    "torch_graph_s": graph,
                    "torch_eager_call_s": eager_e2e, "subgraphs_on_gpu": len(launchers), "kernels": kernels}
    if nbytes:
        record[name]["gbps"] = nbytes / kern / 1e9 if kern else None
    us = lambda v: fmt(v * 1e6 if v else None, "us")  # noqa: E731
    rows.append([name, us(kern), us(e2e), us(eager), us(graph), ratio(eager, kern), ratio(graph, kern),
                 ratio(eager_e2e, e2e)])


class KvAttention(nn.Module):
    """One decode step of attention with a KV cache held as buffers: the step's key and value
    are written at `pos`, the query attends to positions `0..pos`."""

    def __init__(self, b: int, h: int, s: int, d: int, pos: int) -> None:
        super().__init__()
        self.pos = pos
        self.register_buffer("k", torch.randn(b, h, s, d))
        self.register_buffer("v", torch.randn(b, h, s, d))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        p = self.pos
        self.k[:, :, p:p + 1] = k
        self.v[:, :, p:p + 1] = v
        return F.scaled_dot_product_attention(q, self.k[:, :, :p + 1], self.v[:, :, :p + 1])


def bench_softmax(m: int, n: int, rows: list[list[str]], record: dict[str, Any]) -> None:
    x = torch.randn(m, n)
    name = f"softmax rows of {m}x{n} f32"
    compare(name, lambda: (lambda t: torch.softmax(t, -1), (x,)), rows, record, rtol=1e-5, atol=1e-6,
            nbytes=8.0 * m * n)
    r = record[name]
    if r.get("kernels_s"):  # the bandwidth view (bytes of input and output once), as before
        gbps = lambda t: 8.0 * m * n / t / 1e9 if t else None  # noqa: E731
        rows.append([name, fmt(gbps(r["kernels_s"]), "GB/s"), fmt(gbps(r["torch_eager_s"]), "GB/s"),
                     ratio(r["torch_eager_s"], r["kernels_s"])])


def bench_attention(b: int, h: int, t: int, d: int, rows: list[list[str]], record: dict[str, Any]) -> None:
    q, k, v = (torch.randn(b, h, t, d) for _ in range(3))
    causal = lambda q_, k_, v_: F.scaled_dot_product_attention(q_, k_, v_, is_causal=True)  # noqa: E731
    compare(f"attention causal B={b} H={h} T={t} D={d}", lambda: (causal, (q, k, v)), rows, record)
    step = [torch.randn(b, h, 1, d) for _ in range(3)]

    def make() -> tuple[Callable[..., Any], tuple[Any, ...]]:
        torch.manual_seed(1)
        return KvAttention(b, h, t, d, t - 1), tuple(step)

    compare(f"attention decode, KV cache {t} B={b} H={h} D={d}", make, rows, record)


def bench_block(d: int, heads: int, t: int, batch: int, rows: list[list[str]], record: dict[str, Any],
                variants: Sequence[str] = ()) -> None:
    """The block with the default passes, then with each of `variants` (loop passes placed
    before codegen, `;`-separated: `gpu-split-k{min_groups=512};gpu-map{gemm_tile=64x64x16/8x8}`)."""
    x = torch.randn(batch, t, d)

    def make() -> tuple[Callable[..., Any], tuple[Any, ...]]:
        torch.manual_seed(0)
        return Block(d, heads), (x,)

    name = f"GPT block d={d} T={t} batch {batch}"
    compare(name, make, rows, record, iters=50)
    for v in variants:
        opts = {"passes": {"before-codegen": [p for p in v.split(";") if p]}}
        compare(f"{name}, {v}", make, rows, record, iters=50, options=opts)


def bench_mlp(rows: list[list[str]], record: dict[str, Any]) -> None:
    x = torch.randn(32, 512)

    def make() -> tuple[Callable[..., Any], tuple[Any, ...]]:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 256)), (x,)

    compare("README MLP, batch 32", make, rows, record, iters=50)


def table(head: list[str], rows: list[list[str]]) -> str:
    md = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    return "\n".join(md + ["| " + " | ".join(r) + " |" for r in rows])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (software adapters)")
    ap.add_argument("--json", help="write the figures as JSON here")
    ap.add_argument("--md", help="write the table as Markdown here")
    ap.add_argument("--only", default="gemm,elementwise,softmax,attention,mlp,block")
    ap.add_argument("--tiles", default=",".join(TILES), help="GEMM tiles of the GEMM rows (gpu-map's gemm_tile)")
    ap.add_argument("--per-kernel", action="store_true", help="time each kernel alone too (printed)")
    ap.add_argument("--block-variants", default="",
                    help="more GPT block rows, each with these loop passes (`|` between variants, `;` between "
                         "passes), e.g. 'gpu-split-k{min_groups=512}|gpu-map{gemm_tile=64x64x16/8x8}'")
    args = ap.parse_args()
    global PER_KERNEL
    PER_KERNEL = args.per_kernel
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
        bench_gemm(256 if q else 4096, rows, record, args.tiles.split(","))
    if "elementwise" in only:
        bench_elementwise((1 << 16) if q else (64 << 20), rows, record)
    if "softmax" in only:
        bench_softmax(*((64, 256) if q else (8192, 4096)), rows, record)
    if "attention" in only:
        bench_attention(*((1, 2, 32, 16) if q else (4, 12, 1024, 64)), rows, record)
    if "mlp" in only:
        bench_mlp(rows, record)
    if "block" in only:
        d, heads, t = (64, 4, 16) if q else (768, 12, 128)
        bench_block(d, heads, t, 4, rows, record, [v for v in args.block_variants.split("|") if v])
    head = ["workload", "TorchBurn wgpu", "PyTorch CUDA", "TorchBurn / PyTorch"]
    text = table(head, [r for r in rows if len(r) == 4])
    head2 = ["workload", "ours kernels", "ours end to end", "CUDA eager", "CUDA graph", "vs eager (kernels)",
             "vs graph (kernels)", "vs eager (end to end)"]
    text2 = table(head2, [r for r in rows if len(r) == 8])
    print(f"adapter: {info['name']} ({info['backend']}, {info['device_type']}, shader-f16 {info['shader_f16']}); "
          f"torch {torch.__version__}, CUDA device {record['cuda_device']}")
    print(text)
    print()
    print("Ratios are PyTorch time / our time (above 1: we are faster). CUDA eager and graph are CUDA-event")
    print("times on resident CUDA tensors; 'vs eager (end to end)' compares our whole call (CPU tensors in")
    print("and out) with an eager call plus synchronize on resident CUDA tensors.")
    print(text2)
    text = text + "\n\n" + text2
    if args.md:
        Path(args.md).write_text(text + "\n")
    if args.json:
        Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
