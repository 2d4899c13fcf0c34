"""One tuner for the whole compiler: measure a kernel's candidate implementations, keep the fastest.

Where a kernel has several implementations (a generated kernel and a library call such as
ATen's convolution; later tiles, layouts, vector widths and thread splits of generated kernels),
the code that knows the kernel proposes them as `Candidate`s and asks `Tuner.choose`. The tuner
never knows what a candidate is: it prepares each (a compile, an allocation), runs them
interleaved on the real shapes, and keeps the one of the fastest best round (the minimum: on a
loaded machine a round the scheduler preempted takes ten or twenty times as long, and with
three rounds the median can be such a round; the fastest round is the kernel's own time,
which only the kernel can shorten). The result is a `Choice`, stored
as a tuning record under a key of the workload, the target and the tuning context (thread
count, torchburn's source, torch's version), in memory and in the disk cache's private, keyed
folder, so a second process applies it without measuring again (as TVM MetaSchedule's
database does: compilation queries records; only a search writes them).

Modes (`TORCHBURN_TUNE`, or the `tune` option of `torch.compile`):

- ``off``: nothing is looked up or measured; the candidate marked `default` is used (every
  kernel ours: the test suite runs so, which keeps our generated kernels under test);
- ``cached``: a record found in memory or on disk is applied; else the default;
- ``search``: a record is applied; else the candidates are measured while the graph's budget
  (`TORCHBURN_TUNE_BUDGET` seconds) lasts; once it is spent, the default is used. A tuner
  never picks a candidate it has not measured over the default: a guess that a library call
  is faster (an earlier rule gave a spent budget's large convolutions to ATen) made
  EfficientNet-B0 slower with the tuner on than off, where ours was measured faster on those
  very layers. The code that proposes candidates orders its workloads so that the budget goes
  to the largest first (`backend/library_calls.choose_library_calls`).

Rounds are timed by the `measure` clock, which the caller picks: the process's CPU time where
the kernels run on one thread (a round the scheduler preempted then costs what the kernel did,
not what the other processes did: on a loaded machine every round of a 10 ms kernel can be
preempted, and the fastest of them still says nothing), wall time where they run on several
(their time waiting for each other is part of what they cost).

A runner may name its code (`code_key`, an attribute of the callable `prepare` returns: a
digest of the compiled program): candidates whose code is the same are one kernel, measured
once under the first name (the default's, if it is among them). A quantized linear's `auto`
and the explicit form it resolves to were measured twice before, and noise chose between them.

A candidate may carry an `overhead_s`: a cost of choosing it that its own run does not show
(a library call splits the fused graph around it); the ranking adds it to the best round.

A search is bounded twice: by the budget, checked before each workload (a workload started
finishes: its candidates are measured together), and per candidate by `max_rounds` and a
per-workload time cap. The tuner imports no torch: candidates bring their own runners.
"""
from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Optional, Sequence

from blake3 import blake3

if TYPE_CHECKING:
    from .disk_cache import DiskCache

log = logging.getLogger("torchburn")

#: Bumped when the record's layout or the way candidates are measured changes.
RECORD_FORMAT = "tune-4"


@dataclass(frozen=True)
class Candidate:
    """One way to run a kernel. `prepare()` does the one-time work (compiling, allocating
    inputs) and returns a runner that executes the kernel once on the real shapes (optionally
    with a `code_key` attribute naming its code); a candidate that cannot be prepared raises,
    and is then left out with its error in the choice."""

    #: Unique within a workload, e.g. "ours" or "aten".
    name: str
    #: "generated" (a kernel of ours) or "library" (a call into ATen/oneDNN); shown by explain.
    kind: str
    prepare: Callable[[], Callable[[], Any]]
    #: What is used when nothing is known: `off` and `cached` modes, and a `search` whose budget
    #: is spent.
    default: bool = False
    #: Seconds this candidate costs beyond its own run when chosen, which a measurement of it
    #: alone cannot see (a library call cuts the fused graph: its result is written and read
    #: back instead of staying in the next kernel's registers); added when ranking.
    overhead_s: float = 0.0


