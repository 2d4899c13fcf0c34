"""Continuous batching (`runtime/scheduler.py`, `runtime/batch_cache.py`): requests that join
and leave a running batch at token boundaries each get exactly the greedy text they get alone
from `LLM.generate`, through right shifts (a long prompt joining), compactions, cancels and the
prefix cache."""
from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from torchburn.llm import LLM
from torchburn.llm.runtime import batch_cache
from torchburn.llm.runtime.batch_cache import BatchCache, bucket_for
from torchburn.llm.runtime.sampling import SamplingParams
from torchburn.llm.runtime.scheduler import Finish, QueueFull, Request, Scheduler, Text

PROMPTS = ["hello world", "the quick brown fox jumps over the lazy dog, hello there",
           "def add(a, b):", "Grüße", "hello", "the lazy dog jumps over the quick brown fox " * 3,
           "return a + b", "world"]
GREEDY = SamplingParams(temperature=0.0)


def _llm(folder: Path, compile: bool = False, quant: str | None = None) -> LLM:
    llm = LLM.from_pretrained(folder, device="cpu", max_context=128, compile=compile, quant=quant)
    llm.eos_ids = frozenset()  # every answer runs its full length
    return llm


@pytest.fixture
def invariant(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    """TORCHBURN_QLINEAR_INVARIANT=1, as `torchburn serve` sets it: quantized linears take their
    rows form at any number of rows (docs/quantization.md, "Batch invariance")."""
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_QLINEAR_INVARIANT", "1")
    reload_config()
    yield
    monkeypatch.undo()
    reload_config()


class Collect:
    def __init__(self) -> None:
        self.pieces: list[str] = []
        self.finish: Finish | None = None
        self.done = threading.Event()

    def __call__(self, event: object) -> None:
        if isinstance(event, Text):
            self.pieces.append(event.text)
        else:
            assert isinstance(event, Finish) and self.finish is None
            self.finish = event
            self.done.set()

    @property
    def text(self) -> str:
        return "".join(self.pieces)


def _submit(s: Scheduler, llm: LLM, prompt: str, n: int) -> tuple[Request, Collect]:
    c = Collect()
    r = Request(prompt_ids=llm.tokenizer.encode(prompt), max_tokens=n, params=GREEDY, emit=c)
    s.submit(r)
    return r, c


def test_bucket_for() -> None:
    assert [bucket_for(n, 16) for n in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 16, 16]
    assert bucket_for(5, 6) == 6


def test_rows_move_without_changing_what_they_hold(tiny_checkpoint) -> None:
    """A right shift and a compaction move each running row's slots as one block."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    rows = BatchCache(llm.model.new_cache(3, 64))
    prompt = llm.model.new_cache(1, 64)
    prompt.tensor.normal_()
    a = rows.join(prompt, 5)
    held = rows.cache.tensor[:, a, :, 0:5].clone()
    b = rows.join(prompt, 9)                     # longer than end: row a moves right by 4
    assert (rows.end, rows.starts[a], rows.starts[b]) == (9, 4, 0)
    torch.testing.assert_close(rows.cache.tensor[:, a, :, 4:9], held, rtol=0, atol=0)
    rows.leave(b)
    rows.starts[a] = 40                          # as if 31 steps had run since
    rows.end = 45
    rows.cache.tensor[:, a, :, 40:45] = held
    rows.make_room()                             # 40 >= 45 / 2 but < COMPACT_MIN: stays
    assert rows.end == 45
    old = batch_cache.COMPACT_MIN
    try:
        batch_cache.COMPACT_MIN = 16
        rows.make_room()
    finally:
        batch_cache.COMPACT_MIN = old
    assert (rows.end, rows.starts[a]) == (5, 0)
    torch.testing.assert_close(rows.cache.tensor[:, a, :, 0:5], held, rtol=0, atol=0)


@pytest.mark.parametrize("prefix_cache", [0, 4])
def test_joining_and_leaving_requests_get_their_text_alone(tiny_checkpoint, monkeypatch,
                                                            prefix_cache: int) -> None:
    """8 requests of different lengths through 3 rows (5 wait, join as rows free up; long
    prompts shift the rows right; compaction moves them left) give `LLM.generate`'s text."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    lengths = [12, 30, 5, 21, 9, 17, 3, 26]
    expected = [llm.generate(p, max_new_tokens=n, temperature=0) for p, n in zip(PROMPTS, lengths)]
    monkeypatch.setattr(batch_cache, "COMPACT_MIN", 4)
    s = Scheduler(llm, parallel=3, max_queue=8, prefix_cache=prefix_cache)
    moves = []
    real_move = s.rows._move
    monkeypatch.setattr(s.rows, "_move", lambda by: (moves.append(by), real_move(by)))
    s.start()
    try:
        got = [_submit(s, llm, p, n) for p, n in zip(PROMPTS, lengths)]
        for _, c in got:
            assert c.done.wait(120), "a request never finished"
    finally:
        s.stop()
    assert [c.text for _, c in got] == expected
    assert [c.finish.reason for _, c in got] == ["length"] * 8
    assert [c.finish.completion_tokens for _, c in got] == lengths
    assert any(m > 0 for m in moves) and any(m < 0 for m in moves), moves
    assert s.stats.decode_rows > s.stats.decode_steps   # rows were decoded together


def test_repeated_prompt_reuses_its_prefix(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    system = [{"role": "system", "content": "You are terse. " * 6}]
    s = Scheduler(llm, parallel=2, prefix_cache=2)
    s.start()
    try:
        outs = []
        for q in ("hello", "world"):
            ids = llm.encode_prompt(system + [{"role": "user", "content": q}])
            c = Collect()
            s.submit(Request(prompt_ids=ids, max_tokens=4, params=GREEDY, emit=c))
            assert c.done.wait(60)
            outs.append((ids, c.text))
    finally:
        s.stop()
    shared = s.prefixes.reused_tokens
    assert shared >= 30, shared
    assert s.stats.prefilled_tokens == s.stats.prompt_tokens - shared
    for ids, text in outs:   # the reused keys give the same answer as a whole prefill
        assert text == "".join(llm.stream_ids(ids, 4, GREEDY, None, None))


def test_cancel_frees_the_row_at_the_next_step(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    s = Scheduler(llm, parallel=1, max_queue=1)
    s.start()
    try:
        r, c = _submit(s, llm, "hello", 100)
        while not c.pieces:
            assert not c.done.is_set()
            c.done.wait(0.01)
        r.cancel()
        assert c.done.wait(30)
        assert c.finish.reason == "cancelled" and c.finish.completion_tokens < 100
        r2, c2 = _submit(s, llm, "world", 3)   # the one row is free again
        assert c2.done.wait(30) and c2.finish.reason == "length"
    finally:
        s.stop()
    assert not s.running and s.rows.free_rows() == 1


def test_queue_bound_and_shutdown_end_every_request(tiny_checkpoint) -> None:
    """Over ``max_queue`` a request is refused; at shutdown the running and waiting ones end
    with an error event (none silently)."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    s = Scheduler(llm, parallel=1, max_queue=1)
    gate = threading.Event()
    real = s._decode
    s._decode = lambda: (gate.wait(30), real())   # hold the loop at its first step
    s.start()
    a = _submit(s, llm, "hello", 50)[1]
    for _ in range(1000):   # the loop admits the first request into the row
        if s.running:
            break
        threading.Event().wait(0.01)
    b = _submit(s, llm, "world", 50)[1]              # waits (the queue holds one)
    with pytest.raises(QueueFull):
        _submit(s, llm, "again", 50)
    s.drain(0.0)
    gate.set()
    assert a.done.wait(30) and b.done.wait(30)
    s.stop()
    assert a.finish.reason == "error" and "shutting down" in a.finish.error
    assert b.finish.reason == "error"


def _signatures(llm: LLM) -> set:
    return set(llm.steps.entries) if llm.steps is not None else set(llm._compiled_shapes)


def test_compiled_batched_decode_matches_alone(tiny_checkpoint) -> None:
    """Through the compiled step (decode buckets 1, 2, 4 over views of the shared rows): the
    same greedy text alone and together; after `warm_up`, requests compile nothing more (a
    prefix-cache hit's one-token prefill included)."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder, compile=True)
    prompts, n = PROMPTS[:4], 10
    s = Scheduler(llm, parallel=4, prefix_cache=4)
    s.warm_up()
    warm = _signatures(llm)
    s.start()
    try:
        alone = []
        for p in prompts:
            c = _submit(s, llm, p, n)[1]
            assert c.done.wait(600)
            alone.append(c.text)
        together = [_submit(s, llm, p, n)[1] for p in prompts]   # prefix hits: one-token prefills
        for c in together:
            assert c.done.wait(600)
    finally:
        s.stop()
    assert [c.text for c in together] == alone
    assert alone == [llm.generate(p, max_new_tokens=n, temperature=0) for p in prompts]
    assert s.stats.decode_rows > s.stats.decode_steps
    assert s.prefixes.reused_tokens > 0
    assert _signatures(llm) == warm, "a request compiled a step the warm-up did not"


def test_start_gives_back_the_callers_openmp_team(tiny_checkpoint) -> None:
    """The thread that starts the scheduler (it loaded the model, warmed it up) keeps no OpenMP
    team: with two teams alive, libgomp made every team sleep between parallel regions and a
    decode from the scheduler's thread ran 3x slower (`runtime/omp_team.py`)."""
    from tests.runtime.test_omp_team import make_team, native_threads, wait_for_threads

    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    s = Scheduler(llm, parallel=1)
    try:
        make_team()                       # as a load's or a warm-up's torch ops do
        with_team = native_threads()
        s.start()
        assert wait_for_threads(with_team - 1) == with_team - 1
        c = _submit(s, llm, "hello", 3)[1]
        assert c.done.wait(60) and c.finish.reason == "length"
    finally:
        s.stop()
        torch.set_num_threads(old)


@pytest.mark.parametrize("compile,quant", [(False, None), (True, None), (True, "int4")])
def test_requests_that_arrive_together_prefill_together(tiny_checkpoint, compile: bool, quant: str | None,
                                                        request: pytest.FixtureRequest) -> None:
    """Requests waiting at once run one batched prefill (prompts of different lengths
    left-padded, a repeated prompt once, a one-token prompt with nothing to prefill) and each
    still gets `LLM.generate`'s greedy text; a prompt a prefix entry mostly holds prefills
    its rest alone. Compiled, the warm-up made every graph they use. Quantized (int4), as
    `torchburn serve` runs it (TORCHBURN_QLINEAR_INVARIANT=1)."""
    if quant is not None:
        request.getfixturevalue("invariant")
    _, folder = tiny_checkpoint("llama")
    if compile:   # Dynamo compiles every shape here (not reusing another test's same-shaped graph)
        torch._dynamo.reset()
    llm = _llm(folder, compile=compile, quant=quant)
    prompts = [PROMPTS[1], PROMPTS[2], PROMPTS[5], PROMPTS[2], PROMPTS[0], "a"]
    n = 6
    s = Scheduler(llm, parallel=8, prefix_cache=4)
    if compile:
        s.warm_up()
    warm = _signatures(llm)    # `generate` (below) compiles its own chunks: only the warm-up's here
    got = [_submit(s, llm, p, n)[1] for p in prompts]   # all waiting before the loop starts
    s.start()
    try:
        for c in got:
            assert c.done.wait(600)
        # the same long prompt again, with a longer one after it: from its prefix entry
        again = [_submit(s, llm, p, n)[1] for p in (PROMPTS[5], PROMPTS[5] + " again")]
        for c in again:
            assert c.done.wait(600)
    finally:
        s.stop()
    used = _signatures(llm)    # before `generate` below compiles its own chunks
    expected = [llm.generate(p, max_new_tokens=n, temperature=0) for p in prompts]
    assert [c.text for c in got] == expected
    assert [c.text for c in again] == [llm.generate(p, max_new_tokens=n, temperature=0)
                                       for p in (PROMPTS[5], PROMPTS[5] + " again")]
    assert (s.stats.batched_prefills, s.stats.batched_prompts) == (1, 4)
    assert s.stats.prefilled_tokens == s.stats.prompt_tokens - s.prefixes.reused_tokens
    if compile:
        assert used == warm, "a request compiled a step the warm-up did not"
        if llm.steps is not None:   # 11 step shapes, past Dynamo's default limit of 8: none eager
            assert len(warm) > 8 and all(llm.steps.entries.values()), llm.steps.entries


def _step_logits(llm: LLM, rows: list[list[int]], decode: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The last position's logits of one prefill step over `rows` (equal lengths, from slot 0)
    and of one decode step of `decode` (a token per row) after it."""
    cache = llm.cache_for(len(rows))
    try:
        starts = torch.zeros(len(rows), dtype=torch.long)
        prefill = llm.run_step(cache, torch.tensor(rows), 0, starts).clone()
        step = llm.run_step(cache, torch.tensor(decode)[:, None], len(rows[0]), starts).clone()
    finally:
        llm.release_cache(cache)
    return prefill, step


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_quantized_steps_give_each_row_its_logits_alone(tiny_checkpoint, invariant, quant: str) -> None:
    """Bit for bit: 16 prompts of 16 tokens prefilled in one step (256 rows of x: the panel or
    dequantize + GEMM form's size) and decoded in one 16-row step (the AMX tile form's) give
    every row the logits it gets alone (16 and 1 rows: the rows form). Under the default
    forms this fails (docs/quantization.md, "Batch invariance")."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder, compile=True, quant=quant)
    g = torch.Generator().manual_seed(5)
    rows = torch.randint(3, 300, (16, 16), generator=g).tolist()
    decode = torch.randint(3, 300, (16,), generator=g).tolist()
    prefill, step = _step_logits(llm, rows, decode)
    for b in (0, 7, 15):
        alone_prefill, alone_step = _step_logits(llm, rows[b:b + 1], decode[b:b + 1])
        assert torch.equal(prefill[b], alone_prefill[0]), (b, (prefill[b] - alone_prefill[0]).abs().max())
        assert torch.equal(step[b], alone_step[0]), (b, (step[b] - alone_step[0]).abs().max())


@pytest.mark.parametrize("together", [False, True])
def test_a_long_prompt_prefills_beside_running_streams(tiny_checkpoint, together: bool) -> None:
    """A long prompt arriving while a stream decodes is prefilled one chunk per turn of the
    loop: the running stream gets a token in every turn of that prefill (before, the whole
    prefill ran first and the stream waited for it), and every request still gets the greedy
    text it gets alone.  Alone: one prompt into its prefix entry (chunks of 16/64 tokens);
    together: two prompts in one batched prefill (chunks of 16).  Driven turn by turn
    (`Scheduler.step`), so it checks the order of tokens, not timings."""
    from torchburn.llm.runtime.engine import prefill_plan
    from torchburn.llm.runtime.scheduler import TOGETHER_CHUNK

    _, folder = tiny_checkpoint("llama")
    llm = LLM.from_pretrained(folder, device="cpu", max_context=256, compile=False)
    llm.eos_ids = frozenset()
    longs = [PROMPTS[5] * 2, PROMPTS[1] * 3][:2 if together else 1]
    s = Scheduler(llm, parallel=4, prefix_cache=4)
    a, ca = _submit(s, llm, "hello", 30)
    for _ in range(3):
        s.step()
    assert a.generated == 3
    late = [_submit(s, llm, p, 5) for p in longs]
    n = max(len(r.prompt_ids) for r, _ in late) - 1
    chunks = len(prefill_plan(n, 0, llm.max_context, (TOGETHER_CHUNK,) if together else
                              (16, 64, 256)))
    assert chunks >= 3 and n + 5 < llm.max_context, (chunks, n)
    during = 0                        # tokens of the running stream before the late ones' first
    while all(r.generated == 0 for r, _ in late):
        before = a.generated
        s.step()
        if all(r.generated == 0 for r, _ in late):
            during += a.generated - before
    assert during >= chunks - 1, (during, chunks)
    assert s.stats.interleaved_chunks >= chunks - 1
    if together:
        assert s.stats.batched_prefills == 1
    while not s.idle:
        s.step()
    assert a.generated == 30 and ca.text == llm.generate("hello", max_new_tokens=30, temperature=0)
    for (r, c), p in zip(late, longs):
        assert c.finish.reason == "length"
        assert c.text == llm.generate(p, max_new_tokens=5, temperature=0)


def test_a_waiting_request_cancelled_frees_its_queue_place(tiny_checkpoint) -> None:
    """A waiting request whose client went away ends ("cancelled") at the next turn, though
    the row it waited for is still busy, and its place in the queue is free again."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    s = Scheduler(llm, parallel=1, max_queue=1)
    a, ca = _submit(s, llm, "hello", 50)
    s.step()
    b, cb = _submit(s, llm, "world", 5)
    with pytest.raises(QueueFull):
        _submit(s, llm, "again", 5)
    b.cancel()
    s.step()
    assert cb.finish is not None and cb.finish.reason == "cancelled"
    assert ca.finish is None and a.generated == 2
    c, cc = _submit(s, llm, "again", 5)          # the queue place is free
    while not s.idle:
        s.step()
    assert ca.finish.reason == "length" and cc.finish.reason == "length"


def _record_logits(monkeypatch: pytest.MonkeyPatch, s: Scheduler) -> dict[int, list[torch.Tensor]]:
    """Each running request's logits row of every decode step, by `id(request)`."""
    from torchburn.llm.runtime import scheduler as scheduler_module

    seen: dict[int, list[torch.Tensor]] = {}
    real = scheduler_module.greedy_tokens

    def record(logits: torch.Tensor) -> torch.Tensor:
        for row, r in s.running.items():
            seen.setdefault(id(r), []).append(logits[row].clone())
        return real(logits)

    monkeypatch.setattr(scheduler_module, "greedy_tokens", record)
    return seen


def test_invariant_serving_gives_each_request_its_logits_alone(tiny_checkpoint, invariant,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Bit for bit, every decode step's logits: requests run one at a time against the same
    requests arriving together (one batched prefill, right-padded), joining beside running
    rows (other slots, other starts), and continuing a prompt that a prefix entry holds part
    of (the rest from a chunk boundary), on a quantized model as `torchburn serve` runs it.
    Needs the invariant linears (rows form), attention blocks counted from each row's end
    (`block_origin`) and the aligned prefill (`Scheduler._aligned`); any of them missing,
    rows part after a few steps."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder, compile=True, quant="int4")
    prompts = [PROMPTS[1], PROMPTS[2], PROMPTS[5], PROMPTS[0], PROMPTS[5] + " and once more", "a"]
    n = 6
    alone_s = Scheduler(llm, parallel=4, prefix_cache=0)
    assert alone_s.invariant
    alone_logits = _record_logits(monkeypatch, alone_s)
    alone, held = [], []       # requests held: an id is not reused while they live
    for p in prompts:
        held.append(_submit(alone_s, llm, p, n)[0])
        while not alone_s.idle:
            alone_s.step()
        alone.append(alone_logits[id(held[-1])])
    s = Scheduler(llm, parallel=4, prefix_cache=4)
    seen = _record_logits(monkeypatch, s)
    first = [_submit(s, llm, p, n)[0] for p in prompts[:3]]   # arrive together
    s.step()
    s.step()
    late = [_submit(s, llm, p, n)[0] for p in prompts[3:]]     # join beside running rows
    while not s.idle:
        s.step()
    assert s.stats.batched_prefills == 1 and s.prefixes.reused_tokens >= 16
    for k, r in enumerate(first + late):
        got = seen[id(r)]
        assert len(got) == len(alone[k]) == n
        for step, (a, b) in enumerate(zip(got, alone[k])):
            assert torch.equal(a, b), (prompts[k], step, float((a - b).abs().max()))


def test_invariant_prefill_at_the_context_end(tiny_checkpoint, invariant, monkeypatch: pytest.MonkeyPatch) -> None:
    """A context of 40 slots (not a multiple of 16): the chunk at slot 32 would overrun it, so
    the tokens from there run one a step (`aligned_plan`), alone and in a batch alike. Bit for
    bit, every decode step's logits of prompts ending there, one at a time against together;
    and the warm-up compiled every step they take. Before, that chunk ran exact, as long as
    the batch's longest prompt: 3 to 6 rows alone, 6 together, shapes the warm-up never made,
    and a prompt's last keys differed in the last place (its past segment ended elsewhere).
    The linears take f32 activations (their rows form too): int8 ones quantize most such
    differences away before the logits."""
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")   # undone with `invariant`'s
    reload_config()
    _, folder = tiny_checkpoint("llama")
    torch._dynamo.reset()   # every shape compiled here, none reused from another test
    llm = LLM.from_pretrained(folder, device="cpu", max_context=40, compile=True, quant="int4")
    llm.eos_ids = frozenset()
    g = torch.Generator().manual_seed(7)
    prompts = [torch.randint(3, 300, (t,), generator=g).tolist() for t in (39, 36, 34, 20)]
    s = Scheduler(llm, parallel=4, prefix_cache=0)   # no entry kept: each prompt from slot 0
    assert s.invariant
    s.warm_up()
    warm = _signatures(llm)
    seen = _record_logits(monkeypatch, s)

    def submit(ids: list[int]) -> Request:
        r = Request(prompt_ids=ids, max_tokens=3, params=GREEDY, emit=Collect())
        s.submit(r)
        return r

    alone = []
    for p in prompts:
        alone.append(submit(p))
        while not s.idle:
            s.step()
    together = [submit(p) for p in prompts]
    while not s.idle:
        s.step()
    assert s.stats.batched_prefills == 1
    assert _signatures(llm) == warm, "a request compiled a step the warm-up did not"
    for p, a, b in zip(prompts, alone, together):
        assert len(seen[id(a)]) == len(seen[id(b)]) == min(3, llm.max_context - len(p))
        for step, (x, y) in enumerate(zip(seen[id(a)], seen[id(b)])):
            assert torch.equal(x, y), (len(p), step, float((x - y).abs().max()))


def test_invariant_batched_prefill_continues_from_prefix_entries(tiny_checkpoint, invariant,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Prompts arriving together that share a prefix an entry holds (a common system prompt)
    run their rests in one batched prefill from the last chunk boundary the entries hold for
    all of them, the slots before it copied from the entries: bit for bit the logits each gets
    alone, one batched prefill where each would otherwise prefill from its entry in turn (a
    chunk a step: a server's sixteenth client waited for fifteen such prefills)."""
    _, folder = tiny_checkpoint("llama")
    # none of the steps compiled by another test (`test_invariant_prefill_at_the_context_end`'s
    # f32 activations would be reused by Dynamo's cache for some shapes and not for others)
    torch._dynamo.reset()
    llm = _llm(folder, compile=True, quant="int4")
    g = torch.Generator().manual_seed(11)
    system = torch.randint(3, 300, (35,), generator=g).tolist()
    rests = [torch.randint(3, 300, (t,), generator=g).tolist() for t in (9, 20, 4)]
    prompts = [system + r for r in rests]
    n = 4

    def submit(s: Scheduler, ids: list[int]) -> Request:
        r = Request(prompt_ids=ids, max_tokens=n, params=GREEDY, emit=Collect())
        s.submit(r)
        return r

    alone_s = Scheduler(llm, parallel=4, prefix_cache=0)
    alone_logits = _record_logits(monkeypatch, alone_s)
    alone = []
    for p in prompts:
        alone.append(submit(alone_s, p))
        while not alone_s.idle:
            alone_s.step()
    s = Scheduler(llm, parallel=4, prefix_cache=4)
    seen = _record_logits(monkeypatch, s)
    warm = submit(s, system + [5])          # fills an entry with the system prompt
    while not s.idle:
        s.step()
    reused = s.prefixes.reused_tokens
    together = [submit(s, p) for p in prompts]
    while not s.idle:
        s.step()
    assert s.stats.batched_prefills == 1
    assert s.prefixes.reused_tokens - reused == 3 * 32   # the two chunks the entry holds, per prompt
    assert len(seen[id(warm)]) == n
    for p, a, b in zip(prompts, alone, together):
        assert len(alone_logits[id(a)]) == len(seen[id(b)]) == n
        for step, (x, y) in enumerate(zip(alone_logits[id(a)], seen[id(b)])):
            assert torch.equal(x, y), (len(p), step, float((x - y).abs().max()))


def test_a_batched_prefill_takes_prompts_whose_entries_hold_alike(tiny_checkpoint, invariant) -> None:
    """The batch takes the largest set of prompts whose prefix entries hold the same number of
    whole chunks: a long continuation whose entry holds nearly all of it, arriving beside new
    prompts, keeps its own path (from its entry) instead of being run again from slot 0 with
    them; a prompt an entry holds whole runs no prefill at all."""
    _, folder = tiny_checkpoint("llama")
    llm = _llm(folder)
    s = Scheduler(llm, parallel=4, prefix_cache=4)
    g = torch.Generator().manual_seed(5)
    chat = torch.randint(3, 300, (60,), generator=g).tolist()
    r = Request(prompt_ids=chat, max_tokens=1, params=GREEDY, emit=Collect())
    s.submit(r)
    while not s.idle:
        s.step()
    assert s.prefixes.held(chat) == 59

    def req(ids: list[int]) -> Request:
        return Request(prompt_ids=ids, max_tokens=1, params=GREEDY, emit=Collect())

    cont = req(chat + [7, 8, 9])                       # its entry holds 59 of 62: 48 in whole chunks
    same = req(list(chat))                             # held whole: no prefill
    new = [req(torch.randint(3, 300, (t,), generator=g).tolist()) for t in (20, 30)]
    chosen = s._together([cont, same, *new])
    assert {id(x) for x in chosen} == {id(x) for x in new}
    assert s._together([cont, same, new[0]]) == []     # one prompt left for the batch: none
