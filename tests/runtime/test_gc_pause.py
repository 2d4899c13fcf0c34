"""`runtime.gc_pause.gc_paused`: the cyclic collector is off while graphs compile, back as it was after."""
from __future__ import annotations

import gc
import threading

import pytest

from torchburn.runtime.gc_pause import gc_paused


@pytest.fixture
def gc_enabled():
    was = gc.isenabled()
    gc.enable()
    yield
    if not was:
        gc.disable()


def test_paused_inside_and_restored_after(gc_enabled: None) -> None:
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # nested (a compile inside a compile)
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_restored_after_an_error(gc_enabled: None) -> None:
    with pytest.raises(ValueError):
        with gc_paused():
            raise ValueError("a pass failed")
    assert gc.isenabled()


def test_left_off_when_it_was_off(gc_enabled: None) -> None:
    gc.disable()
    with gc_paused():
        pass
    assert not gc.isenabled()


def test_back_on_only_after_the_last_of_concurrent_compilations(gc_enabled: None) -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with gc_paused():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        inside.wait(10)
    assert not gc.isenabled()  # the other thread still compiles
    release.set()
    t.join(10)
    assert gc.isenabled()


def test_a_compilation_runs_its_passes_with_the_collector_off(gc_enabled: None) -> None:
    from torchburn.compiler import driver

    seen: list[bool] = []
    real = driver._run_pipeline

    def spy(*args, **kwargs):
        seen.append(gc.isenabled())
        return real(*args, **kwargs)

    import torch

    driver._run_pipeline = spy
    try:
        driver.memory_cache().clear()
        f = torch.compile(lambda x: x * 3.0 + 1.0, backend="torchburn")
        x = torch.randn(7)
        torch.testing.assert_close(f(x), x * 3.0 + 1.0)
    finally:
        driver._run_pipeline = real
    assert seen == [False] * len(seen) and seen
    assert gc.isenabled()
