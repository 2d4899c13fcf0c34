"""`runtime.switch_interval.short_switch_interval`: a short GIL switch interval while a graph
compiles (LLVM's thread takes the GIL back after each call into LLVM), put back after."""
from __future__ import annotations

import sys
import threading

import pytest

from torchburn.runtime.switch_interval import COMPILE_SWITCH_INTERVAL, short_switch_interval


@pytest.fixture
def default_interval():
    was = sys.getswitchinterval()
    sys.setswitchinterval(0.005)
    yield
    sys.setswitchinterval(was)


def test_short_inside_nested_and_restored_after(default_interval: None) -> None:
    with short_switch_interval():
        assert sys.getswitchinterval() == pytest.approx(COMPILE_SWITCH_INTERVAL, rel=0.05)
        with short_switch_interval():
            assert sys.getswitchinterval() == pytest.approx(COMPILE_SWITCH_INTERVAL, rel=0.05)
        assert sys.getswitchinterval() == pytest.approx(COMPILE_SWITCH_INTERVAL, rel=0.05)
    assert sys.getswitchinterval() == pytest.approx(0.005, rel=0.05)


def test_restored_after_an_error_and_never_lengthened(default_interval: None) -> None:
    with pytest.raises(ValueError):
        with short_switch_interval():
            raise ValueError("a pass failed")
    assert sys.getswitchinterval() == pytest.approx(0.005, rel=0.05)
    sys.setswitchinterval(0.0001)
    with short_switch_interval():
        assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.05)
    assert sys.getswitchinterval() == pytest.approx(0.0001, rel=0.05)


def test_restored_only_after_the_last_of_concurrent_compiles(default_interval: None) -> None:
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with short_switch_interval():
            inside.set()
            release.wait(10)

    t = threading.Thread(target=other)
    with short_switch_interval():
        t.start()
        inside.wait(10)
    assert sys.getswitchinterval() == pytest.approx(COMPILE_SWITCH_INTERVAL, rel=0.05)  # the other still compiles
    release.set()
    t.join(10)
    assert sys.getswitchinterval() == pytest.approx(0.005, rel=0.05)


def test_a_compile_runs_with_the_short_interval(monkeypatch: pytest.MonkeyPatch, default_interval: None) -> None:
    """`driver.compile_graph` runs its passes and codegen with the short interval."""
    from torchburn.compiler import driver
    from torchburn.compiler.kernel_cache import kernel_cache
    from torchburn.ir.parser import parse_graph

    seen: list[float] = []
    run = driver._run_pipeline

    def watched(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(sys.getswitchinterval())
        return run(*args, **kwargs)

    monkeypatch.setattr(driver, "_run_pipeline", watched)
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    driver.memory_cache().clear()
    kernel_cache().clear()
    graph = parse_graph("graph @g(%x: f32[8]) {\n  %0 = tanh(%x) : f32[8]\n  return %0\n}")
    driver.compile_graph(graph)
    assert seen == [pytest.approx(COMPILE_SWITCH_INTERVAL, rel=0.05)]
    assert sys.getswitchinterval() == pytest.approx(0.005, rel=0.05)
