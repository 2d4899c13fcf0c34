"""`qlinear-to-gemm` and the `dequantize` op: a quantized linear over many rows is a decoded
weight and a float GEMM, for every weight layout (int4 symmetric and with mins, int8 grouped
and per channel, every ggml block type), with the same results as the `qlinear` kernel's."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from tests.passes.test_qlinear import Compiled, qlinear_graph, weights
from torchburn.ir.ops import OpError, infer_types
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.ir.qblocks import BLOCK_TYPES
from torchburn.ir.tensor_type import TensorType
from torchburn.ir import dtypes as dt
from torchburn.ir.expr import Const
from torchburn.passes.tensor.qlinear_to_gemm import QLinearToGemm


def _op_names(program) -> list[str]:  # type: ignore[no-untyped-def]
    return [dict(k.attrs).get("qlinear", "") for k in program.kernels]


def test_rewrite_is_the_docstring_example() -> None:
    """The module docstring's Before becomes its After (structurally: names aside)."""
    from torchburn.ir.hashing import structural_hash
    from torchburn.passes.tensor import qlinear_to_gemm

    doc = qlinear_to_gemm.__doc__ or ""
    graphs = [block.split("\n\n")[0] for block in doc.split("    graph @main")[1:]]
    before, after = ("graph @main" + "\n".join(line[4:] if i else line for i, line in enumerate(g.splitlines()))
                     for g in graphs)
    rewritten = QLinearToGemm(int8_gemm=False).run(parse_graph(before))
    assert structural_hash(rewritten) == structural_hash(parse_graph(after)), print_ir(rewritten)
    assert "qlinear" not in print_ir(rewritten)


@pytest.mark.parametrize("rows, rewritten", [(31, False), (32, True)])
def test_min_rows_decides(rows: int, rewritten: bool) -> None:
    text = qlinear_graph(rows, 16, 64, "int4", 32, True)
    out = print_ir(QLinearToGemm().run(parse_graph(text)))
    assert ("dequantize" in out) == rewritten and ("qlinear" in out) != rewritten


def test_large_weights_and_symbolic_rows_keep_the_qlinear() -> None:
    big = qlinear_graph(64, 512, 256, "int8", 256, True)
    assert "qlinear" in print_ir(QLinearToGemm(max_weight_bytes=512 * 256 * 4 - 1).run(parse_graph(big)))
    assert "dequantize" in print_ir(QLinearToGemm(max_weight_bytes=512 * 256 * 4).run(parse_graph(big)))
    symbolic = qlinear_graph("s0", 16, 64, "int4", 32, True)
    assert "qlinear" in print_ir(QLinearToGemm(min_rows=1).run(parse_graph(symbolic)))


def test_dequantize_type_rule() -> None:
    q4 = TensorType(dt.u8, (Const(8), Const(32)))
    s = TensorType(dt.f16, (Const(8), Const(2)))
    (t,) = infer_types("dequantize", [q4, s], {"kind": "int4", "group_size": 32, "symmetric": True})
    assert t == TensorType(dt.f32, (Const(8), Const(64)))
    blk = TensorType(dt.u8, (Const(3), Const(2 * BLOCK_TYPES["Q6_K"].nbytes)))
    (t,) = infer_types("dequantize", [blk], {"kind": "blocks", "block_type": "Q6_K", "group_size": 256, "symmetric": True})
    assert t == TensorType(dt.f32, (Const(3), Const(512)))
    with pytest.raises(OpError, match="whole blocks"):
        infer_types("dequantize", [TensorType(dt.u8, (Const(3), Const(211)))],
                    {"kind": "blocks", "block_type": "Q6_K", "group_size": 256, "symmetric": True})
    with pytest.raises(OpError, match="scales shape"):
        infer_types("dequantize", [q4, TensorType(dt.f16, (Const(8), Const(3)))],
                    {"kind": "int4", "group_size": 32, "symmetric": True})


CASES = [("int4", 32, True), ("int4", 64, False), ("int8", 32, True), ("int8", None, True)]


