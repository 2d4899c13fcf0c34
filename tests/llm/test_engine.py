"""`LLM`: loading a folder, generate (batch, padding, stop strings, seeds), stream, context
limits, generation_config defaults."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchburn.llm import LLM, ContextError
from torchburn.llm.runtime.sampling import SamplingParams

from .conftest import left_pad


def _llm(folder: Path, **kw) -> LLM:  # type: ignore[no-untyped-def]
    kw.setdefault("compile", False)
    return LLM.from_pretrained(folder, device="cpu", max_context=kw.pop("max_context", 96), **kw)


def _hf_greedy(hf, rows: list[list[int]], n: int) -> list[list[int]]:  # type: ignore[no-untyped-def]
    ids, mask = left_pad(rows)
    out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n, min_new_tokens=n,
                      do_sample=False, pad_token_id=0, eos_token_id=None)
    return out[:, ids.shape[1]:].tolist()


def _ours_greedy(llm: LLM, rows: list[list[int]], n: int) -> list[list[int]]:
    llm.eos_ids = frozenset()
    steps = list(llm.generate_ids(rows, n, SamplingParams(temperature=0.0)))
    return [[s[b] for s in steps] for b in range(len(rows))]


ROWS = [[5, 17, 99, 250, 3, 41, 7, 8, 200, 13, 77, 21, 9, 10, 11, 12, 14, 15, 16, 18], [44, 12, 300]]


def test_greedy_batch_matches_transformers_eager(tiny_checkpoint) -> None:
    """Left-padded batch of 2, prompt longer than the first bucket (two prefill chunks)."""
    hf, folder = tiny_checkpoint("qwen3")
    assert _ours_greedy(_llm(folder), ROWS, 20) == _hf_greedy(hf, ROWS, 20)


def test_greedy_batch_matches_transformers_compiled(tiny_checkpoint) -> None:
    hf, folder = tiny_checkpoint("llama")
    assert _ours_greedy(_llm(folder, compile=True), ROWS, 12) == _hf_greedy(hf, ROWS, 12)


def test_generate_text_and_batch(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")
    llm = _llm(folder)
    one = llm.generate("hello world", max_new_tokens=8, temperature=0)
    two = llm.generate(["hello world", "the quick brown fox jumps"], max_new_tokens=8,
                       temperature=0)
    assert isinstance(one, str) and isinstance(two, list) and two[0] == one
    assert two[1] == llm.generate("the quick brown fox jumps", max_new_tokens=8, temperature=0)
    chat = llm.generate([{"role": "user", "content": "hello"}], max_new_tokens=4)
    assert isinstance(chat, str)


def test_stream_equals_generate(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")
    llm = _llm(folder)
    kw = dict(max_new_tokens=24, temperature=0.8, seed=3)
    assert "".join(llm.stream("Grüße 日本語", **kw)) == llm.generate("Grüße 日本語", **kw)


def test_seed_makes_sampling_reproducible(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")
    llm = _llm(folder)
    kw = dict(max_new_tokens=16, temperature=1.5, top_k=50, top_p=0.95, min_p=0.01)
    a, b = llm.generate("hello", seed=1, **kw), llm.generate("hello", seed=1, **kw)
    others = {llm.generate("hello", seed=s, **kw) for s in range(2, 6)}
    assert a == b and len(others | {a}) > 1


def test_stop_strings(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")
    llm = _llm(folder)
    full = llm.generate("hello", max_new_tokens=24, temperature=0)
    assert len(full) > 4
    stop = full[2:4]
    cut = full[:full.find(stop)]
    assert llm.generate("hello", max_new_tokens=24, temperature=0, stop=[stop]) == cut
    assert "".join(llm.stream("hello", max_new_tokens=24, temperature=0, stop=[stop])) == cut


def test_prompt_longer_than_context_is_an_error(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder, max_context=16)
    with pytest.raises(ContextError, match="max_context is 16"):
        llm.generate("the quick brown fox jumps over the lazy dog " * 4, max_new_tokens=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        llm.eos_ids = frozenset()
        list(llm.generate_ids([[5] * 12], 10, SamplingParams(temperature=0.0)))
    assert any("max_context=16" in str(w.message) for w in caught)


def test_generation_config_gives_defaults(tiny_checkpoint, tmp_path: Path) -> None:
    import shutil

    _, folder = tiny_checkpoint("llama")
    copy = tmp_path / "m"
    shutil.copytree(folder, copy)
    (copy / "generation_config.json").write_text(json.dumps(
        {"do_sample": True, "temperature": 0.6, "top_p": 0.9, "max_new_tokens": 7}))
    llm = _llm(copy)
    assert llm.defaults.max_new_tokens == 7
    assert llm.defaults.sampling == SamplingParams(temperature=0.6, top_p=0.9)


def test_sampling_top_k_one_is_greedy() -> None:
    from torchburn.llm.runtime.sampling import next_tokens

    logits = torch.randn(3, 50)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(next_tokens(logits, SamplingParams(temperature=1.0, top_k=1), g),
                       logits.argmax(-1))
    # top_p tiny keeps only the most likely token even at a high temperature.
    picked = next_tokens(logits, SamplingParams(temperature=5.0, top_p=1e-6), g)
    assert torch.equal(picked, logits.argmax(-1))


def test_greedy_tokens_are_torch_argmax() -> None:
    """The NumPy argmax of the greedy path picks what torch's does: first of tied maxima,
    a NaN row's NaN, a strided view (the last position of [B, T, V] logits), int64."""
    from torchburn.llm.runtime.sampling import greedy_tokens

    torch.manual_seed(0)
    logits = torch.randn(3, 4, 49152)
    logits[0, -1, 7] = logits[0, -1, 4000] = 100.0  # a tie: the first wins
    logits[1, -1, 123] = float("nan")
    rows = logits[:, -1]
    got = greedy_tokens(rows)
    assert got.dtype == torch.int64 and torch.equal(got, rows.argmax(-1))
    assert got.tolist()[:2] == [7, 123]


