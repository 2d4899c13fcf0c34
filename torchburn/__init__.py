"""TorchBurn: a tensor compiler for PyTorch.

    import torch, torchburn
    fast = torch.compile(model, backend="torchburn")
    print(torchburn.explain(model, x))
"""
from __future__ import annotations

__version__ = "0.1.0"

from .explain import ExplainReport, explain

__all__ = ["__version__", "explain", "ExplainReport", "backend"]


def __getattr__(name: str):  # lazy: importing torchburn stays cheap
    if name == "backend":
        from .backend import torchburn_backend

        return torchburn_backend
    raise AttributeError(f"module 'torchburn' has no attribute {name!r}")
