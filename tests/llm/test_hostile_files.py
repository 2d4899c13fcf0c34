"""Model files built to exhaust memory or crash the loader (issue 28): every size from a GGUF
header or a ``config.json`` is checked for type, range and agreement with the tensors present
before anything is allocated, and refused with our own error naming the key; duplicated GGUF
keys and tensor names, tensors in two shards and shard paths outside the folder are refused;
JSON nesting is bounded. Hypothesis fuzzes GGUF headers and ``config.json``."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from torchburn.llm.model.config import ConfigError, from_hf_dict
from torchburn.llm.model.gguf_loader import GGUFError, load_gguf_model
from torchburn.llm.model.safetensors_loader import load_safetensors_model, read_json
from torchburn.llm.model.weights import WeightError

OURS = (ConfigError, GGUFError, WeightError)  # all ValueError: the project's own errors

# ---- a GGUF writer that writes anything (duplicates, wrong types) ------------------------------

_TYPES = {bool: 7, str: 8, float: 12}


def _value(v: Any) -> tuple[int, bytes]:
    """(GGUF type, encoded value) of a Python value."""
    if isinstance(v, bool):
        return 7, struct.pack("<?", v)
    if isinstance(v, int):
        return (11, struct.pack("<q", v)) if -(1 << 63) <= v < (1 << 63) else (10, struct.pack("<Q", v % (1 << 64)))
    if isinstance(v, float):
        return 12, struct.pack("<d", v)
    if isinstance(v, str):
        b = v.encode("utf-8", "surrogatepass")
        return 8, struct.pack("<Q", len(b)) + b
    if isinstance(v, list):
        items = [_value(x) for x in v]
        kind = items[0][0] if items else 11
        if any(k != kind for k, _ in items):
            raise ValueError("mixed array")
        return 9, struct.pack("<IQ", kind, len(v)) + b"".join(b for _, b in items)
    raise TypeError(type(v))


def write_gguf(path: Path, kvs: list[tuple[str, Any]], tensors: list[tuple[str, np.ndarray]]) -> Path:
    """A GGUF v3 file of F32 tensors and exactly the metadata ``kvs`` (in order, repeats kept)."""
    def s(x: str) -> bytes:
        b = x.encode()
        return struct.pack("<Q", len(b)) + b

    tensors = [(name, np.asarray(a, dtype=np.float32)) for name, a in tensors]
    out = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kvs)))
    for k, v in kvs:
        kind, data = _value(v)
        out += s(k) + struct.pack("<I", kind) + data
    offset = 0
    for name, a in tensors:
        out += s(name) + struct.pack("<I", a.ndim) + b"".join(struct.pack("<Q", d) for d in reversed(a.shape))
        out += struct.pack("<IQ", 0, offset)
        offset += -(-a.nbytes // 32) * 32
    out += b"\0" * (-len(out) % 32)
    for _, a in tensors:
        out += a.tobytes() + b"\0" * (-a.nbytes % 32)
    path.write_bytes(bytes(out))
    return path


def llama_kvs(**over: Any) -> list[tuple[str, Any]]:
    kv = {"general.architecture": "llama", "llama.block_count": 1, "llama.context_length": 64,
          "llama.embedding_length": 32, "llama.feed_forward_length": 48,
          "llama.attention.head_count": 4, "llama.attention.head_count_kv": 2,
          "llama.attention.layer_norm_rms_epsilon": 1e-5, "llama.vocab_size": 16}
    for k, v in over.items():
        key = k.replace("__", ".")
        if v is None:
            kv.pop(key, None)
        else:
            kv[key] = v
    return list(kv.items())


def llama_tensors(layers: int = 1) -> list[tuple[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    t = [("token_embd.weight", rng.standard_normal((16, 32))), ("output_norm.weight", np.ones(32))]
    for i in range(layers):
        for name, shape in [("attn_q", (32, 32)), ("attn_k", (16, 32)), ("attn_v", (16, 32)),
                            ("attn_output", (32, 32)), ("ffn_gate", (48, 32)), ("ffn_up", (48, 32)),
                            ("ffn_down", (32, 48)), ("attn_norm", (32,)), ("ffn_norm", (32,))]:
            t.append((f"blk.{i}.{name}.weight", rng.standard_normal(shape) * 0.1))
    return t


def test_the_writer_makes_a_loadable_file(tmp_path: Path) -> None:
    model, _ = load_gguf_model(write_gguf(tmp_path / "ok.gguf", llama_kvs(), llama_tensors()), None)
    assert model.config.num_hidden_layers == 1 and model.config.vocab_size == 16


@pytest.mark.parametrize("over, key", [
    (dict(llama__block_count=10**9), "llama.block_count"),
    (dict(llama__block_count=3), "llama.block_count"),          # more than the file holds
    (dict(llama__attention__head_count=0), "llama.attention.head_count"),
    (dict(llama__attention__head_count_kv=0), "llama.attention.head_count_kv"),
    (dict(llama__attention__head_count_kv=3), "llama.attention.head_count"),
    (dict(llama__embedding_length=1 << 40), "llama.embedding_length"),
    (dict(llama__embedding_length="32"), "llama.embedding_length"),
    (dict(llama__feed_forward_length=[48]), "llama.feed_forward_length"),
    (dict(llama__context_length=True), "llama.context_length"),
    (dict(llama__attention__layer_norm_rms_epsilon="x"), "llama.attention.layer_norm_rms_epsilon"),
    (dict(llama__rope__freq_base=float("nan")), "llama.rope.freq_base"),
    (dict(llama__vocab_size=-5), "llama.vocab_size"),
    (dict(general__alignment=0), "general.alignment"),
    (dict(general__architecture=7), "unsupported architecture"),
])
def test_bad_gguf_sizes_are_refused_naming_the_key(tmp_path: Path, over: dict[str, Any], key: str) -> None:
    path = write_gguf(tmp_path / "bad.gguf", llama_kvs(**over), llama_tensors())
    with pytest.raises(OURS, match=key.replace(".", r"\.")):
        load_gguf_model(path, None)


def test_duplicated_gguf_keys_and_tensor_names_are_refused(tmp_path: Path) -> None:
    kvs = llama_kvs() + [("llama.attention.head_count", 4)]
    with pytest.raises(GGUFError, match="llama.attention.head_count' occurs twice"):
        load_gguf_model(write_gguf(tmp_path / "k.gguf", kvs, llama_tensors()), None)
    tensors = llama_tensors() + [("blk.0.attn_q.weight", np.zeros((32, 32)))]  # a silent zero Q
    with pytest.raises(GGUFError, match="blk.0.attn_q.weight' occurs twice"):
        load_gguf_model(write_gguf(tmp_path / "t.gguf", llama_kvs(), tensors), None)


# ---- config.json and safetensors folders -------------------------------------------------------

@pytest.fixture()
def folder(tiny_checkpoint, tmp_path: Path) -> Path:  # type: ignore[no-untyped-def]
    _, src = tiny_checkpoint("llama")
    dst = tmp_path / "model"
    shutil.copytree(src, dst)
    return dst


def _set(folder: Path, **changes: Any) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("changes, key", [
    (dict(num_hidden_layers=10**9), "num_hidden_layers"),
    (dict(num_hidden_layers=3), "num_hidden_layers = 3, but the file holds tensors of 2"),
    (dict(num_attention_heads=0), "num_attention_heads"),
    (dict(num_key_value_heads=3), "num_key_value_heads"),
    (dict(hidden_size=2**40), "hidden_size"),
    (dict(hidden_size="64"), "hidden_size"),
    (dict(intermediate_size=[96]), "intermediate_size"),
    (dict(vocab_size=None), "vocab_size"),
    (dict(rms_norm_eps={"a": 1}), "rms_norm_eps"),
    (dict(head_dim=0), "head_dim"),
    (dict(rope_scaling="linear"), "rope_scaling"),
    (dict(eos_token_id=[2, "x"]), "eos_token_id"),
    (dict(num_hidden_layers=4096, num_key_value_heads=4096, num_attention_heads=4096, head_dim=16384,
          max_position_embeddings=2**31), "does not fit int64"),
])
def test_bad_config_sizes_are_refused_naming_the_key(folder: Path, changes: dict[str, Any], key: str) -> None:
    _set(folder, **changes)
    with pytest.raises(ConfigError, match=key):
        load_safetensors_model(folder, None)


def test_deep_json_is_refused_without_recursion(folder: Path) -> None:
    (folder / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ConfigError, match="deeper than"):
        read_json(folder / "config.json")
    (folder / "generation_config.json").write_text('{"a": ' * 100_000 + "1" + "}" * 100_000)
    with pytest.raises(ConfigError, match="deeper than"):
        read_json(folder / "generation_config.json")
    (folder / "x.json").write_text(json.dumps({"s": "[[[[" * 1000}))  # brackets in strings are text
    assert read_json(folder / "x.json")["s"].startswith("[[[[")


def _split_in_two(folder: Path, duplicate: Optional[str] = None) -> dict[str, str]:
    """Re-save the checkpoint as two shards with an index (``duplicate``: also in shard 2)."""
    from safetensors.torch import load_file, save_file

    single = folder / "model.safetensors"
    tensors = load_file(str(single))
    names = sorted(tensors)
    a = {k: tensors[k] for k in names[: len(names) // 2]}
    b = {k: tensors[k] for k in names[len(names) // 2:]}
    if duplicate is not None:
        b[duplicate] = tensors[duplicate].clone()
    save_file(a, str(folder / "m-1.safetensors"))
    save_file(b, str(folder / "m-2.safetensors"))
    weight_map = {**{k: "m-1.safetensors" for k in a}, **{k: "m-2.safetensors" for k in b}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    single.rename(folder / "original.bin")  # kept for a second split
    return weight_map


def test_sharded_folder_loads_and_a_tensor_in_two_shards_is_refused(folder: Path) -> None:
    _split_in_two(folder)
    assert load_safetensors_model(folder, None).config.num_hidden_layers == 2
    for f in folder.glob("m-*.safetensors"):
        f.unlink()
    (folder / "original.bin").rename(folder / "model.safetensors")
    _split_in_two(folder, duplicate="model.embed_tokens.weight")
    with pytest.raises(WeightError, match="model.embed_tokens.weight' is in two shards"):
        load_safetensors_model(folder, None)


@pytest.mark.parametrize("target", ["../outside.safetensors", "/etc/passwd", "sub/../../x.safetensors"])
def test_shard_paths_stay_inside_the_folder(folder: Path, target: str) -> None:
    weight_map = _split_in_two(folder)
    outside = folder.parent / "outside.safetensors"
    shutil.copy(folder / "m-2.safetensors", outside)
    weight_map[next(iter(weight_map))] = target
    (folder / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    with pytest.raises(WeightError, match="outside the model folder"):
        load_safetensors_model(folder, None)


# ---- memory of a refused load ------------------------------------------------------------------

_MEMORY_SCRIPT = r"""
import json, resource, sys, tracemalloc
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from torchburn.llm.model.gguf_loader import load_gguf_model
from torchburn.llm.model.safetensors_loader import load_safetensors_model
from tests.llm.test_hostile_files import llama_kvs, llama_tensors, write_gguf
tmp, folder = Path(sys.argv[2]), Path(sys.argv[3])
cases = []
for layers in (4000, 20000, 10**9):
    cases.append(("gguf", write_gguf(tmp / f"b{layers}.gguf", llama_kvs(llama__block_count=layers), llama_tensors())))
