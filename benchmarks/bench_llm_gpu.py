"""LLM decode tokens/s and time to first token on the GPU: our GPU engine, our CPU engine, and
transformers on PyTorch CUDA (eager, and with the static cache and the compiled forward that
transformers recommends; fp32 and fp16), all on the same random weights.

    python benchmarks/bench_llm_gpu.py                       # SmolLM2-135M shape (the H200 run)
    python benchmarks/bench_llm_gpu.py --shape qwen2.5-0.5b  # Qwen2.5-0.5B's body (896 wide, 24 layers)
    python benchmarks/bench_llm_gpu.py --json out.json --reps 7 --prompt 128 --tokens 128
    python benchmarks/bench_llm_gpu.py --quick               # tiny model, any machine (llvmpipe)
    python benchmarks/bench_llm_gpu.py --only gpu,gpu-int4   # a subset of the contenders
    python benchmarks/bench_llm_gpu.py --only gpu,base:gpu --baseline-tree /tmp/main   # A/B: "base:" rows
                                                             # run that checkout's code, same session

The checkpoint is a random-weight Llama with SmolLM2-135M's configuration (hidden 576, 30
layers, 9 heads, 3 KV heads, intermediate 1536, vocabulary 49152, tied embeddings), made with
transformers and saved as safetensors in a temporary folder, with a word-level
``tokenizer.json`` written with the tokenizers API (the prompt is token ids, so the tokenizer
only has to load).  Needs only torch, transformers, safetensors, tokenizers and torchburn (and
gguf for the GGUF row).  ``gpu-q4km`` loads the same model as a GGUF file of llama.cpp's
Q4_K_M tensor types (`make_gguf`: Q4_K / Q6_K where a row is a multiple of 256 long, else
their fallbacks Q5_0 / Q8_0, as in the Q4_K_M files of these two models; random blocks, so its
tokens are not the safetensors model's).

Every contender runs in its own worker process (our device choice is per process, and CUDA and
wgpu stay apart), is loaded and warmed up first, then the workers run one repetition each in
turn, the order alternating between rounds, so background load hurts them alike.  One
repetition: a ``--prompt``-token prompt, the time until its first generated token is on the
host (TTFT: prefill and one sampled token), then ``--tokens`` greedy decode steps, each token
brought to the host (as a chat does; transformers' static-cache rows run ``generate`` with
``cache_implementation="static"`` and a streamer that brings each token to the host).  Our GPU
rows also give the host time per token (the decode's wall time less the time the GPU programs'
runs waited for the device) and the GPU time per token (each run's compute pass timed with
timestamp queries, where the adapter has them: `GpuProgram.time_gpu`).  Figures are medians with min and max over ``--reps``;
ratios compare medians.  Rows whose engine is missing (no CUDA, no GPU adapter) are skipped with
the reason.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

#: SmolLM2-135M's LlamaConfig (its config.json, less the token ids).
SMOLLM2_135M = dict(hidden_size=576, num_hidden_layers=30, num_attention_heads=9,
                    num_key_value_heads=3, intermediate_size=1536, vocab_size=49152,
                    max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=100000.0,
                    tie_word_embeddings=True)
#: Qwen2.5-0.5B's body (its config.json's sizes; q/k/v biases as Qwen2 has them).
QWEN25_05B = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, vocab_size=151936,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, rope_theta=1000000.0,
                  tie_word_embeddings=True)
SHAPES = {"smollm2-135m": SMOLLM2_135M, "qwen2.5-0.5b": QWEN25_05B}
QUICK = dict(SMOLLM2_135M, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, intermediate_size=128, vocab_size=512,
             max_position_embeddings=256)

#: name -> (worker kind, options)
CONTENDERS: dict[str, tuple[str, dict[str, Any]]] = {
    "torchburn gpu f32": ("ours", {"device": "gpu", "quant": None}),
    "torchburn gpu f16": ("ours", {"device": "gpu", "quant": "f16"}),
    "torchburn gpu int8": ("ours", {"device": "gpu", "quant": "int8"}),
    "torchburn gpu int4": ("ours", {"device": "gpu", "quant": "int4"}),
    "torchburn cpu f32": ("ours", {"device": "cpu", "quant": None}),
    "torchburn gpu gguf Q4_K_M": ("ours", {"device": "gpu", "quant": None, "gguf": "Q4_K_M"}),
    "transformers cuda eager f32": ("hf", {"dtype": "float32"}),
    "transformers cuda eager f16": ("hf", {"dtype": "float16"}),
    "transformers cuda static f32": ("hf", {"dtype": "float32", "static": True}),
    "transformers cuda static f16": ("hf", {"dtype": "float16", "static": True}),
}
SHORT = {"gpu": "torchburn gpu f32", "gpu-f16": "torchburn gpu f16", "gpu-int8": "torchburn gpu int8",
         "gpu-int4": "torchburn gpu int4", "cpu": "torchburn cpu f32", "gpu-q4km": "torchburn gpu gguf Q4_K_M",
         "cuda-f32": "transformers cuda eager f32", "cuda-f16": "transformers cuda eager f16",
         "static-f32": "transformers cuda static f32", "static-f16": "transformers cuda static f16"}
BASELINE = "transformers cuda eager f32"


def make_checkpoint(folder: Path, config: dict[str, Any], seed: int = 0) -> Path:
    """Random-weight Llama safetensors plus a word-level tokenizer of its vocabulary."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models

    torch.manual_seed(seed)
    if config.get("hidden_size") == QWEN25_05B["hidden_size"] and config.get("num_key_value_heads") == 2:
        cfg = transformers.Qwen2Config(**config, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model = transformers.Qwen2ForCausalLM(cfg)
    else:
        cfg = transformers.LlamaConfig(**config, bos_token_id=1, eos_token_id=2, pad_token_id=0)
        model = transformers.LlamaForCausalLM(cfg)
    model.eval().save_pretrained(folder, safe_serialization=True)
    vocab = {f"t{i}": i for i in range(config["vocab_size"])}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "t1", "eos_token": "t2", "pad_token": "t0"}))
    return folder


