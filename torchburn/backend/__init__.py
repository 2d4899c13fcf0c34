"""The torch-facing layer: the `torch.compile` entry point and everything around it that touches
torch (FX-graph cache, decomposition cache, inference fast path, launchers, report, explain).

`torch.compile(model, backend="torchburn")` finds `torchburn_backend` here through the
`torch_dynamo_backends` entry point. Importing this package stays cheap: the compiler proper
loads on the first cache miss.

The names are looked up lazily (PEP 562 `__getattr__`: `entry.py` imports Dynamo, which a
process running only cached LLM steps never needs), and the lookup of `torchburn_backend` reads
the configuration: `torch.compile(..., backend="torchburn")` loads the entry point at once, so a bad
`TORCHBURN_*` value fails right there with a `ConfigError` naming the variable, rather than as
`BackendCompilerFailed` at the model's first call."""
from __future__ import annotations

from typing import Any

__all__ = ["InternalCompilerError", "compile_fx_graph", "torchburn_backend"]


def __getattr__(name: str) -> Any:
    if name == "torchburn_backend":
        from ..runtime.config import get_config
        from .entry import torchburn_backend

        get_config()  # raises ConfigError naming a bad TORCHBURN_* variable
        return torchburn_backend
    if name in ("InternalCompilerError", "compile_fx_graph"):  # entry.py imports Dynamo: only on use
        from . import entry

        return getattr(entry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
