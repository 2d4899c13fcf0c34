"""Sizes and counts read from model files, checked before anything is allocated from them.

A ``config.json`` or GGUF header is input like any other: ``num_hidden_layers = 10**9`` would
build a billion layer modules before a single weight is read, zero heads divide by zero,
``"64"`` or ``[64]`` where a number belongs raise deep inside the model.  Every size the
loaders read passes through here first: its type (an integer, not a bool or a string; a
finite float), its range (`INT_RANGES`), the products the model forms from it (they must fit
int64), and then its agreement with the tensors actually in the file (`check_layers_present`:
a checkpoint cannot claim more layers than it holds tensors for).  A failure is a
`ConfigError` that names the key.

JSON files are parsed with bounded nesting (`loads_bounded`): a 100,000-deep ``config.json``
is refused by a scan of its brackets, before Python's parser recurses into it.
"""
from __future__ import annotations

import json
import math
import re
from typing import Any, Iterable, Mapping, Optional

from .errors import ConfigError

#: The deepest nesting of arrays and objects a model's JSON file may have (real ones: < 10).
MAX_JSON_DEPTH = 64

#: Allowed range of each size, by its ``config.json`` name (GGUF keys map to these names).
INT_RANGES: dict[str, tuple[int, int]] = {
    "vocab_size": (1, 1 << 24),
    "hidden_size": (1, 1 << 18),
    "intermediate_size": (1, 1 << 20),
    "num_hidden_layers": (1, 1 << 12),
    "num_attention_heads": (1, 1 << 12),
    "num_key_value_heads": (1, 1 << 12),
    "head_dim": (1, 1 << 14),
    "max_position_embeddings": (1, 1 << 31),
    "sliding_window": (0, 1 << 31),
    "max_window_layers": (0, 1 << 12),
    "original_max_position_embeddings": (1, 1 << 31),
}
#: Token ids (a number, or for ``eos_token_id`` a list of them).
TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
#: Floats that must be finite and positive.
POSITIVE_FLOATS = ("rms_norm_eps", "rope_theta", "factor")

#: GGUF metadata keys (after ``<arch>.``) and the ``config.json`` names they stand for.
GGUF_KEYS: dict[str, str] = {
    "vocab_size": "vocab_size",
    "embedding_length": "hidden_size",
    "feed_forward_length": "intermediate_size",
    "block_count": "num_hidden_layers",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.key_length": "head_dim",
    "context_length": "max_position_embeddings",
    "attention.sliding_window": "sliding_window",
    "rope.scaling.original_context_length": "original_max_position_embeddings",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "rope.freq_base": "rope_theta",
    "rope.scaling.factor": "factor",
}
INT64_MAX = (1 << 63) - 1


def check_int(value: Any, key: str, source: str, lo: int, hi: int) -> int:
    """``value`` as an int in ``[lo, hi]``, else a `ConfigError` naming ``key``."""
    if type(value) is not int:  # bool is an int subclass: refused too
        raise ConfigError(f"{source}: {key} must be an integer; got {_show(value)}")
    if not lo <= value <= hi:
        raise ConfigError(f"{source}: {key} = {value} is out of range (allowed {lo} .. {hi})")
    return value


def check_float(value: Any, key: str, source: str) -> float:
    """A finite positive number (int or float), else a `ConfigError` naming ``key``."""
    if type(value) not in (int, float):
        raise ConfigError(f"{source}: {key} must be a number; got {_show(value)}")
    if not math.isfinite(value) or value <= 0 or value > 1e30:
        raise ConfigError(f"{source}: {key} = {value!r} must be a finite positive number")
    return float(value)


def check_sizes(values: Mapping[str, Any], source: str, names: Optional[Mapping[str, str]] = None) -> None:
    """Check every size, token id and float of `INT_RANGES`, `TOKEN_KEYS` and
    `POSITIVE_FLOATS` present in ``values`` (keyed by ``config.json`` names; ``names`` gives
    the key to name in errors, e.g. the GGUF key), then how they combine."""
    shown = dict(names or {})

    def name(k: str) -> str:
        return shown.get(k, k)

    for key, (lo, hi) in INT_RANGES.items():
        if values.get(key) is not None:
            check_int(values[key], name(key), source, lo, hi)
    for key in POSITIVE_FLOATS:
        if values.get(key) is not None:
            check_float(values[key], name(key), source)
    for key in TOKEN_KEYS:
        value = values.get(key)
        for v in (value if isinstance(value, list) and key == "eos_token_id" else [value]):
            if v is not None:
                check_int(v, name(key), source, 0, (1 << 31) - 1)
    heads, kv = values.get("num_attention_heads"), values.get("num_key_value_heads")
    if heads is not None and kv is not None and heads % kv:
        raise ConfigError(f"{source}: {name('num_attention_heads')} = {heads} is not a multiple of "
                          f"{name('num_key_value_heads')} = {kv}")
    hidden = values.get("hidden_size")
    if hidden is not None and heads is not None and values.get("head_dim") is None and hidden % heads:
        raise ConfigError(f"{source}: {name('hidden_size')} = {hidden} is not a multiple of "
                          f"{name('num_attention_heads')} = {heads} (and no head_dim is given)")
    _check_products(values, source, name)


