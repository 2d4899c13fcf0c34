"""Decode-step time of a 2-layer random Llama (SmolLM2-135M's layer shapes: hidden 576, 9 query
heads over 3 key/value heads of 64, MLP 1536; vocab cut to 2048 so attention and the layers,
not the output head, are what is timed) at a filled KV cache of `--filled` slots.

    python benchmarks/bench_decode_attention.py --filled 512 --threads 1

Prints the median thread CPU time of a decode step (the compiled step, cache write included)
over `--steps` steps, each at the same position (the cache is rewound), and the kernels
of the step's program that compute attention.
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def make_checkpoint(folder: Path) -> None:
    import transformers

    from tests.llm.conftest import tiny_tokenizer

    cfg = transformers.LlamaConfig(vocab_size=2048, hidden_size=576, intermediate_size=1536, num_hidden_layers=2,
                                   num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=2048,
                                   bos_token_id=None, eos_token_id=2, pad_token_id=0)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg).eval().save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer(folder)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--filled", type=int, default=512)
    p.add_argument("--steps", type=int, default=41)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from torchburn.llm import LLM
    from torchburn.llm.cli.profile import profile_decode

    with tempfile.TemporaryDirectory() as tmp:
        make_checkpoint(Path(tmp))
        llm = LLM.from_pretrained(tmp, device="cpu", max_context=args.filled + 64)
        cache = llm.cache_for(1)
        starts = torch.zeros(1, dtype=torch.long)
        times = []
        with torch.no_grad():
            llm.run_step(cache, torch.randint(3, 2048, (1, args.filled)), 0, starts)
            for i in range(args.steps + 3):
                t0 = time.thread_time()
                llm.run_step(cache, torch.tensor([[100 + i]]), args.filled, starts)
                times.append(time.thread_time() - t0)
        prof = profile_decode(llm, steps=1, filled=args.filled)
    attn = [dict(k.attrs).get("origin", "") for k in prof.program.kernels
            if "Attention.forward" in dict(k.attrs).get("origin", "")]
    print(f"decode step, 2 layers, filled {args.filled}, {args.threads} thread(s): "
          f"median {statistics.median(times[3:]) * 1e3:.3f} ms of thread CPU time over {args.steps} steps; "
          f"{len(prof.program.kernels)} kernels, {len(attn)} from Attention.forward")


if __name__ == "__main__":
    main()
