"""`split-accumulators`: the IR it writes, the loops it leaves alone, and results (IR executed
on the CPU, and whole reductions through the compiler against eager)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchburn.ir.printer import print_kernel
from torchburn.passes.base import parse_pipeline
from torchburn.passes.loop.simplify import Simplify
from torchburn.passes.loop.split_accumulators import SplitAccumulators
from torchburn.passes.loop.vectorize import Vectorize
from tests.helpers import run_compiled

from .util import assert_ir, execute, kernel, run_pass

VECTOR_SUM = """
    kernel @k(%x: f32[s1] strides [1], %out: f32[1] strides [1]) symbols(s0, s1) {
      alloc %acc_v: f32[8] strides [1] local
      %acc_v[ramp(0, 1, 8)] = broadcast(-0.0:f32, 8)
      for r_v in 0..s0 {
        %acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v * 8, 1, 8)]
      }
      %out[0] = vreduce_add(%acc_v[ramp(0, 1, 8)])
    }
"""

ROW_MAX = """
    kernel @k(%x: f32[s0, s1] strides [s1, 1], %out: f32[s0] strides [1]) symbols(s0, s1) {
      for i0 in 0..s0 {
        alloc %acc0: f32[1] strides [1] local
        %acc0[0] = -inf:f32
        for r0 in 0..s1 {
          %acc0[0] = max(%acc0[0], %x[i0, r0])
        }
        %out[i0] = %acc0[0]
      }
    }
