"""Quantized-linear bandwidth benchmark: a 4096 x 4096 linear at batch 1 and batch 16.

    python benchmarks/bench_quant.py                    # table on stdout
    python benchmarks/bench_quant.py --json out.json    # also write the figures as JSON
    python benchmarks/bench_quant.py --batches 1 --rounds 51 --extra

Contenders (inference, `torch.no_grad`, x in f32):

- `f32 eager`: `F.linear(x, W)` with the float32 weight (PyTorch's own kernel);
- `int8`: `QuantizedLinear` INT8 per channel (f16 scales), compiled by TorchBurn;
- `int4 g64`: `QuantizedLinear` INT4, group 64, symmetric (f16 scales), compiled by TorchBurn;
- with `--extra`: `int4 g32` (symmetric) and `int4 g64 asym` (with mins).

`--activations int8` (default) quantizes x to int8 per group for byte dot products,
`--activations f32` keeps float x (TORCHBURN_QLINEAR_ACTIVATIONS, docs/quantization.md); run
the script once per value. The int8 kernels are checked against the eager op within 2%
relative error (x's rounding), the float ones within 1e-4.

A quantized linear at batch 1 is a stream over its weight, so the figure that matters is the
achieved bandwidth: bytes of weight + scales (+ mins) + x + y per call, divided by the time.
It is compared with the machine's read bandwidth measured in the same run: eager
`t.sum()` over a float32 tensor of `--stream-mib` MiB (512 by default) with all of torch's
threads, a streaming read far larger than the caches. Ratios are time(f32 eager) / time(x):
above 1 is faster than float32 eager. Every contender is checked against the eager reference
of its own op (and fully compiled) before it is timed; timings are medians of interleaved
rounds (`benchmarks/common.py`). Run it in its own scheduling group on a shared machine
(`echo -20 > /proc/self/autogroup`).
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import compare, format_table, machine_info, write_json

IN_FEATURES = OUT_FEATURES = 4096


def weight_bytes(layer: torch.nn.Module) -> int:
    """Bytes a call reads from the layer: its parameters and buffers (packed weight, scales,
    mins; no bias here)."""
    return sum(t.numel() * t.element_size() for t in (*layer.parameters(), *layer.buffers()))


def stream_bandwidth(mib: int, rounds: int) -> dict[str, Any]:
    """Read bandwidth of eager `t.sum()` over `mib` MiB of float32 (GB/s, median of rounds)."""
    t = torch.ones(mib * (1 << 20) // 4)
    timing = compare({"sum": lambda: t.sum()}, rounds=rounds, warmup=2, min_round_s=0.05)["sum"]
    return {"method": f"eager t.sum() over a {mib} MiB float32 tensor, {torch.get_num_threads()} threads",
            "bytes": t.numel() * 4, "timing": timing, "gb_s": t.numel() * 4 / timing.median_s / 1e9}


def contenders(extra: bool) -> dict[str, torch.nn.Module]:
    from torchburn.quant import QuantizedLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(IN_FEATURES, OUT_FEATURES, bias=False)
    lin.weight.data /= 4
    layers: dict[str, torch.nn.Module] = {"f32 eager": lin}
    layers["int8"] = QuantizedLinear.from_float(lin, "int8", None, scale_dtype=torch.float16)
    layers["int4 g64"] = QuantizedLinear.from_float(lin, "int4", 64, True, torch.float16)
    if extra:
        layers["int4 g32"] = QuantizedLinear.from_float(lin, "int4", 32, True, torch.float16)
        layers["int4 g64 asym"] = QuantizedLinear.from_float(lin, "int4", 64, False, torch.float16)
    return layers


def compiled(layer: torch.nn.Module, x: torch.Tensor, activations: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """`layer` compiled by TorchBurn with `activations` ("f32" or "int8"), checked against
    its eager result and for fallbacks."""
    from torchburn.backend import report as rep
    from torchburn.runtime.config import reload_config

    os.environ["TORCHBURN_QLINEAR_ACTIVATIONS"] = activations
    reload_config()
    fn = torch.compile(layer, backend="torchburn", fullgraph=True)
    records = rep.start_recording()
    try:
        got = fn(x)
    finally:
        rep.stop_recording()
    fallbacks = [op for r in records for op in r.fallback_ops]
    failed = [(s.name, s.reason) for r in records for s in r.subgraphs if not s.compiled]
    if fallbacks or failed or not records:
        raise SystemExit(f"not fully compiled: {fallbacks} {failed}")
    want = layer(x)
    if activations == "f32":
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    elif float((got - want).norm() / want.norm()) > 0.02:
        raise SystemExit(f"int8 activations: relative error {float((got - want).norm() / want.norm()):.3g}")
    return fn


def run_batch(batch: int, layers: dict[str, torch.nn.Module], rounds: int, activations: str) -> dict[str, Any]:
    x = torch.randn(batch, IN_FEATURES)
    fns: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {}
    owner: dict[str, torch.nn.Module] = {}
    for name, layer in layers.items():
        if name == "f32 eager":
            fns[name], owner[name] = (lambda x, w=layer.weight: F.linear(x, w)), layer
            continue
        act = activations
        fns[f"{name} (x {act})"], owner[f"{name} (x {act})"] = compiled(layer, x, act), layer
    timings = compare(fns, (x,), rounds=rounds)
    io = (batch * IN_FEATURES + batch * OUT_FEATURES) * 4
    rows = {}
    for name, t in timings.items():
        nbytes = weight_bytes(owner[name]) + io
        rows[name] = {"timing": t, "bytes": nbytes, "gb_s": nbytes / t.median_s / 1e9,
                      "vs_f32_eager": timings["f32 eager"].median_s / t.median_s}
    return {"batch": batch, "results": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="1,16")
    parser.add_argument("--rounds", type=int, default=31, help="interleaved timing rounds per batch")
    parser.add_argument("--stream-mib", type=int, default=512, help="size of the bandwidth probe")
    parser.add_argument("--extra", action="store_true", help="also INT4 group 32 and asymmetric")
    parser.add_argument("--threads", type=int, default=0,
                        help="threads of torch and of TorchBurn's kernels (0: leave both)")
    parser.add_argument("--json", default="", help="write the results to this file")
    parser.add_argument("--activations", choices=("f32", "int8"), default="int8",
                        help="x of the quantized kernels (one per process: Dynamo reuses a module's graph)")
    args = parser.parse_args(argv)
    os.environ.setdefault("TORCHBURN_CACHE_DIR", "off")  # the key does not see compiler edits
    if args.threads:  # both engines: torch's pool and the threads of our parallel loops
        torch.set_num_threads(args.threads)
        os.environ["TORCHBURN_NUM_THREADS"] = str(args.threads)
    import torchburn  # noqa: F401  (registers the backend)

    layers = contenders(args.extra)
    with torch.no_grad():
        bandwidth = stream_bandwidth(args.stream_mib, args.rounds)
        batches = [run_batch(int(b), layers, args.rounds, args.activations) for b in args.batches.split(",") if b]
    peak = bandwidth["gb_s"]
    info = machine_info()
    print(f"# {info['cpu']}, {info['torch_threads']} threads, torch {info['torch']}, "
          f"load {info['loadavg_1m']:.2f}; median of {args.rounds} interleaved rounds")
    print(f"# read bandwidth: {peak:.1f} GB/s ({bandwidth['method']})")
    headers = ["batch", "contender", "ms", "MB read", "GB/s", "% of read bw", "vs f32 eager"]
    rows = []
    for b in batches:
        for name, r in b["results"].items():
            rows.append([b["batch"], name, f"{r['timing'].median_s * 1e3:.3f}", f"{r['bytes'] / 1e6:.1f}",
                         f"{r['gb_s']:.1f}", f"{100 * r['gb_s'] / peak:.0f}%", f"{r['vs_f32_eager']:.2f}x"])
    print(format_table(headers, rows))
    write_json(args.json, {"machine": info, "rounds": args.rounds, "bandwidth": bandwidth, "batches": batches})
    return 0


if __name__ == "__main__":
    sys.exit(main())
