"""Sweep the GPU engine's tile shapes against PyTorch CUDA, in one process (for choosing the
defaults of `gpu-map`'s `gemm_tile`, `attention_tile` and `row_lanes` on a device).

    TORCHBURN_WGPU_BACKEND=vulkan python benchmarks/bench_gpu_sweep.py [--quick] [--json F]

For each GEMM shape `MxNxK` (f32, `a @ b`; `MxNxKt`: `a @ b.t()` with `b` N x K, a linear layer) and each tile of `--gemm-tiles` (or of the shape's own
list, `MxNxK=tile+tile`; `tile~S` also sets `gpu-split-k{splits=S}`, 1: no split), and for each causal
attention shape `BxHxTxD` (f32, `F.scaled_dot_product_attention`) and each tile of
`--attention-tiles` ("rows" is the one-invocation-per-row schedule; a tile of either list
spelled `tile@checked` compiles with wgpu's runtime checks, as `TORCHBURN_DEBUG=bounds` does,
to see what naga's index clamping and loop counters cost): our kernel time (inputs
resident, one submission of many runs), the error against the CUDA result, and PyTorch CUDA
eager's time by CUDA events (TF32 off). Rows print as they finish, so a run cut short by a
time limit still reports what it measured. Ratios are PyTorch time / ours (above 1: faster).

`--only gemv`: a decode step's matrix-vector products (`--gemv-shapes`, `NxK`), each weight
dtype of `--gemv-dtypes` (f32, f16 storage, int4, int8, ggml blocks such as Q4_K) and each
`gpu-map{row_lanes=L}` of `--gemv-lanes` (0: the pass's choice): our kernel time against
PyTorch CUDA's f16 GEMV of the same shape.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gpu import cuda_kernels, kernel_time, ours  # noqa: E402

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torchburn  # noqa: E402
from torchburn.runtime.config import reload_config  # noqa: E402

GEMM_TILES = ("128x128x16/8x8/sw/w", "128x128x16/8x8/w", "64x64x16/4x4/s2/sw/w", "128x128x16/8x8", "128x128x16/8x8/s2", "128x128x8/8x8/s2", "128x128x8/8x16",
              "128x128x8/8x16/s2", "128x128x16/8x16", "128x128x8/16x8/s2", "128x64x16/8x8/s2",
              "64x128x16/8x8/s2", "64x64x16/8x8/s2", "64x64x16/4x4", "64x64x16/4x4/s2", "64x32x16/4x4",
              "32x64x16/4x4")
GEMM_SHAPES = ("4096x4096x4096", "512x2304x768", "512x768x768", "512x3072x768", "512x768x3072")
ATTENTION_TILES = ("rows", "64x64/4x8", "64x32/4x4", "64x64/4x4", "32x64/4x8", "32x32/4x4", "64x32/8x4",
                   "128x32/8x4", "16x64/4x8")
ATTENTION_SHAPES = ("4x12x1024x64", "4x12x128x64")
#: A decode step's matrix-vector products, `NxK` (output rows x input features): SmolLM2-135M's
#: k/v, gate+up, down and output head, Qwen2.5-0.5B's q/o, gate+up, down and output head.
GEMV_SHAPES = ("192x576", "3072x576", "576x1536", "49152x576", "896x896", "9728x896", "896x4864", "151936x896")
GEMV_DTYPES = ("f32", "f16", "int4", "int8", "Q4_K", "Q6_K")
#: `gpu-map{row_lanes=...}`: invocations per output element (0: the pass's own choice).
GEMV_LANES = ("0", "32", "64", "128", "256")


@contextlib.contextmanager
def wgpu_checks(tile: str) -> Any:
    """`tile` without its `@checked` suffix; with it, wgpu's runtime checks stay on for the
    compile inside the block (`TORCHBURN_DEBUG=bounds`: shader modules with naga's clamps)."""
    base, _, flag = tile.partition("@")
    if flag not in ("", "checked"):
        raise SystemExit(f"tile {tile!r}: the only suffix is @checked")
    saved = os.environ.get("TORCHBURN_DEBUG")
    if flag:
        os.environ["TORCHBURN_DEBUG"] = "bounds"
        reload_config()
    try:
        yield base
    finally:
        if flag:
            if saved is None:
                os.environ.pop("TORCHBURN_DEBUG", None)
            else:
                os.environ["TORCHBURN_DEBUG"] = saved
            reload_config()


def emit(line: str, out: list[str]) -> None:
    print(line, flush=True)
    out.append(line)


def sweep_gemm(shapes: list[str], tiles: list[str], record: dict[str, Any], lines: list[str], iters: int) -> None:
    for spec in shapes:
        shape, _, own = spec.partition("=")
        linear = shape.endswith("t")  # b held as N x K, read transposed (a linear layer's weight)
        m, n, k = (int(x) for x in shape.rstrip("t").split("x"))
        a, b = torch.randn(m, k), torch.randn(n, k) if linear else torch.randn(k, n)
        mm: Callable[..., Any] = (lambda x, y: x @ y.t()) if linear else (lambda x, y: x @ y)
        flops = 2.0 * m * n * k
        ref = cuda_kernels(mm, (a, b), iters)
        expected = mm(a.cuda(), b.cuda()).cpu() if torch.cuda.is_available() else mm(a, b)
        rows = record.setdefault("gemm", {}).setdefault(shape, {"torch_s": ref})
        emit(f"GEMM {shape}: PyTorch {flops / ref / 1e12:.2f} TFLOP/s" if ref else f"GEMM {shape}", lines)
        for tile in own.split("+") if own else tiles:
            gemm_tile, _, splits = tile.partition("@")[0].partition("~")
            # gpu-split-k before gpu-map, as the GPU pipeline places it (its parts are a GEMM to map)
            passes = ([f"gpu-split-k{{splits={splits}}}"] if splits else []) + [f"gpu-map{{gemm_tile={gemm_tile}}}"]
            opts = {"passes": {"before-codegen": passes}}
            try:
                t0 = time.perf_counter()
                with wgpu_checks(tile):
                    _, launchers, out = ours(mm, (a, b), opts)
                compile_s = time.perf_counter() - t0
                if not launchers:  # the compile cache handed back an earlier row's program
                    raise RuntimeError("no new kernels: the same program as an earlier row")
                t = kernel_time(launchers, iters)
                err = float((out - expected).abs().max())
                summary = [s for x in launchers for s in x.compiled.kernel_summary()]
            except Exception as e:  # noqa: BLE001 - one tile failing does not stop the sweep
                emit(f"  {tile:>20}: failed: {type(e).__name__}: {' '.join(str(e).split())[:150]}", lines)
                rows[tile] = {"error": str(e)}
                continue
            rows[tile] = {"seconds": t, "tflops": flops / t / 1e12, "max_abs_err": err, "compile_s": compile_s,
                          "kernels": summary}
            ratio = f"{ref / t:.2f}x" if ref else ""
            emit(f"  {tile:>20}: {flops / t / 1e12:6.2f} TFLOP/s {t * 1e6:9.1f} us  {ratio:>6}  err {err:.1e}"
                 f"  (compile {compile_s:.1f} s) {summary}", lines)


def _gemv_layer(dtype: str, n: int, k: int) -> torch.nn.Module:
    """A linear layer of `n` x `k` whose weight is stored as `dtype` (random values)."""
    from torchburn.llm.model.decoder import HalfLinear
    from torchburn.quant import BlockWeight, QuantizedLinear

    lin = torch.nn.Linear(k, n, bias=False)
    if dtype == "f32":
        return lin
    if dtype == "f16":
        half = HalfLinear(k, n, bias=False)
        half.weight.data = lin.weight.data.half()
        return half
    if dtype in ("int4", "int8"):
        return QuantizedLinear.from_float(lin, dtype, 32 if dtype == "int4" else None, True, torch.float16)
    from torchburn.ir.qblocks import BLOCK_TYPES

    bt = BLOCK_TYPES[dtype]
    # bytes below 0x3c: every float16 field (scales) finite and below 1
    raw = torch.randint(0, 0x3C, (n, k // bt.block * bt.nbytes), dtype=torch.uint8)
    return QuantizedLinear.from_weight(BlockWeight(raw, dtype), None)


def sweep_gemv(shapes: list[str], dtypes: list[str], lanes: list[str], record: dict[str, Any], lines: list[str],
               iters: int) -> None:
    """Each decode-step product (one row of x) in each weight dtype and each `row_lanes`:
    our kernel time against PyTorch CUDA's f16 and f32 GEMV (cuBLAS) of the same shape."""
    for shape in shapes:
        n, k = (int(x) for x in shape.split("x"))
        x = torch.randn(1, k)
        w = torch.randn(n, k)
        ref32 = cuda_kernels(lambda a, b: a @ b.t(), (x, w), iters)
        ref16 = cuda_kernels(lambda a, b: a @ b.t(), (x.half(), w.half()), iters)
        rows = record.setdefault("gemv", {}).setdefault(shape, {"torch_f32_s": ref32, "torch_f16_s": ref16})
        emit(f"GEMV {shape}: PyTorch CUDA f32 {ref32 * 1e6:.1f} us, f16 {ref16 * 1e6:.1f} us" if ref32 else
             f"GEMV {shape}", lines)
        for dtype in dtypes:
            try:
                layer = _gemv_layer(dtype, n, k)
                with torch.no_grad():
                    expected = layer(x)
            except Exception as e:  # noqa: BLE001 - a dtype the shape cannot take (block size)
                emit(f"  {dtype:>5}: skipped: {type(e).__name__}: {str(e)[:120]}", lines)
                continue
            for lane in lanes:
                opts = {"passes": {"before-codegen": [f"gpu-map{{row_lanes={lane}}}"]}}
                try:
                    _, launchers, out = ours(layer, (x,), opts)
                    if not launchers:
                        raise RuntimeError("no new kernels: the same program as an earlier row")
                    t = kernel_time(launchers, iters)
                    err = float((out - expected).abs().max() / (expected.abs().max() + 1e-30))
                    summary = [s for z in launchers for s in z.compiled.kernel_summary()]
                except Exception as e:  # noqa: BLE001 - one setting failing does not stop the sweep
                    emit(f"  {dtype:>5} lanes {lane:>3}: failed: {type(e).__name__}: {' '.join(str(e).split())[:150]}",
                         lines)
                    continue
                rows.setdefault(dtype, {})[lane] = {"seconds": t, "rel_err": err, "kernels": summary}
                vs = f"  {ref16 / t:.2f}x CUDA f16" if ref16 else ""
                emit(f"  {dtype:>5} lanes {lane:>3}: {t * 1e6:8.1f} us{vs}  err {err:.1e}  {summary}", lines)


def sweep_attention(shapes: list[str], tiles: list[str], record: dict[str, Any], lines: list[str], iters: int) -> None:
    for shape in shapes:
        b, h, t_, d = (int(x) for x in shape.split("x"))
        q, k, v = (torch.randn(b, h, t_, d) for _ in range(3))
        fn: Callable[..., Any] = lambda x, y, z: F.scaled_dot_product_attention(x, y, z, is_causal=True)  # noqa: E731
        ref = cuda_kernels(fn, (q, k, v), iters)
        expected = fn(q.cuda(), k.cuda(), v.cuda()).cpu() if torch.cuda.is_available() else fn(q, k, v)
        rows = record.setdefault("attention", {}).setdefault(shape, {"torch_s": ref})
        emit(f"attention causal {shape}: PyTorch {ref * 1e6:.1f} us" if ref else f"attention causal {shape}", lines)
        for tile in tiles:
            opts = {"passes": {"before-codegen": [f"gpu-map{{attention_tile={tile.partition('@')[0]}}}"]}}
            try:
                t0 = time.perf_counter()
                with wgpu_checks(tile):
                    _, launchers, out = ours(fn, (q, k, v), opts)
                compile_s = time.perf_counter() - t0
                if not launchers:  # the compile cache handed back an earlier row's program
                    raise RuntimeError("no new kernels: the same program as an earlier row")
                t = kernel_time(launchers, iters)
                err = float((out - expected).abs().max())
                summary = [s for x in launchers for s in x.compiled.kernel_summary() if "attention" in s]
            except Exception as e:  # noqa: BLE001
                emit(f"  {tile:>12}: failed: {type(e).__name__}: {' '.join(str(e).split())[:150]}", lines)
                rows[tile] = {"error": str(e)}
                continue
            rows[tile] = {"seconds": t, "max_abs_err": err, "compile_s": compile_s, "kernels": summary}
            ratio = f"{ref / t:.2f}x" if ref else ""
            emit(f"  {tile:>12}: {t * 1e6:9.1f} us  {ratio:>6}  err {err:.1e}  (compile {compile_s:.1f} s) {summary}",
                 lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (software adapters)")
    ap.add_argument("--gemm-shapes", default=",".join(GEMM_SHAPES))
    ap.add_argument("--gemm-tiles", default=",".join(GEMM_TILES))
    ap.add_argument("--attention-shapes", default=",".join(ATTENTION_SHAPES))
    ap.add_argument("--attention-tiles", default=",".join(ATTENTION_TILES))
    ap.add_argument("--gemv-shapes", default=",".join(GEMV_SHAPES))
    ap.add_argument("--gemv-dtypes", default=",".join(GEMV_DTYPES))
    ap.add_argument("--gemv-lanes", default=",".join(GEMV_LANES))
    ap.add_argument("--only", default="gemm,attention", help="parts in the order to run them (gemm, attention, gemv)")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--json", help="write the figures as JSON here")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    info = torchburn.gpu_info()
    if info is None or torchburn.active_engine() != "wgpu":
        sys.exit("no WebGPU adapter: nothing to sweep")
    record: dict[str, Any] = {"adapter": info, "torch": torch.__version__}
    lines: list[str] = []
    emit(f"adapter: {info['name']} ({info['backend']}); torch {torch.__version__}", lines)
    if args.quick:
        args.gemm_shapes, args.attention_shapes, args.gemv_shapes = "200x260x132", "1x2x70x16", "70x256"
    try:
        for part in args.only.split(","):  # in the order given
            if part == "gemm":
                sweep_gemm(args.gemm_shapes.split(","), args.gemm_tiles.split(","), record, lines, args.iters)
            elif part == "attention":
                sweep_attention(args.attention_shapes.split(","), args.attention_tiles.split(","), record, lines,
                                args.iters)
            elif part == "gemv":
                sweep_gemv(args.gemv_shapes.split(","), args.gemv_dtypes.split(","), args.gemv_lanes.split(","),
                           record, lines, args.iters)
    finally:
        if args.json:
            Path(args.json).write_text(json.dumps(record, indent=2, default=str) + "\n")


if __name__ == "__main__":
    main()
