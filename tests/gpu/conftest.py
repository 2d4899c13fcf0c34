"""The GPU engine's tests run on whatever adapter wgpu finds (CI: Mesa's llvmpipe through
OpenGL, a software GPU) and are skipped, with the reason, when there is none."""
from __future__ import annotations

from typing import Any, Callable, Iterator, Optional

import pytest
import torch

from torchburn.runtime.config import reload_config
from tests.helpers import run_compiled


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """TORCHBURN_DEVICE=gpu for one test; skips when no adapter exists."""
    monkeypatch.setenv("TORCHBURN_DEVICE", "gpu")
    monkeypatch.delenv("TORCHBURN_ENGINE", raising=False)
    reload_config()
    from torchburn.runtime import gpu as engine

    if not engine.gpu_available():
        monkeypatch.undo()
        reload_config()
        pytest.skip(f"no WebGPU adapter: {engine.gpu_unavailable_reason()}")
    yield engine
    monkeypatch.undo()
    reload_config()


def engines(reports: list[Any]) -> list[tuple[str, Optional[str]]]:
    return [(s.engine, s.engine_note) for r in reports for s in r.subgraphs if s.compiled]


def check_gpu(fn: Callable[..., Any], *args: Any, rtol: Optional[float] = None, atol: Optional[float] = None,
              dynamic: Optional[bool] = False) -> list[Any]:
    """`fn` compiled on the GPU engine equals eager, and every compiled subgraph ran there."""
    with torch.no_grad():
        expected = fn(*args)
        out, reports = run_compiled(fn, *args, dynamic=dynamic)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol, equal_nan=True)
    used = engines(reports)
    assert used, "nothing was compiled"
    assert all(e == "wgpu" for e, _ in used), f"a subgraph left the GPU engine: {used}"
    return reports
