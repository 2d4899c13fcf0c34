"""TorchBurn's LLM engine: open decoder-only models (Llama/SmolLM2, Qwen2/2.5, Qwen3, Mistral)
from safetensors folders, the Hugging Face Hub or GGUF files, run as ordinary ``nn.Module``s
through ``torch.compile(backend="torchburn")``.  See ``docs/llm.md``.

    from torchburn import LLM
    llm = LLM.from_pretrained()            # SmolLM2-135M-Instruct (GGUF), fetched on first use
    print(llm.generate("Hello"))

The engine lives in rooms by job, imported in this order only (tests/test_layering.py):
``model/`` (families as modules, weights, tokenizers, chat templates; imports no other room),
``runtime/`` (engine, KV slots, sampling, the scheduler), ``serve/`` (the HTTP server) and
``cli/`` (the command line).  The public names below are loaded on first use, so importing one
room (say ``torchburn.llm.model.gguf_reader``) does not load the engine.
"""
from __future__ import annotations

import importlib
from typing import Any

#: Public name -> the module that defines it.
_LAZY = {
    "LLM": "torchburn.llm.runtime.engine",
    "ContextError": "torchburn.llm.runtime.engine",
    "ConfigError": "torchburn.llm.model.config",
    "DecoderConfig": "torchburn.llm.model.config",
    "SUPPORTED_ARCHITECTURES": "torchburn.llm.model.config",
    "Decoder": "torchburn.llm.model.decoder",
    "SamplingParams": "torchburn.llm.runtime.sampling",
    "ChatSession": "torchburn.llm.runtime.session",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'torchburn.llm' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