#: llama.cpp's Q4_K_M per tensor: Q6_K for the output (a tied embedding is it), for attn_v and ffn_down
#: in its "more bits" layers (the first and last eighth, every third between), else Q4_K; a
#: row whose length is not a multiple of 256 takes its fallback (Q4_K -> Q5_0, Q6_K -> Q8_0), as
#: in the Q4_K_M files of SmolLM2-135M (576 wide) and Qwen2.5-0.5B (896 wide) people download.
K_FALLBACK = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}


def _q4_k_m_type(name: str, layer: int, layers: int, in_features: int, tied: bool = True) -> str:
    more_bits = layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2
    head = name == "output" or (name == "token_embd" and tied)  # a tied embedding is the head
    kind = "Q6_K" if head or (name in ("attn_v", "ffn_down") and more_bits) else "Q4_K"
    return kind if in_features % 256 == 0 else K_FALLBACK[kind]


def _random_blocks(type_name: str, rows: int, in_features: int, rng: Any) -> Any:
    """uint8 ``[rows, row bytes]`` of random ggml blocks whose float16 scales are set so that
    the weights stay within about +-0.05 (a random model's size; the codes are random bytes)."""
    import numpy as np
    import torch

    from torchburn.ir.qblocks import BLOCK_TYPES, f16_offsets
    from torchburn.quant.blocks import dequantize_block_rows

    bt = BLOCK_TYPES[type_name]
    n = in_features // bt.block
    raw = rng.integers(0, 256, (rows, n, bt.nbytes), dtype=np.uint8)
    offsets = f16_offsets(bt)
    for scale in (1.0, None):
        if scale is None:  # the largest weight at scales 1.0, brought to 0.05
            top = float(dequantize_block_rows(torch.from_numpy(raw[: min(rows, 64)].reshape(-1, n * bt.nbytes)),
                                              type_name).abs().max())
            scale = 0.05 / max(top, 1e-30)
        for o in offsets:
            raw[:, :, o:o + 2] = np.frombuffer(np.float16(scale).tobytes(), dtype=np.uint8)
    return raw.reshape(rows, n * bt.nbytes)


