"""Run by `ik_fixtures.ik_logits` in a process of its own (ik_llama.cpp bundles libllama and
libggml): ik_llama.cpp's logits at every position of a token prompt (one prefill batch), then
greedy decoding from it, saving the tokens and every position's logits.

    python ik_logits.py MODEL.gguf '[1, 2, 3]' STEPS OUT.npz
"""
from __future__ import annotations

import json
import sys

import numpy as np


def main() -> None:
    path, prompt_json, steps_text, out = sys.argv[1:5]
    from ik_llama_cpp import _ctypes_api as C
    from ik_llama_cpp._internals import IkContext, IkModel, make_batch_range, make_batch_single

    prompt = [int(t) for t in json.loads(prompt_json)]
    steps = int(steps_text)
    model = IkModel(path, use_mmap=True)
    ctx = IkContext(model, n_ctx=len(prompt) + steps + 8, n_threads=1, flash_attn=False)
    vocab = model.n_vocab
    batch = make_batch_range(prompt, pos_start=0, logits_last=True)
    for i in range(len(prompt)):
        batch.logits[i] = 1
    if ctx.decode(batch) != 0:
        raise SystemExit("llama_decode failed on the prompt")
    C.llama_batch_free(batch)
    rows = [np.ctypeslib.as_array(ctx.get_logits(i), shape=(vocab,)).astype(np.float32).copy()
            for i in range(len(prompt) - 1)]
    tokens = list(prompt)
    for step in range(steps):
        logits = np.ctypeslib.as_array(ctx.get_logits(-1), shape=(vocab,)).astype(np.float32).copy()
        rows.append(logits)
        token = int(np.argmax(logits))
        tokens.append(token)
        if step + 1 == steps:
            break
        batch = make_batch_single(token, len(tokens) - 1)
        if ctx.decode(batch) != 0:
            raise SystemExit(f"llama_decode failed at step {step}")
        C.llama_batch_free(batch)
    np.savez(out, tokens=np.array(tokens, dtype=np.int64), logits=np.stack(rows))
    ctx.close()
    model.close()


if __name__ == "__main__":
    main()