for layers in (4000, 20000, 10**9):
    cfg = json.loads((folder / "config.json").read_text()); cfg["num_hidden_layers"] = layers
    d = tmp / f"f{layers}"; d.mkdir(); (d / "config.json").write_text(json.dumps(cfg))
    for f in folder.glob("*.safetensors"): (d / f.name).symlink_to(f)
    cases.append(("folder", d))
try:
    load_gguf_model(write_gguf(tmp / "warm.gguf", llama_kvs(llama__block_count=2), llama_tensors()), None)
except ValueError:
    pass
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
tracemalloc.start()
refused = 0
for kind, path in cases:
    try:
        (load_gguf_model(path, None) if kind == "gguf" else load_safetensors_model(path, None))
    except ValueError:
        refused += 1
peak = tracemalloc.get_traced_memory()[1]
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) * 1024
print(json.dumps({"refused": refused, "peak": peak, "rss_grown": grown}))
"""


def test_a_refused_load_stays_under_64_mb(folder: Path, tmp_path: Path) -> None:
    """Headers claiming 4,000 / 20,000 / 10**9 layers over a one-layer file (and a config of a
    two-layer folder): each refused, the Python heap's peak and the process's peak RSS
    growing by under 64 MB over all of them (a fresh process, so RSS is this test's)."""
    root = Path(__file__).resolve().parents[2]
    out = subprocess.run([sys.executable, "-c", _MEMORY_SCRIPT, str(root), str(tmp_path), str(folder)],
                         capture_output=True, text=True, timeout=300, cwd=root)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["refused"] == 6
    assert got["peak"] < 64 << 20 and got["rss_grown"] < 64 << 20, got


# ---- fuzzing -----------------------------------------------------------------------------------

_ANY = st.one_of(st.integers(-(1 << 64) + 1, (1 << 64) - 1), st.integers(-3, 70),
                 st.floats(allow_nan=True), st.text(max_size=8), st.booleans(),
                 st.lists(st.integers(-5, 100), max_size=3), st.none())
_GGUF_KEYS = ["llama.block_count", "llama.context_length", "llama.embedding_length",
              "llama.feed_forward_length", "llama.attention.head_count", "llama.attention.head_count_kv",
              "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size", "llama.attention.key_length",
              "llama.rope.freq_base", "llama.rope.scaling.type", "llama.rope.scaling.factor",
              "llama.attention.sliding_window", "general.alignment", "general.architecture",
              "tokenizer.ggml.eos_token_id", "tokenizer.ggml.tokens"]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                   HealthCheck.too_slow])
