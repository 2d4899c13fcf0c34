"""The LLM step cache: a learned step is used in-process and by a later `LLM` without Dynamo
(disk hit), keys change with what shapes the step, and every miss or refusal takes the
`torch.compile` path with the same tokens."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from torchburn.backend import report
from torchburn.compiler import driver
from torchburn.llm import LLM
from torchburn.llm.runtime import step_cache as sc
from torchburn.llm.runtime.sampling import SamplingParams
from torchburn.runtime import config

ROWS = [[5, 17, 99, 250, 3, 41, 7]]


def _llm(folder: Path, **kw: Any) -> LLM:
    llm = LLM.from_pretrained(folder, device="cpu", max_context=kw.pop("max_context", 64), **kw)
    llm.eos_ids = frozenset()
    return llm


def _greedy(llm: LLM, n: int = 6) -> list[int]:
    return [s[0] for s in llm.generate_ids(ROWS, n, SamplingParams(temperature=0.0))]


@pytest.fixture()
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path))
    config.reload_config()
    driver.memory_cache().clear()
    torch._dynamo.reset()
    yield tmp_path
    monkeypatch.undo()
    config.reload_config()
    driver.memory_cache().clear()


def _fresh_process_state() -> None:
    """What a new process lacks: Dynamo's compiled frames and the in-memory program cache."""
    torch._dynamo.reset()
    driver.memory_cache().clear()


def _step_files(folder: Path) -> list[Path]:
    return sorted(folder.glob("**/st/st*.tbfx"))


def test_in_process_step_is_learned_and_gives_the_same_tokens(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("llama")
    torch._dynamo.reset()
    eager = _greedy(_llm(folder, compile=False))
    llm = _llm(folder, compile=True)
    assert llm.steps is not None
    assert _greedy(llm) == eager
    # the prefill bucket and the decode step, each checked against Dynamo's result
    assert llm.steps.stats.recorded == 2 and llm.steps.stats.stored == 0  # disk cache off
    assert sum(s is not None for s in llm.steps.entries.values()) == 2


def test_warm_llm_skips_dynamo_and_matches(tiny_checkpoint, disk: Path) -> None:
    _, folder = tiny_checkpoint("llama")
    cold = _llm(folder, compile=True)
    first = _greedy(cold)
    assert cold.steps is not None and cold.steps.stats.stored == 2
    assert len(_step_files(disk)) == 2
    _fresh_process_state()
    warm = _llm(folder, compile=True)
    graphs = report.start_recording()
    try:
        second = _greedy(warm)
    finally:
        report.stop_recording()
    assert second == first
    assert graphs == []  # no Dynamo graph was compiled: both steps came from the step cache
    assert warm.steps is not None and warm.steps.stats.disk_hits == 2
    assert warm._step.compiled is None  # torch.compile was never even called


def test_changed_layout_or_context_is_a_miss(tiny_checkpoint, disk: Path) -> None:
    _, folder = tiny_checkpoint("llama")
    _greedy(_llm(folder, compile=True))
    _fresh_process_state()
    quantized = _llm(folder, compile=True, quant="int8")  # other tensors: its own steps
    _greedy(quantized)
    assert quantized.steps is not None and quantized.steps.stats.disk_hits == 0
    assert quantized.steps.stats.recorded == 2
    _fresh_process_state()
    longer = _llm(folder, compile=True, max_context=96)
    _greedy(longer)
    assert longer.steps is not None and longer.steps.stats.disk_hits == 0


def test_key_covers_version_config_layout_and_signature(tiny_checkpoint, disk: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder = tiny_checkpoint("qwen2")  # tied embeddings
    llm = _llm(folder, compile=False)
    part = sc.model_fingerprint(llm.model)
    ids = torch.zeros((1, 1), dtype=torch.long)
    past = torch.zeros((4, 1, 2, 8, 16))[:, :, :, :4]
    args = (ids, ids, ids[0], ids[0], past, None)
    base = sc.step_key(part, 64, sc.signature(args))
    assert base is not None and base == sc.step_key(part, 64, sc.signature(args))
    assert base != sc.step_key(part, 65, sc.signature(args))
    assert base != sc.step_key(part, 64, sc.signature((ids, ids, ids[0], ids[0], past, ids[0])))
    assert base != sc.step_key(part, 64, sc.signature((torch.zeros((2, 1), dtype=torch.long),) + args[1:]))
    # the past's length is bound per call: it does not change the key
    assert base == sc.step_key(part, 64, sc.signature(args[:4] + (past[:, :, :, :3], None)))
    # a parameter of another dtype, or untied weights, is another layout
    head = llm.model.lm_head.weight
    llm.model.lm_head.weight = torch.nn.Parameter(head.detach().clone())
    assert sc.model_fingerprint(llm.model) != part
    llm.model.lm_head.weight = torch.nn.Parameter(head.detach().double())
    assert sc.model_fingerprint(llm.model) != part
    llm.model.lm_head.weight = head
    assert sc.model_fingerprint(llm.model) == part
    # torchburn's source and the engine configuration
    from torchburn.runtime import disk_cache

    monkeypatch.setattr(disk_cache, "source_digest", lambda: "another checkout")
    assert base != sc.step_key(part, 64, sc.signature(args))
    monkeypatch.undo()
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(disk))
    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")
    config.reload_config()
    assert base != sc.step_key(part, 64, sc.signature(args))
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    config.reload_config()
    assert sc.step_key(part, 64, sc.signature(args)) is None  # no disk cache, no disk key


def test_malformed_entry_or_missing_program_is_a_miss_that_recompiles(tiny_checkpoint, disk: Path) -> None:
    _, folder = tiny_checkpoint("llama")
    first = _greedy(_llm(folder, compile=True))
    files = _step_files(disk)
    assert len(files) == 2
    files[0].write_bytes(b"not a step record")
    for program in disk.glob("**/*.tbc"):  # every program gone: the other entry misses too
        program.unlink()
    _fresh_process_state()
    llm = _llm(folder, compile=True)
    assert _greedy(llm) == first
    assert llm.steps is not None and llm.steps.stats.disk_hits == 0 and llm.steps.stats.stored == 2


def test_a_step_the_program_refuses_falls_back_to_dynamo(tiny_checkpoint, disk: Path) -> None:
    _, folder = tiny_checkpoint("llama")
    first = _greedy(_llm(folder, compile=True))
    disk_cache = __import__("torchburn.runtime.disk_cache", fromlist=["disk_cache"]).disk_cache(disk)
    for path in _step_files(disk):  # bind the ids where the slots go: the launcher's guards refuse
        key = path.name.split(".")[0]
        raw = disk_cache.load_graph(key)
        inputs = raw["plan"]["inputs"]
        a, b = inputs.index(["arg", 0]), inputs.index(["arg", 2])
        inputs[a], inputs[b] = inputs[b], inputs[a]
        disk_cache.store_graph(key, raw)
    _fresh_process_state()
    llm = _llm(folder, compile=True)
    assert _greedy(llm) == first
    assert llm.steps is not None and llm.steps.stats.disk_hits == 2 and llm.steps.stats.stale == 2


def test_step_cache_off_keeps_dynamo(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    _, folder = tiny_checkpoint("llama")
    monkeypatch.setenv("TORCHBURN_LLM_STEP_CACHE", "off")
    assert _llm(folder, compile=True).steps is None
