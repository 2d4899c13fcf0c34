"""The LLM engine's team size chosen by measured step time (`llm/runtime/thread_governor.py`):
on a simulated clock, it keeps the configured count on a quiet machine, moves to fewer threads
when steps on all of them slow down (a busy machine), moves back when the load goes, backs off
its probes while they lose, and keeps each step shape apart; in the engine, it changes no
token and no logit."""
from __future__ import annotations

from typing import Callable

import pytest
import torch

from torchburn.llm.runtime.thread_governor import MAX_BACKOFF, PROBE_STEPS, WINDOW, ThreadGovernor, team_sizes


def test_team_sizes_are_the_halvings() -> None:
    assert team_sizes(1) == [1] and team_sizes(2) == [2, 1] and team_sizes(6) == [6, 3, 1]
    assert team_sizes(16) == [16, 8, 4, 2, 1]
    with pytest.raises(ValueError, match="threads"):
        team_sizes(0)
    with pytest.raises(ValueError, match="probe_every"):
        ThreadGovernor(2, probe_every=1)
    with pytest.raises(ValueError, match="window"):
        ThreadGovernor(2, window=1)


class Machine:
    """A step's time by team size, on a clock the governor reads."""

    def __init__(self, threads: int, probe_every: int = 8) -> None:
        self.now = 0.0
        self.size = 0
        self.last = 0
        self.count = 0
        self.cost: dict[int, float] = {}
        #: Seconds the first step after a change of team size adds (its threads wake up).
        self.wake = 0.0
        #: Every `spike_every`-th step on more than one thread takes `spike` seconds more
        #: (another thread of the process took a core: the barrier waits).
        self.spike_every, self.spike = 0, 0.0
        self.gov = ThreadGovernor(threads, probe_every=probe_every, apply=self._apply, clock=lambda: self.now)

    def _apply(self, n: int) -> None:
        self.size = n

    def steps(self, n: int, shape: object = "decode") -> list[int]:
        def step() -> int:
            self.count += 1
            self.now += self.cost[self.size]
            if self.size != self.last:
                self.now += self.wake
            if self.size > 1 and self.spike_every and self.count % self.spike_every == 0:
                self.now += self.spike
            self.last = self.size
            return self.size

        return [self.gov.run(shape, step) for _ in range(n)]


def test_quiet_keeps_the_configured_count_and_load_moves_it() -> None:
    m = Machine(2)
    m.cost = {2: 0.010, 1: 0.016}                      # quiet: two threads 1.6x one
    quiet = m.steps(200)
    assert quiet[:6] == [2, 2, 2, 1, 1, 1]             # each size measured (first step uncounted)
    assert quiet[6:].count(1) <= len(quiet[6:]) // 8 + 1 and quiet[-1] == 2
    m.cost = {2: 1.0, 1: 0.1}                          # a busy machine: barriers wait for the OS
    busy = m.steps(400)
    assert busy.index(1) <= WINDOW // 2 + 1            # load that lasts moves the median
    probes = busy.count(2)
    assert busy[-1] == 1 and probes <= WINDOW // 2 + 1 + 4 * PROBE_STEPS, probes   # probes back off while they lose
    m.cost = {2: 0.010, 1: 0.016}                      # the load went away
    back = m.steps(8 * MAX_BACKOFF + 8)
    tail = back[back.index(2):] if 2 in back else []
    assert tail and tail.count(1) <= len(tail) // 8 + PROBE_STEPS, back   # back, probing now and then


def test_bursts_of_other_work_keep_the_configured_count() -> None:
    """A server's HTTP thread now and then takes a core from a 2-thread step (one step in
    four takes 2.5x as long), and a team woken after a spell on one thread is slow for one
    step: two threads stay the faster choice, and the governor keeps them. An average moved by
    the bursts, and a probe that counted the wake-up, had a server's single stream on one
    thread for most of its steps (session 39)."""
    m = Machine(2)
    m.cost = {2: 0.0035, 1: 0.005}
    m.spike_every, m.spike = 4, 0.005
    m.wake = 0.004
    sizes = m.steps(400)
    assert sizes[100:].count(1) <= 300 // 8, sizes[100:].count(1)
    assert m.gov.averages("decode")[2] < m.gov.averages("decode")[1]


