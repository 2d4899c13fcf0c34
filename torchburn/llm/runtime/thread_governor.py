"""`ThreadGovernor`: the team size of the engine's CPU steps, chosen by their measured time.

Why: a parallel region ends at a barrier that waits for every thread of the team. On a machine
whose cores are busy with other work, the OS deschedules one of our threads for a time slice
(milliseconds) and the others wait at the next barrier, hundreds of times a token. Measured on
this project's 2-core machine with the default model (SmolLM2-135M Q4_1) at load 4.8 (other
processes running), 64-token greedy generations alternating: 2 threads 1.0-7.9 tok/s, 1 thread
66-81 tok/s. On a quiet machine 2 threads are ~1.6x one. No fixed count is right for both,
and the load changes while a server runs.

How: per step shape (rows x tokens: a decode step, a prefill chunk, each bucket of a batched
step), the wall times of the last `WINDOW` steps on each team size tried, and their median (of
two, the smaller); steps run on the size with the lowest median. A median, not an average: a
server's own HTTP thread (or any short burst of other work) now and then takes a core from a
2-thread step, which then waits at a barrier for milliseconds; an average moved by a few such
steps made one thread look faster and kept a server's single stream on one thread for hundreds
of steps (0.77x `LLM.generate`'s speed on this project's 2-core host, session 39; 1.0x on a
fixed count). Load that lasts (a busy machine) moves the median within `WINDOW // 2 + 1` steps.
Every `probe_every` steps of a shape `PROBE_STEPS` steps run on another size (round robin over
the halvings of the configured count: 8 -> 4, 2, 1), so a change of load is seen within a few
hundred steps; the probe's measured steps replace that size's old samples; a probe that loses
doubles the interval (up to `MAX_BACKOFF` times: a 2-thread probe on a busy machine cost ten
1-thread steps), one that wins resets it. Each size is measured first, as a probe (a shape's
first steps: 2, 2, 2, then 1, 1, 1). A shape's first step after its own team size changed is
not counted (it compiles, builds the team, or wakes the team's sleeping threads: counted, it
made a 2-thread probe after a spell on one thread lose); per shape, so that shapes taking turns
on different sizes (a server's prefill chunks and decode steps) are each measured. A team size
never changes a result: every parallel loop's iterations compute whole outputs
(`split-reductions` fixes its partials at compile time), so this is a speed choice only.
`TORCHBURN_ADAPTIVE_THREADS=0` keeps the configured count (benchmarks that compare fixed thread
counts).
"""
from __future__ import annotations

import collections
import statistics
import time
from typing import Callable, Hashable, Optional, TypeVar

T = TypeVar("T")

#: Step times kept per team size: the estimate is their median.
WINDOW = 5
#: Steps a probe runs on the other size (the first, after the change of team, not counted),
#: and the steps each size runs first.
PROBE_STEPS = 3
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
        #: the wall times of the last `WINDOW` counted steps, per size
        self.samples: dict[int, collections.deque[float]] = {}
        self.steps = 0
        self.next_probe = 0                      # index into the other sizes, round robin
        self.sizes = sizes
        self.interval = 0                        # steps between probes (set by the governor)
        self.probe_at = 0                        # the step that probes next
        self.probing: Optional[int] = None       # the size the probe in progress runs
        self.probe_left = 0                      # its steps still to run
        self.fresh = False                       # its samples replace the size's old ones
        self.last: Optional[int] = None          # the size of the shape's last step

    def estimate(self, size: int) -> float:
        """The median of the size's samples (of two, the smaller: other work only adds time)."""
        return statistics.median_low(self.samples[size])

    def best(self) -> int:
        return min(self.samples, key=self.estimate) if self.samples else self.sizes[0]


class ThreadGovernor:
    """Chooses the team size of each step (see the module docstring)."""

    def __init__(self, threads: int, probe_every: int = PROBE_EVERY, window: int = WINDOW,
                 apply: Optional[Callable[[int], None]] = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if probe_every < 2:
            raise ValueError(f"probe_every must be >= 2, got {probe_every}")
        if window < PROBE_STEPS - 1:
            raise ValueError(f"window must be >= {PROBE_STEPS - 1} (a probe's counted steps), got {window}")
        self.sizes = team_sizes(threads)
        self.probe_every = probe_every
        self.window = window
        self.clock = clock
        #: Sets the team size (every step: another LLM in the process may have changed it).
        self._apply = apply or _set_team_size
        self._shapes: dict[Hashable, _Shape] = {}

    def choose(self, shape: Hashable) -> int:
        """The team size for the next step of `shape`: each size in turn until every one is
        measured (the configured one first; `PROBE_STEPS` steps each, the first not counted),
        then the best, except every `probe_every` steps, when `PROBE_STEPS` steps take the next
        other size."""
        if len(self.sizes) == 1:
            return self.sizes[0]
        s = self._shapes.setdefault(shape, _Shape(self.sizes))
        s.steps += 1
        unmeasured = [n for n in self.sizes if len(s.samples.get(n, ())) < PROBE_STEPS - 1]
        if unmeasured:
            return unmeasured[0]
        if s.probing is not None:
            if s.probe_left > 0:
                s.probe_left -= 1
                return s.probing
            won = s.probing == s.best()       # the probe is over: back off if it lost
            s.interval = self.probe_every if won else min(s.interval * 2, self.probe_every * MAX_BACKOFF)
            s.probe_at = s.steps + s.interval
            s.probing = None
        best = s.best()
        if not s.interval:
            s.interval, s.probe_at = self.probe_every, s.steps + self.probe_every
        if s.steps >= s.probe_at:
            others = [n for n in self.sizes if n != best]
            s.probing = others[s.next_probe % len(others)]
            s.next_probe += 1
            s.probe_left = PROBE_STEPS - 1
            s.fresh = True
            return s.probing
        return best

    def record(self, shape: Hashable, size: int, seconds: float) -> None:
        """A step of `shape` on `size` threads took `seconds` (wall time)."""
        s = self._shapes.setdefault(shape, _Shape(self.sizes))
        changed, s.last = size != s.last, size
        if changed:                       # compiles, team start-up or wake-up: not what a step costs
            return
        window = s.samples.get(size)
        if window is None or (size == s.probing and s.fresh):
            # a probe's size last ran long ago: its samples are stale, the probe's replace them
            window = s.samples[size] = collections.deque(maxlen=self.window)
            s.fresh = False
        window.append(seconds)

    def run(self, shape: Hashable, step: Callable[[], T]) -> T:
        """`step()` on the team size chosen for `shape`, timed and recorded."""
        size = self.choose(shape)
        self._apply(size)
        t0 = self.clock()
        out = step()
        self.record(shape, size, self.clock() - t0)
        return out

    def averages(self, shape: Hashable) -> dict[int, float]:
        """The estimated step time of `shape` per team size measured so far (seconds: the
        median of the last `window` steps)."""
        s = self._shapes.get(shape)
        return {n: s.estimate(n) for n in s.samples} if s is not None else {}


def _set_team_size(n: int) -> None:
    from ...runtime.threads import set_num_threads

    set_num_threads(n)
