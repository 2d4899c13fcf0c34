"""The tuner (`torchburn/runtime/tuner.py`): modes, budget, records in memory and on disk.

Candidates here are plain functions that advance a fake clock by a fixed cost, so which one
wins, and what the budget allows, does not depend on the machine's load."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

from torchburn.runtime.disk_cache import DiskCache
from torchburn.runtime.tuner import Candidate, Choice, TuneOptions, Tuner, measuring_clock, record_key, records


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def _fresh_records() -> Any:
    records().clear()
    yield
    records().clear()


def costing(clock: FakeClock, seconds: float, prepared: list[str], name: str,
            prepare_s: float = 0.0) -> Callable[[], Callable[[], None]]:
    def prepare() -> Callable[[], None]:
        prepared.append(name)
        clock.now += prepare_s

        def run() -> None:
            clock.now += seconds
        return run
    return prepare


def two(clock: FakeClock, prepared: list[str], ours_s: float, lib_s: float) -> list[Candidate]:
    return [Candidate("ours", "generated", costing(clock, ours_s, prepared, "ours"), default=True),
            Candidate("aten", "library", costing(clock, lib_s, prepared, "aten"))]


WORK = {"op": "convolution", "shape": [8, 64, 56, 56]}
CTX = {"target": "test", "threads": "2/2"}


def test_search_keeps_the_fastest_and_records_its_times() -> None:
    clock, prepared = FakeClock(), []
    tuner = Tuner(TuneOptions(mode="search"), CTX, clock=clock)
    choice = tuner.choose("convolution", WORK, "conv", two(clock, prepared, ours_s=0.002, lib_s=0.003))
    assert choice.chosen == "ours" and choice.source == "measured"
    assert choice.times == pytest.approx({"ours": 0.002, "aten": 0.003})
    assert choice.speedup == pytest.approx(1.5)
    assert "1.50x the next" in choice.line()
    choice = tuner.choose("convolution", {**WORK, "shape": [1]}, "conv", two(clock, prepared, 0.004, 0.001))
    assert choice.chosen == "aten"
    assert [c.chosen for c in tuner.choices] == ["ours", "aten"]


def test_a_record_is_applied_without_measuring_again() -> None:
    clock, prepared = FakeClock(), []
    Tuner(TuneOptions(mode="search"), CTX, clock=clock).choose("convolution", WORK, "conv",
                                                                 two(clock, prepared, 0.004, 0.001))
    prepared.clear()
    for mode in ("search", "cached"):
        choice = Tuner(TuneOptions(mode=mode), CTX, clock=clock).choose("convolution", WORK, "conv",
                                                                        two(clock, prepared, 0.001, 0.004))
        assert (choice.chosen, choice.source) == ("aten", "record")
        assert choice.times["aten"] == pytest.approx(0.001)
    assert prepared == []


def test_off_and_cached_without_a_record_use_the_default_and_measure_nothing() -> None:
    clock, prepared = FakeClock(), []
    for mode in ("off", "cached"):
        choice = Tuner(TuneOptions(mode=mode), CTX, clock=clock).choose("convolution", WORK, "conv",
                                                                        two(clock, prepared, 0.004, 0.001))
        assert (choice.chosen, choice.source) == ("ours", "default")
    assert prepared == [] and clock.now == 0.0


def test_off_ignores_records() -> None:
    clock, prepared = FakeClock(), []
    Tuner(TuneOptions(mode="search"), CTX, clock=clock).choose("convolution", WORK, "conv",
                                                                 two(clock, prepared, 0.004, 0.001))
    choice = Tuner(TuneOptions(mode="off"), CTX, clock=clock).choose("convolution", WORK, "conv",
                                                                      two(clock, prepared, 0.004, 0.001))
    assert choice.chosen == "ours"


def test_a_spent_budget_takes_the_default() -> None:
    """Never an unmeasured guess over the default: a rule that gave a spent budget's large
    convolutions to ATen made EfficientNet-B0 slower with the tuner than without."""
    clock, prepared = FakeClock(), []
    tuner = Tuner(TuneOptions(mode="search", budget_s=0.05), CTX, clock=clock)
    first = tuner.choose("convolution", WORK, "conv",
                         [Candidate("ours", "generated", costing(clock, 0.001, prepared, "ours", prepare_s=0.1),
                                    default=True),
                          Candidate("aten", "library", costing(clock, 0.002, prepared, "aten"))])
    assert first.source == "measured" and first.chosen == "ours"
    assert tuner.spent_s > 0.05 and tuner.budget_left_s == 0
    prepared.clear()
    second = tuner.choose("convolution", {**WORK, "shape": [2]}, "conv", two(clock, prepared, 0.002, 0.001))
    assert (second.chosen, second.source) == ("ours", "budget")
    assert prepared == []


def test_rounds_stop_at_the_workload_cap() -> None:
    clock, prepared = FakeClock(), []
    runs: list[str] = []

    def slow() -> Callable[[], None]:
        def run() -> None:
            runs.append("slow")
            clock.now += 1.5
        return run
    tuner = Tuner(TuneOptions(mode="search", min_rounds=2, max_rounds=50, workload_cap_s=2.0), CTX, clock=clock)
    tuner.choose("x", WORK, "x", [Candidate("slow", "generated", slow, default=True)])
    assert len(runs) == 1 + 2  # the warm-up, then the minimum rounds (the cap was passed after one)


def test_a_failing_candidate_is_left_out_with_its_error() -> None:
    clock, prepared = FakeClock(), []

    def broken() -> Callable[[], None]:
        raise RuntimeError("no lowering")
    tuner = Tuner(TuneOptions(mode="search"), CTX, clock=clock)
    choice = tuner.choose("convolution", WORK, "conv",
                          [Candidate("ours", "generated", broken, default=True),
                           Candidate("aten", "library", costing(clock, 0.003, prepared, "aten"))])
    assert choice.chosen == "aten" and set(choice.times) == {"aten"}
    assert "RuntimeError: no lowering" in choice.failed["ours"]
    assert "ours failed: RuntimeError: no lowering" in choice.line()


def test_records_outlive_the_process_in_the_disk_cache(tmp_path: Path) -> None:
    clock, prepared = FakeClock(), []
    disk = DiskCache(tmp_path)
    Tuner(TuneOptions(mode="search"), CTX, disk, clock=clock).choose("convolution", WORK, "conv",
                                                                       two(clock, prepared, 0.004, 0.001))
    assert len(disk.record_files()) == 1 and disk.info()["tuning_records"] == 1
    records().clear()  # a new process: only the disk has it
    prepared.clear()
    choice = Tuner(TuneOptions(mode="cached"), CTX, DiskCache(tmp_path), clock=clock).choose(
        "convolution", WORK, "conv", two(clock, prepared, 0.001, 0.004))
    assert (choice.chosen, choice.source) == ("aten", "record") and prepared == []
    # another thread count or target is another key: measured again
    other = Tuner(TuneOptions(mode="search"), {**CTX, "threads": "1/1"}, DiskCache(tmp_path), clock=clock).choose(
        "convolution", WORK, "conv", two(clock, prepared, 0.001, 0.004))
    assert (other.chosen, other.source) == ("ours", "measured")


def test_a_corrupt_record_is_dropped_and_measured_again(tmp_path: Path) -> None:
    clock, prepared = FakeClock(), []
    disk = DiskCache(tmp_path)
    Tuner(TuneOptions(mode="search"), CTX, disk, clock=clock).choose("convolution", WORK, "conv",
                                                                       two(clock, prepared, 0.004, 0.001))
    (path,) = disk.record_files()
    path.write_bytes(path.read_bytes()[:-3] + b"xyz")
    records().clear()
    choice = Tuner(TuneOptions(mode="search"), CTX, DiskCache(tmp_path), clock=clock).choose(
        "convolution", WORK, "conv", two(clock, prepared, 0.001, 0.004))
    assert (choice.chosen, choice.source) == ("ours", "measured")


def test_keys_separate_families_workloads_and_contexts() -> None:
    keys = {record_key("convolution", WORK, CTX), record_key("convolution_backward", WORK, CTX),
            record_key("convolution", {**WORK, "shape": [1]}, CTX),
            record_key("convolution", WORK, {**CTX, "target": "other"})}
    assert len(keys) == 4
    assert record_key("convolution", WORK, CTX) == record_key("convolution", dict(reversed(WORK.items())), CTX)


def test_bad_options_and_candidates_are_refused() -> None:
    with pytest.raises(ValueError, match="tune mode 'fast'"):
        TuneOptions(mode="fast")
    with pytest.raises(ValueError, match="budget"):
        TuneOptions(budget_s=-1)
    clock, prepared = FakeClock(), []
    with pytest.raises(ValueError, match="distinct names"):
        Tuner(TuneOptions(), CTX, clock=clock).choose("x", WORK, "x", two(clock, prepared, 1, 1) * 2)


def test_choice_line_without_times() -> None:
    assert Choice("convolution", "f32[1]", "aten", "budget").line() == "convolution f32[1]: aten (budget)"


def test_an_overhead_counts_against_its_candidate() -> None:
    """A library call measured 10% faster alone loses once its cut of the fused graph (its
    `overhead_s`) is counted; the line shows both."""
    clock, prepared = FakeClock(), []
    tuner = Tuner(TuneOptions(mode="search"), CTX, clock=clock)
    choice = tuner.choose("convolution", WORK, "conv",
                          [Candidate("ours", "generated", costing(clock, 0.0011, prepared, "ours"), default=True),
                           Candidate("aten", "library", costing(clock, 0.0010, prepared, "aten"),
                                     overhead_s=0.0002)])
    assert choice.chosen == "ours"
    assert choice.speedup == pytest.approx(0.0012 / 0.0011)
    assert "aten 1.000 ms + 0.200 ms cut" in choice.line()
    again = Tuner(TuneOptions(mode="cached"), CTX, clock=clock).choose("convolution", WORK, "conv",
                                                                       two(clock, prepared, 1, 1))
    assert again.source == "record" and again.overheads == {"aten": pytest.approx(0.0002)}


def test_a_fatal_error_is_not_taken_for_a_losing_candidate() -> None:
    """A compiler bug raised in strict mode propagates instead of leaving the candidate out
    (the library call would hide it)."""
    class Bug(RuntimeError):
        pass

    def broken() -> Callable[[], None]:
        raise Bug("internal compiler error")
    clock, prepared = FakeClock(), []
    tuner = Tuner(TuneOptions(mode="search"), CTX, clock=clock, fatal=(Bug,))
    with pytest.raises(Bug):
        tuner.choose("convolution", WORK, "conv",
                     [Candidate("ours", "generated", broken, default=True),
                      Candidate("aten", "library", costing(clock, 0.003, prepared, "aten"))])


def test_the_best_round_wins_not_a_preempted_one() -> None:
    """On a loaded machine a round the scheduler preempted takes many times the kernel's
    time: `ours` is preempted in two of its three rounds (median 20 ms), `aten` never
    (3 ms each); ours's own time, its best round, is 1 ms."""
    clock, prepared = FakeClock(), []
    costs = iter([0.001, 0.020, 0.001, 0.020])  # the warm-up, then three rounds

    def preempted() -> Callable[[], None]:
        def run() -> None:
            clock.now += next(costs)
        return run
    tuner = Tuner(TuneOptions(mode="search", min_rounds=3, max_rounds=3), CTX, clock=clock)
    choice = tuner.choose("convolution", WORK, "conv",
                          [Candidate("ours", "generated", preempted, default=True),
                           Candidate("aten", "library", costing(clock, 0.003, prepared, "aten"))])
    assert choice.chosen == "ours"
    assert choice.times == pytest.approx({"ours": 0.001, "aten": 0.003})


