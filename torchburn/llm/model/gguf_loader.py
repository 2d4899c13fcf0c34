"""Loading a GGUF file: configuration from its metadata, weights from its tensors.

Every block type llama.cpp writes stays quantized: Q4_0, Q4_1 and Q8_0 linear weights become
our INT4/INT8 layouts bit for bit (`torchburn.quant`), Q4_K ones INT4 with group 32 (the
scale and min products rounded to float16: `import_gguf_q4_k`; its GEMV runs the int4 kernel
with int8 activations, 5-10x the block table's f32 form), and every other type of the block table
(`ir/qblocks.py`: Q5_0, Q5_1, Q2_K, Q3_K, Q5_K, Q6_K), like any quantized token embedding
other than Q8_0, is kept as the file's blocks (`BlockWeight`): no conversion, no copy; their
decode GEMV reads those bytes with int8 activations and byte dot products
(`passes/quant/qlinear_blocks_i8.py`), their prefill the panel kernel (`qgemm_i8.py`), and a
tied output projection (Llama-3.2's Q6_K `token_embd`) the same GEMV. F32/F16/BF16 are widened to float32
(exactly). Other types (the i-quants IQ*, TQ*, MXFP4, types only forks write) are refused with
an error naming the type and the tensor.  llama.cpp's converter permutes the rows of the Q and K projections of
Llama-family models for its interleaved rope; we undo that permutation, which moves whole
rows (codes and scales together) and so stays lossless.

Memory: weights are memory-mapped, as llama.cpp maps them (`mapped.py`). Every tensor's data
is a view of one copy-on-write map of the file; a tensor the kernels read as it is -- blocks
of any type in `ir/qblocks.py` whose rows need no permutation, F32 tensors -- stays that
view, so loading reads none of it and the pages come in (file-backed, shared with the page
cache) as the first step touches them. A tensor that is converted (Q4_0/Q4_1/Q8_0 into our
layouts, Q/K rows unpermuted, F16/BF16 widened, sibling projections stacked) is read through
the map and its pages released once converted (`mapped.release`); the converted tensors go
to the weight cache, which maps them back in later processes. The metadata comes from our
reader (`gguf_reader.py`: plain values, no per-entry arrays), dropped before any tensor is
touched.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Union

import numpy as np
import torch

from ...ir.qblocks import BLOCK_TYPES
from ...quant import (BlockWeight, Int4Weight, Int8Weight, dequantize_block_rows, import_gguf_q4_0,
                     import_gguf_q4_1, import_gguf_q4_k, import_gguf_q8_0)
from .config import ConfigError, DecoderConfig, unsupported_message
from .decoder import Decoder
from .families import BY_GGUF_ARCH, Family, sliding_layers
from .mapped import MappedFile, release
from .progress import progress
from .validate import check_gguf_metadata, check_layers_present
from .weights import WeightError, WeightSink, meta_decoder

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
#: Sandwich-norm families (Gemma 2/3): llama.cpp's ``ffn_norm`` is the MLP's input norm there
#: too, and the attention and MLP outputs have norms of their own.
_SANDWICH_NAMES = {
    "ffn_norm": "pre_feedforward_layernorm",
    "post_attention_norm": "post_attention_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
#: Phi-3 files store q/k/v as one tensor and gate/up as one ``ffn_up`` (gate rows first).
_PHI3_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}
#: Tensors that carry rope frequency factors rather than weights.
ROPE_FREQS, ROPE_LONG, ROPE_SHORT = "rope_freqs.weight", "rope_factors_long.weight", "rope_factors_short.weight"


def layer_names(fam: Family) -> dict[str, str]:
    """llama.cpp's per-layer tensor names -> ours, for a family."""
    names = dict(_LAYER_NAMES)
    if fam.sandwich_norms:
        names.update(_SANDWICH_NAMES)
    if fam.name == "phi3":
        names.update(_PHI3_NAMES)
    return names


class GGUFError(ValueError):
    """A GGUF file we cannot read, with the reason."""


def open_gguf(path: Path, fast: bool = False) -> Any:
    """The file's reader: `gguf.GGUFReader`, or with ``fast`` our `gguf_reader.FastGGUFReader`
    (values only, no per-part arrays: what loading needs, in a fraction of the time)."""
    import gguf

    if not path.is_file():
        raise GGUFError(f"{path} does not exist")
    try:
        if fast:
            from .gguf_reader import FastGGUFReader

            return FastGGUFReader(path)
        return gguf.GGUFReader(str(path))
    except Exception as e:  # gguf raises ValueError/IndexError/struct errors on bad files
        raise GGUFError(f"{path} is not a readable GGUF file ({type(e).__name__}: {e})") from None


