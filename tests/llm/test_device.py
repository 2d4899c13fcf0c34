"""``device="gpu"``: the same model compiled for the wgpu engine (the software adapter in CI)
gives transformers' logits."""
from __future__ import annotations

import os

import pytest
import torch

from .conftest import VOCAB, assert_same_logits, hf_logits, our_logits


def _gpu() -> bool:
    try:
        from torchburn.runtime.gpu import gpu_available

        return gpu_available()
    except Exception:
        return False


@pytest.mark.skipif(not _gpu(), reason="no WebGPU adapter on this machine")
def test_gpu_device_matches_transformers(tiny_checkpoint, monkeypatch) -> None:
    from torchburn.runtime.config import reload_config
    from torchburn.llm import LLM

    monkeypatch.setenv("TORCHBURN_DEVICE", os.environ.get("TORCHBURN_DEVICE", "cpu"))
    hf, folder = tiny_checkpoint("llama")
    try:
        llm = LLM.from_pretrained(folder, device="gpu", max_context=64)
        assert llm.device == "gpu" and os.environ["TORCHBURN_DEVICE"] == "gpu"
        rows = [[5, 17, 99, 250, 3, 41, 7, 8]]
        steps = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(0))
        got = our_logits(llm._step, llm.model, rows, steps, dynamic=llm.compiled)
        assert_same_logits(got, hf_logits(hf, rows, steps), rows)
    finally:
        monkeypatch.undo()
        reload_config()


def test_unknown_device_is_refused() -> None:
    from torchburn.llm.device import select_device

    with pytest.raises(ValueError, match="device must be one of auto, cpu, gpu"):
        select_device("tpu", None)