def test_a_probe_is_not_judged_by_its_wake_up() -> None:
    """After a busy spell on one thread, a quiet machine's 2-thread probe pays the team's
    wake-up in its first step only: not counted, the probe wins and two threads come back."""
    m = Machine(2)
    m.cost = {2: 0.010, 1: 0.016}
    m.steps(20)
    m.cost = {2: 1.0, 1: 0.1}
    assert m.steps(40)[-1] == 1
    m.cost = {2: 0.010, 1: 0.016}
    m.wake = 0.5                                       # far more than a step: counted, it would lose
    back = m.steps(8 * MAX_BACKOFF + 8)
    assert back.index(2) <= 16 and back[back.index(2):].count(1) <= len(back) // 8, back


def test_shapes_are_measured_apart() -> None:
    m = Machine(4)
    m.cost = {4: 0.004, 2: 0.006, 1: 0.010}
    assert m.steps(9, "decode") == [4, 4, 4, 2, 2, 2, 1, 1, 1]
    assert m.steps(3, "prefill") == [4, 4, 4]             # a new shape starts with its own measurements
    assert set(m.gov.averages("decode")) == {4, 2, 1} and set(m.gov.averages("prefill")) == {4}


def test_one_thread_never_changes() -> None:
    m = Machine(1)
    m.cost = {1: 0.01}
    assert m.steps(20) == [1] * 20


def test_the_team_size_changes_no_token_and_no_logit(tiny_checkpoint, monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled, steps alternating 2 and 1 threads (a probe every other step) give the same
    logits, bit for bit, as a fixed count: every parallel loop computes whole outputs."""
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams
    from torchburn.runtime.threads import num_threads, set_num_threads

    _, folder = tiny_checkpoint("llama")
    llm = LLM.from_pretrained(folder, device="cpu", max_context=64, compile=True, threads=2)
    llm.eos_ids = frozenset()
    ids = llm.tokenizer.encode("the quick brown fox jumps over the lazy dog")
    seen: list[torch.Tensor] = []
    sizes: list[int] = []
    real: Callable[..., torch.Tensor] = llm.run_step

    def record(*args, **kwargs):  # type: ignore[no-untyped-def]
        out = real(*args, **kwargs)
        seen.append(out.clone())
        sizes.append(num_threads())
        return out

    monkeypatch.setattr(llm, "run_step", record)
    greedy = SamplingParams(temperature=0.0)
    old = num_threads()
    try:
        llm.governor = None
        set_num_threads(2)
        fixed = list(llm.stream_ids(ids, 12, greedy, None, None))
        fixed_logits, seen[:] = list(seen), []
        llm.governor = ThreadGovernor(2, probe_every=2)
        adaptive = list(llm.stream_ids(ids, 12, greedy, None, None))
    finally:
        set_num_threads(old)
    assert {1, 2} <= set(sizes), sizes
    assert adaptive == fixed
    assert len(seen) == len(fixed_logits)
    for a, b in zip(seen, fixed_logits):
        assert torch.equal(a, b)


def test_shapes_taking_turns_on_different_sizes_are_each_measured() -> None:
    """A server's prefill chunks and decode steps take turns; where one shape is best on two
    threads and the other on one, each step changes the team size: a change is judged per
    shape, so both keep being measured, and load that comes later still moves each."""
    m = Machine(2)
    m.cost = {2: 0.010, 1: 0.016}
    decode_cost, prefill_cost = {2: 0.010, 1: 0.016}, {2: 0.050, 1: 0.030}
    sizes: dict[str, list[int]] = {"decode": [], "prefill": []}
    for _ in range(200):
        for shape, cost in (("decode", decode_cost), ("prefill", prefill_cost)):
            m.cost = cost
            sizes[shape] += m.steps(1, shape)
    assert sizes["decode"][-50:].count(2) >= 45 and sizes["prefill"][-50:].count(1) >= 45, sizes
    decode_cost[2] = 1.0                                # the load comes: decode moves to one thread
    moved = []
    for _ in range(20):
        for shape, cost in (("decode", decode_cost), ("prefill", prefill_cost)):
            m.cost = cost
            step = m.steps(1, shape)
            if shape == "decode":
                moved += step
    assert 1 in moved[:WINDOW + 1], moved
    with pytest.raises(ValueError, match="window"):
        ThreadGovernor(2, window=PROBE_STEPS - 2)
