"""Command lines: `torchburn-opt` (passes on IR text) and `python -m torchburn` (demo, cache)."""