def field(reader: Any, key: str, default: Any = None) -> Any:
    """A metadata value as a Python value (str, number, or list), or ``default``; ``reader``
    is a ``GGUFReader`` or the plain dict of `metadata`."""
    if isinstance(reader, dict):
        return reader.get(key, default)
    f = reader.fields.get(key)
    if f is None:
        return default
    try:
        return f.contents()
    except Exception as e:
        raise GGUFError(f"metadata {key!r} is malformed: {e}") from None


def _factors(reader: Any, name: str, path: Path) -> Optional[list[float]]:
    """The values of a small float tensor of rope factors, or None if the file has none."""
    from gguf import GGMLQuantizationType as Q

    t = next((t for t in reader.tensors if t.name == name), None)
    if t is None:
        return None
    if t.tensor_type not in (Q.F32, Q.F16):
        raise GGUFError(f"{path.name}: {name!r} has ggml type {t.tensor_type.name}; rope "
                        f"factors must be F32 or F16")
    return [float(v) for v in np.asarray(t.data, dtype=np.float32).reshape(-1)]


def _rope_scaling(reader: Any, arch: str, path: Path, head_dim: int) -> dict[str, Any]:
    """The rope scaling a file describes: ``rope.scaling.*`` keys, Llama 3's frequency factors
    (``rope_freqs.weight``: llama.cpp divides each frequency by its factor), or Phi-3's
    LongRoPE (``rope_factors_short``/``_long`` and the attention factor)."""
    scaling: dict[str, Any] = {"rope_type": "default"}
    kind = field(reader, f"{arch}.rope.scaling.type")
    factor = field(reader, f"{arch}.rope.scaling.factor")
    original = field(reader, f"{arch}.rope.scaling.original_context_length")
    if kind and kind != "none" and factor:
        scaling = {"rope_type": kind, "factor": float(factor)}
        if original:
            scaling["original_max_position_embeddings"] = int(original)
    freqs = _factors(reader, ROPE_FREQS, path)
    if freqs is not None:
        if scaling["rope_type"] == "linear":  # llama.cpp applies both: positions / factor too
            freqs = [f * scaling["factor"] for f in freqs]
        elif scaling["rope_type"] != "default":
            raise ConfigError(f"{path.name}: rope scaling {scaling['rope_type']!r} together with "
                              f"{ROPE_FREQS!r} is not supported")
        scaling = {"rope_type": "freq_factors", "freq_factors": freqs}
    long, short = _factors(reader, ROPE_LONG, path), _factors(reader, ROPE_SHORT, path)
    if long is not None or short is not None:
        if long is None or short is None or not original:
            raise ConfigError(f"{path.name}: LongRoPE needs both {ROPE_LONG!r} and {ROPE_SHORT!r} "
                              f"and {arch}.rope.scaling.original_context_length")
        scaling = {"rope_type": "longrope", "long_factor": long, "short_factor": short,
                   "original_max_position_embeddings": int(original)}
        attn = field(reader, f"{arch}.rope.scaling.attn_factor")
        if attn is not None:
            scaling["attention_factor"] = float(attn)
    for key in (ROPE_FREQS, "long_factor", "short_factor"):
        values = scaling.get("freq_factors" if key == ROPE_FREQS else key)
        if values is not None and len(values) != head_dim // 2:
            raise ConfigError(f"{path.name}: {len(values)} rope factors for a head dim of "
                              f"{head_dim} (needs {head_dim // 2})")
    return scaling


def _windows(reader: Any, fam: Family, arch: str, n_layers: int) -> tuple[Optional[int], ...]:
    """Per layer: the sliding window or None. Gemma 2 files may omit the window (llama.cpp's
    default is 4096); Gemma 3's layer pattern is llama.cpp's (5 sliding, 1 global) unless the
    file lists it (``attention.sliding_window_pattern``: a period, or one bool per layer)."""
    window = field(reader, f"{arch}.attention.sliding_window")
    if window is None and fam.name == "gemma2":
        window = 4096
    if not window:
        return tuple([None] * n_layers)
    pattern = field(reader, f"{arch}.attention.sliding_window_pattern")
    if isinstance(pattern, list):
        if len(pattern) != n_layers:
            raise ConfigError(f"{arch}.attention.sliding_window_pattern lists {len(pattern)} "
                              f"layers; the model has {n_layers}")
        slides = [bool(p) for p in pattern]
    else:
        slides = sliding_layers(fam, n_layers, int(pattern) if pattern else None)
        if fam.window_pattern is None and not pattern:  # Llama-arch files (Mistral): every layer
            slides = [True] * n_layers
    return tuple(int(window) if s else None for s in slides)


