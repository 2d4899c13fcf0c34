"""Tokenizers rebuilt from GGUF metadata and read from tokenizer.json agree with transformers'
on multilingual, code and emoji text; streamed pieces never split a character."""
from __future__ import annotations

import pytest

from torchburn.llm.model.tokenizer import StreamDecoder, tokenizer_from_folder

from .conftest import smollm_gguf, smollm_missing, transformers

TEXTS = [
    "Hello world, 12345 and 3.14!",
    "Grüße aus Köln — naïve café, Ærøskøbing",
    "日本語のテキストと中文，한국어",
    "Привет, мир! مرحبا بالعالم",
    "def f(x):\n    return x**2  # squared\n\tif a != b: pass\n",
    "emoji 🎉🔥 family 👩‍👩‍👧 flags 🇫🇷",
    "<|im_start|>user\nhi<|im_end|>\n",
    "  leading   spaces\n\n\nand newlines  ",
]


@pytest.fixture(scope="module")
def gguf_pair():  # type: ignore[no-untyped-def]
    path = smollm_gguf()
    if path is None:
        pytest.skip(smollm_missing())
    from torchburn.llm.model.gguf_loader import open_gguf
    from torchburn.llm.model.tokenizer import tokenizer_from_gguf

    ours = tokenizer_from_gguf(open_gguf(path))
    ref = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return ours, ref


@pytest.mark.parametrize("text", TEXTS)
def test_gguf_tokenizer_matches_transformers(gguf_pair, text: str) -> None:
    ours, ref = gguf_pair
    ids = ours.encode(text)
    assert ids == ref(text)["input_ids"]
    assert ours.decode(ids) == ref.decode(ids) == text


def test_gguf_special_tokens(gguf_pair) -> None:
    ours, _ = gguf_pair
    assert ours.encode("<|im_end|>") == [2]
    assert 2 in ours.eos_token_ids
    assert ours.decode([2, 504], skip_special_tokens=True) == "The"


@pytest.mark.parametrize("text", TEXTS)
def test_tokenizer_json_matches_transformers(tiny_checkpoint, text: str) -> None:
    _, folder = tiny_checkpoint("llama")
    ours = tokenizer_from_folder(folder)
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    ids = ours.encode(text)
    assert ids == ref(text)["input_ids"]
    assert ours.decode(ids) == ref.decode(ids) == text


@pytest.mark.parametrize("text", TEXTS)
def test_stream_decoder_reassembles_text(gguf_pair, text: str) -> None:
    ours, _ = gguf_pair
    stream = StreamDecoder(ours)
    pieces = [stream.push(i) for i in ours.encode(text)]
    assert "".join(pieces) == ours.decode(ours.encode(text), skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces)


def test_stream_decoder_waits_for_whole_characters(gguf_pair) -> None:
    """A byte-level token holding half of a character yields nothing until the rest comes."""
    ours, _ = gguf_pair
    vocab = ours.backend.get_vocab()
    # "é" is bytes C3 A9, which GPT-2's byte map renders as "Ã" and "©".
    first, second = vocab["Ã"], vocab["©"]
    stream = StreamDecoder(ours)
    assert stream.push(first) == ""
    assert stream.push(second) == "é"
