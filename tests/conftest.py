"""Test-session set-up: tests never read or write the user's on-disk compile cache.

Tests that exercise the disk cache pass their own TORCHBURN_CACHE_DIR to the processes they
start; everything else compiles fresh, so what a test inspects is what it compiled."""
from __future__ import annotations

import os

os.environ["TORCHBURN_CACHE_DIR"] = "off"
