"""The model room: decoder families as ``nn.Module``s, their configs and validation, weights from
GGUF/safetensors files and the Hub, tokenizers and chat templates.  It imports no other room of
``torchburn.llm`` (the engine, the server and the command line build on it, never the reverse)."""
