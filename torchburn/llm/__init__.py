"""TorchBurn's LLM engine: open decoder-only models (Llama/SmolLM2, Qwen2/2.5, Qwen3, Mistral)
from safetensors folders, the Hugging Face Hub or GGUF files, run as ordinary ``nn.Module``s
through ``torch.compile(backend="torchburn")``.  See ``docs/llm.md``.

    from torchburn import LLM
    llm = LLM.from_pretrained()            # SmolLM2-135M-Instruct (GGUF), fetched on first use
    print(llm.generate("Hello"))
"""
from __future__ import annotations

from .config import SUPPORTED_ARCHITECTURES, ConfigError, DecoderConfig
from .engine import LLM, ContextError
from .model import Decoder

__all__ = ["LLM", "ContextError", "ConfigError", "Decoder", "DecoderConfig",
           "SUPPORTED_ARCHITECTURES"]
