"""Host-side cost of one LLM decode step on the GPU engine: wgpu calls and host microseconds.

    TORCHBURN_DEVICE=gpu python benchmarks/bench_gpu_host.py                  # 2 layers, SmolLM2 width
    TORCHBURN_DEVICE=gpu python benchmarks/bench_gpu_host.py --layers 30 --vocab 49152   # SmolLM2-135M
    TORCHBURN_DEVICE=gpu python benchmarks/bench_gpu_host.py --checkpoint /tmp/smol135  # an existing one
    ... --profile 25     # also the 25 costliest functions (cProfile, cumulative) of the counted steps
    ... --python-encode  # dispatches encoded by the Python loop, not the native one (A/B)
    ... --gpu-time       # also the GPU's own time per step (timestamp queries, where the adapter has them)
    ... --gguf Q4_K_M    # the same model as a GGUF of llama.cpp's Q4_K_M tensor types (random blocks)
    ... --kernels 15     # also the step's dispatches run back to back, and each alone (the 15 costliest kernels)
    TORCHBURN_LLM_STEP_CACHE=off ...   # each step through Dynamo's guards, not the step cache (A/B)

A random-weight Llama of SmolLM2-135M's shape (hidden 576, 9 heads, 3 KV heads, intermediate
1536; `--layers`, `--vocab` and `--hidden` shrink it for a software adapter) is loaded with
`device="gpu"`, warmed up (prefill and decode compiled, buffers made), then `--tokens` greedy
decode steps run twice: once while `torchburn.runtime.gpu_calls.count_calls()` counts the wgpu
calls (through wgpu's public methods), once timed without the counting wrappers.
Printed per decode step: dispatches, buffers / bind groups / command encoders created,
write_buffer, submits, map and read calls; and the host time: the whole step, the step less
the wait for the GPU (the host's own time: the greedy decode submits step t+1 before it waits
for step t's token, so on a real GPU a step takes about the larger of this and the GPU time),
the GPU launcher's submission (binding, residency checks, the program's run: buffers, uploads
and encoding, then `submit`, then encoding the next run's commands ahead) and its result (the
wait for the GPU's work, on llvmpipe's OpenGL path done inside `submit`; reading; the results).
`--json` writes the same figures.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

SHOWN = ("dispatch_workgroups", "set_pipeline", "set_bind_group", "create_buffer", "create_bind_group",
         "create_command_encoder", "begin_compute_pass", "copy_buffer_to_buffer", "write_buffer", "submit",
         "map_sync", "read_mapped", "create_compute_pipeline", "create_shader_module")


def checkpoint(args: argparse.Namespace) -> Path:
    from bench_llm_gpu import SMOLLM2_135M, make_checkpoint

    if args.checkpoint and (Path(args.checkpoint) / "config.json").is_file():
        return Path(args.checkpoint)
    config = dict(SMOLLM2_135M, num_hidden_layers=args.layers, vocab_size=args.vocab, hidden_size=args.hidden)
    if args.hidden != SMOLLM2_135M["hidden_size"]:
        config.update(num_attention_heads=max(1, args.hidden // 64), num_key_value_heads=1,
                      intermediate_size=args.hidden * 8 // 3)
    folder = Path(args.checkpoint or tempfile.mkdtemp(prefix="bench_gpu_host_"))
    folder.mkdir(parents=True, exist_ok=True)
    return make_checkpoint(folder, config)


def encode_ab(launcher: Any, rounds: int = 7, iters: int = 50) -> dict[str, float]:
    """Host microseconds to encode the last run's dispatches of `launcher`'s program (a new
    encoder, one compute pass, every dispatch, `finish`; nothing submitted): by the native loop
    (`runtime/gpu_encode.py`), by the Python loop, and with no dispatch (what the encoder and the
    pass cost alone); interleaved rounds, medians. Empty when the native loop is unavailable."""
    import statistics

    from torchburn.runtime.gpu_encode import NativeEncoder

    prog = launcher.gpu
    last = prog._last_dispatches
    if last is None or NativeEncoder.get() is None:
        return {}
    dispatches = last[2]
    saved = NativeEncoder.enabled

    def per_call(native: bool, what: list[Any]) -> float:
        NativeEncoder.enabled = native
        t0 = time.perf_counter()
        for _ in range(iters):
            encoder = prog.dev.device.create_command_encoder()
            prog._encode(encoder, what)
            encoder.finish()
        return (time.perf_counter() - t0) / iters * 1e6

    samples: dict[str, list[float]] = {"native": [], "python": [], "empty": []}
    try:
        for _ in range(rounds):
            samples["native"].append(per_call(True, dispatches))
            samples["python"].append(per_call(False, dispatches))
            samples["empty"].append(per_call(True, []))
    finally:
        NativeEncoder.enabled = saved
    med = {k: statistics.median(v) for k, v in samples.items()}
    n = len(dispatches)
    return {"dispatches": float(n), "native us": med["native"], "python us": med["python"], "empty us": med["empty"],
            "native us/dispatch": (med["native"] - med["empty"]) / n,
            "python us/dispatch": (med["python"] - med["empty"]) / n}


def kernel_times(launcher: Any, top: int, iters: int = 20) -> dict[str, Any]:
    """Device time of the last run's dispatches of `launcher`'s program: all of them back to back
    in one pass (`iters` runs a submission, median of 5), and each one alone, summed per kernel;
    on the device clock where the adapter has timestamp queries, else host-measured (submit to
    done), so a dispatch alone includes a submission's fixed cost / iters."""
    prog = launcher.gpu
    last = prog._last_dispatches
    if last is None:
        return {}
    plan, _, dispatches = last
    calls = [k for (k, _), dims in zip(prog.calls, plan.groups) if 0 not in dims]
    whole = prog._time(dispatches, iters) * 1e6
    per: dict[str, list[float]] = {}
    for k, d in zip(calls, dispatches):
        key = f"{prog.shaders[k].name} {prog.shaders[k].summary}"[:110]
        per.setdefault(key, []).append(prog._time([d], iters, rounds=3) * 1e6)
    rows = sorted(((sum(v), len(v), name) for name, v in per.items()), reverse=True)
    return {"back_to_back_us": whole, "alone_sum_us": sum(r[0] for r in rows), "dispatches": len(dispatches),
            "kernels": [{"kernel": name, "dispatches": n, "us": us} for us, n, name in rows[:top]]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--hidden", type=int, default=576)
    p.add_argument("--quant", default=None, help="int8, int4 (default: f32 weights)")
    p.add_argument("--gguf", default=None, choices=("Q4_K_M",),
                   help="load the checkpoint written as a GGUF of these tensor types (bench_llm_gpu.make_gguf)")
    p.add_argument("--tokens", type=int, default=16, help="decode steps counted")
    p.add_argument("--checkpoint", default=None, help="reuse (or keep) the random checkpoint here")
    p.add_argument("--profile", type=int, default=0, help="print this many cProfile rows")
    p.add_argument("--profile-sort", default="cumulative", choices=("cumulative", "tottime"),
                   help="order of the cProfile rows (tottime: a function's own time, where the host's "
                        "microseconds go once the wait for the GPU is set aside)")
    p.add_argument("--python-encode", action="store_true",
                   help="encode dispatches from Python, not the native loop (runtime/gpu_encode.py)")
    p.add_argument("--gpu-time", action="store_true",
                   help="time each run's compute pass on the device (timestamp queries; GpuProgram.time_gpu)")
    p.add_argument("--kernels", type=int, default=0,
                   help="also time the step's dispatches back to back and alone; print this many kernels")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)

    from torchburn.backend import gpu_launcher as gl
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams
    from torchburn.runtime.gpu import get_device
    from torchburn.runtime.gpu_calls import count_calls

    if args.python_encode:
        from torchburn.runtime.gpu_encode import NativeEncoder

        NativeEncoder.enabled = False
    if args.gpu_time:
        from torchburn.runtime.gpu import GpuProgram

        GpuProgram.time_gpu = True
    folder = checkpoint(args)
    if args.gguf:
        from bench_llm_gpu import make_gguf

        folder = make_gguf(folder, args.gguf)
    llm = LLM.from_pretrained(folder, device="gpu", max_context=args.tokens + 64,
                              **({"quant": args.quant} if args.quant else {}))
    llm.eos_ids = frozenset()
    greedy = SamplingParams(temperature=0.0)
    prompt = [[3, 5, 7, 11]]
    list(llm.generate_ids(prompt, args.tokens + 1, greedy))  # compiles prefill and decode, makes the buffers

    # a launcher call is its submission (`GpuLauncher.submit`: binding, checks, uploads, encoding,
    # submit) and its result (`PendingCall.result`: waiting for the GPU, reading, the results);
    # the greedy decode submits step t+1 between the two of step t
    launcher_s = [0.0, 0.0]
    submit_fn, result_fn = gl.GpuLauncher.submit, gl.PendingCall.result

    def timed_submit(self: Any, *a: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        try:
            return submit_fn(self, *a, **kw)
        finally:
            launcher_s[0] += time.perf_counter() - t

    def timed_result(self: Any) -> Any:
        t = time.perf_counter()
        try:
            return result_fn(self)
        finally:
            launcher_s[1] += time.perf_counter() - t

    def snapshot() -> dict[int, tuple[int, int, float, float, float, float]]:
        return {id(x): (x.calls, x.gpu.dispatches, x.gpu.times.encode_s, x.gpu.times.submit_s, x.gpu.times.wait_s,
                        x.gpu.times.gpu_s, x.gpu.times.ahead_s, x.gpu.ahead_runs) for x in gl.recent_launchers()}

    # 1. counted: the same steps (the prompt again: lengths the warm-up reached) under count_calls
    steps = llm.generate_ids(prompt, args.tokens + 1, greedy)
    next(steps)  # the prefill (and first token): not counted
    with count_calls() as calls:
        n = sum(1 for _ in steps)
        counted = dict(calls)
    assert n == args.tokens, n
    # 2. timed: no counting wrappers (the engine's fast encoding path), optionally profiled
    prof = cProfile.Profile() if args.profile else None
    gl.GpuLauncher.submit = timed_submit  # type: ignore[method-assign]
    gl.PendingCall.result = timed_result  # type: ignore[method-assign]
    try:
        steps = llm.generate_ids(prompt, args.tokens + 1, greedy)
        next(steps)
        launcher_s[:] = [0.0, 0.0]
        base = snapshot()
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        n = sum(1 for _ in steps)
        wall = time.perf_counter() - t0
        if prof:
            prof.disable()
    finally:
        gl.GpuLauncher.submit = submit_fn  # type: ignore[method-assign]
        gl.PendingCall.result = result_fn  # type: ignore[method-assign]
    encode = submit = wait = gpu = ahead = 0.0
    programs = []
    for x in gl.recent_launchers():
        c0, d0, e0, s0, w0, g0, a0, r0 = base.get(id(x), (0, 0, 0.0, 0.0, 0.0, 0.0, 0.0, 0))
        if x.calls > c0:
            t = x.gpu.times
            encode += t.encode_s - e0
            submit += t.submit_s - s0
            wait += t.wait_s - w0
            gpu += t.gpu_s - g0
            ahead += t.ahead_s - a0
            programs.append({"program": x.program.name, "calls": x.calls - c0, "kernels": len(x.program.kernels),
                             "pinned_calls": x.pinned_calls, "encoded_ahead_runs": x.gpu.ahead_runs - r0,
                             "dispatches_per_call": (x.gpu.dispatches - d0) / (x.calls - c0),
                             "fallbacks": x.eager_fallbacks})
    dev = get_device()
    per = {k: counted.get(k, 0) / n for k in SHOWN}
    us = {"step": wall / n * 1e6, "host (step - wait)": (wall - wait) / n * 1e6,
          "launcher submit": launcher_s[0] / n * 1e6, "launcher result": launcher_s[1] / n * 1e6,
          "run: buffers+encode": encode / n * 1e6, "run: submit": (submit - encode) / n * 1e6,
          "run: wait+read": wait / n * 1e6, "run: encode next": ahead / n * 1e6}
    us["outside launcher"] = us["step"] - us["launcher submit"] - us["launcher result"]
    if args.gpu_time and not get_device().timestamps:
        print("--gpu-time: the adapter has no timestamp queries; no GPU time")
    elif args.gpu_time:
        us["GPU (timestamps)"] = gpu / n * 1e6
    us["launcher before run"] = us["launcher submit"] - submit / n * 1e6 - us["run: encode next"]
    us["result after wait"] = us["launcher result"] - us["run: wait+read"]
    print(f"adapter: {dev.adapter.info.get('device')} ({dev.adapter.info.get('backend_type')}), "
          f"storage buffers per stage {dev.caps.max_storage_buffers}")
    print(f"checkpoint {folder}: {n} decode steps, programs: {programs}")
    print("wgpu calls per decode step (counted through wgpu's public calls, whose map_sync submits an empty "
          "command buffer of its own: 2 submits; uncounted runs submit once):")
    for k in SHOWN:
        print(f"  {k:24s} {per[k]:8.1f}")
    print("host microseconds per decode step:")
    for k, v in us.items():
        print(f"  {k:24s} {v:10.0f}")
    print(f"{n / wall:.1f} tokens/s")
    encode = encode_ab(max(gl.recent_launchers(), key=lambda x: x.calls))
    if encode:
        print("encoding the decode step's dispatches alone (encoder, pass, dispatches, finish; no submit), "
              "median of 7 interleaved rounds of 50:")
        for k, v in encode.items():
            print(f"  {k:24s} {v:10.1f}")
    kernels = kernel_times(max(gl.recent_launchers(), key=lambda x: x.calls), args.kernels) if args.kernels else {}
    if kernels:
        print(f"device time of the step's {kernels['dispatches']} dispatches (host-timed, submit to done): "
              f"back to back {kernels['back_to_back_us']:.0f} us, each alone summed {kernels['alone_sum_us']:.0f} us")
        for row in kernels["kernels"]:
            print(f"  {row['us']:8.1f} us  {row['dispatches']:4d} x  {row['kernel']}")
    if prof:
        pstats.Stats(prof).sort_stats(args.profile_sort).print_stats(args.profile)
    if args.json:
        Path(args.json).write_text(json.dumps({"calls_per_step": per, "us_per_step": us, "encode_us": encode,
                                               "programs": programs, "kernel_times": kernels,
                                               "tokens_per_s": n / wall}, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
