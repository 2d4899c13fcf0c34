"""Test-session set-up: tests never read or write the user's on-disk compile cache.

Tests that exercise the disk cache pass their own TORCHBURN_CACHE_DIR to the processes they
start; everything else compiles fresh, so what a test inspects is what it compiled."""
from __future__ import annotations

import os

os.environ["TORCHBURN_CACHE_DIR"] = "off"


def pytest_addoption(parser) -> None:  # type: ignore[no-untyped-def]
    parser.addoption("--engine", default=None, metavar="NAME",
                     help="run the tests with TORCHBURN_ENGINE=NAME (e.g. reference; see docs/reference-engine.md)")


def pytest_configure(config) -> None:  # type: ignore[no-untyped-def]
    name = config.getoption("--engine")
    if name:
        os.environ["TORCHBURN_ENGINE"] = name
        from torchburn.runtime.config import reload_config

        reload_config()  # a bad name fails here, with the accepted spellings