def make_gguf(folder: Path, ftype: str = "Q4_K_M", seed: int = 0) -> Path:
    """The checkpoint's model as a GGUF file of llama.cpp's `ftype` tensor types (Q4_K_M only),
    next to it (kept): norms in F32, every matrix in random ggml blocks of its type (the
    benchmark times the kernels of each block type; its tokens are a random model's anyway), F16
    where no block fits a row.
    A placeholder vocabulary of the checkpoint's size (ids in, ids out)."""
    import gguf
    import numpy as np
    from safetensors import safe_open

    if ftype != "Q4_K_M":
        raise SystemExit(f"make_gguf writes Q4_K_M files only, not {ftype}")
    path = folder / f"random-{ftype}.gguf"
    if path.is_file():
        return path
    cfg = json.loads((folder / "config.json").read_text())
    arch = "qwen2" if cfg["model_type"] == "qwen2" else "llama"
    layers, heads, kv = cfg["num_hidden_layers"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg["hidden_size"] // heads
    partial = path.with_suffix(".partial")  # a write cut short (a timeout) is never taken for the file
    w = gguf.GGUFWriter(str(partial), arch)
    w.add_block_count(layers)
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(cfg.get("rope_theta", 10000.0))
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_string("tokenizer.ggml.model", "gpt2")
    w.add_array("tokenizer.ggml.tokens", [f"<t{i}>" for i in range(cfg["vocab_size"])])
    w.add_array("tokenizer.ggml.token_type", [1] * cfg["vocab_size"])
    for key, value in (("bos", 1), ("eos", 2), ("padding", 0)):
        w.add_uint32(f"tokenizer.ggml.{key}_token_id", value)
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(arch_enum, layers)
    rng = np.random.default_rng(seed)
    files = sorted(folder.glob("*.safetensors"))
    for file in files:
        with safe_open(str(file), "np") as f:
            for hf_name in f.keys():
                if hf_name == "lm_head.weight" and cfg.get("tie_word_embeddings"):
                    continue
                name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
                if name is None:
                    raise SystemExit(f"no GGUF name for {hf_name}")
                value = f.get_tensor(hf_name).astype(np.float32)
                if value.ndim == 1:  # norms and biases: F32, their values
                    w.add_tensor(name, np.ascontiguousarray(value))
                    continue
                base = name.split(".")[-2] if name.startswith("blk.") else name.split(".")[0]
                layer = int(name.split(".")[1]) if name.startswith("blk.") else 0
                kind = _q4_k_m_type(base, layer, layers, value.shape[1], bool(cfg.get("tie_word_embeddings")))
                if value.shape[1] % 32:  # no ggml block fits the row: llama.cpp writes F16
                    w.add_tensor(name, np.ascontiguousarray(value.astype(np.float16)))
                    continue
                blocks = _random_blocks(kind, value.shape[0], value.shape[1], rng)
                w.add_tensor(name, blocks, raw_shape=blocks.shape, raw_dtype=gguf.GGMLQuantizationType[kind])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    os.replace(partial, path)
    return path


def prompt_ids(n: int, vocab: int) -> list[int]:
    return [3 + (i * 7919) % (vocab - 3) for i in range(n)]


# ---------------------------------------------------------------- workers (one per contender)
class OursWorker:
    def __init__(self, folder: Path, device: str, quant: Optional[str], context: int,
                 threads: Optional[int], gguf: Optional[str] = None) -> None:
        from torchburn.llm import LLM

        source = str(make_gguf(folder, gguf)) if gguf else folder  # made by the driver first
        self.llm = LLM.from_pretrained(source, quant=quant, device=device, max_context=context,
                                       threads=threads)
        if device == "gpu":  # each run's compute pass timed on the device (timestamp queries)
            from torchburn.runtime.gpu import GpuProgram

            GpuProgram.time_gpu = True
        self.llm.eos_ids = frozenset()

    def _waited(self) -> tuple[float, float, int]:
        """Seconds the GPU programs' runs spent waiting for the device (map and read), the
        device's own time of their compute passes (timestamps), and the runs timed."""
        from torchburn.backend import gpu_launcher as gl

        progs = {id(x.gpu): x.gpu for x in gl.recent_launchers()}.values()
        return (sum(p.times.wait_s for p in progs), sum(p.times.gpu_s for p in progs),
                sum(p.times.gpu_runs for p in progs))

    def rep(self, prompt: list[int], tokens: int) -> tuple[float, float, Optional[float]]:
        from torchburn.llm.runtime.sampling import SamplingParams

        t0 = time.perf_counter()
        steps = self.llm.generate_ids([prompt], tokens + 1, SamplingParams(temperature=0.0))
        next(steps)
        t1 = time.perf_counter()
        w0 = self._waited() if self.llm.device == "gpu" else None
        count = sum(1 for _ in steps)
        t2 = time.perf_counter()
        assert count == tokens, count
        if w0 is None:
            return t1 - t0, t2 - t1, None
        w1 = self._waited()
        if w1[2] == w0[2] and (w1[0] == w0[0]):
            # no GPU program ran a decode step: a graph went to the CPU engine (a shader the
            # device rejected, say); a CPU figure must not stand in a GPU row
            raise RuntimeError("the decode steps ran no GPU program: the step fell back to the CPU engine "
                               "(TORCHBURN_DEBUG=1 or explain() says why)")
        self.gpu_s = (w1[1] - w0[1]) if w1[2] > w0[2] else None
        return t1 - t0, t2 - t1, (t2 - t1) - (w1[0] - w0[0])


class HFWorker:
    def __init__(self, folder: Path, dtype: str, static: bool = False) -> None:
        import torch
        import transformers

        if not torch.cuda.is_available():
            raise RuntimeError("PyTorch has no CUDA device")
        self.torch = torch
        self.static = static
        self.model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, dtype=getattr(torch, dtype)).to("cuda").eval()

    def rep(self, prompt: list[int], tokens: int) -> tuple[float, float, Optional[float]]:
        if self.static:
            return self._rep_static(prompt, tokens)
        return (*self._rep_eager(prompt, tokens), None)

    def _rep_static(self, prompt: list[int], tokens: int) -> tuple[float, float, Optional[float]]:
        """`generate` with `cache_implementation="static"` (greedy, exactly `tokens` new
        tokens after the first), which on CUDA compiles the decoding forward itself
        (`torch.compile`, CUDA graphs: transformers' auto-compile of a static cache); a
        streamer brings each token to the host as it comes, the first one's arrival is the
        TTFT."""
        from transformers.generation.streamers import BaseStreamer

        torch = self.torch
        stamps: list[float] = []

        class Stamps(BaseStreamer):
            def put(self, value: Any) -> None:  # the prompt first, then each new token
                int(value.reshape(-1)[-1])
                stamps.append(time.perf_counter())

            def end(self) -> None:
                pass

        ids = torch.tensor([prompt], device="cuda")
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.no_grad():
            self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens + 1,
                                min_new_tokens=tokens + 1, do_sample=False, cache_implementation="static",
                                streamer=Stamps(), pad_token_id=0)
        t2 = time.perf_counter()
        first = stamps[1]
        return first - t0, t2 - first, None

    def _rep_eager(self, prompt: list[int], tokens: int) -> tuple[float, float]:
        torch = self.torch
        with torch.no_grad():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = self.model(input_ids=torch.tensor([prompt], device="cuda"), use_cache=True)
            tok = int(out.logits[0, -1].argmax())
            t1 = time.perf_counter()
            past = out.past_key_values
            for _ in range(tokens):
                out = self.model(input_ids=torch.tensor([[tok]], device="cuda"),
                                 past_key_values=past, use_cache=True)
                past = out.past_key_values
                tok = int(out.logits[0, -1].argmax())
            t2 = time.perf_counter()
        return t1 - t0, t2 - t1