@pytest.mark.parametrize("kind, group, symmetric", CASES)
@pytest.mark.parametrize("rows", [37, 64])
def test_int_layouts_through_the_gemm(kind: str, group: Optional[int], symmetric: bool, rows: int) -> None:
    """A ragged and a round M; the product's epilogue (bias, tanh) fused into the GEMM."""
    n, k = 24, 128
    c = Compiled(qlinear_graph(rows, n, k, kind, group, symmetric, scale_dtype="f16"))
    assert not any(_op_names(c.program)), "the qlinear kernel ran; expected dequantize + GEMM"
    arrays, wd = weights(n, k, kind, group, symmetric)
    arrays = {name: (a.astype(np.float16) if name in ("s", "mn") else a) for name, a in arrays.items()}
    wd = _dequantized_with_f16_scales(kind, group, symmetric, n, k)
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((rows, n), np.float32)
    c({"x": x, "b": b, "out0": out, **arrays})
    expected = np.tanh(x.astype(np.float64) @ wd.T + b)
    np.testing.assert_allclose(out, expected, rtol=1e-5, atol=2e-5)


def _dequantized_with_f16_scales(kind: str, group: Optional[int], symmetric: bool, n: int, k: int) -> np.ndarray:
    """`weights`' weight with its scales (and mins) rounded to f16, as the graph passes them."""
    arrays, _ = weights(n, k, kind, group, symmetric)
    s = arrays["s"].astype(np.float16).astype(np.float64)
    g = group or k
    if kind == "int8":
        codes = arrays["q"].astype(np.float64).reshape(n, k // g, g)
        scales = s.reshape(n, -1, 1)
        return (codes * scales).reshape(n, k)
    packed = arrays["q"].reshape(n, k // g, g // 2)
    codes = np.concatenate([packed & 15, packed >> 4], axis=-1).astype(np.float64)
    if symmetric:
        return ((codes - 8) * s[:, :, None]).reshape(n, k)
    mins = arrays["mn"].astype(np.float16).astype(np.float64)
    return (codes * s[:, :, None] + mins[:, :, None]).reshape(n, k)


@pytest.mark.parametrize("name", list(BLOCK_TYPES))
def test_block_types_through_the_gemm(name: str) -> None:
    """Every ggml block type: decoded by the block table, against gguf-py's weights."""
    from tests.quant.test_block_types import blocks_graph, gguf_reference, random_blocks

    bt = BLOCK_TYPES[name]
    m, n, k = 33, 7, 2 * max(bt.block, 128)
    c = Compiled(blocks_graph(m, n, k, name).replace("symmetric = true", 'symmetric = true, activations = "f32"'))
    assert not any(_op_names(c.program))
    raw = random_blocks(name, n, k // bt.block, 5)
    w = gguf_reference(raw, name).astype(np.float64)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({"x": x, "q": np.ascontiguousarray(raw), "b": b, "out0": out})
    expected = x.astype(np.float64) @ w.T + b
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T + 1
    assert np.all(np.abs(out - expected) <= 2e-6 * scale), np.max(np.abs(out - expected) / scale)


def test_quantized_linear_module_compiles_to_the_gemm_and_matches_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through torch.compile: a 3-D x (reshaped to rows and back), a bias, fully compiled; f32
    activations (int8 ones take the panel kernel, `tests/passes/test_qgemm_i8.py`)."""
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")
    reload_config()
    try:
        _module_through_the_gemm()
    finally:
        monkeypatch.undo()
        reload_config()


def _module_through_the_gemm() -> None:
    import torch

    from tests.helpers import assert_fully_compiled, run_compiled
    from torchburn.quant import QuantizedLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 96)
    layer = QuantizedLinear.from_float(lin, "int4", group_size=32)
    x = torch.randn(2, 40, 256)
    with torch.no_grad():
        expected = layer(x)
        out, reports = run_compiled(layer, x)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert_fully_compiled(reports)
