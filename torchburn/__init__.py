"""TorchBurn: a tensor compiler for PyTorch.

    import torch, torchburn
    fast = torch.compile(model, backend="torchburn")
    print(torchburn.explain(model, x))
"""
from __future__ import annotations

__version__ = "0.1.0"

from .explain import ExplainReport, explain

__all__ = ["__version__", "explain", "ExplainReport", "backend", "gpu_available", "gpu_info", "active_engine"]

_GPU_EXPORTS = ("gpu_available", "gpu_info", "active_engine")


def __getattr__(name: str):  # lazy: importing torchburn stays cheap
    if name == "backend":
        from .backend import torchburn_backend

        return torchburn_backend
    if name in _GPU_EXPORTS:
        from .runtime import gpu

        return getattr(gpu, name)
    raise AttributeError(f"module 'torchburn' has no attribute {name!r}")
