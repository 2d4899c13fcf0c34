"""`fuse{vector_producers}` (`passes/tensor/fusion.py`, on in the GPU pipeline): elementwise
producers of attention ops and one-row products are computed in those kernels, not stored;
many-row products and producers that read a reduction keep their stored operand."""
from __future__ import annotations

import textwrap

from torchburn.ir.parser import parse_graph
from torchburn.ir.tensor import Graph
from torchburn.ir.verifier import verify
from torchburn.passes.tensor.fusion import Fuse

SWIGLU = """
    graph @main(%x: f32[{m}, 8], %wgu: f32[8, 12], %wd: f32[6, 4]) {{
      %0 = matmul(%x, %wgu) : f32[{m}, 12]
      %1 = slice(%0) {{dim = 1, start = 0, end = 6, step = 1}} : f32[{m}, 6]
      %2 = slice(%0) {{dim = 1, start = 6, end = 12, step = 1}} : f32[{m}, 6]
      %3 = sigmoid(%1) : f32[{m}, 6]
      %4 = mul(%1, %3) : f32[{m}, 6]
      %5 = mul(%4, %2) : f32[{m}, 6]
      %6 = matmul(%5, %wd) : f32[{m}, 4]
      return %6
    }}
"""

NORM_THEN_VECTOR = """
    graph @main(%x: f32[1, 8], %w: f32[8, 4]) {
      %0 = mul(%x, %x) : f32[1, 8]
      %1 = reduce_sum(%0) {dims = [1], keepdim = true} : f32[1, 1]
      %2 = rsqrt(%1) : f32[1, 1]
      %3 = expand(%2) {shape = [1, 8]} : f32[1, 8]
      %4 = mul(%x, %3) : f32[1, 8]
      %5 = matmul(%4, %w) : f32[1, 4]
      return %5
    }
"""

ROPE_INTO_ATTENTION = """
    graph @main(%q: f32[1, 2, 1, 4], %k: f32[1, 2, 5, 4], %v: f32[1, 2, 5, 4], %c: f32[1, 1, 1, 4]) {
      %0 = expand(%c) {shape = [1, 2, 1, 4]} : f32[1, 2, 1, 4]
      %1 = mul(%q, %0) : f32[1, 2, 1, 4]
      %2 = attention(%1, %k, %v) {scale = 0.5, causal = false, masked = false, segments = 1} : f32[1, 2, 1, 4]
      return %2
    }
"""


def _fused(text: str, on: bool) -> Graph:
    g = parse_graph(textwrap.dedent(text))
    verify(g)
    out = Fuse(vector_producers=on).run(g)
    verify(out)
    return out


def _stored(g: Graph) -> list[str]:
    """The op names that are kernel roots, in order."""
    return [op.name for op in g.ops if "kernel" in op.attrs]


def test_swiglu_joins_the_one_row_down_projection() -> None:
    """The module docstring's example: with the option, SiLU * up is no kernel of its own."""
    assert _stored(_fused(SWIGLU.format(m=1), on=False)) == ["matmul", "mul", "matmul"]
    assert _stored(_fused(SWIGLU.format(m=1), on=True)) == ["matmul", "matmul"]


def test_many_row_products_keep_their_stored_operand() -> None:
    """A GEMM of many rows reads each operand element once per output tile: stored."""
    assert _stored(_fused(SWIGLU.format(m=16), on=True)) == ["matmul", "mul", "matmul"]


def test_a_producer_behind_a_reduction_stays_stored() -> None:
    """Inlining a norm into the product would make its reduction a kernel: nothing saved."""
    assert _stored(_fused(NORM_THEN_VECTOR, on=True)) == _stored(_fused(NORM_THEN_VECTOR, on=False))
    assert "mul" in _stored(_fused(NORM_THEN_VECTOR, on=True))


def test_query_producer_joins_the_attention_kernel() -> None:
    assert _stored(_fused(ROPE_INTO_ATTENTION, on=False)) == ["mul", "attention"]
    assert _stored(_fused(ROPE_INTO_ATTENTION, on=True)) == ["attention"]