def test_rounds_are_timed_by_the_measuring_clock() -> None:
    """A round's time is read from the `measure` clock (CPU time on one thread): `ours` runs
    1 ms of its own work but is preempted for 30 ms of wall time in every round, `aten`
    runs 5 ms unpreempted. By wall time `aten` would win; by the work each did, `ours`. The
    budget still counts wall time."""
    wall, cpu = FakeClock(), FakeClock()

    def preempted() -> Callable[[], None]:
        def run() -> None:
            cpu.now += 0.001
            wall.now += 0.031
        return run

    def steady() -> Callable[[], None]:
        def run() -> None:
            cpu.now += 0.005
            wall.now += 0.005
        return run
    tuner = Tuner(TuneOptions(mode="search"), CTX, clock=wall, measure=cpu)
    choice = tuner.choose("convolution", WORK, "conv", [Candidate("ours", "generated", preempted, default=True),
                                                        Candidate("aten", "library", steady)])
    assert choice.chosen == "ours" and choice.times == pytest.approx({"ours": 0.001, "aten": 0.005})
    assert tuner.spent_s == pytest.approx(wall.now)


def test_one_thread_is_measured_in_cpu_time() -> None:
    assert measuring_clock(1) is time.process_time
    assert measuring_clock(2) is time.perf_counter


def test_candidates_with_the_same_code_are_measured_once() -> None:
    """A runner's `code_key` names its code: a second candidate with the same code (a form
    that resolves to the default's kernel) is not measured, the default keeps the name, and
    the line says which candidate it was."""
    clock, runs = FakeClock(), []

    def runner(name: str, code: str, seconds: float) -> Callable[[], Callable[[], None]]:
        def prepare() -> Callable[[], None]:
            def run() -> None:
                runs.append(name)
                clock.now += seconds
            run.code_key = code  # type: ignore[attr-defined]
            return run
        return prepare

    # the twin comes first and is (by noise) a little faster: the default still keeps the name
    candidates = [Candidate("panel", "generated", runner("panel", "k1", 0.001)),
                  Candidate("auto", "generated", runner("auto", "k1", 0.0011), default=True),
                  Candidate("rows", "generated", runner("rows", "k2", 0.003))]
    choice = Tuner(TuneOptions(mode="search"), CTX, clock=clock).choose("qlinear", WORK, "q", candidates)
    assert "panel" not in runs and set(runs) == {"auto", "rows"}
    assert choice.chosen == "auto" and set(choice.times) == {"auto", "rows"}
    assert choice.same_code == {"panel": "auto"} and "panel is auto's code" in choice.line()
