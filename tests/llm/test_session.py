"""`ChatSession`: the KV cache kept across chat turns; a turn prefills only what the cache lacks
and answers exactly as a from-scratch run of the whole conversation would (greedy)."""
from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from torchburn.llm import LLM
from torchburn.llm.runtime.chat import run_chat
from torchburn.llm.runtime.sampling import SamplingParams
from torchburn.llm.runtime.session import ChatSession, common_prefix

GREEDY = SamplingParams(temperature=0.0)


def _llm(folder: Path, compile: bool = False, max_context: int = 160) -> LLM:
    return LLM.from_pretrained(folder, device="cpu", max_context=max_context, compile=compile)


def _record_prefills(llm: LLM) -> list[tuple[int, int]]:
    """Wrap `run_step` to log (first slot, tokens) of every step of more than one token."""
    log: list[tuple[int, int]] = []
    inner = llm.run_step

    def spy(cache: Any, ids: Any, first_slot: int, starts: Any, logit_index: Any = None) -> Any:
        if logit_index is not None:  # prefill chunks pass the index of their last real token
            log.append((first_slot, int(logit_index[0]) + 1))
        return inner(cache, ids, first_slot, starts, logit_index)

    llm.run_step = spy  # type: ignore[method-assign]
    return log


def _answer(session: ChatSession, ids: list[int], n: int) -> list[int]:
    return [t for t in session.stream_ids(ids, n, GREEDY) if t is not None]


def _fresh(folder: Path, ids: list[int], n: int, **kw: Any) -> list[int]:
    llm = _llm(folder, **kw)
    llm.eos_ids = frozenset()
    return _answer(ChatSession(llm), ids, n)


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0 and common_prefix([7], [8]) == 0


@pytest.mark.parametrize("compile", [False, True])
def test_second_turn_prefills_only_the_new_tokens(tiny_checkpoint, compile: bool) -> None:
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder, compile=compile)
    llm.eos_ids = frozenset()
    log = _record_prefills(llm)
    session = ChatSession(llm)
    first = [5, 17, 99, 250, 3, 41, 7, 8, 200, 13, 77, 21, 9, 10, 11, 12, 14, 15, 16, 18]
    answer = _answer(session, first, 6)
    # prefill_plan covers the 20 tokens as two chunks of 16 (the second padded), not one of 64
    assert log == [(0, 16), (16, 4)] and session.last_prefill == len(first)
    # The next turn: the answer (its last token was sampled, never fed) and a new message.
    second = first + answer + [44, 12, 300, 8, 9]
    log.clear()
    again = _answer(session, second, 8)
    held = len(first) + len(answer) - 1
    assert log == [(held, len(second) - held)] and session.last_prefill == 6
    assert again == _fresh(folder, second, 8, compile=compile)


def test_turns_through_the_template_equal_a_from_scratch_run(tiny_checkpoint) -> None:
    """Rendered conversations (the template re-renders the answer as text): the cache is used up
    to the first differing id, and the answer equals a fresh run of the whole history."""
    _, folder = tiny_checkpoint("qwen2")
    llm = _llm(folder)
    session = ChatSession(llm)
    history = [{"role": "system", "content": "Be brief."},
               {"role": "user", "content": "hello there"}]
    first = llm.encode_prompt(history)
    answer = "".join(session.stream(first, 10, GREEDY))
    history += [{"role": "assistant", "content": answer},
                {"role": "user", "content": "the quick brown fox"}]
    second = llm.encode_prompt(history)
    cached = list(session.cached)
    reply = "".join(session.stream(second, 10, GREEDY))
    assert common_prefix(cached, second) >= len(first)
    assert session.last_prefill == len(second) - common_prefix(cached, second)
    assert reply == "".join(_llm(folder).stream_ids(second, 10, GREEDY, None, None))


def test_reset_prefills_everything_and_other_requests_leave_the_session_alone(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    llm.eos_ids = frozenset()
    session = ChatSession(llm)
    first = [5, 17, 99, 250, 3, 41]
    answer = _answer(session, first, 4)
    second = first + answer + [8, 9]
    session.reset()
    assert _answer(session, second, 5) == _fresh(folder, second, 5)
    assert session.last_prefill == len(second)
    list(llm.generate_ids([[1, 2], [3, 4, 5]], 3, GREEDY))  # a batch of 2 on the same LLM
    list(llm.generate_ids([[9, 9, 9, 9, 9, 9, 9, 9]], 3, GREEDY))  # and a batch of 1
    third = second + [40, 41]
    assert _answer(session, third, 5) == _fresh(folder, third, 5)
    assert session.last_prefill == 2  # the session's own cache still held the conversation


def test_an_interrupted_answer_keeps_only_the_finished_steps(tiny_checkpoint) -> None:
    """Stopping an answer part way (Ctrl-C closes the generator): the next turn still equals a
    fresh run, reusing the prompt and the tokens whose steps ran."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    llm.eos_ids = frozenset()
    session = ChatSession(llm)
    first = [5, 17, 99, 250, 3, 41]
    stream = session.stream_ids(first, 20, GREEDY)
    got = [next(stream) for _ in range(3)]
    stream.close()
    assert session.cached == first + got[:2]
    second = first + got + [60, 61]
    assert _answer(session, second, 5) == _fresh(folder, second, 5)
    assert session.last_prefill == len(second) - len(first) - 2


def test_chat_drops_the_oldest_turns_and_says_so(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")
    llm = _llm(folder, max_context=64)
    lines = "".join(f"the quick brown fox number {i}\n" for i in range(6)) + "/exit\n"
    out = io.StringIO()
    run_chat(llm, "Be brief.", max_new_tokens=8, stdin=io.StringIO(lines), stdout=out,
             temperature=0.0)
    text = out.getvalue()
    assert "dropped the" in text and "oldest message(s)" in text and "error" not in text
    assert text.count(">>> ") == 7