def _query_pre_attn_scalar(fam: Family, n_layers: int, hidden: int, heads: int) -> Optional[float]:
    """Gemma's attention scale, which GGUF files do not store: llama.cpp's rule, from the
    published configs, is ``hidden / heads`` for the 27B models (46 layers for Gemma 2, 62 for
    Gemma 3) and the head dim otherwise."""
    big = {"gemma2": 46, "gemma3": 62}.get(fam.name)
    return float(hidden // heads) if big is not None and n_layers == big else None


def gguf_config(reader: Any, path: Path) -> DecoderConfig:
    arch = field(reader, "general.architecture")
    fam = BY_GGUF_ARCH.get(arch) if isinstance(arch, str) else None
    if fam is None:
        raise ConfigError(unsupported_message(arch))
    # every size checked for type, range and products, and the layer count against the
    # tensors present, before anything is built from them
    check_gguf_metadata(lambda key: field(reader, key), arch, path.name)
    block_count = field(reader, f"{arch}.block_count")
    if block_count is not None:
        check_layers_present(block_count, (t.name for t in reader.tensors), f"{arch}.block_count", path.name)

    def need(key: str) -> Any:
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise ConfigError(f"{path.name} is missing the metadata key {arch}.{key!r}")
        return value

    def number(key: str) -> Optional[float]:
        value = field(reader, f"{arch}.{key}")
        return float(value) if value else None

    hidden = int(need("embedding_length"))
    heads = int(need("attention.head_count"))
    kv = field(reader, f"{arch}.attention.head_count_kv", heads)
    n_layers = int(need("block_count"))
    tokens = field(reader, "tokenizer.ggml.tokens")
    if tokens is not None and not isinstance(tokens, list):
        raise ConfigError(f"{path.name}: tokenizer.ggml.tokens must be an array of strings")
    vocab = field(reader, f"{arch}.vocab_size") or (len(tokens) if tokens else None)
    if vocab is None:
        raise ConfigError(f"{path.name} gives no vocabulary size")
    head_dim = int(field(reader, f"{arch}.attention.key_length") or hidden // heads)
    rope_dims = field(reader, f"{arch}.rope.dimension_count")
    if rope_dims is not None and int(rope_dims) != head_dim:
        raise ConfigError(f"{path.name}: rope on {rope_dims} of each head's {head_dim} dimensions "
                          f"(partial rotary) is not supported")
    names = {t.name for t in reader.tensors}
    eos = field(reader, "tokenizer.ggml.eos_token_id")
    if isinstance(eos, (list, tuple)):  # an array where a scalar belongs: one integer id, or an error
        if len(eos) != 1 or isinstance(eos[0], bool) or not isinstance(eos[0], (int, np.integer)):
            raise ConfigError(f"{path.name}: tokenizer.ggml.eos_token_id must be one token id, got {eos!r}")
        eos = eos[0]
    return DecoderConfig(
        architecture=fam.name,
        vocab_size=int(vocab),
        hidden_size=hidden,
        intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=n_layers,
        num_attention_heads=heads,
        num_key_value_heads=int(kv),
        head_dim=head_dim,
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        max_position_embeddings=int(need("context_length")),
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        rope_scaling=_rope_scaling(reader, arch, path, head_dim),
        tie_word_embeddings="output.weight" not in names,
        qkv_bias="blk.0.attn_q.bias" in names or "blk.0.attn_qkv.bias" in names,
        o_bias="blk.0.attn_output.bias" in names,
        mlp_bias="blk.0.ffn_up.bias" in names,
        qk_norm="blk.0.attn_q_norm.weight" in names,
        layer_windows=_windows(reader, fam, arch, n_layers),
        bos_token_id=field(reader, "tokenizer.ggml.bos_token_id"),
        eos_token_ids=(int(eos),) if eos is not None else (),
        pad_token_id=field(reader, "tokenizer.ggml.padding_token_id"),
        hidden_act=fam.hidden_act,
        embed_scale=float(hidden) ** 0.5 if fam.scale_embedding else 1.0,
        sandwich_norms=fam.sandwich_norms,
        query_pre_attn_scalar=_query_pre_attn_scalar(fam, n_layers, hidden, heads),
        attn_logit_softcapping=number("attn_logit_softcapping") if fam.name == "gemma2" else None,
        final_logit_softcapping=number("final_logit_softcapping"),
        rope_local_base_freq=(float(field(reader, f"{arch}.rope.freq_base_swa", 10000.0))
                              if fam.name == "gemma3" else None),
    )


def our_name(gguf_name: str, names: Optional[dict[str, str]] = None) -> Optional[str]:
    """``blk.3.attn_q.weight`` -> ``layers.3.self_attn.q_proj.weight`` (None if unknown);
    ``names``: the family's per-layer names (`layer_names`), Llama's by default."""
    names = _LAYER_NAMES if names is None else names
    parts = gguf_name.split(".")
    if parts[0] == "blk" and len(parts) == 4 and parts[2] in names:
        return f"layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
    if len(parts) == 2 and parts[0] in _TOP_NAMES:
        return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"
    return None


def unpermute_rows(n_rows: int, n_heads: int) -> torch.Tensor:
    """Row order that undoes llama.cpp's Q/K permutation (``rows[perm]`` is HF's order)."""
    half = n_rows // n_heads // 2
    return torch.arange(n_rows).reshape(n_heads, half, 2).transpose(1, 2).reshape(-1)


def _permute(tensor: torch.Tensor, perm: Optional[torch.Tensor]) -> torch.Tensor:
    if perm is None:
        return tensor
    if tensor.dtype == torch.bfloat16:
        return torch.index_select(tensor, 0, perm)
    # numpy's row gather: torch's parallel one waits ~20 ms per call for a second thread on a
    # busy machine (seconds over a model's Q and K weights)
    return torch.from_numpy(np.take(tensor.numpy(), perm.numpy(), axis=0))


def _permute_weight(w: Union[Int8Weight, Int4Weight, BlockWeight],
                    perm: Optional[torch.Tensor]) -> Union[Int8Weight, Int4Weight, BlockWeight]:
    """Reorder the rows of a quantized weight; each row carries its own scales, so this is
    exact."""
    if perm is None:
        return w
    if isinstance(w, BlockWeight):
        return BlockWeight(blocks=_permute(w.blocks, perm), block_type=w.block_type)
    if isinstance(w, Int8Weight):
        return Int8Weight(qweight=_permute(w.qweight, perm), scales=_permute(w.scales, perm))
    mins = None if w.mins is None else _permute(w.mins, perm)
    return Int4Weight(packed=_permute(w.packed, perm), scales=_permute(w.scales, perm),
                      mins=mins, group_size=w.group_size)


def metadata(reader: Any) -> dict[str, Any]:
    """Every metadata field as a plain Python value (what the tokenizer and chat template
    read), so the reader itself can be dropped."""
    return {key: field(reader, key) for key in reader.fields}


def load_gguf_model(path: Path, quant: Optional[str],
                    record: Optional[Callable[[str, Any], None]] = None) -> tuple[Decoder, dict[str, Any]]:
    """(model, metadata): the metadata (a dict, `field` reads it) is kept for the tokenizer and
    chat template. `record`: the sink's hook (`WeightSink.record`, the weight cache's)."""
    reader = open_gguf(path, fast=True)
    config = gguf_config(reader, path)
    sink = WeightSink(meta_decoder(config), quant, record)
    permute = config.family.gguf_permuted_qk
    names = layer_names(config.family)
    tensors = []
    for t in reader.tensors:
        name = our_name(t.name, names)
        if name is None or not sink.wants(name):
            continue
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        sink.check(name, shape)
        _check_type(path, t.name, t.tensor_type.name)  # before any tensor is read
        expected_bytes = _nbytes(t.tensor_type, shape)
        if expected_bytes is not None and t.data.nbytes != expected_bytes:
            raise GGUFError(
                f"{path.name}: tensor {t.name!r} has {t.data.nbytes} bytes of data; its header "
                f"({t.tensor_type.name} {list(shape)}) needs {expected_bytes}; the file is "
                f"truncated or corrupt")
        tensors.append((t.name, t.tensor_type, int(t.data_offset), int(t.data.nbytes),
                        t.data.dtype, tuple(t.data.shape), name, shape))
    _check_extents(path, [(t.name, int(t.data_offset), int(t.data.nbytes)) for t in reader.tensors])
    meta = metadata(reader)
    del reader  # its metadata and its own map of the file
    mapped = MappedFile(path)
    for item in progress(tensors, desc=f"loading {path.name}",
                         total=sum(t[3] for t in tensors), size=lambda t: t[3]):
        _load_tensor(mapped, item, config, sink, permute)
    return sink.finish(), meta


def _check_extents(path: Path, extents: list[tuple[str, int, int]]) -> None:
    """Every tensor's data (offset and byte count from its header) lies inside the file and
    before the next tensor's: a header whose size disagrees with the data laid out after it
    would otherwise read its neighbour's bytes."""
    size = path.stat().st_size
    ordered = sorted(extents, key=lambda e: e[1])
    for (name, start, n), nxt in zip(ordered, ordered[1:] + [("end of file", size, 0)]):
        if start + n > nxt[1]:
            raise GGUFError(
                f"{path.name}: tensor {name!r} needs {n} bytes from offset {start}, which "
                f"runs into {nxt[0] if nxt[0] == 'end of file' else repr(nxt[0])}; its header "
                f"disagrees with the data (the file is truncated or corrupt)")


def _load_tensor(mapped: MappedFile, item: tuple[Any, ...], config: DecoderConfig,
                 sink: WeightSink, permute: bool) -> None:
    """Hand one tensor to the sink: a view of the map where the kernels read it as it is,
    else converted (and its pages of the map released)."""
    from gguf import GGMLQuantizationType as Q

    gguf_name, kind, offset, nbytes, dtype, data_shape, name, shape = item
    assert mapped.array is not None  # the file holds this tensor's bytes (`_check_extents`)
    source = mapped.array[offset:offset + nbytes]
    if offset % np.dtype(dtype).itemsize:
        # misaligned elements (an alignment below 4 with an odd metadata size): read a copy
        source = source.copy()
    data = source.view(dtype).reshape(data_shape)
    try:
        _put_tensor(data, kind, gguf_name, name, shape, config, sink, permute)
    finally:
        release(torch.from_numpy(source))


def _put_tensor(data: np.ndarray, kind: Any, gguf_name: str, name: str, shape: tuple[int, ...],
                config: DecoderConfig, sink: WeightSink, permute: bool) -> None:
    from gguf import GGMLQuantizationType as Q

    perm = None
    if permute and name.endswith(("q_proj.weight", "q_proj.bias", "k_proj.weight",
                                  "k_proj.bias")):
        heads = config.num_attention_heads if ".q_proj." in name else config.num_key_value_heads
        perm = unpermute_rows(shape[0], heads)
    importers = {Q.Q8_0: import_gguf_q8_0, Q.Q4_0: import_gguf_q4_0, Q.Q4_1: import_gguf_q4_1,
                 Q.Q4_K: import_gguf_q4_k}
    embedding = name == "embed_tokens.weight"
    if kind in importers and len(shape) == 2 and (kind == Q.Q8_0 or not embedding):
        w = importers[kind](data, shape)
        sink.put_quantized(name, _permute_weight(w, perm))
        return
    if kind.name in BLOCK_TYPES:
        blocks = torch.from_numpy(data.reshape(_prod(shape[:-1]), -1))
        if len(shape) == 2:
            sink.put_quantized(name, _permute_weight(BlockWeight(blocks, kind.name), perm))
            return
        value = dequantize_block_rows(blocks, kind.name)  # a quantized vector (a few KB)
    elif kind in (Q.F32, Q.F16, Q.BF16):
        if kind == Q.BF16:
            value = torch.from_numpy(data.view(np.int16)).view(torch.bfloat16)
        else:
            value = torch.from_numpy(data)
    else:  # `_check_type` refused it before any tensor was read
        raise AssertionError(f"{gguf_name}: ggml type {kind.name} reached the tensor reader")
    sink.put(name, _permute(value.reshape(shape), perm))


FLOAT_TYPES = ("F32", "F16", "BF16")


def _check_type(path: Path, gguf_name: str, type_name: str) -> None:
    """`GGUFError` naming the tensor and its type, and why, unless we load that type."""
    if type_name in FLOAT_TYPES or type_name in BLOCK_TYPES:
        return
    if type_name.startswith("IQ"):
        why = "an i-quant, whose codebook blocks have no kernels here"
    else:
        why = "not a block type of llama.cpp's K-quant or legacy families"
    raise GGUFError(
        f"{path.name}: tensor {gguf_name!r} has ggml type {type_name}, which torchburn does not "
        f"support ({why}); supported: {', '.join(FLOAT_TYPES)}, {', '.join(BLOCK_TYPES)}")


def _prod(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= int(d)
    return n


def _nbytes(kind: Any, shape: tuple[int, ...]) -> Optional[int]:
    from gguf.constants import GGML_QUANT_SIZES

    if kind not in GGML_QUANT_SIZES:
        return None
    block, type_size = GGML_QUANT_SIZES[kind]
    n = int(np.prod(shape))
    if n % block:
        return None
    return n // block * type_size
