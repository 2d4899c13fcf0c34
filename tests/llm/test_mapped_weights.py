"""Weights are memory-mapped, never a second copy in process memory (`llm/model/mapped.py`).

On a file with a different block type nearly every tensor (`write_mixed`): the tensors the
kernels read as they are (blocks needing no permutation or stacking, F32 norms) are views of
the GGUF file at their own offsets; the converted ones (unpermuted Q/K, stacked q/k/v and
gate/up, Q4_x/Q8_0 into our layouts) are not. Through the weight cache, a model -- the first
load's, rebuilt from the entry it wrote, and a warm load's -- holds no tensor outside the two
mapped files. Decoding reads the views and never writes them. In a subprocess, on a
generated file of some tens of MB: resident memory grows during a load by far less than the
file (the weights stay on disk until touched) and, while decoding, by file-backed pages, not
anonymous ones.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.llm.test_gguf_block_loading import write_mixed
from torchburn.llm.model import weight_cache as wc
from torchburn.llm.model.gguf_loader import load_gguf_model
from torchburn.llm.model.mapped import locate
from torchburn.runtime import config

gguf = pytest.importorskip("gguf")
ROOT = Path(__file__).resolve().parents[2]

#: GGUF tensor -> the model's tensor that must be a view of it.
IN_PLACE = {
    "token_embd.weight": "embed_tokens.blocks",  # Q6_K; the tied head shares it
    "blk.0.attn_output.weight": "layers.0.self_attn.o_proj.blocks",  # Q5_0
    "blk.0.ffn_gate.weight": "layers.0.mlp.gate_proj.blocks",  # Q3_K (unlike up: not stacked)
    "blk.0.ffn_up.weight": "layers.0.mlp.up_proj.blocks",  # Q2_K
    "blk.0.ffn_down.weight": "layers.0.mlp.down_proj.blocks",  # Q5_1
    "blk.1.attn_v.weight": "layers.1.self_attn.v_proj.blocks",  # Q6_K beside Q5_K q/k
    "blk.0.attn_norm.weight": "layers.0.input_layernorm.weight",  # F32
    "output_norm.weight": "norm.weight",
}
#: Converted: Q4_K into INT4 (Q/K unpermuted, stacked with V), Q5_K Q/K unpermuted, Q8_0 and Q4_0
#: into INT8/INT4.
CONVERTED = ["layers.0.self_attn.qkv_proj.packed", "layers.1.self_attn.q_proj.blocks",
             "layers.1.self_attn.o_proj.qweight", "layers.1.mlp.down_proj.packed"]


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("mapped") / "mixed.gguf"
    write_mixed(path)
    return path.resolve()


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


def _offsets(path: Path) -> dict[str, tuple[int, int]]:
    return {t.name: (int(t.data_offset), int(t.n_bytes)) for t in gguf.GGUFReader(str(path)).tensors}


def test_weights_the_kernels_read_as_they_are_are_views_of_the_file(mixed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    config.reload_config()
    try:
        model, _ = load_gguf_model(mixed, None)
    finally:
        monkeypatch.undo()
        config.reload_config()
    tensors, offsets = _tensors(model), _offsets(mixed)
    raw = mixed.read_bytes()
    for gguf_name, name in IN_PLACE.items():
        t = tensors[name]
        offset, nbytes = offsets[gguf_name]
        assert locate(t) == (mixed, offset), name
        assert t.numel() * t.element_size() == nbytes
        assert t.contiguous().view(torch.uint8).numpy().tobytes() == raw[offset:offset + nbytes], name
    assert tensors["lm_head.blocks"].data_ptr() == tensors["embed_tokens.blocks"].data_ptr()
    for name in CONVERTED:
        assert locate(tensors[name]) is None, name


def test_through_the_weight_cache_every_weight_is_mapped(mixed: Path, disk: Path) -> None:
    def build(record: Any) -> Any:
        return load_gguf_model(mixed, None, record)

    offsets = _offsets(mixed)
    hits = wc.STATS.hits
    for run in ("first", "warm"):
        model, _ = wc.cached_load(mixed, None, build)
        entries = sorted(disk.glob(f"**/*{wc.SUFFIX}"))
        assert len(entries) == 1
        # the entry holds the converted tensors only: the views stay in the GGUF
        assert entries[0].stat().st_size < 0.7 * mixed.stat().st_size
        tensors = _tensors(model)
        for name, t in tensors.items():
            if name.endswith(("inv_freq", "rope_cos", "rope_sin")) or t.numel() == 0:
                continue  # rope tables: computed, not loaded
            where = locate(t)
            assert where is not None, f"{run} load: {name} is not a view of a mapped file"
            assert where[0] in (mixed, entries[0].resolve()), (name, where)
        for gguf_name, name in IN_PLACE.items():
            assert locate(tensors[name]) == (mixed, offsets[gguf_name][0]), (run, name)
        for name in CONVERTED:
            assert locate(tensors[name])[0] == entries[0].resolve(), (run, name)
    assert wc.STATS.hits == hits + 1


def test_decoding_reads_the_mapped_weights_and_writes_none(mixed: Path, disk: Path) -> None:
    """Logits from the mapped model equal those of a model whose tensors were copied into
    process memory, and the mapped bytes are what the file holds after the steps."""
    from torchburn.llm import LLM

    def logits(llm: LLM, ids: list[int]) -> torch.Tensor:
        cache = llm.cache_for(1)
        try:
            return llm.run_step(cache, torch.tensor([ids]), 0, torch.zeros(1, dtype=torch.long))
        finally:
            llm.release_cache(cache)

    mapped = LLM.from_pretrained(mixed, device="cpu")
    copied = LLM.from_pretrained(mixed, device="cpu")
    moved = 0
    for t in _tensors(copied.model).values():
        if locate(t) is not None:
            t.data = t.detach().clone()
            moved += 1
    assert moved > 10 and not any(locate(t) for t in _tensors(copied.model).values())
    ids = [3, 17, 42, 5, 9, 60]
    torch.testing.assert_close(logits(mapped, ids), logits(copied, ids), rtol=0, atol=0)
    raw = mixed.read_bytes()
    offsets = _offsets(mixed)
    tensors = _tensors(mapped.model)
    for gguf_name, name in IN_PLACE.items():
        offset, nbytes = offsets[gguf_name]
        assert tensors[name].view(torch.uint8).numpy().tobytes() == raw[offset:offset + nbytes], name


RSS_MEASURE = r"""
import json, re, sys
from pathlib import Path

