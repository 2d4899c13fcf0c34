"""docs/ir.md is generated from the IR's definitions (tools/gen_ir_docs.py) and must be current."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_tool():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("gen_ir_docs", ROOT / "tools" / "gen_ir_docs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_ir_reference_is_current() -> None:
    tool = load_tool()
    committed = (ROOT / "docs" / "ir.md").read_text()
    assert committed == tool.generate(), "docs/ir.md is stale: run `python tools/gen_ir_docs.py`"


def test_every_op_and_node_is_documented() -> None:
    from torchburn.ir import ops

    text = (ROOT / "docs" / "ir.md").read_text()
    for name in ops.OPS:
        assert f"`{name}`" in text, name
    for node in ("Program", "Kernel", "For", "Store", "Load", "Ramp", "Broadcast", "Select"):
        assert f"### `{node}`" in text, node