def _check_products(values: Mapping[str, Any], source: str, name: Any) -> None:
    """The element counts the model forms from the sizes fit int64 (so no tensor size, index
    or byte count computed from them wraps)."""
    v = {k: values.get(k) for k in INT_RANGES}
    heads = v["num_attention_heads"] or 1
    head_dim = v["head_dim"] or ((v["hidden_size"] or heads) // heads) or 1
    products = {
        ("vocab_size", "hidden_size"): [v["vocab_size"], v["hidden_size"]],
        ("hidden_size", "intermediate_size", "num_hidden_layers"):
            [v["hidden_size"], v["intermediate_size"], v["num_hidden_layers"], 3],
        ("num_hidden_layers", "num_attention_heads", "head_dim", "hidden_size"):
            [v["num_hidden_layers"], heads, head_dim, v["hidden_size"], 4],
        ("num_hidden_layers", "num_key_value_heads", "head_dim", "max_position_embeddings"):
            [v["num_hidden_layers"], v["num_key_value_heads"] or 1, head_dim,
             v["max_position_embeddings"], 2 * 8],
    }
    for keys, factors in products.items():
        total = math.prod(f for f in factors if f)
        if total > INT64_MAX:
            raise ConfigError(f"{source}: {' x '.join(name(k) for k in keys)} = {total} elements "
                              f"does not fit int64")


def check_gguf_metadata(get: Any, arch: str, source: str) -> None:
    """`check_sizes` for the GGUF keys of `GGUF_KEYS` (``get(key)`` reads a metadata value)."""
    values: dict[str, Any] = {}
    names: dict[str, str] = {}
    for suffix, hf in GGUF_KEYS.items():
        value = get(f"{arch}.{suffix}")
        if value is not None:
            values[hf], names[hf] = value, f"{arch}.{suffix}"
    for key, hf in (("tokenizer.ggml.bos_token_id", "bos_token_id"),
                    ("tokenizer.ggml.eos_token_id", "eos_token_id"),
                    ("tokenizer.ggml.padding_token_id", "pad_token_id")):
        value = get(key)
        if value is not None:
            values[hf], names[hf] = value, key
    kind = get(f"{arch}.rope.scaling.type")
    if kind is not None and not isinstance(kind, str):
        raise ConfigError(f"{source}: {arch}.rope.scaling.type must be a string; got {_show(kind)}")
    check_sizes(values, source, names)


_LAYER = re.compile(r"^(?:model\.)?(?:layers|blk)\.(\d+)\.")


def check_layers_present(layers: int, tensor_names: Iterable[str], key: str, source: str) -> None:
    """Every layer ``0 .. layers - 1`` has tensors in the file (checked before a layer is
    built: a header claiming 10**9 layers over a file of 30 is refused here)."""
    present = set()
    for n in tensor_names:
        m = _LAYER.match(n)
        if m:
            present.add(int(m.group(1)))
    if layers > len(present):
        raise ConfigError(f"{source}: {key} = {layers}, but the file holds tensors of "
                          f"{len(present)} layer(s)")
    missing = [i for i in range(layers) if i not in present]
    if missing:
        raise ConfigError(f"{source}: {key} = {layers}, but layer {missing[0]} has no tensors")


def loads_bounded(text: str, source: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """``json.loads``, refusing nesting deeper than ``max_depth`` (a `ConfigError`) before
    parsing, and any parse error as a `ConfigError` naming ``source``."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:  # brackets outside strings
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > max_depth:
                raise ConfigError(f"{source} nests arrays/objects deeper than {max_depth} levels")
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError, ValueError) as e:
        raise ConfigError(f"{source} is not valid JSON: {e}") from None


def _show(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"
