"""Test-session set-up.

- Tests never read or write the user's on-disk compile cache: tests that exercise the disk
  cache pass their own TORCHBURN_CACHE_DIR to the processes they start; everything else
  compiles fresh, so what a test inspects is what it compiled.
- Strict mode (`TORCHBURN_STRICT=1`): an internal compiler error raises instead of silently
  falling back to PyTorch, so no test passes on the strength of eager PyTorch. A test that
  checks the fallback on purpose turns it off locally (`strict_off` fixture).
- Every test starts from a torch random state derived from its own id, so what it draws does not
  depend on which tests ran before it in the same worker (a test that fails does so every time).
  Python's `random` is left alone: Hypothesis seeds each run from it."""
from __future__ import annotations

import os
import zlib

import pytest

os.environ["TORCHBURN_CACHE_DIR"] = "off"
os.environ["TORCHBURN_STRICT"] = "1"


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


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    name = config.getoption("--engine")
    if name:
        os.environ["TORCHBURN_ENGINE"] = name
        from torchburn.runtime.config import reload_config

        reload_config()  # a bad name fails here, with the accepted spellings
