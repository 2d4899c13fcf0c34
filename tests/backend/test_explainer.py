"""`explain()` shows, per GPU subgraph, the bytes that crossed the device boundary."""
from __future__ import annotations

import pytest
import torch

import torchburn
from torchburn.backend import gpu_resident as gr
from torchburn.runtime.config import reload_config


def test_gpu_subgraph_reports_bytes_up_down_and_resident(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_DEVICE", "gpu")
    reload_config()
    try:
        from torchburn.runtime.gpu import gpu_available, gpu_unavailable_reason

        if not gpu_available():
            pytest.skip(f"no WebGPU adapter: {gpu_unavailable_reason()}")
        cache = torch.zeros(4, 16)
        gr.keep_on_gpu(cache)

        def step(cache: torch.Tensor, slot: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
            out = (cache * x).sum(-1)
            cache[slot] = x * 2
            return out

        report = torchburn.explain(step, cache, torch.tensor([1], dtype=torch.int32), torch.ones(1, 16))
        (sub,) = [s for g in report.graphs for s in g.subgraphs]
        assert sub.engine == "wgpu" and sub.transfers is not None
        t = sub.transfers
        # one call: the cache (256 B), the slot (4 B) and x (64 B) up; only the output (16 B) down
        assert (t.calls, t.last_up, t.last_down, t.resident) == (1, 256 + 4 + 64, 16, 256 + 4 + 64)
        assert "device boundary: last call 324 B up, 16 B down" in str(report)
        gr.release(cache)
        assert cache[1].tolist() == [2.0] * 16  # brought back by release
    finally:
        monkeypatch.undo()
        reload_config()
