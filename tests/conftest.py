"""Test-session set-up.

- Tests never read or write the user's on-disk compile cache: tests that exercise the disk
  cache pass their own TORCHBURN_CACHE_DIR to the processes they start; everything else
  compiles fresh, so what a test inspects is what it compiled.
- The tuner is off (`TORCHBURN_TUNE=off`): every kernel is ours, so the suite tests our
  generated kernels (a library call chosen by a measurement would hide them) and no test's
  result depends on the machine's load. The tuner's own tests turn it on locally.
- Strict mode (`TORCHBURN_STRICT=1`): an internal compiler error raises instead of silently
  falling back to PyTorch, so no test passes on the strength of eager PyTorch. A test that
  checks the fallback on purpose turns it off locally (`strict_off` fixture).
- Every test starts from a torch random state derived from its own id, so what it draws does not
  depend on which tests ran before it in the same worker (a test that fails does so every time).
  Python's `random` is left alone: Hypothesis seeds each run from it.
- A pytest-xdist worker that dies of a fatal signal (a crash in native code) writes every
  thread's stack to a file of its own, and the session's summary prints the crashing thread's
  innermost frames: a CI log that keeps only its tail still says where the crash was."""
from __future__ import annotations

import faulthandler
import os
import shutil
import tempfile
import zlib
from pathlib import Path

import pytest

os.environ["TORCHBURN_CACHE_DIR"] = "off"
os.environ["TORCHBURN_STRICT"] = "1"
os.environ["TORCHBURN_TUNE"] = "off"


@pytest.fixture
def strict_off(monkeypatch: pytest.MonkeyPatch):
    """Internal compiler errors fall back to PyTorch (the users' default) for this test."""
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_STRICT", "0")
    monkeypatch.delenv("TORCHBURN_DEBUG", raising=False)
    reload_config()
    yield
    monkeypatch.undo()
    reload_config()


@pytest.fixture(autouse=True)
def _seeded_by_test_id(request: pytest.FixtureRequest) -> None:
    import torch

    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))


def pytest_addoption(parser) -> None:  # type: ignore[no-untyped-def]
    parser.addoption("--engine", default=None, metavar="NAME",
                     help="run the tests with TORCHBURN_ENGINE=NAME (e.g. reference; see docs/reference-engine.md)")


#: Where xdist workers write their fatal-signal stacks (set by the controller, inherited).
_CRASH_DIR = "TORCHBURN_TEST_CRASH_DIR"


@pytest.hookimpl(trylast=True)  # after pytest's own faulthandler plugin, which writes to stderr
def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    _configure_engine(config)
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is None:
        os.environ.setdefault(_CRASH_DIR, tempfile.mkdtemp(prefix="torchburn-test-crashes-"))
    elif os.environ.get(_CRASH_DIR):
        stream = open(Path(os.environ[_CRASH_DIR]) / f"{worker}-{os.getpid()}.txt", "w")
        config._torchburn_crash_stream = stream  # kept open: faulthandler writes to its descriptor
        faulthandler.enable(file=stream, all_threads=True)


def pytest_terminal_summary(terminalreporter) -> None:  # type: ignore[no-untyped-def]
    folder = os.environ.get(_CRASH_DIR)
    if os.environ.get("PYTEST_XDIST_WORKER") is not None or not folder or not Path(folder).is_dir():
        return
    for path in sorted(Path(folder).glob("*.txt")):
        lines = path.read_text(errors="replace").splitlines()
        if not lines:
            continue
        terminalreporter.section(f"worker crash: {path.stem}", sep="=", red=True)
        current = next((i for i, line in enumerate(lines) if line.startswith("Current thread")), 0)
        for line in lines[:2] + lines[current:current + 40]:
            terminalreporter.write_line(line)
    shutil.rmtree(folder, ignore_errors=True)


def _configure_engine(config) -> None:  # type: ignore[no-untyped-def]
    name = config.getoption("--engine")
    if name:
        os.environ["TORCHBURN_ENGINE"] = name
        from torchburn.runtime.config import reload_config

        reload_config()  # a bad name fails here, with the accepted spellings
