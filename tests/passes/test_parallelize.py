"""`parallelize`: which loops become parallel, collapsing, and results with threads."""
from __future__ import annotations

import numpy as np

from torchburn.passes.loop.parallelize import Parallelize, estimated_work
from torchburn.passes.loop.vectorize import Vectorize

from .util import assert_ir, execute, kernel, run_pass

ROW_SUM = """
    kernel @k(%x: f32[s0, s1] strides [s1, 1], %out: f32[s0] strides [1]) symbols(s0, s1) {
      for i0 in 0..s0 {
        alloc %acc0: f32[1] strides [1] local
        %acc0[0] = 0.0:f32
        for r0 in 0..s1 {
          %acc0[0] = %acc0[0] + %x[i0, r0]
        }
        %out[i0] = %acc0[0]
      }
    }
"""


def test_outer_loop_with_private_accumulator() -> None:
    assert_ir(run_pass(Parallelize(), kernel(ROW_SUM)), """
        kernel @k(%x: f32[s0, s1] strides [s1, 1], %out: f32[s0] strides [1]) symbols(s0, s1) {
          parallel for i0 in 0..s0 {
            alloc %acc0: f32[1] strides [1] local
            %acc0[0] = 0.0:f32
            for r0 in 0..s1 {
              %acc0[0] = %acc0[0] + %x[i0, r0]
            }
            %out[i0] = %acc0[0]
          }
        }
    """)


def test_small_work_stays_serial() -> None:
    k = kernel("""
        kernel @k(%x: f32[64, 64] strides [64, 1], %out: f32[64, 64] strides [64, 1]) {
          for i in 0..64 {
            for j in 0..64 {
              %out[i, j] = %x[i, j]
            }
          }
        }
    """)
    assert estimated_work(k.body) == 4096
    assert run_pass(Parallelize(), k) == k
    assert run_pass(Parallelize(min_work=1000), k).body.kind == "parallel"  # type: ignore[attr-defined]


def test_dependent_outer_loop_parallelizes_the_inner_one() -> None:
    """A reduction over the outer loop (column sums accumulated into %out) cannot run in
    parallel; the loop over columns can."""
    k = kernel("""
        kernel @k(%x: f32[s0, s1] strides [s1, 1], %out: f32[s1] strides [1]) symbols(s0, s1) {
          for r in 0..s0 {
            for j in 0..s1 {
              %out[j] = %out[j] + %x[r, j]
            }
          }
        }
    """)
    assert_ir(run_pass(Parallelize(), k), """
        kernel @k(%x: f32[s0, s1] strides [s1, 1], %out: f32[s1] strides [1]) symbols(s0, s1) {
          for r in 0..s0 {
            parallel for j in 0..s1 {
              %out[j] = %out[j] + %x[r, j]
            }
          }
        }
    """)


def test_shared_accumulator_and_scan_stay_serial() -> None:
    shared = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: f32[1] strides [1]) symbols(s0) {
          for i in 0..s0 {
            %out[0] = %out[0] + %x[i]
          }
        }
    """)
    assert run_pass(Parallelize(), shared) == shared
    scan = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 1..+s0 - 1 {
            %out[i] = %out[i - 1] + %x[i]
          }
        }
    """)
    assert run_pass(Parallelize(), scan) == scan


def test_blocked_index_is_disjoint() -> None:
    """`%out[i * 4 + j]` for j in 0..4: iterations of i write disjoint blocks of 4."""
    k = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..s0 // 4 {
            for j in 0..4 {
              %out[i * 4 + j] = %x[i * 4 + j] * 2.0:f32
            }
          }
        }
    """)
    assert run_pass(Parallelize(), k).body.kind == "parallel"  # type: ignore[attr-defined]
    overlapping = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..s0 // 4 {
            for j in 0..5 {
              %out[i * 4 + j] = %x[i * 4 + j] * 2.0:f32
            }
          }
        }
    """)
    assert run_pass(Parallelize(), overlapping).body.kind == "serial"  # type: ignore[attr-defined]


def test_vector_loop_after_vectorize() -> None:
    k = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..s0 {
            %out[i] = %x[i] * 2.0:f32
          }
        }
    """)
    out = run_pass(Parallelize(), run_pass(Vectorize(width=8), k))
    assert_ir(out, """
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          parallel for i_v in 0..s0 // 8 {
            %out[ramp(i_v * 8, 1, 8)] = %x[ramp(i_v * 8, 1, 8)] * broadcast(2.0:f32, 8)
          }
          for i in s0 // 8 * 8..+s0 % 8 {
            %out[i] = %x[i] * 2.0:f32
          }
        }
    """)
    x = np.random.default_rng(0).standard_normal(100_003, dtype=np.float32)
    r = execute(out, {"x": x, "out": np.zeros_like(x)}, {"s0": x.size})
    np.testing.assert_array_equal(r["out"], x * 2)


def test_collapse_small_outer_loop() -> None:
    k = kernel("""
        kernel @k(%x: f32[4, s0, 64] strides [s0 * 64, 64, 1], %out: f32[4, s0, 64] strides [s0 * 64, 64, 1]) symbols(s0) {
          for b in 0..4 {
            for i in 0..s0 {
              for j in 0..64 {
                %out[b, i, j] = %x[b, i, j] * 2.0:f32
              }
            }
          }
        }
    """)
    out = run_pass(Parallelize(threads=16), k)
    assert_ir(out, """
        kernel @k(%x: f32[4, s0, 64] strides [s0 * 64, 64, 1], %out: f32[4, s0, 64] strides [s0 * 64, 64, 1]) symbols(s0) {
          parallel for b_i in 0..s0 * 4 {
            for j in 0..64 {
              %out[b_i // s0, b_i % s0, j] = %x[b_i // s0, b_i % s0, j] * 2.0:f32
            }
          }
        }
    """)
    assert run_pass(Parallelize(collapse=False), k).body.kind == "parallel"  # type: ignore[attr-defined]
    x = np.random.default_rng(1).standard_normal((4, 5, 64), dtype=np.float32)
    r = execute(out, {"x": x, "out": np.zeros_like(x)}, {"s0": 5})
    np.testing.assert_array_equal(r["out"], x * 2)