"""


def test_two_accumulators_ir() -> None:
    out = run_pass(Simplify(), run_pass(SplitAccumulators(count=2), kernel(VECTOR_SUM)))
    assert_ir(out, """
        kernel @k(%x: f32[s1] strides [1], %out: f32[1] strides [1]) symbols(s0, s1) {
          alloc %acc_v: f32[8] strides [1] local
          %acc_v[ramp(0, 1, 8)] = broadcast(-0.0:f32, 8)
          alloc %acc_v_1: f32[8] strides [1] local
          %acc_v_1[ramp(0, 1, 8)] = broadcast(-0.0:f32, 8)
          for r_v_u in 0..s0 // 2 {
            %acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v_u * 16, 1, 8)]
            %acc_v_1[ramp(0, 1, 8)] = %acc_v_1[ramp(0, 1, 8)] + %x[ramp(r_v_u * 16 + 8, 1, 8)]
          }
          for r_v in s0 // 2 * 2..+s0 % 2 {
            %acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v * 8, 1, 8)]
          }
          %acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %acc_v_1[ramp(0, 1, 8)]
          %out[0] = vreduce_add(%acc_v[ramp(0, 1, 8)])
        }
    """)


def test_four_accumulators_fold_as_a_tree_after_vectorize() -> None:
    k = kernel(ROW_MAX)
    for p in parse_pipeline("vectorize{width=4},split-accumulators,simplify"):
        k = run_pass(p, k)  # type: ignore[arg-type]
    text = "\n".join(line.strip() for line in print_kernel(k).splitlines())
    assert "%acc0_v[ramp(0, 1, 4)] = max(max(%acc0_v[ramp(0, 1, 4)], %acc0_v_1[ramp(0, 1, 4)]), " \
           "max(%acc0_v_2[ramp(0, 1, 4)], %acc0_v_3[ramp(0, 1, 4)]))" in text
    assert "%acc0_v_3[ramp(0, 1, 4)] = broadcast(-inf:f32, 4)" in text
    # the scalar tail keeps its single accumulator
    assert "%acc0[0] = max(%acc0[0], %x[i0, r0])" in text


def test_loops_left_alone() -> None:
    scalar = kernel(ROW_MAX)
    assert run_pass(SplitAccumulators(), scalar) == scalar  # no vector accumulator
    short = kernel(VECTOR_SUM.replace("0..s0", "0..3"))
    assert run_pass(SplitAccumulators(), short) == short  # fewer iterations than accumulators
    global_acc = kernel("""
        kernel @k(%x: f32[s1] strides [1], %out: f32[8] strides [1]) symbols(s0, s1) {
          for r_v in 0..s0 {
            %out[ramp(0, 1, 8)] = %out[ramp(0, 1, 8)] + %x[ramp(r_v * 8, 1, 8)]
          }
        }
    """)
    assert run_pass(SplitAccumulators(), global_acc) == global_acc  # not a local buffer
    read_inside = kernel(VECTOR_SUM.replace(
        "%acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v * 8, 1, 8)]",
        "%acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v * 8, 1, 8)]\n"
        "%out[0] = vreduce_add(%acc_v[ramp(0, 1, 8)])"))
    assert run_pass(SplitAccumulators(), read_inside) == read_inside  # running value is read
    assert run_pass(SplitAccumulators(count=1), kernel(VECTOR_SUM)) == kernel(VECTOR_SUM)


@pytest.mark.parametrize("n", [5, 6, 9])
def test_constant_extents_with_lets_verify_and_execute(n: int) -> None:
    """A constant trip count of one group plus a remainder (5 = 1 * 4 + 1) makes both loops a
    single trip, inlined into one scope: the remainder's lets are renamed, not bound again
    (an attention kernel's P @ V loop over 5 keys failed verification)."""
    text = VECTOR_SUM.replace("0..s0", f"0..{n}").replace(
        "%acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + %x[ramp(r_v * 8, 1, 8)]",
        "let t_v = %x[ramp(r_v * 8, 1, 8)] * broadcast(2.0:f32, 8)\n"
        "%acc_v[ramp(0, 1, 8)] = %acc_v[ramp(0, 1, 8)] + t_v")
    k = run_pass(Simplify(), run_pass(SplitAccumulators(), kernel(text)))
    x = np.random.default_rng(n).standard_normal(8 * n, dtype=np.float32)
    r = execute(k, {"x": x, "out": np.zeros(1, np.float32)}, {"s0": n, "s1": 8 * n})
    np.testing.assert_allclose(r["out"][0], 2 * x.astype(np.float64).sum(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 7, 8, 9, 15, 17, 64, 100])
def test_vector_sum_executes(n: int) -> None:
    """Every remainder of the unrolled loop, each vector read once and in bounds."""
    k = run_pass(SplitAccumulators(), kernel(VECTOR_SUM))
    x = np.random.default_rng(n).standard_normal(8 * n, dtype=np.float32)
    r = execute(k, {"x": x, "out": np.zeros(1, np.float32)}, {"s0": n, "s1": 8 * n})
    np.testing.assert_allclose(r["out"][0], x.astype(np.float64).sum(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("cols", [1, 15, 17, 63, 64, 65, 1000, 1023])
def test_row_max_and_int_sum_execute(cols: int) -> None:
    k = kernel(ROW_MAX)
    for p in (Vectorize(width=8), SplitAccumulators(), Simplify()):
        k = run_pass(p, k)
    x = np.random.default_rng(cols).standard_normal((3, cols), dtype=np.float32)
    r = execute(k, {"x": x, "out": np.zeros(3, np.float32)}, {"s0": 3, "s1": cols})
    np.testing.assert_array_equal(r["out"], x.max(axis=1))
    ki = kernel(ROW_MAX.replace("f32", "i32").replace("-inf:i32", "0:i32")
                .replace("max(%acc0[0], %x[i0, r0])", "%acc0[0] + %x[i0, r0]"))
    for p in (Vectorize(width=8), SplitAccumulators(), Simplify()):
        ki = run_pass(p, ki)
    xi = np.random.default_rng(cols).integers(-1000, 1000, (3, cols), dtype=np.int32)
    ri = execute(ki, {"x": xi, "out": np.zeros(3, np.int32)}, {"s0": 3, "s1": cols})
    np.testing.assert_array_equal(ri["out"], xi.sum(axis=1))


REDUCTIONS = {
    "softmax": lambda x: torch.softmax(x, -1),
    "sum": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(-1),
    "amax": lambda x: x.amax(-1),
    "layer_norm": lambda x: F.layer_norm(x, (x.shape[-1],)),
}


@pytest.mark.parametrize("cols", [1, 15, 17, 1000, 1023])
@pytest.mark.parametrize("name", list(REDUCTIONS))
def test_last_dim_reductions_match_eager(name: str, cols: int) -> None:
    fn = REDUCTIONS[name]
    x = torch.randn(5, cols, generator=torch.Generator().manual_seed(cols))
    with torch.no_grad():
        got, _ = run_compiled(fn, x)
        torch.testing.assert_close(got, fn(x), rtol=1e-5, atol=1e-5)
