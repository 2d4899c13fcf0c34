"""The CPU attention kernel (`passes/loopgen/attention.py`) against eager PyTorch's
`scaled_dot_product_attention`, per layer shape of the default model (SmolLM2-135M: 9 query
heads over 3 key/value heads of 64).

    python benchmarks/bench_attention_cpu.py --threads 1 --clock cpu
    python benchmarks/bench_attention_cpu.py --lengths 128,512 --forms causal,engine

Forms:
- `causal`: one segment, `causal = true` (what `F.scaled_dot_product_attention(is_causal=True)`
  becomes), Tq = Tk = T;
- `engine`: what the LLM engine's prefill chunk of T tokens computes after `P` filled cache
  slots: a past segment and the step's own keys, each with an additive mask (`decoder.py`),
  against sdpa on the concatenated keys with the concatenated mask;
- `decode`: one query row over a cache of T filled slots (the engine's decode step).

Each graph goes through the default pipeline and is called on numpy arrays, once as it is and
once with `lower-to-loops{attention_tiles=false}` (the row form: one dot product and one
horizontal sum per score, the kernel before the tile form); the three contenders run in
interleaved rounds (`--rounds`), each timed by `--clock` (`cpu`: process CPU time, which on a
shared machine leaves out time spent descheduled), summarized by the median and the range.
The load average is printed.
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

HQ, HK, D = 9, 3, 64
MASKED = float(np.finfo(np.float32).min)


def _graph(form: str, t: int, past: int) -> str:
    q = f"%q: f32[1, {HQ}, {t if form != 'decode' else 1}, {D}]"
    if form == "causal":
        return (f"graph @main({q}, %k: f32[1, {HK}, {t}, {D}], %v: f32[1, {HK}, {t}, {D}]) {{\n"
                f"  %0 = attention(%q, %k, %v) {{scale = 0.125, causal = true, masked = false, segments = 1}}"
                f" : f32[1, {HQ}, {t}, {D}]\n  return %0\n}}")
    tq = t if form == "engine" else 1
    p = past if form == "engine" else t
    return (f"graph @main({q}, %kp: f32[1, {HK}, {p}, {D}], %vp: f32[1, {HK}, {p}, {D}], "
            f"%k: f32[1, {HK}, {tq}, {D}], %v: f32[1, {HK}, {tq}, {D}], %mp: f32[1, 1, {tq}, {p}], "
            f"%mn: f32[1, 1, {tq}, {tq}]) {{\n"
            f"  %0 = expand(%mp) {{shape = [1, {HQ}, {tq}, {p}]}} : f32[1, {HQ}, {tq}, {p}]\n"
            f"  %1 = expand(%mn) {{shape = [1, {HQ}, {tq}, {tq}]}} : f32[1, {HQ}, {tq}, {tq}]\n"
            f"  %2 = attention(%q, %kp, %vp, %k, %v, %0, %1) {{scale = 0.125, causal = false, masked = true, "
            f"segments = 2}} : f32[1, {HQ}, {tq}, {D}]\n  return %2\n}}")


def _arrays(form: str, t: int, past: int, filled: int) -> dict[str, np.ndarray]:
    """Random q, k, v; the engine's masks: past slot j is attended when j < filled (the step's own
    slots at the end of the past view are masked), own key j when j <= i."""
    rng = np.random.default_rng(0)
    tq = t if form != "decode" else 1
    out = {"q": rng.standard_normal((1, HQ, tq, D), np.float32), "out0": np.zeros((1, HQ, tq, D), np.float32)}
    if form == "causal":
        out["k"] = rng.standard_normal((1, HK, t, D), np.float32)
        out["v"] = rng.standard_normal((1, HK, t, D), np.float32)
        return out
    p = past if form == "engine" else t
    out["kp"] = rng.standard_normal((1, HK, p, D), np.float32)
    out["vp"] = rng.standard_normal((1, HK, p, D), np.float32)
    out["k"] = rng.standard_normal((1, HK, tq, D), np.float32)
    out["v"] = rng.standard_normal((1, HK, tq, D), np.float32)
    out["mp"] = np.where(np.arange(p)[None, :] < filled, 0.0, MASKED).astype(np.float32).repeat(tq, 0)[None, None]
    out["mn"] = np.where(np.arange(tq)[None, :] <= np.arange(tq)[:, None], 0.0, MASKED).astype(np.float32)[None, None]
    return out


class Compiled:
    """The graph through the default pipeline, callable on the arrays."""

    def __init__(self, text: str, tiles: bool = True) -> None:
        from torchburn.codegen import emit_program, entry_name, host_target
        from torchburn.ir.parser import parse_graph
        from torchburn.passes.base import PassManager
        from torchburn.passes.lower_to_loops import LowerToLoops
        from torchburn.passes.pipeline import Pipeline
        from torchburn.runtime import jit

        target = host_target()
        pipeline = Pipeline.default()
        pipeline.lowering = LowerToLoops(attention_tiles=tiles)
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


def _eager(form: str, arrays: dict[str, np.ndarray]) -> Callable[[], object]:
    import torch
    import torch.nn.functional as F

    t = {k: torch.from_numpy(v) for k, v in arrays.items()}
    if form == "causal":
        return lambda: F.scaled_dot_product_attention(t["q"], t["k"], t["v"], is_causal=True, scale=0.125,
                                                      enable_gqa=True)
    k = torch.cat([t["kp"], t["k"]], -2)
    v = torch.cat([t["vp"], t["v"]], -2)
    mask = torch.cat([t["mp"], t["mn"]], -1)
    return lambda: F.scaled_dot_product_attention(t["q"], k, v, attn_mask=mask, scale=0.125, enable_gqa=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", default="128,256,512", help="T: tokens of the step (decode: filled slots)")
    p.add_argument("--forms", default="causal,engine,decode")
    p.add_argument("--filled", type=int, default=256,
                   help="engine form: cache slots filled before the step (the chunk after the first)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    args = p.parse_args(argv)
    os.environ["TORCHBURN_NUM_THREADS"] = str(args.threads)
    os.environ.setdefault("TORCHBURN_CACHE_DIR", "off")
    import torch

    torch.set_num_threads(args.threads)
    clock = time.process_time if args.clock == "cpu" else time.perf_counter
    print("| form | T | keys | torchburn ms | row form ms | eager sdpa ms | torchburn / eager | row form / eager |")
    print("|---|---:|---|---:|---:|---:|---:|---:|")
    for form in args.forms.split(","):
        for t in (int(x) for x in args.lengths.split(",")):
            past = args.filled + t
            arrays = _arrays(form, t, past, args.filled)
            ours = Compiled(_graph(form, t, past)).bind(arrays)
            rows = Compiled(_graph(form, t, past), tiles=False).bind(arrays)
            eager = _eager(form, arrays)
            expected = eager().numpy()
            for name, fn in (("torchburn", ours), ("the row form", rows)):
                arrays["out0"][...] = np.nan
                fn()
                err = float(np.abs(arrays["out0"] - expected).max())
                if not err <= 1e-3:
                    raise SystemExit(f"{form} T={t}: {name} differs from eager by {err}")
            contenders = {"ours": ours, "rows": rows, "eager": eager}
            times: dict[str, list[float]] = {name: [] for name in contenders}
            reps = max(1, int(2e7 / (t * max(t, 64) * HQ * D)))  # ~ the same work per timed batch
            for r in range(args.rounds):
                for name in (contenders if r % 2 == 0 else reversed(list(contenders))):
                    f = contenders[name]
                    t0 = clock()
                    for _ in range(reps):
                        f()
                    times[name].append((clock() - t0) / reps)
            med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
            rng = {n: f"{min(v) * 1e3:.3f}-{max(v) * 1e3:.3f}" for n, v in times.items()}
            keys = {"causal": f"{t} causal", "engine": f"{past} past ({args.filled} filled) + {t} own",
                    "decode": f"{t} filled"}[form]
            print(f"| {form} | {t} | {keys} | {med['ours']:.3f} ({rng['ours']}) | {med['rows']:.3f} ({rng['rows']}) "
                  f"| {med['eager']:.3f} ({rng['eager']}) | {med['ours'] / med['eager']:.2f}x "
                  f"| {med['rows'] / med['eager']:.2f}x |", flush=True)
    print(f"threads {args.threads}, {args.clock} time, median (range) of {args.rounds} interleaved rounds; "
          f"load average {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
