"""Every family from a GGUF file written as llama.cpp's converter writes it (`gguf_fixtures`):
the same logits as transformers running the checkpoint the file was made from, including
Llama 3's rope scaling (a ``rope_freqs`` tensor), Gemma's ``1 + w`` norms and Phi-3's fused
tensors and LongRoPE factors. transformers' own GGUF reader checks that the files keep
llama.cpp's conventions (it undoes them and must get the original weights back)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from torchburn.llm.model.config import ConfigError
from torchburn.llm.model.gguf_loader import load_gguf_model

from .conftest import assert_same_logits, hf_logits, our_logits, transformers
from .gguf_fixtures import write_gguf
from .test_model import BATCHES, _decode_tokens

ARCHS = ["llama", "mistral", "qwen2", "qwen3", "gemma2", "gemma3", "phi3"]


@pytest.fixture(scope="module")
def gguf_file(tiny_checkpoint, tmp_path_factory):  # type: ignore[no-untyped-def]
    made: dict[str, Path] = {}

    def make(arch: str) -> tuple:
        hf, _ = tiny_checkpoint(arch)
        if arch not in made:
            made[arch] = write_gguf(hf, tmp_path_factory.mktemp(f"gguf_{arch}") / f"{arch}.gguf")
        return hf, made[arch]

    return make


@pytest.mark.parametrize("arch", ARCHS)
def test_gguf_logits_match_transformers(gguf_file, arch: str) -> None:
    hf, path = gguf_file(arch)
    ours, _ = load_gguf_model(path, None)
    assert ours.config.architecture == ("llama" if arch == "mistral" else arch)
    rows, steps = BATCHES[2], _decode_tokens(2)
    assert_same_logits(our_logits(ours, ours, rows, steps), hf_logits(hf, rows, steps), rows)


def test_llama3_rope_freqs_are_applied(gguf_file) -> None:
    """The file's ``rope_freqs`` divisors are Llama 3's scaling: rope without them decodes
    different logits (what the loader did before it read them)."""
    hf, path = gguf_file("llama")
    ours, _ = load_gguf_model(path, None)
    assert ours.config.rope_type == "freq_factors"
    rows, steps = BATCHES[1], _decode_tokens(1)
    ref = hf_logits(hf, rows, steps)
    from torchburn.llm.model.rope import _base_inv_freq

    ours.inv_freq = _base_inv_freq(ours.config.rope_theta, ours.config.head_dim)
    with pytest.raises(AssertionError):
        assert_same_logits(our_logits(ours, ours, rows, steps), ref, rows)


@pytest.mark.parametrize("arch", ["llama", "gemma2", "gemma3", "phi3"])
def test_fixture_keeps_llama_cpp_conventions(gguf_file, arch: str) -> None:
    """transformers' GGUF reader (which undoes llama.cpp's Q/K permutation and Gemma's +1)
    reads the fixture back to the original weights."""
    hf, path = gguf_file(arch)
    back = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                             dtype=torch.float32)
    want = hf.state_dict()
    got = back.state_dict()
    for name, value in want.items():
        if name == "lm_head.weight" and name not in got:
            continue
        torch.testing.assert_close(got[name], value, atol=1e-6, rtol=0, msg=name)


def test_gguf_compiled_gemma2_matches_transformers(gguf_file) -> None:
    hf, path = gguf_file("gemma2")
    ours, _ = load_gguf_model(path, None)

    def step(*args):  # type: ignore[no-untyped-def]
        return ours(*args)

    compiled = torch.compile(step, backend="torchburn", dynamic=False)
    rows, steps = BATCHES[2], _decode_tokens(2)
    assert_same_logits(our_logits(compiled, ours, rows, steps, dynamic=True),
                       hf_logits(hf, rows, steps), rows)


@pytest.mark.parametrize("arch", ["gemma3", "phi3"])
def test_llm_runs_a_gguf_file_with_its_sentencepiece_tokenizer(tmp_path, arch: str) -> None:
    """`LLM.from_pretrained` on a GGUF file holding a SentencePiece vocabulary: the prompt is
    encoded and the chat template rendered as transformers does, and the compiled model's
    greedy tokens are transformers' on the same checkpoint."""
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams

    from .conftest import hf_config
    from .tokenizer_fixtures import sentencepiece_folder, sentencepiece_gguf_metadata

    gemma = arch == "gemma3"
    folder = sentencepiece_folder(tmp_path / "tok", gemma)
    ref_tok = transformers.AutoTokenizer.from_pretrained(folder)
    meta = sentencepiece_gguf_metadata(folder, ref_tok, gemma)
    config = hf_config(arch)
    config.vocab_size = len(meta["tokenizer.ggml.tokens"])
    torch.manual_seed(5)
    hf = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager").eval()
    path = write_gguf(hf, tmp_path / f"{arch}.gguf", tokenizer=meta)
    llm = LLM.from_pretrained(path, device="cpu", max_context=64)
    messages = [{"role": "user", "content": "Grüße, how are you? 🎉"}]
    ids = llm.encode_prompt(messages)
    assert ids == ref_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False)
    llm.eos_ids = frozenset()
    got = [s[0] for s in llm.generate_ids([ids], 8, SamplingParams(temperature=0.0))]
    expected = hf.generate(torch.tensor([ids]), max_new_tokens=8, do_sample=False, eos_token_id=None,
                           min_new_tokens=8)[0, len(ids):].tolist()
    assert got == expected


def _set(key: str, value: Any, kind: str):  # type: ignore[no-untyped-def]
    def edit(w, tensors):  # type: ignore[no-untyped-def]
        import gguf

        w.add_key_value(key, value, getattr(gguf.GGUFValueType, kind))
    return edit


def _rope_freqs(n: int):  # type: ignore[no-untyped-def]
    def edit(w, tensors):  # type: ignore[no-untyped-def]
        tensors["rope_freqs.weight"] = np.ones(n, dtype=np.float32)
    return edit


def _drop(name: str):  # type: ignore[no-untyped-def]
    def edit(w, tensors):  # type: ignore[no-untyped-def]
        del tensors[name]
    return edit


BAD = [
    ("llama", _set("general.architecture", "gemma3n", "STRING"), ConfigError, "unsupported architecture 'gemma3n'"),
    ("llama", _set("llama.rope.dimension_count", 8, "UINT32"), ConfigError, "partial rotary"),
    ("llama", _rope_freqs(5), ConfigError, "5 rope factors for a head dim of 16"),
    ("phi3", _drop("rope_factors_short.weight"), ConfigError, "LongRoPE needs both"),
    ("gemma3", _set("gemma3.attention.sliding_window_pattern", [True, False], "ARRAY"), ConfigError,
     "lists 2 layers; the model has 6"),
]


@pytest.mark.parametrize("arch,edit,error,message", BAD, ids=[b[3][:24] for b in BAD])
def test_gguf_family_metadata_errors_name_the_problem(tiny_checkpoint, tmp_path, arch, edit, error,
                                                      message) -> None:  # type: ignore[no-untyped-def]
    hf, _ = tiny_checkpoint(arch)
    path = write_gguf(hf, tmp_path / "bad.gguf", edit=edit)
    with pytest.raises(error, match=message):
        load_gguf_model(path, None)