@pytest.mark.parametrize("vocab", [100, 4096, 49152, 151936, 32064, 4099])
def test_chunked_first_argmax_is_argmax(vocab: int) -> None:
    """The GPU greedy step's argmax in chunks (`first_argmax_in_chunks`) is argmax's first
    index: ties across and inside chunks (the first wins), a maximum in the last, padded chunk
    (V not a multiple of 128), a row of all -inf, int32 [B, 1]."""
    from torchburn.llm.runtime.sampling import first_argmax_in_chunks

    torch.manual_seed(vocab)
    logits = torch.randn(5, vocab).mul(4).round()  # many ties among the larger values
    logits[0, vocab // 2] = logits[0, vocab - 1] = 50.0   # tie in two chunks: the first wins
    logits[1, vocab - 1] = 60.0                           # the last entry, in the padded chunk
    logits[2, 3] = logits[2, 4] = 70.0                    # tie inside one chunk
    logits[3] = float("-inf")                             # nothing finite: index 0
    got = first_argmax_in_chunks(logits)
    assert got.dtype == torch.int32 and got.shape == (5, 1)
    assert got[:, 0].tolist() == logits.argmax(-1).tolist()
    assert got[:3, 0].tolist() == [vocab // 2, vocab - 1, 3]


def test_repetition_penalty_follows_its_definition() -> None:
    from torchburn.llm.runtime.sampling import apply_repetition_penalty

    logits = torch.tensor([[2.0, -2.0, 1.0]])
    out = apply_repetition_penalty(logits, torch.tensor([[0, 1]]), 2.0)
    assert out.tolist() == [[1.0, -4.0, 1.0]]


def test_decode_compiles_once_over_200_steps_and_reads_only_filled_slots(tiny_checkpoint,
                                                                         monkeypatch) -> None:
    """The decode graph is compiled once for every length (the past's length is a dynamic
    dimension), and each step is handed only the slots filled so far and its own, not
    ``max_context``; the cache write is part of the compiled step."""
    from torchburn.backend import report
    from torchburn.llm.model.kv_cache import KVCache

    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder, compile=True, max_context=256)
    llm.eos_ids = frozenset()
    lengths: list[int] = []
    past = KVCache.past

    def spy(self: KVCache, filled: int, tokens: int = 0) -> torch.Tensor:
        view = past(self, filled, tokens)
        lengths.append(view.shape[3])
        return view

    monkeypatch.setattr(KVCache, "past", spy)
    torch._dynamo.reset()
    graphs = report.start_recording()
    try:
        steps = list(llm.generate_ids([[5, 17, 99, 250, 3, 41]], 201, SamplingParams(temperature=0.0)))
    finally:
        report.stop_recording()
    assert len(steps) == 201
    # One graph for the prefill bucket (16 tokens; a 6-token prompt is cheaper as one padded
    # chunk than as 6 decode steps), one for every decode step.
    assert len(graphs) == 2, [g.kind for g in graphs]
    assert all(not g.fallback_ops and len(g.subgraphs) == 1 for g in graphs)
    # the prefill's 16 slots, then per decode step the filled slots and its own one
    assert lengths == [16] + list(range(7, 207))
    # the KV-cache write is inside the one compiled graph: no index_copy_ outside it, and the
    # decode program stores into the cache input itself (only the new slot)
    assert all("index_copy" in " ".join(sub.ops) for g in graphs for sub in g.subgraphs)


def test_one_token_prompt_runs_the_decode_step_and_matches_transformers(tiny_checkpoint) -> None:
    """A one-token prompt is run by the decode step (no prefill bucket padded to 16)."""
    hf, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    shapes: list[tuple[int, ...]] = []
    step = llm.run_step

    def spy(cache, ids, first_slot, starts, logit_index=None):  # type: ignore[no-untyped-def]
        shapes.append(tuple(ids.shape))
        return step(cache, ids, first_slot, starts, logit_index)

    llm.run_step = spy  # type: ignore[method-assign]
    rows = [[17], [250]]
    assert _ours_greedy(llm, rows, 6) == _hf_greedy(hf, rows, 6)
    assert set(shapes) == {(2, 1)}


def test_prefill_plan_pads_little() -> None:
    from torchburn.llm.runtime.engine import prefill_plan

    assert prefill_plan(31, 0, 4096) == [(16, 16), (16, 15)]  # not one 64-token chunk (33 padded rows)
    assert prefill_plan(17, 0, 4096) == [(16, 16), (1, 1)]    # the last token by the decode step
    assert prefill_plan(19, 0, 4096) == [(16, 16)] + [(1, 1)] * 3  # a short tail token by token
    assert prefill_plan(20, 0, 4096) == [(16, 16), (16, 4)]  # 4 decode steps cost a padded chunk
    assert prefill_plan(3, 0, 4096) == [(1, 1)] * 3
    assert prefill_plan(19, 0, 4096, tails=False) == [(16, 16), (16, 3)]  # the GPU engine's plan
    assert prefill_plan(17, 0, 4096, tails=False) == [(16, 16), (1, 1)]
    assert prefill_plan(50, 0, 4096) == [(64, 50)]
    assert prefill_plan(512, 0, 4096) == [(256, 256), (256, 256)]
    assert prefill_plan(1, 0, 4096) == [(1, 1)]
    assert prefill_plan(60, 50, 64) == [(10, 10)]  # no bucket fits: one exact chunk


@given(first=st.integers(0, 699), new=st.integers(1, 700), room=st.integers(0, 100))
@settings(max_examples=300, deadline=None)
def test_prefill_plan_covers_the_prompt_within_the_context(first: int, new: int, room: int) -> None:
    from torchburn.llm.runtime.engine import PREFILL_BUCKETS, prefill_plan

    n, context = first + new, first + new + room  # first < n <= context by construction
    plan = prefill_plan(n, first, context)
    slot = first
    for i, (size, real) in enumerate(plan):
        assert 1 <= real <= size and slot + size <= context
        assert size in PREFILL_BUCKETS or size == real  # a bucket's graph, or an exact chunk
        if i < len(plan) - 1:
            assert real == size  # only the last chunk is padded
        slot += real
    assert slot == n
    # never more padded rows than the old rule's single smallest fitting bucket
    fitting = [b for b in PREFILL_BUCKETS if b >= n - first and first + b <= context]
    if fitting:
        assert sum(size for size, _ in plan) <= min(fitting)


@pytest.mark.parametrize("compile", [False, True])
def test_a_token_id_past_the_vocabulary_raises_eagers_index_error(tiny_checkpoint, compile: bool) -> None:
    """A tokenizer larger than the embedding (issue 28): the id's lookup raises, compiled (the
    checked index faults and the step reruns in PyTorch) as eagerly; valid ids still work."""
    from .conftest import VOCAB

    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder, compile=compile)
    greedy = SamplingParams(temperature=0.0)
    good = list(llm.generate_ids([[5, 17, 99]], 3, greedy))
    for bad in ([[5, VOCAB, 99]], [[5, 17, VOCAB + 1000]], [[VOCAB]]):
        with pytest.raises(IndexError, match="index out of range in self"):
            list(llm.generate_ids(bad, 3, greedy))
    assert list(llm.generate_ids([[5, 17, 99]], 3, greedy)) == good
