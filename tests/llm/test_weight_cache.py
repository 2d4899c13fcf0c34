"""The weight cache: a second load maps the first one's converted tensors (same model, same
step-cache fingerprint), its key follows the source's metadata and `quant`, and a damaged or
foreign entry is deleted and the source loaded again."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import pytest
import torch

from torchburn.llm import LLM
from torchburn.llm.runtime import step_cache as sc
from torchburn.llm.model import weight_cache as wc
from torchburn.runtime import config

from .test_gguf_loader import _small_gguf


@pytest.fixture()
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path / "cache"))
    config.reload_config()
    yield tmp_path / "cache"
    monkeypatch.undo()
    config.reload_config()


def _tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    out = dict(model.named_parameters(remove_duplicate=False))
    out.update(model.named_buffers(remove_duplicate=False))
    return out


def _same_model(a: torch.nn.Module, b: torch.nn.Module) -> None:
    ta, tb = _tensors(a), _tensors(b)
    assert ta.keys() == tb.keys()
    for name in ta:
        assert ta[name].dtype == tb[name].dtype and ta[name].shape == tb[name].shape, name
        assert torch.equal(ta[name], tb[name]), name
    assert sc.model_fingerprint(a) == sc.model_fingerprint(b)  # the step cache sees the same layout


def _load(source: Path, quant: Any = None) -> LLM:
    return LLM.from_pretrained(source, quant=quant, device="cpu", compile=False)


def _files(folder: Path) -> list[Path]:
    return sorted(folder.glob(f"**/*{wc.SUFFIX}"))


def test_gguf_second_load_comes_from_the_cache(disk: Path, tmp_path: Path) -> None:
    gguf = _small_gguf(tmp_path / "m.gguf")
    before = wc.STATS.hits
    first = _load(gguf)
    assert len(_files(disk)) == 1 and wc.STATS.hits == before
    second = _load(gguf)
    assert wc.STATS.hits == before + 1
    _same_model(first.model, second.model)
    assert second.tokenizer.encode("abc aa") == first.tokenizer.encode("abc aa")
    assert second.config == first.config
    # the cached tensors are views of the mapped file, not copies
    packed = second.model.layers[0].self_attn.qkv_proj.qweight  # q, k and v fused on loading
    assert not packed.untyped_storage().resizable()


def test_quantized_safetensors_second_load_comes_from_the_cache(disk: Path, tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")  # tied head
    first = _load(folder, "int4")
    hits = wc.STATS.hits
    second = _load(folder, "int4")
    assert wc.STATS.hits == hits + 1
    _same_model(first.model, second.model)
    from torchburn.llm.runtime.sampling import SamplingParams

    greedy = SamplingParams(temperature=0.0)
    rows = [[5, 17, 99, 250, 3]]
    assert list(second.generate_ids(rows, 4, greedy)) == list(first.generate_ids(rows, 4, greedy))


def test_float_and_unlike_projections_round_trip(disk: Path, tmp_path: Path, tiny_checkpoint) -> None:
    """The cache holds what the loader fused (float, with qwen2's q/k/v biases) and keeps
    apart what it kept apart (a GGUF whose V is F32 while Q and K are Q8_0)."""
    _, folder = tiny_checkpoint("qwen2")
    first, second = _load(folder), _load(folder)
    _same_model(first.model, second.model)
    assert second.model.layers[0].self_attn.qkv_proj.bias is not None
    gguf = _small_gguf(tmp_path / "v.gguf", float_v=True)
    hits = wc.STATS.hits
    first, second = _load(gguf), _load(gguf)
    assert wc.STATS.hits == hits + 1
    _same_model(first.model, second.model)
    attn, mlp = second.model.layers[0].self_attn, second.model.layers[0].mlp
    assert attn.qkv_proj is None and isinstance(attn.v_proj, torch.nn.Linear)
    assert attn.q_proj is not None and mlp.gate_up_proj is not None


def test_key_follows_source_metadata_and_quant(tmp_path: Path, tiny_checkpoint) -> None:
    gguf = _small_gguf(tmp_path / "m.gguf")
    key = wc.source_key(gguf, None)
    assert wc.source_key(gguf, None) == key
    assert wc.source_key(gguf, "int8") != key
    st = gguf.stat()
    os.utime(gguf, ns=(st.st_atime_ns, st.st_mtime_ns + 1000))  # rewritten in place: a new mtime
    assert wc.source_key(gguf, None) != key
    _, folder = tiny_checkpoint("llama")
    assert wc.source_key(folder, "int4") != wc.source_key(folder, None)


def test_a_damaged_entry_is_deleted_and_the_source_loaded(disk: Path, tmp_path: Path) -> None:
    gguf = _small_gguf(tmp_path / "m.gguf")
    reference = _load(gguf)
    (entry,) = _files(disk)
    data = bytearray(entry.read_bytes())
    data[20] ^= 0xFF  # inside the header: fails the keyed digest
    entry.write_bytes(bytes(data))
    corrupt = wc.STATS.corrupt
    again = _load(gguf)
    assert wc.STATS.corrupt == corrupt + 1
    _same_model(reference.model, again.model)
    (entry,) = _files(disk)  # written again by that load
    entry.write_bytes(entry.read_bytes()[:-64])  # truncated tensor data
    corrupt = wc.STATS.corrupt
    _same_model(reference.model, _load(gguf).model)
    assert wc.STATS.corrupt == corrupt + 1


def test_entry_for_another_key_is_refused(disk: Path, tmp_path: Path) -> None:
    a, b = _small_gguf(tmp_path / "a.gguf"), _small_gguf(tmp_path / "b.gguf", q_rows=64)
    _load(a)
    (entry,) = _files(disk)
    target = wc.cache_path(wc.source_key(b, None))
    assert target is not None
    target.parent.mkdir(parents=True, exist_ok=True)
    entry.rename(target)  # a's entry planted under b's key
    assert wc.load(wc.source_key(b, None)) is None
    assert not target.exists()


def test_no_cache_folder_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    config.reload_config()
    try:
        gguf = _small_gguf(tmp_path / "m.gguf")
        _load(gguf)
        assert _files(tmp_path) == []
    finally:
        monkeypatch.undo()
        config.reload_config()


def test_a_config_dict_in_its_own_key_order_reads_back_the_same(disk: Path, tmp_path: Path) -> None:
    """Llama 3 files give ``rope_scaling = {"rope_type": ..., "freq_factors": [...]}``: with the
    header's keys sorted it read back reordered, failed the configuration check and every such
    file was loaded from the source again (and deleted from the cache) in every process."""
    from torchburn.llm.model.config import DecoderConfig

    gguf = _small_gguf(tmp_path / "m.gguf")
    model = _load(gguf).model
    scaling = {"rope_type": "freq_factors", "freq_factors": [1.0] * (model.config.head_dim // 2)}
    config = dataclasses.replace(model.config, rope_scaling=scaling)
    assert isinstance(config, DecoderConfig)
    key = wc.source_key(gguf, "llama3-order")
    assert wc.store(key, config, [], {}) is not None
    hit = wc.load(key)
    assert hit is not None and repr(hit[0]) == repr(config)
