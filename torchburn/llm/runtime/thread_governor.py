"""`ThreadGovernor`: the team size of the engine's CPU steps, chosen by their measured time.

Why: a parallel region ends at a barrier that waits for every thread of the team. On a machine
whose cores are busy with other work, the OS deschedules one of our threads for a time slice
(milliseconds) and the others wait at the next barrier, hundreds of times a token. Measured on
this project's 2-core machine with the default model (SmolLM2-135M Q4_1) at load 4.8 (other
processes running), 64-token greedy generations alternating: 2 threads 1.0-7.9 tok/s, 1 thread
66-81 tok/s. On a quiet machine 2 threads are ~1.6x one. No fixed count is right for both,
and the load changes while a server runs.

How: per step shape (rows x tokens: a decode step, a prefill chunk, each bucket of a batched
step), an exponential average of the step's wall time for each team size tried; steps run on
the size with the lowest average. Every `probe_every` steps of a shape one step runs on
another size (round robin over the halvings of the configured count: 8 -> 4, 2, 1), so a
change of load is seen within a few hundred steps; a probe that loses doubles the interval
(up to `MAX_BACKOFF` times: a 2-thread probe on a busy machine cost ten 1-thread steps), one
that wins resets it. Each size is measured first, two steps
each (a shape's first steps: 2, 2, then 1, 1); the first step of a shape on a size is not
counted (it compiles, or builds the team). A team size never changes a result: every parallel
loop's iterations compute whole outputs (`split-reductions` fixes its partials at compile
time), so this is a speed choice only. `TORCHBURN_ADAPTIVE_THREADS=0` keeps the configured
count (benchmarks that compare fixed thread counts).
"""
from __future__ import annotations

import time
from typing import Callable, Hashable, Optional, TypeVar

T = TypeVar("T")

#: Weight of the newest step time in a size's average.
SMOOTHING = 0.3
#: Steps of one shape between two probes of another team size...
PROBE_EVERY = 64
#: ...doubled after each probe that lost, up to this many times (a probe on a busy machine
#: can cost ten steps' time), and back to `PROBE_EVERY` after one that won.
MAX_BACKOFF = 16


def team_sizes(threads: int) -> list[int]:
    """The sizes tried for a configured count: it and its halvings down to one, largest first."""
    if threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    sizes = [threads]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    return sizes


class _Shape:
    """What the governor knows of one step shape."""

    def __init__(self, sizes: list[int]) -> None:
        self.seconds: dict[int, float] = {}      # average wall time of a step, per size
        self.seen: set[int] = set()              # sizes that ran their first (uncounted) step
        self.steps = 0
        self.next_probe = 0                      # index into the other sizes, round robin
        self.sizes = sizes
        self.interval = 0                        # steps between probes (set by the governor)
        self.probe_at = 0                        # the step that probes next
        self.probing: Optional[int] = None       # the size the last probe ran

    def best(self) -> int:
        return min(self.seconds, key=self.seconds.__getitem__) if self.seconds else self.sizes[0]


class ThreadGovernor:
    """Chooses the team size of each step (see the module docstring)."""

    def __init__(self, threads: int, probe_every: int = PROBE_EVERY, smoothing: float = SMOOTHING,
                 apply: Optional[Callable[[int], None]] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if probe_every < 2:
            raise ValueError(f"probe_every must be >= 2, got {probe_every}")
        if not 0.0 < smoothing <= 1.0:
            raise ValueError(f"smoothing must be in (0, 1], got {smoothing}")
        self.sizes = team_sizes(threads)
        self.probe_every = probe_every
        self.smoothing = smoothing
        self.clock = clock
        #: Sets the team size (every step: another LLM in the process may have changed it).
        self._apply = apply or _set_team_size
        self._shapes: dict[Hashable, _Shape] = {}

    def choose(self, shape: Hashable) -> int:
        """The team size for the next step of `shape`: each size in turn until every one is
        measured (the configured one first; two steps each, the first not counted), then the
        best, except every `probe_every`-th step, which takes the next other size."""
        if len(self.sizes) == 1:
            return self.sizes[0]
        s = self._shapes.setdefault(shape, _Shape(self.sizes))
        s.steps += 1
        unmeasured = [n for n in self.sizes if n not in s.seconds]
        if unmeasured:
            return unmeasured[0]
        best = s.best()
        if s.probing is not None:        # the last step probed: back off if it lost
            won = s.probing == best
            s.interval = self.probe_every if won else min(s.interval * 2, self.probe_every * MAX_BACKOFF)
            s.probe_at = s.steps + s.interval
            s.probing = None
        if not s.interval:
            s.interval, s.probe_at = self.probe_every, s.steps + self.probe_every
        if s.steps >= s.probe_at:
            others = [n for n in self.sizes if n != best]
            s.probing = others[s.next_probe % len(others)]
            s.next_probe += 1
            return s.probing
        return best

    def record(self, shape: Hashable, size: int, seconds: float) -> None:
        """A step of `shape` on `size` threads took `seconds` (wall time)."""
        s = self._shapes.setdefault(shape, _Shape(self.sizes))
        if size not in s.seen:            # compiles, team start-up: not what a step costs
            s.seen.add(size)
            return
        old = s.seconds.get(size)
        # a probe's size last ran long ago: its average is stale, the probe replaces it
        fresh = old is None or size == s.probing
        s.seconds[size] = seconds if fresh else old + self.smoothing * (seconds - old)

    def run(self, shape: Hashable, step: Callable[[], T]) -> T:
        """`step()` on the team size chosen for `shape`, timed and recorded."""
        size = self.choose(shape)
        self._apply(size)
        t0 = self.clock()
        out = step()
        self.record(shape, size, self.clock() - t0)
        return out

    def averages(self, shape: Hashable) -> dict[int, float]:
        """The average step time of `shape` per team size measured so far (seconds)."""
        s = self._shapes.get(shape)
        return dict(s.seconds) if s is not None else {}


def _set_team_size(n: int) -> None:
    from ...runtime.threads import set_num_threads

    set_num_threads(n)