@given(changes=st.dictionaries(st.sampled_from(_GGUF_KEYS), _ANY, min_size=1, max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 400)), flip=st.one_of(st.none(), st.integers(0, 600)))
@example(changes={"tokenizer.ggml.eos_token_id": []}, cut=None, flip=None)  # found by this test: int([])
def test_fuzzed_gguf_headers_load_or_raise_our_error(tmp_path: Path, changes: dict[str, Any],
                                                     cut: Optional[int], flip: Optional[int]) -> None:
    over = {k.replace(".", "__"): v for k, v in changes.items()}
    try:
        kvs = llama_kvs(**over)
        path = write_gguf(tmp_path / "f.gguf", kvs, llama_tensors())
    except (ValueError, TypeError, struct.error, UnicodeEncodeError):
        return  # not expressible in GGUF (a mixed array, an out-of-range float)
    data = bytearray(path.read_bytes())
    if flip is not None and flip < len(data):
        data[flip] ^= 0xFF
    if cut is not None:
        data = data[:cut]
    path.write_bytes(bytes(data))
    try:
        load_gguf_model(path, None)
    except OURS:
        pass


_CONFIG_KEYS = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "rms_norm_eps",
                "max_position_embeddings", "rope_theta", "rope_scaling", "sliding_window",
                "eos_token_id", "model_type", "tie_word_embeddings", "layer_types", "rope_parameters"]
_JSON = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-(1 << 70), 1 << 70),
                               st.floats(allow_nan=False), st.text(max_size=6)),
                     lambda inner: st.one_of(st.lists(inner, max_size=3),
                                             st.dictionaries(st.text(max_size=6), inner, max_size=3)),
                     max_leaves=6)


@settings(max_examples=150, deadline=None)
@given(changes=st.dictionaries(st.sampled_from(_CONFIG_KEYS), _JSON, min_size=1, max_size=4))
@example(changes={"eos_token_id": [None]})   # found by this test: int(None) was a TypeError
def test_fuzzed_config_json_builds_or_raises_config_error(changes: dict[str, Any]) -> None:
    cfg = dict(model_type="llama", vocab_size=320, hidden_size=64, intermediate_size=96,
               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
               max_position_embeddings=256)
    cfg.update(changes)
    try:
        from_hf_dict(cfg)
    except ConfigError:
        pass
