"""`truncate_gguf`: the default GGUF cut to its first blocks, byte for byte."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from torchburn.llm.model.gguf_loader import GGUFError, field, open_gguf
from torchburn.llm.model.gguf_truncate import truncate_gguf

from .conftest import smollm_gguf, smollm_missing

GGUF = smollm_gguf()
needs_gguf = pytest.mark.skipif(GGUF is None, reason=smollm_missing())


@needs_gguf
def test_truncated_file_keeps_metadata_and_the_first_blocks(tmp_path: Path) -> None:
    assert GGUF is not None
    out = truncate_gguf(GGUF, tmp_path / "one.gguf", 1)
    src, cut = open_gguf(GGUF), open_gguf(out)
    assert field(cut, "llama.block_count") == 1
    assert field(cut, "tokenizer.ggml.tokens") == field(src, "tokenizer.ggml.tokens")
    assert field(cut, "tokenizer.chat_template") == field(src, "tokenizer.chat_template")
    kept = {t.name: t for t in cut.tensors}
    assert kept and all(not n.startswith("blk.") or n.startswith("blk.0.") for n in kept)
    for t in src.tensors:
        if not t.name.startswith("blk.") or t.name.startswith("blk.0."):
            assert t.tensor_type == kept[t.name].tensor_type
            assert np.array_equal(np.asarray(t.data), np.asarray(kept[t.name].data)), t.name
    with pytest.raises(GGUFError, match="cannot keep 31"):
        truncate_gguf(GGUF, tmp_path / "more.gguf", 31)