def worker_main(args: argparse.Namespace) -> int:
    """Load, warm up, print ``ready``; then answer each ``rep`` line with one JSON line."""
    kind, opts = CONTENDERS[args.worker]
    folder = Path(args.model)
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    prompt = prompt_ids(args.prompt, vocab)
    try:
        t0 = time.perf_counter()
        engine: Any = (OursWorker(folder, opts["device"], opts["quant"],
                                  args.prompt + args.tokens + 8, args.threads, opts.get("gguf"))
                       if kind == "ours" else HFWorker(folder, opts["dtype"], opts.get("static", False)))
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        engine.rep(prompt, min(4, args.tokens))   # compiles / warms every graph used below
        engine.rep(prompt, args.tokens)
        warm_s = time.perf_counter() - t0
    except Exception as e:  # reported as a skipped row, not a crash of the whole benchmark
        print(json.dumps({"skip": f"{type(e).__name__}: {e}"}), flush=True)
        return 0
    print(json.dumps({"ready": True, "load_s": load_s, "warmup_s": warm_s}), flush=True)
    for line in sys.stdin:
        if line.strip() != "rep":
            break
        ttft, decode, host = engine.rep(prompt, args.tokens)
        print(json.dumps({"ttft_s": ttft, "decode_s": decode, "host_s": host,
                          "gpu_s": getattr(engine, "gpu_s", None)}), flush=True)
    return 0


