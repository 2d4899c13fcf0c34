"""Tokenizers rebuilt from GGUF metadata equal transformers' tokenizer loaded from the model's
own files, for SentencePiece vocabularies (Llama 2 / Mistral style and Gemma style) and
byte-level BPE ones (Llama 3 and Qwen2 pre-tokenizers): the same ids on a varied corpus, the
same text back, the same special tokens, the chat template from the file. The tokenizers are
trained here (`tokenizer_fixtures`) and their metadata written as llama.cpp's converter does."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from torchburn.llm.model.chat_template import render_chat
from torchburn.llm.model.gguf_loader import metadata, open_gguf
from torchburn.llm.model.tokenizer import tokenizer_from_gguf

from .conftest import transformers
from .gguf_fixtures import add_tokenizer_metadata
from .tokenizer_fixtures import (CHAT_TEMPLATE, bpe_folder, bpe_gguf_metadata, sentencepiece_folder,
                                 sentencepiece_gguf_metadata)

pytest.importorskip("sentencepiece")

TEXTS = [
    "Hello world, 12345 and 3.14!",
    "Grüße aus Köln — naïve café, Ærøskøbing",
    "日本語のテキストと中文，한국어",
    "Привет, мир! مرحبا بالعالم",
    "def f(x):\n    return x**2  # squared\n\tif a != b: pass\n",
    "emoji 🎉🔥 family 👩‍👩‍👧 flags 🇫🇷",
    "  leading   spaces\n\n\nand newlines  ",
    "\t\ttabs\tand\u00a0nbsp and ​zero width",
    "<start_of_turn>user\nhi there<end_of_turn>\n<start_of_turn>model\n",
    "<|im_start|>user\nhi<|im_end|> <|eot_id|><|begin_of_text|> <tool>x",
    "the quick brown fox jumps over the lazy dog",
    " ",
    "",
    "a" * 50 + " " * 7 + "!" * 9,
]
KINDS = ["spm-llama", "spm-gemma", "bpe-llama3", "bpe-qwen2"]


def _write(path: Path, meta: dict[str, Any]) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    add_tokenizer_metadata(w, meta)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def pair(tmp_path_factory):  # type: ignore[no-untyped-def]
    made: dict[str, tuple] = {}

    def make(kind: str) -> tuple:
        if kind not in made:
            folder = tmp_path_factory.mktemp(kind)
            if kind.startswith("spm"):
                gemma = kind == "spm-gemma"
                sentencepiece_folder(folder, gemma)
                ref = transformers.AutoTokenizer.from_pretrained(folder)
                meta = sentencepiece_gguf_metadata(folder, ref, gemma)
            else:
                pre = {"bpe-llama3": "llama-bpe", "bpe-qwen2": "qwen2"}[kind]
                bpe_folder(folder, pre)
                ref = transformers.AutoTokenizer.from_pretrained(folder)
                meta = bpe_gguf_metadata(folder, pre)
            path = _write(folder / "tok.gguf", meta)
            ours = tokenizer_from_gguf(metadata(open_gguf(path, fast=True)))
            made[kind] = (ours, ref)
        return made[kind]

    return make


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_gguf_tokenizer_matches_transformers(pair, kind: str, text: str) -> None:
    ours, ref = pair(kind)
    ids = ours.encode(text)
    assert ids == ref(text)["input_ids"]
    assert ours.decode(ids) == ref.decode(ids)
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
    plain = ours.encode(text, add_special_tokens=False)
    assert plain == ref(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("kind", KINDS)
def test_gguf_tokenizer_specials_and_template(pair, kind: str) -> None:
    ours, ref = pair(kind)
    assert ours.vocab_size == len(ref)
    if ref.bos_token is not None and kind != "bpe-qwen2":
        assert ours.bos_token == ref.bos_token and ours.add_bos
    assert ref.convert_tokens_to_ids(ours.eos_token) in ours.eos_token_ids
    assert ours.chat_template == CHAT_TEMPLATE
    messages = [{"role": "user", "content": "hi"}]
    text = render_chat(ours.chat_template, messages, bos_token=ours.bos_token or "")
    assert text == ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert ours.encode(text, add_special_tokens=False) == ref.apply_chat_template(
        messages, tokenize=True, add_generation_prompt=True, return_dict=False)


def test_sentencepiece_byte_fallback_is_used(pair) -> None:
    """Characters the small vocabulary lacks come out as their UTF-8 byte pieces."""
    ours, _ = pair("spm-llama")
    ids = ours.encode("€", add_special_tokens=False)
    pieces = [ours.backend.id_to_token(i) for i in ids]
    assert "<0xE2>" in pieces and ours.decode(ids) == "€"


def test_end_of_turn_tokens_end_generation(pair) -> None:
    """Gemma-style files name ``<eos>`` as EOS; a turn ends with ``<end_of_turn>``, which
    stops generation too (as in llama.cpp)."""
    ours, ref = pair("spm-gemma")
    assert set(ours.eos_token_ids) == {ref.convert_tokens_to_ids("<eos>"),
                                       ref.convert_tokens_to_ids("<end_of_turn>")}
