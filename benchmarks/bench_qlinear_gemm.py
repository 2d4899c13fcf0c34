"""Many-row quantized linears (prefill): the `qlinear` kernel's forms (`form` attribute) per
weight layout, and eager PyTorch on the dequantized weight.

    python benchmarks/bench_qlinear_gemm.py                      # 512 x 2048 -> 8192, 1 thread
    python benchmarks/bench_qlinear_gemm.py --rows 64 --threads 2 --types Q4_K,Q6_K,int4 --forms panel,rows,gemm
    python benchmarks/bench_qlinear_gemm.py --rows 16 --k 576 --n 3072 --types int4 --forms rows --calls 50

Each layout's graph (`qlinear` plus a bias) is compiled through the default pipeline once per
form (`panel`: int8 x by a packed weight panel, `passes/quant/qgemm_i8.py`; `gemm`:
dequantize + float GEMM, `qlinear-to-gemm`; `rows`: the weight streamed row by row, the
GEMV's kernel), and all run interleaved on the same arrays
(`--rounds` rounds, median and range of the process's CPU time, or wall time with
`--clock wall`); eager is `x @ w.T + b` in PyTorch on the f32 weight, same threads. GFLOP/s
count 2 M N K. The load average is printed: on a shared machine read CPU time.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _graph(kind: str, m: int, n: int, k: int, form: str = "auto") -> str:
    from torchburn.ir.qblocks import BLOCK_TYPES

    if kind in BLOCK_TYPES:
        bt = BLOCK_TYPES[kind]
        ins = f"%x: f32[{m}, {k}], %q: u8[{n}, {k // bt.block * bt.nbytes}], %b: f32[{n}]"
        call = f'qlinear(%x, %q) {{kind = "blocks", block_type = "{kind}", group_size = {bt.block}, symmetric = true, form = "{form}"}}'
    elif kind == "int8":  # Q8_0's form: int8 codes, an f16 scale per group of 32
        ins = f"%x: f32[{m}, {k}], %q: i8[{n}, {k}], %s: f16[{n}, {k // 32}], %b: f32[{n}]"
        call = f'qlinear(%x, %q, %s) {{kind = "int8", group_size = 32, symmetric = true, form = "{form}"}}'
    else:  # int4 with mins (Q4_1's form), group 32
        ins = f"%x: f32[{m}, {k}], %q: u8[{n}, {k // 2}], %s: f16[{n}, {k // 32}], %mn: f16[{n}, {k // 32}], %b: f32[{n}]"
        call = f'qlinear(%x, %q, %s, %mn) {{kind = "int4", group_size = 32, symmetric = false, form = "{form}"}}'
    return (f"graph @main({ins}) {{\n  %0 = {call} : f32[{m}, {n}]\n"
            f"  %1 = expand(%b) {{shape = [{m}, {n}]}} : f32[{m}, {n}]\n  %2 = add(%0, %1) : f32[{m}, {n}]\n"
            f"  return %2\n}}")


def _arrays(kind: str, m: int, n: int, k: int) -> dict[str, np.ndarray]:
    from torchburn.ir.qblocks import BLOCK_TYPES, f16_offsets

    rng = np.random.default_rng(0)
    out = {"x": rng.standard_normal((m, k)).astype(np.float32), "b": rng.standard_normal(n).astype(np.float32),
           "out0": np.zeros((m, n), np.float32)}
    if kind in BLOCK_TYPES:
        bt = BLOCK_TYPES[kind]
        raw = rng.integers(0, 256, (n, k // bt.block, bt.nbytes), dtype=np.uint8)
        for o in f16_offsets(bt):
            raw[:, :, o:o + 2] = np.full((n, k // bt.block), 0.01, np.float16).view(np.uint8).reshape(n, -1, 2)
        out["q"] = raw.reshape(n, -1)
    elif kind == "int8":
        out["q"] = rng.integers(-127, 128, (n, k), dtype=np.int8)
        out["s"] = np.full((n, k // 32), 0.01, np.float16)
    else:
        out["q"] = rng.integers(0, 256, (n, k // 2), dtype=np.uint8)
        out["s"] = np.full((n, k // 32), 0.01, np.float16)
        out["mn"] = np.full((n, k // 32), -0.08, np.float16)
    return out


class Compiled:
    """The graph through the default pipeline (less `without`), callable on the arrays."""

    def __init__(self, text: str, without: tuple[str, ...]) -> None:
        from torchburn.codegen import emit_program, entry_name, host_target
        from torchburn.ir.parser import parse_graph
        from torchburn.passes.base import PassManager
        from torchburn.passes.pipeline import Pipeline
        from torchburn.runtime import jit

        pipeline = Pipeline.default()
        pipeline.tensor = [p for p in pipeline.tensor if p.name not in without]
        target = host_target()
        self.program = PassManager(pipeline.passes(), target=target).run(parse_graph(text))
        self.native = jit.load_object(jit.compile_llvm_ir(emit_program(self.program, target), target))
        self.entry = self.native.entry(entry_name(self.program))
        size = int(getattr(self.program.workspace_bytes, "value", 0))
        self.ws = np.zeros(size + 64, np.uint8) if size else None

    def bind(self, arrays: dict[str, np.ndarray]) -> Callable[[], None]:
        names = [b.name for b in (*self.program.inputs, *self.program.outputs)]
        ptrs = (ctypes.c_void_p * len(names))(*[arrays[n].ctypes.data for n in names])
        syms = (ctypes.c_int64 * 1)()
        ws = None if self.ws is None else self.ws.ctypes.data
        return lambda: self.entry(ctypes.addressof(ptrs), ctypes.addressof(syms), ws)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=512)
    p.add_argument("--k", type=int, default=2048)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--types", default="Q4_K,Q6_K,Q5_0,Q8_0,int4,int8")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    p.add_argument("--forms", default="panel,gemm", help="qlinear forms to time (panel, gemm, rows, tiles: AMX)")
    p.add_argument("--calls", type=int, default=1,
                   help="calls per timing (short calls: a few rows of a small weight); times are per call")
    args = p.parse_args(argv)
    os.environ["TORCHBURN_THREADS"] = str(args.threads)
    os.environ.setdefault("TORCHBURN_CACHE_DIR", "off")
    import torch

    from torchburn.quant.blocks import dequantize_block_rows

    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    m, n, k = args.rows, args.n, args.k
    flops = 2.0 * m * n * k
    forms = args.forms.split(",")
    print("| weight | M x K -> N | " + " | ".join(f"{f} ms" for f in forms) + " | eager (f32 weight) ms | "
          + " | ".join(f"eager / {f}" for f in forms) + " |")
    print("|---|---|" + "---:|" * (2 * len(forms) + 1))
    for kind in args.types.split(","):
        arrays = _arrays(kind, m, n, k)
        compiled = {f: Compiled(_graph(kind, m, n, k, f), ()).bind(arrays) for f in forms}
        if kind == "int4":
            codes = np.concatenate([arrays["q"].reshape(n, -1, 16) & 15, arrays["q"].reshape(n, -1, 16) >> 4], -1)
            w = torch.from_numpy((codes * arrays["s"][:, :, None].astype(np.float32)
                                  + arrays["mn"][:, :, None].astype(np.float32)).reshape(n, k).astype(np.float32))
        elif kind == "int8":
            w = torch.from_numpy((arrays["q"].reshape(n, -1, 32) * arrays["s"][:, :, None].astype(np.float32))
                                 .reshape(n, k).astype(np.float32))
        else:
            w = dequantize_block_rows(torch.from_numpy(arrays["q"]), kind)
        x, b = torch.from_numpy(arrays["x"]), torch.from_numpy(arrays["b"])
        contenders = {**compiled, "eager": lambda: torch.addmm(b, x, w.T)}
        times: dict[str, list[float]] = {name: [] for name in contenders}
        for f in contenders.values():
            f()
        for r in range(args.rounds):
            for name in (contenders if r % 2 == 0 else reversed(list(contenders))):
                fn = contenders[name]
                t0 = clock()
                for _ in range(args.calls):
                    fn()
                times[name].append((clock() - t0) / args.calls)
        med = {name: statistics.median(t) * 1e3 for name, t in times.items()}
        spread = {name: f"{min(t) * 1e3:.3f}-{max(t) * 1e3:.3f}" for name, t in times.items()}
        cells = [f"{med[f]:.3f} ({spread[f]}; {flops / med[f] / 1e6:.0f} GFLOP/s)" for f in forms]
        ratios = [f"{med['eager'] / med[f]:.2f}x" for f in forms]
        print(f"| {kind} | {m} x {k} -> {n} | " + " | ".join(cells) + f" | {med['eager']:.3f} | "
              + " | ".join(ratios) + " |", flush=True)
    print(f"threads {args.threads}, {args.clock} time, median (range) of {args.rounds}; load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
