"""Shared test helpers: compile with torchburn, compare with eager, and prove it compiled."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Callable, Iterator, Optional

import torch

from torchburn.backend import report as rep
from torchburn.backend.entry import torchburn_backend


def run_compiled(fn: Callable[..., Any], *args: Any, dynamic: Optional[bool] = False,
                 reset: bool = True, options: Optional[dict[str, Any]] = None) -> tuple[Any, list[rep.GraphReport]]:
    """Compile `fn` with a fresh Dynamo cache (and the backend's `options`), run it, and return
    (result, graph reports)."""
    if reset:
        torch._dynamo.reset()
    records = rep.start_recording()
    try:
        out = torch.compile(fn, backend=torchburn_backend, dynamic=dynamic, fullgraph=True, options=options)(*args)
    finally:
        rep.stop_recording()
    return out, list(records)


def assert_fully_compiled(reports: list[rep.GraphReport]) -> None:
    """At least one subgraph was compiled and nothing fell back to PyTorch."""
    assert reports, "no graph reached the backend"
    fallbacks = [op for r in reports for op in r.fallback_ops]
    reasons = [(s.name, s.reason) for r in reports for s in r.subgraphs if not s.compiled]
    assert not fallbacks, f"ops fell back to PyTorch: {fallbacks} {reasons} {[r.fallbacks for r in reports]}"
    assert any(s.compiled for r in reports for s in r.subgraphs), "no subgraph was compiled"


def train_step_like_eager(compiled: Callable[..., Any], model: torch.nn.Module, eager: torch.nn.Module,
                          x: torch.Tensor) -> list[rep.GraphReport]:
    """One training step of `compiled` (wrapping `model`) and of `eager` (its copy) on `x`:
    outputs and parameter gradients equal; returns the graphs compiled during the step."""
    records = rep.start_recording()
    try:
        out = compiled(x)
        out.square().sum().backward()
    finally:
        rep.stop_recording()
    want = eager(x)
    want.square().sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-3)
    return records


def check(fn: Callable[..., Any], *args: Any, rtol: Optional[float] = None, atol: Optional[float] = None,
          dynamic: Optional[bool] = False, require_compiled: bool = True) -> Any:
    """Compiled result equals eager's (with `assert_close`'s dtype-aware tolerances)."""
    expected = fn(*args)
    out, reports = run_compiled(fn, *args, dynamic=dynamic)
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol, equal_nan=True)
    if require_compiled:
        assert_fully_compiled(reports)
    return out


@contextlib.contextmanager
def engine(name: str) -> Iterator[None]:
    """Run the block with `TORCHBURN_ENGINE=name` (configuration reloaded on the way in and out)."""
    from torchburn.runtime.config import reload_config

    old = os.environ.get("TORCHBURN_ENGINE")
    os.environ["TORCHBURN_ENGINE"] = name
    reload_config()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCHBURN_ENGINE", None)
        else:
            os.environ["TORCHBURN_ENGINE"] = old
        reload_config()


def check_engines(fn: Callable[..., Any], *args: Any, rtol: Optional[float] = None,
                  atol: Optional[float] = None) -> None:
    """Compiled (LLVM) vs reference engine vs eager: each engine's result equals eager's, and
    the two engines agree with each other, and the reference run is reported as such."""
    expected = fn(*args)
    native = check(fn, *args, rtol=rtol, atol=atol)
    with engine("reference"):
        golden, reports = run_compiled(fn, *args)
    assert_fully_compiled(reports)
    assert {s.engine for r in reports for s in r.subgraphs if s.compiled} == {"reference"}
    torch.testing.assert_close(golden, expected, rtol=rtol, atol=atol, equal_nan=True)
    torch.testing.assert_close(native, golden, rtol=rtol, atol=atol, equal_nan=True)
