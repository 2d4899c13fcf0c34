"""`tile`: the IR it writes, the nests it leaves alone, partial tiles executed on the CPU, and
transposes through the compiler against eager."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from tests.helpers import run_compiled
from torchburn.ir.printer import print_kernel
from torchburn.passes.base import PassError, parse_pipeline
from torchburn.passes.pipeline import Pipeline
from torchburn.passes.loop.simplify import Simplify
from torchburn.passes.loop.tile import Tile

from .util import assert_ir, execute, kernel, run_pass

TRANSPOSE = """
    kernel @k(%x: f32[64, s0] strides [s0, 1], %out: f32[s0, 64] strides [64, 1]) symbols(s0) {
      for i0 in 0..s0 {
        for i1 in 0..64 {
          %out[i0, i1] = %x[i1, i0] * 2.0:f32
        }
      }
    }
"""

SYMBOLIC = """
    kernel @k(%x: f32[s1, s0] strides [s0, 1], %out: f32[s0, s1] strides [s1, 1]) symbols(s0, s1) {
      for i0 in 0..s0 {
        for i1 in 0..s1 {
          let t = %x[i1, i0]
          %out[i0, i1] = t
        }
      }
    }
"""


def test_transpose_ir() -> None:
    assert_ir(run_pass(Tile(size=32), kernel(TRANSPOSE)), """
        kernel @k(%x: f32[64, s0] strides [s0, 1], %out: f32[s0, 64] strides [64, 1]) symbols(s0) {
          for i0_o in 0..(s0 + 31) // 32 {
            for i1_o in 0..2 {
              for i0_i in 0..min(32, s0 - i0_o * 32) {
                for i1_i in 0..32 {
                  %out[i0_o * 32 + i0_i, i1_o * 32 + i1_i] = %x[i1_o * 32 + i1_i, i0_o * 32 + i0_i] * 2.0:f32
                }
              }
            }
          }
        }
    """)


def test_symbolic_extents_and_starts_ir() -> None:
    assert_ir(run_pass(Tile(size=8), kernel(SYMBOLIC)), """
        kernel @k(%x: f32[s1, s0] strides [s0, 1], %out: f32[s0, s1] strides [s1, 1]) symbols(s0, s1) {
          for i0_o in 0..(s0 + 7) // 8 {
            for i1_o in 0..(s1 + 7) // 8 {
              for i0_i in 0..min(8, s0 - i0_o * 8) {
                for i1_i in 0..min(8, s1 - i1_o * 8) {
                  let t = %x[i1_o * 8 + i1_i, i0_o * 8 + i0_i]
                  %out[i0_o * 8 + i0_i, i1_o * 8 + i1_i] = t
                }
              }
            }
          }
        }
    """)
    shifted = kernel(TRANSPOSE.replace("for i1 in 0..64", "for i1 in 3..+40").replace("f32[64, s0]", "f32[64, s0]"))
    assert_ir(run_pass(Simplify(), run_pass(Tile(size=32), shifted)), """
        kernel @k(%x: f32[64, s0] strides [s0, 1], %out: f32[s0, 64] strides [64, 1]) symbols(s0) {
          for i0_o in 0..(s0 + 31) // 32 {
            for i1_o in 0..2 {
              for i0_i in 0..min(32, s0 - i0_o * 32) {
                for i1_i in 0..min(32, 40 - i1_o * 32) {
                  %out[i0_i + i0_o * 32, i1_i + i1_o * 32 + 3] = %x[i1_i + i1_o * 32 + 3, i0_i + i0_o * 32] * 2.0:f32
                }
              }
            }
          }
        }
    """)


def test_nests_left_alone() -> None:
    def unchanged(text: str, p: Tile | None = None) -> None:
        p = p or Tile(size=32)
        k = kernel(text)
        assert run_pass(p, k) == k, print_kernel(run_pass(p, k))

    # rows read in order: no transpose (and tiled when asked to tile every nest)
    copy = TRANSPOSE.replace("%x[i1, i0]", "%x[i0, i1]").replace("f32[64, s0] strides [s0, 1]",
                                                                  "f32[s0, 64] strides [64, 1]")
    unchanged(copy)
    assert "i0_o" in print_kernel(run_pass(Tile(size=32, only_transposes=False), kernel(copy)))
    # a reduction over the inner loop: iterations are not independent
    unchanged("""
        kernel @k(%x: f32[64, s0] strides [s0, 1], %out: f32[s0] strides [1]) symbols(s0) {
          for i0 in 0..s0 {
            for i1 in 0..64 {
              %out[i0] = %out[i0] + %x[i1, i0]
            }
          }
        }
    """, Tile(size=32, only_transposes=False))
    # a triangular nest, a nest with a statement beside the inner loop, a parallel loop
    unchanged(TRANSPOSE.replace("for i1 in 0..64", "for i1 in 0..i0"))
    unchanged(TRANSPOSE.replace("for i1 in 0..64 {", "%out[i0, 0] = 0.0:f32\n for i1 in 0..64 {"))
    unchanged(TRANSPOSE.replace("for i0 in", "parallel for i0 in"))
    # one tile would hold the whole nest
    unchanged(TRANSPOSE.replace("0..s0", "0..32").replace("0..64", "0..32"))
    # size 1 is no tiling
    unchanged(TRANSPOSE, Tile(size=1))
    with pytest.raises(PassError):
        run_pass(Tile(size=0), kernel(TRANSPOSE))


def test_only_the_innermost_pair_of_a_deeper_nest() -> None:
    k = run_pass(Tile(size=16), kernel("""
        kernel @k(%x: f32[4, 64, s0] strides [s0 * 64, s0, 1], %out: f32[4, s0, 64] strides [s0 * 64, 64, 1]) symbols(s0) {
          for b in 0..4 {
            for i0 in 0..s0 {
              for i1 in 0..64 {
                %out[b, i0, i1] = %x[b, i1, i0]
              }
            }
          }
        }
    """))
    text = print_kernel(k)
    assert "for b in 0..4 {\n    for i0_o in 0..(s0 + 15) // 16 {" in text
    assert "%out[b, i0_o * 16 + i0_i, i1_o * 16 + i1_i] = %x[b, i1_o * 16 + i1_i, i0_o * 16 + i0_i]" in text


@pytest.mark.parametrize("rows", [1, 31, 33, 100])
@pytest.mark.parametrize("cols", [1, 31, 33, 100])
def test_partial_tiles_execute(rows: int, cols: int) -> None:
    """Every combination of whole and partial tiles, scalar and vectorized, writes each element
    once and reads nothing out of bounds (the output's guard words stay as they were)."""
    k = kernel(SYMBOLIC)
    for p in parse_pipeline("tile{size=32},simplify,parallelize{threads=2},vectorize{width=8},simplify"):
        k = run_pass(p, k)  # type: ignore[arg-type]
    x = np.random.default_rng(rows * 1000 + cols).standard_normal((cols, rows), dtype=np.float32)
    guard = np.full(rows * cols + 8, np.float32(-7.0))
    r = execute(k, {"x": x, "out": guard}, {"s0": rows, "s1": cols})
    np.testing.assert_array_equal(r["out"][:rows * cols].reshape(rows, cols), x.T)
    assert (r["out"][rows * cols:] == -7.0).all()


@pytest.mark.parametrize("extent", [1, 31, 33, 100])
def test_constant_extents_execute(extent: int) -> None:
    text = SYMBOLIC.replace("s1", str(extent)).replace("symbols(s0, " + str(extent) + ")", "symbols(s0)")
    k = run_pass(Tile(size=32), kernel(text))
    # a loop no longer than a tile stays whole inside the other loop's tiles
    assert "i0_o" in print_kernel(k) and ("i1_o" in print_kernel(k)) == (extent > 32)
    x = np.random.default_rng(extent).standard_normal((extent, 45), dtype=np.float32)
    r = execute(k, {"x": x, "out": np.zeros((45, extent), np.float32)}, {"s0": 45})
    np.testing.assert_array_equal(r["out"], x.T)


def test_default_pipeline_tiles_transposes() -> None:
    names = [p.name for p in Pipeline.default().loop]
    assert "tile" in names and names.index("tile") < names.index("parallelize") < names.index("vectorize")
    k = kernel(TRANSPOSE)
    for p in Pipeline.default().loop:
        k = run_pass(p, k)  # type: ignore[arg-type]
    text = print_kernel(k)
    # threads take whole tiles; the inner loop is still vectorized, its transposed load a gather
    assert text.splitlines()[1].startswith("  parallel for i0_o in 0..(s0 + 15) // 16 {")
    assert "%x[ramp(" in text and "%out[" in text and ", ramp(" in text


TRANSPOSES = {
    "t": lambda x: x.t().contiguous(),
    "t_mul": lambda x: x.t().contiguous() * 2,
    "permute_add": lambda x: x.unsqueeze(0).permute(0, 2, 1) + 1,
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("shape", [(1, 5), (17, 33), (100, 37), (257, 130)])
@pytest.mark.parametrize("name", list(TRANSPOSES))
def test_transposes_match_eager(name: str, shape: tuple[int, int], dtype: torch.dtype) -> None:
    fn = TRANSPOSES[name]
    g = torch.Generator().manual_seed(shape[0] * 7 + shape[1])
    x = (torch.randn(*shape, generator=g) * 50).to(dtype)
    got, _ = run_compiled(fn, x)
    torch.testing.assert_close(got, fn(x), rtol=0, atol=0)
