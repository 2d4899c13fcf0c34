"""`unroll`: marked loops, small innermost loops, fresh names, results."""
from __future__ import annotations

import numpy as np
import pytest

from torchburn.ir.printer import print_kernel
from torchburn.passes.base import PassError
from torchburn.passes.loop.simplify import Simplify
from torchburn.passes.loop.unroll import Unroll

from .util import assert_ir, execute, kernel, run_pass

SMALL = """
    kernel @k(%x: f32[s0, 2] strides [2, 1], %out: f32[s0, 2] strides [2, 1]) symbols(s0) {
      for i0 in 0..s0 {
        for i1 in 0..2 {
          let t = %x[i0, i1] * 2.0:f32
          %out[i0, i1] = t + 1.0:f32
        }
      }
    }
"""


def test_small_innermost_loop() -> None:
    out = run_pass(Unroll(max_extent=4), kernel(SMALL))
    assert_ir(out, """
        kernel @k(%x: f32[s0, 2] strides [2, 1], %out: f32[s0, 2] strides [2, 1]) symbols(s0) {
          for i0 in 0..s0 {
            let t = %x[i0, 0] * 2.0:f32
            %out[i0, 0] = t + 1.0:f32
            let t_1 = %x[i0, 1] * 2.0:f32
            %out[i0, 1] = t_1 + 1.0:f32
          }
        }
    """)
    x = np.random.default_rng(0).standard_normal((3, 2), dtype=np.float32)
    r = execute(out, {"x": x, "out": np.zeros_like(x)}, {"s0": 3})
    np.testing.assert_array_equal(r["out"], x * 2 + 1)


def test_only_marked_loops_with_max_extent_zero() -> None:
    k = kernel(SMALL)
    assert run_pass(Unroll(max_extent=0), k) == k


def test_marked_loop_with_start_and_local_buffer() -> None:
    k = kernel("""
        kernel @k(%x: f32[8] strides [1], %out: f32[8] strides [1]) {
          unrolled for i in 4..+3 {
            alloc %tmp: f32[1] strides [1] local
            %tmp[0] = %x[i]
            %out[i] = %tmp[0] * %tmp[0]
          }
        }
    """)
    out = run_pass(Simplify(), run_pass(Unroll(max_extent=0), k))
    assert_ir(out, """
        kernel @k(%x: f32[8] strides [1], %out: f32[8] strides [1]) {
          alloc %tmp: f32[1] strides [1] local
          %tmp[0] = %x[4]
          %out[4] = %tmp[0] * %tmp[0]
          alloc %tmp_1: f32[1] strides [1] local
          %tmp_1[0] = %x[5]
          %out[5] = %tmp_1[0] * %tmp_1[0]
          alloc %tmp_2: f32[1] strides [1] local
          %tmp_2[0] = %x[6]
          %out[6] = %tmp_2[0] * %tmp_2[0]
        }
    """)


def test_nested_small_loops_unroll_inside_out() -> None:
    k = kernel("""
        kernel @k(%out: i64[2, 2] strides [2, 1]) {
          for a in 0..2 {
            for b in 0..2 {
              %out[a, b] = a * 10 + b
            }
          }
        }
    """)
    out = run_pass(Simplify(), run_pass(Unroll(), k))
    assert_ir(out, """
        kernel @k(%out: i64[2, 2] strides [2, 1]) {
          %out[0, 0] = 0
          %out[0, 1] = 1
          %out[1, 0] = 10
          %out[1, 1] = 11
        }
    """)


def test_large_or_symbolic_loops() -> None:
    big = kernel("""
        kernel @k(%out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..16 {
            %out[i] = 0.0:f32
          }
        }
    """)
    assert run_pass(Unroll(), big) == big
    with pytest.raises(PassError, match="marked unrolled with 2000 iterations"):
        run_pass(Unroll(), kernel("""
            kernel @k(%out: f32[2000] strides [1]) {
              unrolled for i in 0..2000 {
                %out[i] = 0.0:f32
              }
            }
        """))


def test_auto_unroll_respects_the_size_budget() -> None:
    body = "\n".join(f"let t{n} = %x[i] * {n}.0:f32" for n in range(10)) + "\n%out[i] = t9"
    k = kernel(f"""
        kernel @k(%x: f32[8] strides [1], %out: f32[8] strides [1]) {{
          for i in 0..8 {{
            {body}
          }}
        }}
    """)
    assert run_pass(Unroll(), k) == k  # 8 copies of 11 statements is over the budget


def test_loop_annotated_keep_rolled_stays_a_loop_and_its_inner_loops_unroll() -> None:
    """`{loop = "keep-rolled"}` (`lp.KEEP_ROLLED`): `unroll` leaves that loop rolled even when it
    fits the budget, and still unrolls the loops inside it."""
    k = kernel("""
        kernel @k(%out: i64[4, 2] strides [2, 1]) {
          for a in 0..4 attrs {loop = "keep-rolled"} {
            for b in 0..2 {
              %out[a, b] = a * 10 + b
            }
          }
        }
    """)
    out = run_pass(Simplify(), run_pass(Unroll(), k))
    assert_ir(out, """
        kernel @k(%out: i64[4, 2] strides [2, 1]) {
          for a in 0..4 attrs {loop = "keep-rolled"} {
            %out[a, 0] = a * 10
            %out[a, 1] = a * 10 + 1
          }
        }
    """)
    r = execute(out, {"out": np.zeros((4, 2), np.int64)}, {})
    np.testing.assert_array_equal(r["out"], np.arange(4)[:, None] * 10 + np.arange(2))
    plain = kernel(print_kernel(k).replace(' attrs {loop = "keep-rolled"}', ""))
    assert "for" not in print_kernel(run_pass(Unroll(), plain))  # without it: unrolled whole