@dataclass
class Choice:
    """What the tuner decided for one workload, and why."""

    #: The family and a readable description of the workload ("convolution f32[8,64,56,56] ...").
    family: str
    workload: str
    chosen: str
    #: "measured" (this process), "record" (memory or disk), "default" (off/cached without a
    #: record), "budget" (search mode, budget spent: the default).
    source: str
    #: Seconds of each candidate's best round (empty unless measured or read from a record).
    times: dict[str, float] = field(default_factory=dict)
    #: Candidates that could not be prepared or run, with the error.
    failed: dict[str, str] = field(default_factory=dict)
    #: Seconds this choice cost the compile (measuring), 0 for records.
    cost_s: float = 0.0
    #: Each candidate's `overhead_s`, where not 0 (added to its time when ranking).
    overheads: dict[str, float] = field(default_factory=dict)
    #: Candidates left unmeasured because they compiled to the same code as an earlier one
    #: (name -> that one's name): `auto` and the explicit form it picks are one kernel.
    same_code: dict[str, str] = field(default_factory=dict)

    def cost(self, name: str) -> float:
        """Candidate `name`'s measured time plus its overhead."""
        return self.times[name] + self.overheads.get(name, 0.0)

    @property
    def speedup(self) -> Optional[float]:
        """How many times faster the chosen candidate is than the next best (overheads
        included), when measured."""
        if self.chosen not in self.times or len(self.times) < 2:
            return None
        others = [self.cost(n) for n in self.times if n != self.chosen]
        return min(others) / self.cost(self.chosen) if self.cost(self.chosen) > 0 else None

    def line(self) -> str:
        """One line for `explain()`."""
        if self.times:
            ranked = sorted(self.times, key=self.cost)
            timing = ", ".join(f"{n} {self.times[n] * 1e3:.3f} ms" + (f" + {self.overheads[n] * 1e3:.3f} ms cut"
                                                                     if self.overheads.get(n) else "")
                               for n in ranked)
            gain = f"; {self.speedup:.2f}x the next" if self.speedup is not None else ""
            failed = "".join(f"; {n} failed: {e}" for n, e in self.failed.items())
            same = "".join(f"; {n} is {m}'s code" for n, m in self.same_code.items())
            return f"{self.family} {self.workload}: {self.chosen} ({self.source}: {timing}{gain}{same}{failed})"
        failed = "".join(f": {n} failed: {e}" for n, e in self.failed.items())
        return f"{self.family} {self.workload}: {self.chosen} ({self.source}{failed})"


@dataclass(frozen=True)
class TuneOptions:
    """How much the tuner may do (see the module docstring)."""

    mode: str = "search"
    #: Seconds of measuring per `Tuner` (one compiled graph).
    budget_s: float = 30.0
    #: Rounds per candidate: at least `min_rounds`, then more until a round-robin pass exceeds
    #: `workload_cap_s` or `max_rounds` is reached.
    min_rounds: int = 3
    max_rounds: int = 15
    workload_cap_s: float = 2.0

    def __post_init__(self) -> None:
        if self.mode not in ("off", "cached", "search"):
            raise ValueError(f"tune mode {self.mode!r}: expected off, cached or search")
        if not self.budget_s >= 0:
            raise ValueError(f"tune budget {self.budget_s!r}: expected seconds >= 0")


class RecordStore:
    """Tuning records: an in-process dict in front of the disk cache (when one is on)."""

    def __init__(self) -> None:
        self._memory: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def get(self, key: str, disk: Optional["DiskCache"]) -> Optional[dict[str, Any]]:
        with self._lock:
            hit = self._memory.get(key)
        if hit is None and disk is not None:
            hit = disk.load_record(key)
            if hit is not None:
                with self._lock:
                    self._memory[key] = hit
        return hit

    def put(self, key: str, record: dict[str, Any], disk: Optional["DiskCache"]) -> None:
        with self._lock:
            self._memory[key] = record
        if disk is not None:
            disk.store_record(key, record)

    def clear(self) -> None:
        with self._lock:
            self._memory.clear()


_records = RecordStore()


def records() -> RecordStore:
    """The process's tuning records (tests clear them)."""
    return _records


def record_key(family: str, workload: dict[str, Any], context: dict[str, Any]) -> str:
    """The key of a tuning record: BLAKE3 of the family, the workload and the context (target,
    threads, versions) as canonical JSON."""
    doc = json.dumps({"format": RECORD_FORMAT, "family": family, "workload": workload, "context": context},
                     sort_keys=True, default=str)
    return "tune" + blake3(doc.encode("utf-8")).hexdigest()


Clock = Callable[[], float]


def measuring_clock(threads: int) -> Clock:
    """The clock that times a candidate's rounds when kernels run on `threads` threads: the
    process's CPU time for one (immune to preemption), wall time for more (see the module
    docstring)."""
    return time.process_time if threads == 1 else time.perf_counter


