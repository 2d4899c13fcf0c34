"""Generated docs are current: `docs/ops_coverage.md` matches the lowering registry (and the
committed OpInfo results it is rendered with). Regenerate with `python tools/gen_ops_coverage.py`."""
from __future__ import annotations

import json

from tools.gen_ops_coverage import PAGE, RESULTS, lowered_ops, render


def test_ops_coverage_page_is_current() -> None:
    results = json.loads(RESULTS.read_text())
    expected = render(results)
    actual = PAGE.read_text()
    if actual != expected:
        section = actual.split("## Lowered ops", 1)[-1].split("\n## ", 1)[0]
        listed = {line.split("`")[1] for line in section.splitlines() if line.startswith("| `")}
        lowered = {op for op, _ in lowered_ops()}
        raise AssertionError(
            "docs/ops_coverage.md is stale: run `python tools/gen_ops_coverage.py`. "
            f"Lowered but not listed: {sorted(lowered - listed)[:20]}; "
            f"listed but not lowered: {sorted(listed - lowered)[:20]}")
