"""`explain()`: Dynamo's graph breaks with their reason and user line, the ops that ran in
PyTorch between graphs, a header that agrees with the body, the int8-activation numerics
note, and kernels that point at the user's line rather than torchburn's own files."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

import torchburn
from torchburn.runtime.config import reload_config

HERE = Path(__file__).name


def breaking(x: torch.Tensor) -> tuple[torch.Tensor, int]:
    y = torch.relu(x) * 2
    print("explain-test")  # break 1: print
    if y.sum() > 0:  # break 2: a branch on a tensor's value
        y = y + 1
    idx = torch.nonzero(y)  # break 3: a data-dependent shape
    return y.sin(), idx.shape[0]


def _line(text: str) -> int:
    import inspect

    source, start = inspect.getsourcelines(breaking)
    return start + next(i for i, ln in enumerate(source) if text in ln)


def test_graph_breaks_are_listed_with_reason_and_user_line() -> None:
    # an input with positive entries takes the branch, so the graph after it is not empty
    # (an all-negative randn(8), 1 in 256, left three graphs instead of four)
    report = torchburn.explain(breaking, torch.linspace(-1.0, 1.0, 8))
    breaks = {b.location.rsplit(":", 1)[1]: b for b in report.graph_breaks if HERE in b.location}
    assert len(report.graph_breaks) == 3 and len(breaks) == 3, report.graph_breaks
    assert "print" in breaks[str(_line('print("explain-test")'))].reason
    jump = breaks[str(_line("if y.sum() > 0"))]
    assert "generic_jump" in jump.reason and jump.source == "if y.sum() > 0:  # break 2: a branch on a tensor's value"
    assert "nonzero" in breaks[str(_line("torch.nonzero(y)"))].reason
    assert report.dynamo_graphs == 4
    # the code at the breaks ran in PyTorch: the nonzero itself and the tensor's truth value
    assert report.eager_ops is not None
    assert report.eager_ops.get("aten::nonzero") == 1 and report.eager_ops.get("aten::is_nonzero") == 1
    text = str(report)
    assert "4 Dynamo graph(s) (3 graph break(s))" in text
    assert f"{report.eager_op_count} between graphs" in text and report.eager_op_count >= 2
    assert "[graph 4: forward]" in text and f"{HERE}:{_line('torch.nonzero(y)')} `idx = torch.nonzero(y)" in text


def test_no_break_no_eager_ops() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.GELU())
    report = torchburn.explain(model, torch.randn(2, 16))
    assert report.graph_breaks == [] and report.eager_ops == {} and report.dynamo_graphs == 1
    assert "graph break" not in str(report) and "0 between graphs" in str(report)


def _header_counts(text: str) -> tuple[int, int]:
    hits, misses = re.search(r"cache (\d+) hit\(s\), (\d+) miss\(es\)", text.splitlines()[0]).groups()
    return int(hits), int(misses)


def test_header_cache_counts_agree_with_the_body() -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(x) * 3 - 1

    x = torch.randn(5, 7)
    for expect_hit in (False, True):  # the second explain finds the program in memory
        report = torchburn.explain(f, x)
        text = str(report)
        body_hits = text.count("(cache hit)")
        body_misses = len(re.findall(r"\(compiled ", text))
        assert _header_counts(text) == (body_hits, body_misses) == (report.cache_hits, report.cache_misses)
        assert body_hits == (len(report.compiled_subgraphs) if expect_hit else 0)


def _quantized_layer(kind: str) -> tuple[torch.nn.Module, str, int]:
    """A quantized linear of `kind` (int4, int8 or a ggml block type), the op its kernel's
    origin names, and the rows of x that reach the int8 kernel (block weights: decode)."""
    torch.manual_seed(0)
    if kind in ("int4", "int8"):
        layer = torchburn.QuantizedLinear.from_float(torch.nn.Linear(256, 64), quant_type=kind, group_size=64)
        return layer, f"linear_{kind}", 4
    from tests.quant.test_block_types import random_blocks
    from torchburn.ir.qblocks import BLOCK_TYPES
    from torchburn.quant.blocks import BlockWeight

    raw = torch.from_numpy(random_blocks(kind, 64, 256 // BLOCK_TYPES[kind].block, seed=0))
    return torchburn.QuantizedLinear.from_weight(BlockWeight(blocks=raw, block_type=kind)), "linear_blocks", 1


@pytest.mark.parametrize("kind", ["int4", "int8", "Q6_K", "Q4_0"])
@pytest.mark.parametrize("activations, note", [("int8", True), ("f32", False)])
def test_quantized_kernels_name_the_user_line_and_the_numerics(
        kind: str, activations: str, note: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if kind not in ("int4", "int8"):
        pytest.importorskip("gguf")
    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", activations)
    reload_config()
    try:
        layer, op, rows = _quantized_layer(kind)

        def user(x: torch.Tensor) -> torch.Tensor:
            return layer(x) * 2  # the user's line

        report = torchburn.explain(user, torch.randn(rows, 256))
    finally:
        monkeypatch.undo()
        reload_config()
    (sub,) = report.compiled_subgraphs
    kernel = next(k for k in sub.kernels if op in k)
    assert f"torchburn.{op}.default @ " in kernel and HERE in kernel
    assert "quant/linear.py" not in kernel
    assert ("numerics: x is quantized to int8" in str(report)) == note
    assert ("[int8 activations]" in kernel) == note


@pytest.mark.parametrize("rows, tiles", [(16, True), (2, False)])
def test_quantized_kernels_name_the_amx_tile_form(rows: int, tiles: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A quantized linear of 16 rows of x on an AMX CPU takes the tile form
    (`passes/quant/qlinear_tiles.py`) and explain() says so next to its int8 activations;
    2 rows keep the rows form."""
    from torchburn.codegen import host_target

    if not host_target().tile_dot():
        pytest.skip("this CPU (or this process) has no AMX-INT8")
    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "int8")
    reload_config()
    try:
        torch.manual_seed(0)
        layer = torchburn.QuantizedLinear.from_float(torch.nn.Linear(256, 64), quant_type="int4", group_size=32)
        report = torchburn.explain(lambda x: layer(x) * 2, torch.randn(rows, 256))
    finally:
        monkeypatch.undo()
        reload_config()
    (sub,) = report.compiled_subgraphs
    kernel = next(k for k in sub.kernels if "linear_int4" in k)
    assert "[int8 activations]" in kernel
    assert ("[AMX tiles]" in kernel) == tiles, kernel
