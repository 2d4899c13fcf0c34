"""`fold-batch-norm` (`passes/tensor/fold_batch_norm.py`): per-channel affine chains after a
convolution folded into its weight and bias, and left alone where that would be wrong."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.passes.test_matmul import Compiled
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify
from torchburn.passes.tensor import fold_batch_norm
from torchburn.passes.tensor.fold_batch_norm import FoldBatchNorm


def _docstring_graph(part: str) -> str:
    doc = fold_batch_norm.__doc__ or ""
    text = doc.split("Before:\n\n")[1] if part == "before" else doc.split("After (dead ops removed):\n\n")[1]
    text = text.split("\n\nAfter")[0] if part == "before" else text
    lines = [line[4:] for line in text.splitlines()]
    return "\n".join(lines[:lines.index("}") + 1])


def _fold(text: str) -> str:
    g = FoldBatchNorm().run(parse_graph(text))
    verify(g)
    g.rename_canonically()
    return print_ir(g).strip()


def test_docstring_example() -> None:
    assert _fold(_docstring_graph("before")) == _docstring_graph("after").strip()


BN = """
graph @main(%x: f32[2, 4, 5, 5], %w: f32[6, 2, 3, 3], %b: f32[6], %m: f32[6], %v: f32[6], %g: f32[6], %beta: f32[6], %r: f32[2, 6, 5, 5]) {
  %0 = conv(%x, %w, %b) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 2} : f32[2, 6, 5, 5]
  %1 = rsqrt(%v) : f32[6]
  %2 = reshape(%m) {shape = [1, 6, 1, 1]} : f32[1, 6, 1, 1]
  %3 = expand(%2) {shape = [2, 6, 5, 5]} : f32[2, 6, 5, 5]
  %4 = sub(%0, %3) : f32[2, 6, 5, 5]
  %5 = reshape(%1) {shape = [1, 6, 1, 1]} : f32[1, 6, 1, 1]
  %6 = expand(%5) {shape = [2, 6, 5, 5]} : f32[2, 6, 5, 5]
  %7 = mul(%6, %4) : f32[2, 6, 5, 5]
  %8 = reshape(%g) {shape = [1, 6, 1, 1]} : f32[1, 6, 1, 1]
  %9 = expand(%8) {shape = [2, 6, 5, 5]} : f32[2, 6, 5, 5]
  %10 = mul(%7, %9) : f32[2, 6, 5, 5]
  %11 = reshape(%beta) {shape = [1, 6, 1, 1]} : f32[1, 6, 1, 1]
  %12 = expand(%11) {shape = [2, 6, 5, 5]} : f32[2, 6, 5, 5]
  %13 = add(%12, %10) : f32[2, 6, 5, 5]
  %14 = add(%13, %r) : f32[2, 6, 5, 5]
  %15 = tanh(%14) : f32[2, 6, 5, 5]
  return %15
}
"""


def test_batch_norm_chain_becomes_one_convolution() -> None:
    out = _fold(BN)
    assert out.count("conv(") == 1 and "conv(%x, %" in out
    # The residual add and tanh stay, now reading the folded convolution directly.
    assert "sub(" not in out.split("conv(")[1] and "tanh(" in out


def test_folded_graph_computes_the_same() -> None:
    rng = np.random.default_rng(0)
    arrays = {"x": rng.standard_normal((2, 4, 5, 5)), "w": rng.standard_normal((6, 2, 3, 3)),
              "b": rng.standard_normal(6), "m": rng.standard_normal(6), "v": rng.uniform(0.5, 2, 6),
              "g": rng.standard_normal(6), "beta": rng.standard_normal(6), "r": rng.standard_normal((2, 6, 5, 5))}
    arrays = {k: v.astype(np.float32) for k, v in arrays.items()}
    t = {k: torch.from_numpy(v).double() for k, v in arrays.items()}
    y = F.conv2d(t["x"], t["w"], t["b"], padding=1, groups=2)
    per = lambda v: v.view(1, 6, 1, 1)  # noqa: E731
    want = torch.tanh((y - per(t["m"])) * per(t["v"].rsqrt()) * per(t["g"]) + per(t["beta"]) + t["r"]).numpy()
    compiled = Compiled(BN)
    assert sum(1 for k in compiled.program.kernels if "conv" in dict(k.attrs)) == 1
    out = np.full((2, 6, 5, 5), np.nan, np.float32)
    compiled({**arrays, "out0": out})
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("text", [
    # Training-mode statistics: the mean is computed from the convolution's own output.
    """
graph @main(%x: f32[2, 4, 5, 5], %w: f32[6, 4, 3, 3]) {
  %0 = conv(%x, %w) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[2, 6, 5, 5]
  %1 = reduce_sum(%0) {dims = [0, 2, 3], keepdim = false} : f32[6]
  %2 = reshape(%1) {shape = [1, 6, 1, 1]} : f32[1, 6, 1, 1]
  %3 = expand(%2) {shape = [2, 6, 5, 5]} : f32[2, 6, 5, 5]
  %4 = sub(%0, %3) : f32[2, 6, 5, 5]
  return %4
}
""",
    # The convolution's result is read by something else too.
    """
graph @main(%x: f32[2, 4, 5, 5], %w: f32[6, 4, 3, 3], %m: f32[6]) {
  %0 = conv(%x, %w) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[2, 6, 5, 5]
  %1 = reshape(%m) {shape = [1, 6, 1, 1]} : f32[1, 6, 1, 1]
  %2 = expand(%1) {shape = [2, 6, 5, 5]} : f32[2, 6, 5, 5]
  %3 = mul(%0, %2) : f32[2, 6, 5, 5]
  return %3, %0
}
""",
    # Not per channel: the vector runs along the width.
    """
graph @main(%x: f32[2, 4, 5, 6], %w: f32[6, 4, 3, 3], %m: f32[6]) {
  %0 = conv(%x, %w) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[2, 6, 5, 6]
  %1 = reshape(%m) {shape = [1, 1, 1, 6]} : f32[1, 1, 1, 6]
  %2 = expand(%1) {shape = [2, 6, 5, 6]} : f32[2, 6, 5, 6]
  %3 = mul(%0, %2) : f32[2, 6, 5, 6]
  return %3
}
""",
    # `p - conv` is not `conv - p`.
    """
graph @main(%x: f32[2, 4, 5, 5], %w: f32[6, 4, 3, 3], %m: f32[6]) {
  %0 = conv(%x, %w) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[2, 6, 5, 5]
  %1 = reshape(%m) {shape = [1, 6, 1, 1]} : f32[1, 6, 1, 1]
  %2 = expand(%1) {shape = [2, 6, 5, 5]} : f32[2, 6, 5, 5]
  %3 = sub(%2, %0) : f32[2, 6, 5, 5]
  return %3
}
"""], ids=["batch-statistics", "two-users", "not-per-channel", "reversed-sub"])
def test_left_alone(text: str) -> None:
    g = parse_graph(text)
    g.rename_canonically()
    assert _fold(text) == print_ir(g).strip()
