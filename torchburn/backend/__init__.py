"""The torch-facing layer: the `torch.compile` entry point and everything around it that touches
torch (FX-graph cache, decomposition cache, inference fast path, launchers, report, explain).

`torch.compile(model, backend="torchburn")` finds `torchburn_backend` here through the
`torch_dynamo_backends` entry point. Importing this package stays cheap: the compiler proper
loads on the first cache miss."""
from __future__ import annotations

from .entry import compile_fx_graph, torchburn_backend

__all__ = ["compile_fx_graph", "torchburn_backend"]
