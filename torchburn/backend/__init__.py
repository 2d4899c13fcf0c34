"""The torch-facing layer: the `torch.compile` entry point and everything around it that touches
torch (FX-graph cache, decomposition cache, inference fast path, launchers, report, explain).

`torch.compile(model, backend="torchburn")` finds `torchburn_backend` here through the
`torch_dynamo_backends` entry point. Importing this package stays cheap: the compiler proper
loads on the first cache miss.

`torchburn_backend` is looked up lazily (PEP 562 `__getattr__`), and the lookup reads the
configuration: `torch.compile(..., backend="torchburn")` loads the entry point at once, so a bad
`TORCHBURN_*` value fails right there with a `ConfigError` naming the variable, rather than as
`BackendCompilerFailed` at the model's first call."""
from __future__ import annotations

from typing import Any

from .entry import InternalCompilerError, compile_fx_graph

__all__ = ["InternalCompilerError", "compile_fx_graph", "torchburn_backend"]


def __getattr__(name: str) -> Any:
    if name == "torchburn_backend":
        from ..runtime.config import get_config
        from .entry import torchburn_backend

        get_config()  # raises ConfigError naming a bad TORCHBURN_* variable
        return torchburn_backend
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