# ---------------------------------------------------------------- driver
#: A contender's name with this prefix runs `--baseline-tree`'s code (its own copy of this script).
BASE = "base: "


def _spawn(name: str, folder: Path, args: argparse.Namespace) -> subprocess.Popen[str]:
    root, script = ROOT, Path(__file__).resolve()
    if name.startswith(BASE):
        root = Path(args.baseline_tree).resolve()
        script, name = root / "benchmarks" / Path(__file__).name, name[len(BASE):]
    cmd = [sys.executable, str(script), "--worker", name, "--model", str(folder),
           "--prompt", str(args.prompt), "--tokens", str(args.tokens)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _read(proc: subprocess.Popen[str]) -> dict[str, Any]:
    assert proc.stdout is not None
    for line in proc.stdout:
        line = line.strip()
        if line.startswith("{"):
            return json.loads(line)
    return {"skip": f"the worker exited with status {proc.wait()}"}


def _summary(values: list[float]) -> dict[str, Any]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values),
            "samples": values}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    names = list(CONTENDERS)
    if args.only:
        wanted = []
        for s in args.only.split(","):
            s = s.strip()
            base = s.startswith("base:")
            s = s[len("base:"):] if base else s
            wanted.append((BASE if base else "") + SHORT.get(s, s))
        unknown = [w for w in wanted if w.removeprefix(BASE) not in CONTENDERS]
        if unknown:
            raise SystemExit(f"unknown contenders {unknown}; choose from {', '.join(SHORT)} (base:NAME with "
                             "--baseline-tree)")
        if any(w.startswith(BASE) for w in wanted) and not (
                args.baseline_tree and (Path(args.baseline_tree) / "benchmarks" / Path(__file__).name).is_file()):
            raise SystemExit("base: contenders need --baseline-tree, a checkout holding benchmarks/bench_llm_gpu.py")
        names = wanted
    config = QUICK if args.quick else SHAPES[args.shape]
    if args.checkpoint and (Path(args.checkpoint) / "config.json").is_file():
        folder = Path(args.checkpoint)   # made by an earlier run (same --quick choice)
        config = json.loads((folder / "config.json").read_text())
    else:
        folder = Path(args.checkpoint) if args.checkpoint else Path(tempfile.mkdtemp(prefix="bench_llm_gpu_"))
        folder.mkdir(parents=True, exist_ok=True)
        folder = make_checkpoint(folder, config)
    for ftype in sorted({CONTENDERS[n.removeprefix(BASE)][1].get("gguf") for n in names} - {None}):
        make_gguf(folder, ftype)  # once, before the workers that load it start
    payload: dict[str, Any] = {"config": config, "shape": "quick" if args.quick else args.shape, "prompt": args.prompt, "tokens": args.tokens,
                               "reps": args.reps, "torch": torch.__version__,
                               "cuda": torch.cuda.get_device_name(0)
                               if torch.cuda.is_available() else None,
                               "results": {}, "skipped": {}}
    workers: dict[str, subprocess.Popen[str]] = {}
    for name in names:  # one at a time: loading and compiling do not overlap the others
        print(f"loading {name} ...", flush=True)
        proc = _spawn(name, folder, args)
        msg = _read(proc)
        if "skip" in msg:
            payload["skipped"][name] = msg["skip"]
            print(f"  skipped: {msg['skip']}", flush=True)
            proc.kill()
            continue
        print(f"  load {msg['load_s']:.1f} s, warm-up {msg['warmup_s']:.1f} s", flush=True)
        workers[name] = proc
        payload["results"][name] = {"load_s": msg["load_s"], "warmup_s": msg["warmup_s"]}
    samples: dict[str, dict[str, list[float]]] = {n: {"ttft": [], "tps": [], "host_us": [], "gpu_us": []}
                                                  for n in workers}
    try:
        for r in range(args.reps):
            order = list(workers) if r % 2 == 0 else list(reversed(workers))
            for name in order:
                proc = workers[name]
                assert proc.stdin is not None
                proc.stdin.write("rep\n")
                proc.stdin.flush()
                got = _read(proc)
                if "skip" in got:
                    raise RuntimeError(f"{name}: {got['skip']}")
                samples[name]["ttft"].append(got["ttft_s"])
                samples[name]["tps"].append(args.tokens / got["decode_s"])
                if got.get("host_s") is not None:
                    samples[name]["host_us"].append(got["host_s"] / args.tokens * 1e6)
                if got.get("gpu_s") is not None:
                    samples[name]["gpu_us"].append(got["gpu_s"] / args.tokens * 1e6)
    finally:
        for proc in workers.values():
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=60)
    for name, s in samples.items():
        payload["results"][name].update(ttft_s=_summary(s["ttft"]), decode_tps=_summary(s["tps"]))
        if s["host_us"]:
            payload["results"][name]["host_us_per_token"] = _summary(s["host_us"])
        if s["gpu_us"]:
            payload["results"][name]["gpu_us_per_token"] = _summary(s["gpu_us"])
    return payload