class Tuner:
    """The tuner of one compiled graph: its options, its budget, and the choices it made."""

    def __init__(self, options: TuneOptions, context: dict[str, Any], disk: Optional["DiskCache"] = None,
                 clock: Clock = time.perf_counter, fatal: tuple[type[BaseException], ...] = (),
                 measure: Optional[Clock] = None) -> None:
        self.options = options
        #: Errors a candidate must not swallow (a compiler bug in strict mode): they propagate
        #: instead of leaving the candidate out.
        self.fatal = fatal
        self.context = dict(context)
        self.disk = disk
        #: The budget's clock (wall time: what a user waits for) and the rounds' clock.
        self.clock = clock
        self.measure = measure or clock
        self.spent_s = 0.0
        self.choices: list[Choice] = []

    @property
    def budget_left_s(self) -> float:
        return max(0.0, self.options.budget_s - self.spent_s)

    def choose(self, family: str, workload: dict[str, Any], description: str,
               candidates: Sequence[Candidate]) -> Choice:
        """The candidate to use for `workload` (a JSON-able description of the kernel's shapes
        and attributes), by the rules of the mode; recorded in `self.choices`."""
        names = [c.name for c in candidates]
        if len(set(names)) != len(names) or not candidates:
            raise ValueError(f"tuner: candidates need distinct names, got {names}")
        default = next((c for c in candidates if c.default), candidates[0])
        mode = self.options.mode
        choice: Optional[Choice] = None
        if mode != "off":
            key = record_key(family, workload, self.context)
            record = _records.get(key, self.disk)
            if record is not None and record.get("chosen") in names:
                choice = Choice(family, description, record["chosen"], "record",
                                {str(k): float(v) for k, v in record.get("times", {}).items()},
                                overheads={str(k): float(v) for k, v in record.get("overheads", {}).items()})
            elif mode == "search" and self.budget_left_s > 0:
                choice = self._measure(family, description, candidates, default)
                if choice.times:  # a measurement, even a partial one, is worth keeping
                    _records.put(key, {"chosen": choice.chosen, "times": choice.times,
                                       "overheads": choice.overheads, "workload": description}, self.disk)
            elif mode == "search":
                choice = Choice(family, description, default.name, "budget")
        if choice is None:
            choice = Choice(family, description, default.name, "default")
        self.choices.append(choice)
        log.debug("torchburn tuner: %s", choice.line())
        return choice

    def _measure(self, family: str, description: str, candidates: Sequence[Candidate],
                 default: Candidate) -> Choice:
        start = self.clock()
        runners: dict[str, Callable[[], Any]] = {}
        failed: dict[str, str] = {}
        same_code: dict[str, str] = {}
        by_code: dict[str, str] = {}
        # the default first: of candidates with the same code, it is the one measured
        for c in sorted(candidates, key=lambda c: c is not default):
            try:
                run = c.prepare()
                code = getattr(run, "code_key", None)
                if code is not None and code in by_code:
                    same_code[c.name] = by_code[code]  # one kernel under two names: measure it once
                    continue
                run()  # warm-up: first-touch of memory, lazy loading, caches
                runners[c.name] = run
                if code is not None:
                    by_code[code] = c.name
            except self.fatal:
                raise
            except Exception as err:  # noqa: BLE001 - a candidate that fails is not chosen
                failed[c.name] = f"{type(err).__name__}: {err}"
                log.info("torchburn tuner: candidate %s of %s failed: %s", c.name, description, err)
        samples: dict[str, list[float]] = {n: [] for n in runners}
        rounds = 0
        measuring_started = self.clock()
        while runners and rounds < self.options.max_rounds:
            for name, run in list(runners.items()):  # interleaved: drift hits every candidate alike
                t0 = self.measure()
                try:
                    run()
                except self.fatal:
                    raise
                except Exception as err:  # noqa: BLE001
                    failed[name] = f"{type(err).__name__}: {err}"
                    del runners[name]
                    samples.pop(name, None)
                    continue
                samples[name].append(self.measure() - t0)
            rounds += 1
            if rounds >= self.options.min_rounds and self.clock() - measuring_started > self.options.workload_cap_s:
                break
        times = {n: min(s) for n, s in samples.items() if s}
        overheads = {c.name: c.overhead_s for c in candidates if c.overhead_s}
        chosen = min(times, key=lambda n: times[n] + overheads.get(n, 0.0)) if times else default.name
        cost = self.clock() - start
        self.spent_s += cost
        return Choice(family, description, chosen, "measured" if times else "default", times, failed, cost, overheads,
                      same_code)
