"""One `LLM` shared by many callers: threads calling `generate`/`stream` at once and stream
generators interleaved on one thread each get exactly the text they would get alone (greedy)."""
from __future__ import annotations

import threading
from pathlib import Path

from torchburn.llm import LLM
from torchburn.llm.runtime.sampling import SamplingParams

PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog, hello there",
           "def add(a, b):", "Grüße", "hello", "the lazy dog jumps over the quick brown fox " * 3,
           "return a + b", "world"]
GREEDY = SamplingParams(temperature=0.0)


def _llm(folder: Path, compile: bool) -> LLM:
    llm = LLM.from_pretrained(folder, device="cpu", max_context=128, compile=compile)
    llm.eos_ids = frozenset()  # every answer runs its full length
    return llm


def _alone(folder: Path, compile: bool, n: int) -> list[str]:
    llm = _llm(folder, compile)
    return [llm.generate(p, max_new_tokens=n, temperature=0) for p in PROMPTS]


def _threads(llm: LLM, n: int) -> list[str]:
    """Each of 8 threads runs one prompt, half through `generate`, half through `stream`, all
    released at once."""
    got: list[str] = [""] * len(PROMPTS)
    errors: list[BaseException] = []
    gate = threading.Barrier(len(PROMPTS))

    def work(i: int) -> None:
        try:
            gate.wait()
            if i % 2:
                got[i] = "".join(llm.stream(PROMPTS[i], max_new_tokens=n, temperature=0))
            else:
                got[i] = llm.generate(PROMPTS[i], max_new_tokens=n, temperature=0)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    assert not errors, errors
    return got


def test_eight_threads_get_what_they_get_alone_eager(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("llama")
    expected = _alone(folder, False, 12)
    llm = _llm(folder, False)
    for _ in range(2):
        assert _threads(llm, 12) == expected


def test_eight_threads_get_what_they_get_alone_compiled(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")
    expected = _alone(folder, True, 10)
    assert _threads(_llm(folder, True), 10) == expected


def test_interleaved_streams_on_one_thread(tiny_checkpoint) -> None:
    """Generators advanced in turn (round robin, then one drained while another is part way):
    no lock held across a yield, so no deadlock, and each its own KV cache."""
    _, folder = tiny_checkpoint("llama")
    expected = _alone(folder, False, 12)
    llm = _llm(folder, False)
    streams = [llm.stream(p, max_new_tokens=12, temperature=0) for p in PROMPTS[:4]]
    pieces: list[list[str]] = [[] for _ in streams]
    live = set(range(len(streams)))
    while live:
        for i in sorted(live):
            piece = next(streams[i], None)
            if piece is None:
                live.discard(i)
            else:
                pieces[i].append(piece)
    assert ["".join(p) for p in pieces] == expected[:4]
    first = llm.stream(PROMPTS[4], max_new_tokens=12, temperature=0)
    head = next(first)
    assert llm.generate(PROMPTS[5], max_new_tokens=12, temperature=0) == expected[5]
    assert head + "".join(first) == expected[4]


def test_interleaved_batches_and_token_streams(tiny_checkpoint) -> None:
    """`generate_ids` runs of different batch sizes interleaved step by step."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder, False)
    rows_a, rows_b = [[5, 17, 99, 250]], [[3, 41], [7, 8, 200, 13, 77]]
    alone_a = list(llm.generate_ids(rows_a, 8, GREEDY))
    alone_b = list(llm.generate_ids(rows_b, 8, GREEDY))
    a, b = llm.generate_ids(rows_a, 8, GREEDY), llm.generate_ids(rows_b, 8, GREEDY)
    got_a, got_b = [], []
    for x, y in zip(a, b):
        got_a.append(x)
        got_b.append(y)
    assert (got_a, got_b) == (alone_a, alone_b)
    assert len(llm.kv.idle()) == 1  # the pool keeps one idle cache, as before