def status():
    text = Path("/proc/self/status").read_text()
    return {k: int(re.search(k + r":\s+(\d+) kB", text).group(1)) * 1024
            for k in ("VmRSS", "VmHWM", "RssAnon", "RssFile")}

import torch
from torchburn.llm.model.gguf_loader import load_gguf_model

def steps(model, n):
    # eager decode steps: every weight is read
    with torch.no_grad():
        cache = model.new_cache(1, 16)
        for i in range(n):
            model(torch.tensor([[i]]), torch.tensor([[i]]), torch.tensor([i]), torch.zeros(1, dtype=torch.long),
                  cache.tensor, None)

steps(load_gguf_model(Path(sys.argv[1]), None)[0], 2)     # one-time costs (imports, operator tables)
Path("/proc/self/clear_refs").write_text("5")             # reset VmHWM
before = status()
model, _ = load_gguf_model(Path(sys.argv[2]), None)
loaded = status()
steps(model, 2)
ran = status()
print(json.dumps({"before": before, "loaded": loaded, "ran": ran}))
"""


def _write_big(path: Path, small: bool = False) -> Path:
    """A Qwen2 GGUF (no Q/K permutation) whose weights the kernels read in place: Q5_0 q/k/
    gate/down, Q5_1 v/up/o (unlike siblings: none stacked), a Q5_0 embedding (tied)."""
    hidden, ffn, vocab, layers = (256, 256, 512, 1) if small else (1024, 2816, 16384, 3)
    w = gguf.GGUFWriter(str(path), "qwen2")
    for add, value in [(w.add_block_count, layers), (w.add_context_length, 64), (w.add_embedding_length, hidden),
                       (w.add_feed_forward_length, ffn), (w.add_head_count, 8), (w.add_head_count_kv, 8)]:
        add(value)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    w.add_token_list([f"<{i}>" for i in range(vocab)])
    w.add_token_types([1] * vocab)
    rng = np.random.default_rng(0)

    def put(name: str, kind: str, shape: tuple[int, int]) -> None:
        # 64 quantized rows repeated (gguf-py's quantizer is slow on tens of MB)
        x = (rng.standard_normal((64, shape[1]), dtype=np.float32) / np.sqrt(shape[1])).astype(np.float32)
        qtype = gguf.GGMLQuantizationType[kind]
        rows = gguf.quants.quantize(x, qtype)
        w.add_tensor(name, np.ascontiguousarray(np.tile(rows, (shape[0] // 64, 1))), raw_dtype=qtype)

    put("token_embd.weight", "Q5_0", (vocab, hidden))
    for i in range(layers):
        for t, kind, shape in [("attn_q", "Q5_0", (hidden, hidden)), ("attn_k", "Q5_0", (hidden, hidden)),
                               ("attn_v", "Q5_1", (hidden, hidden)), ("attn_output", "Q5_1", (hidden, hidden)),
                               ("ffn_gate", "Q5_0", (ffn, hidden)), ("ffn_up", "Q5_1", (ffn, hidden)),
                               ("ffn_down", "Q5_0", (hidden, ffn))]:
            put(f"blk.{i}.{t}.weight", kind, shape)
        for norm in ("attn_norm", "ffn_norm"):
            w.add_tensor(f"blk.{i}.{norm}.weight", np.ones(hidden, dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to measure RSS")
def test_loading_maps_the_weights_instead_of_reading_them(tmp_path: Path) -> None:
    small, big = _write_big(tmp_path / "small.gguf", small=True), _write_big(tmp_path / "big.gguf")
    size = big.stat().st_size
    assert size > 30e6
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHBURN_DEBUG="0", TORCHBURN_CACHE_DIR="off",
               MALLOC_MMAP_THRESHOLD_="131072")
    run = subprocess.run([sys.executable, "-c", RSS_MEASURE, str(small), str(big)], env=env,
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    got = json.loads(run.stdout.strip().splitlines()[-1])
    before, loaded, ran = got["before"], got["loaded"], got["ran"]
    mib = 2 ** 20
    grown = loaded["VmHWM"] - before["VmRSS"]
    assert grown < 0.15 * size, f"RSS grew by {grown / mib:.1f} MiB loading a {size / mib:.1f} MiB file"
    # decoding touched the weights: they came in as file-backed pages, not anonymous copies
    file_pages = ran["RssFile"] - before["RssFile"]
    anon = ran["RssAnon"] - before["RssAnon"]
    assert file_pages > 0.8 * size, f"only {file_pages / mib:.1f} MiB of the file's pages are resident"
    assert anon < 0.1 * size, f"anonymous memory grew by {anon / mib:.1f} MiB while decoding"


def test_safetensors_float32_tensors_are_views_of_the_file(tmp_path: Path) -> None:
    """A float32 checkpoint loaded as it is: the tensors kept unchanged are views of the file
    (at the offsets its header gives); stacked q/k/v and gate/up are copies, and with
    ``quant`` the linears are quantized from positioned reads (only the norms map)."""
    from safetensors import safe_open

    from tests.llm.test_load_memory import _checkpoint
    from torchburn.llm.model.safetensors_loader import TensorFile, load_safetensors_model

    folder = _checkpoint(tmp_path / "ckpt", 64, 128, 2, 256, 4, 2)
    file = (folder / "model.safetensors").resolve()
    table = TensorFile(file)
    model = load_safetensors_model(folder, None)
    tensors = _tensors(model)
    with safe_open(str(file), framework="pt") as f:
        for hf_name in ("model.embed_tokens.weight", "model.layers.1.self_attn.o_proj.weight",
                        "model.layers.0.mlp.down_proj.weight", "model.norm.weight"):
            name = hf_name.removeprefix("model.")
            begin = int(table.entries[hf_name]["data_offsets"][0])
            assert locate(tensors[name]) == (file, table.base + begin), name
            assert torch.equal(tensors[name], f.get_tensor(hf_name)), name
    assert locate(tensors["layers.0.self_attn.qkv_proj.weight"]) is None
    quantized = _tensors(load_safetensors_model(folder, "int8"))
    assert locate(quantized["norm.weight"]) is not None  # kept as it is
    assert not any(locate(t) for n, t in quantized.items() if n.endswith(("qweight", "scales")))