def print_report(payload: dict[str, Any]) -> None:
    res = payload["results"]
    print(f"\ndecode of {payload['tokens']} tokens after a {payload['prompt']}-token prompt, "
          f"{payload['reps']} interleaved repetitions (median [min, max]); "
          f"CUDA: {payload['cuda']}")
    print("| engine | decode tokens/s | TTFT ms | host us/token (not waiting for the GPU) | "
          "GPU us/token (timestamps) | decode vs transformers cuda f32 |")
    print("|---|---:|---:|---:|---:|---:|")
    base = res.get(BASELINE, {}).get("decode_tps", {}).get("median")
    for name, r in res.items():
        if "decode_tps" not in r:
            continue
        d, t = r["decode_tps"], r["ttft_s"]
        ratio = f"{d['median'] / base:.2f}x" if base else "-"
        host = f"{r['host_us_per_token']['median']:.0f}" if "host_us_per_token" in r else "-"
        gpu = f"{r['gpu_us_per_token']['median']:.0f}" if "gpu_us_per_token" in r else "-"
        print(f"| {name} | {d['median']:.1f} [{d['min']:.1f}, {d['max']:.1f}] | "
              f"{t['median'] * 1e3:.1f} [{t['min'] * 1e3:.1f}, {t['max'] * 1e3:.1f}] | {host} | {gpu} | {ratio} |")
    med = {n: r["decode_tps"]["median"] for n, r in res.items() if "decode_tps" in r}
    pairs = [("torchburn gpu f32", "torchburn cpu f32"),
             ("torchburn gpu f32", "transformers cuda eager f16"),
             ("torchburn gpu f32", "transformers cuda static f32"),
             ("torchburn gpu f16", "transformers cuda static f16"),
             ("torchburn gpu int4", "transformers cuda eager f16"),
             ("torchburn gpu int4", "transformers cuda static f16"),
             ("torchburn gpu gguf Q4_K_M", "transformers cuda static f16"),
             ("torchburn gpu int8", "transformers cuda static f16"),
             ("torchburn gpu int4", "torchburn cpu f32")]
    pairs += [(n.removeprefix(BASE), n) for n in med if n.startswith(BASE)]
    for a, b in pairs:
        if a in med and b in med:
            print(f"decode {a} / {b}: {med[a] / med[b]:.2f}x")
    for name, why in payload["skipped"].items():
        print(f"skipped {name}: {why}")


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="a tiny model (CI, software adapters)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="smollm2-135m",
                   help="the random model's sizes: SmolLM2-135M's or Qwen2.5-0.5B's body")
    p.add_argument("--prompt", type=int, default=None, help="prompt tokens (128; quick: 8)")
    p.add_argument("--tokens", type=int, default=None, help="decode tokens (128; quick: 8)")
    p.add_argument("--reps", type=int, default=None, help="repetitions (5; quick: 2)")
    p.add_argument("--threads", type=int, default=None, help="threads of our CPU engine")
    p.add_argument("--only", default=None, help=f"comma list of {', '.join(SHORT)}")
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--checkpoint", default=None,
                   help="keep the random checkpoint in this folder (reused when it holds one)")
    p.add_argument("--baseline-tree", default=None,
                   help="another checkout (e.g. main): its code runs the contenders named base:NAME")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--model", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    small = args.quick
    args.prompt = args.prompt or (8 if small else 128)
    args.tokens = args.tokens or (8 if small else 128)
    args.reps = args.reps or (2 if small else 5)
    if args.worker:
        return worker_main(args)
    payload = run(args)
    print_report(payload)
    if args.json:
        Path(args.json).write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
