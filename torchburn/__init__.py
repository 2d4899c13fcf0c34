"""TorchBurn: a tensor compiler for PyTorch.

    import torch, torchburn
    fast = torch.compile(model, backend="torchburn")
    print(torchburn.explain(model, x))
"""
from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

#: Public names and the modules that define them; imported on first use so that
#: `import torchburn` (and `import torchburn.quant`) stays cheap.
_LAZY = {
    "explain": ("torchburn.backend.explainer", "explain"),
    "ExplainReport": ("torchburn.backend.explainer", "ExplainReport"),
    "backend": ("torchburn.backend", "torchburn_backend"),
    "forget_kept": ("torchburn.backend.launcher", "forget_kept"),
    "LLM": ("torchburn.llm", "LLM"),
    **{name: ("torchburn.runtime.gpu", name) for name in ("gpu_available", "gpu_info", "active_engine")},
    **{name: ("torchburn.quant", name) for name in (
        "QuantizedLinear", "quantize_", "quantize_weight_int8", "quantize_weight_int4_grouped",
        "dequantize_int8", "dequantize_int4", "Int8Weight", "Int4Weight")},
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module), attr)
    raise AttributeError(f"module 'torchburn' has no attribute {name!r}")
