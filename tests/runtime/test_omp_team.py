"""`runtime/omp_team.py`: a thread gives back its idle OpenMP team (libgomp counts the threads
of every team; more than the CPUs, and every team sleeps between parallel regions)."""
from __future__ import annotations

import os
import sys
import threading
import time

import pytest
import torch

from torchburn.runtime import omp_team

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/task")


def native_threads() -> int:
    """OS threads of this process that Python did not start (libgomp's workers among them)."""
    return len(os.listdir("/proc/self/task")) - threading.active_count()


def wait_for_threads(n: int, timeout: float = 30.0) -> int:
    """The native thread count once it is ``n`` (exiting workers take a moment to go), or
    what it is at the timeout."""
    deadline = time.monotonic() + timeout
    while native_threads() != n and time.monotonic() < deadline:
        time.sleep(0.01)
    return native_threads()


def make_team() -> None:
    """A parallel torch op in this thread: a libgomp team of 2 (one worker besides it)."""
    torch.rand(1 << 22).exp_()


@pytest.fixture
def two_threads():
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(old)


def test_release_gives_back_the_calling_threads_team(two_threads) -> None:
    make_team()
    with_team = native_threads()
    assert omp_team.release()
    assert wait_for_threads(with_team - 1) == with_team - 1
    make_team()                      # the next parallel region makes a team again
    assert wait_for_threads(with_team) == with_team
