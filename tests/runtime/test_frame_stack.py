"""`runtime.frame_stack.run_on_deep_stack`: calls crossing a chunk of CPython's frame stack do not
map and unmap memory each time (page faults counted), and the call behaves as a plain call."""
from __future__ import annotations

import sys

import pytest

from torchburn.runtime.frame_stack import run_on_deep_stack

resource = pytest.importorskip("resource")
if not hasattr(resource, "RUSAGE_THREAD"):
    pytest.skip("per-thread page fault counts are Linux's", allow_module_level=True)

ROUNDS = 300


def _descend(n: int) -> int:
    return _descend(n - 1) + 1 if n else 0


def _oscillate(base: int, depth: int, rounds: int) -> int:
    """At `base` frames below here, call `depth` frames deep `rounds` times (an IR visitor
    walking many small trees below a deep caller)."""
    if base:
        return _oscillate(base - 1, depth, rounds)
    return sum(_descend(depth) for _ in range(rounds))


def _faults(fn, *args: object) -> int:
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    fn(*args)
    return resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before


def _worst(call) -> int:
    # 300 caller depths span a few 16 KiB chunks: at some of them the 40-deep calls cross a
    # chunk boundary every round
    return max(_faults(call, base) for base in range(0, 300, 3))


@pytest.mark.skipif(sys.implementation.name != "cpython" or sys.version_info < (3, 11),
                    reason="CPython's chunked frame stack")
def test_no_page_faults_at_a_chunk_boundary() -> None:
    deep = _worst(lambda base: run_on_deep_stack(_oscillate, base, 40, ROUNDS))
    assert deep < ROUNDS // 10
    if sys.version_info < (3, 13):  # no spare chunk cached: the plain calls do thrash
        assert _worst(lambda base: _oscillate(base, 40, ROUNDS)) >= ROUNDS


def test_a_plain_call() -> None:
    assert run_on_deep_stack(_oscillate, 5, 10, rounds=3) == 30
    with pytest.raises(ZeroDivisionError):
        run_on_deep_stack(lambda: 1 // 0)
    # nested: the inner call goes straight on
    assert run_on_deep_stack(run_on_deep_stack, _descend, 7) == 7
