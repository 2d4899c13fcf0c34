"""`vectorize`: loop choice, the vector IR it writes, reductions, and results on the CPU."""
from __future__ import annotations

import numpy as np
import pytest

from torchburn.ir.printer import print_kernel
from torchburn.passes.base import PassError, parse_pipeline
from torchburn.passes.loop.vectorize import Vectorize

from .util import as_program, assert_ir, execute, kernel, run_pass

ELEMENTWISE = """
    kernel @k(%x: f32[s0, 100] strides [100, 1], %scale: f32[1] strides [1], %out: f32[s0, 100] strides [100, 1]) symbols(s0) {
      for i0 in 0..s0 {
        for i1 in 0..100 {
          %out[i0, i1] = exp(%x[i0, i1]) * %scale[0]
        }
      }
    }
"""

ROW_SUM = """
    kernel @k(%x: f32[s0, s1] strides [s1, 1], %out: f32[s0] strides [1]) symbols(s0, s1) {
      for i0 in 0..s0 {
        alloc %acc0: f32[1] strides [1] local
        %acc0[0] = 0.0:f32
        for r0 in 0..s1 {
          let x0 = %x[i0, r0]
          %acc0[0] = %acc0[0] + x0
        }
        let x1 = %acc0[0]
        %out[i0] = x1
      }
    }
"""

COLUMN_MAX = """
    kernel @k(%x: f32[100, s0] strides [s0, 1], %out: f32[s0] strides [1]) symbols(s0) {
      for i0 in 0..s0 {
        alloc %acc0: f32[1] strides [1] local
        %acc0[0] = -inf:f32
        for r0 in 0..100 {
          %acc0[0] = max(%acc0[0], %x[r0, i0])
        }
        %out[i0] = %acc0[0]
      }
    }
"""

MATMUL = """
    kernel @k(%a: f32[s0, 32] strides [32, 1], %b: f32[32, s1] strides [s1, 1], %out: f32[s0, s1] strides [s1, 1]) symbols(s0, s1) {
      for i in 0..s0 {
        for j in 0..s1 {
          %out[i, j] = 0.0:f32
        }
        for k in 0..32 {
          let a = %a[i, k]
          for j2 in 0..s1 {
            let p = a * %b[k, j2]
            %out[i, j2] = %out[i, j2] + p
          }
        }
      }
    }
"""


def test_elementwise_ir() -> None:
    out = run_pass(Vectorize(width=8), kernel(ELEMENTWISE))
    assert_ir(out, """
        kernel @k(%x: f32[s0, 100] strides [100, 1], %scale: f32[1] strides [1], %out: f32[s0, 100] strides [100, 1]) symbols(s0) {
          for i0 in 0..s0 {
            for i1_v in 0..12 {
              %out[i0, ramp(i1_v * 8, 1, 8)] = exp(%x[i0, ramp(i1_v * 8, 1, 8)]) * broadcast(%scale[0], 8)
            }
            for i1 in 96..+4 {
              %out[i0, i1] = exp(%x[i0, i1]) * %scale[0]
            }
          }
        }
    """)


def test_elementwise_runs() -> None:
    k = run_pass(Vectorize(), kernel(ELEMENTWISE))
    x = np.random.default_rng(0).standard_normal((3, 100), dtype=np.float32)
    r = execute(k, {"x": x, "scale": np.array([0.5], np.float32), "out": np.zeros_like(x)}, {"s0": 3})
    np.testing.assert_allclose(r["out"], np.exp(x) * 0.5, rtol=1e-6)


def test_row_sum_vectorizes_the_reduction_loop() -> None:
    out = run_pass(Vectorize(width=8), kernel(ROW_SUM))
    assert_ir(out, """
        kernel @k(%x: f32[s0, s1] strides [s1, 1], %out: f32[s0] strides [1]) symbols(s0, s1) {
          for i0 in 0..s0 {
            alloc %acc0: f32[1] strides [1] local
            %acc0[0] = 0.0:f32
            alloc %acc0_v: f32[8] strides [1] local
            %acc0_v[ramp(0, 1, 8)] = broadcast(-0.0:f32, 8)
            for r0_v in 0..s1 // 8 {
              let x0_v = %x[i0, ramp(r0_v * 8, 1, 8)]
              %acc0_v[ramp(0, 1, 8)] = %acc0_v[ramp(0, 1, 8)] + x0_v
            }
            %acc0[0] = %acc0[0] + vreduce_add(%acc0_v[ramp(0, 1, 8)])
            for r0 in s1 // 8 * 8..+s1 % 8 {
              let x0 = %x[i0, r0]
              %acc0[0] = %acc0[0] + x0
            }
            let x1 = %acc0[0]
            %out[i0] = x1
          }
        }
    """)


@pytest.mark.parametrize("n", [1, 7, 16, 100])
def test_row_sum_runs(n: int) -> None:
    k = run_pass(Vectorize(), kernel(ROW_SUM))
    x = np.random.default_rng(n).standard_normal((5, n), dtype=np.float32)
    r = execute(k, {"x": x, "out": np.zeros(5, np.float32)}, {"s0": 5, "s1": n})
    # a vectorized sum adds in another order: equal up to rounding
    np.testing.assert_allclose(r["out"], x.astype(np.float64).sum(1), rtol=1e-5, atol=1e-5)


def test_column_reduction_vectorizes_the_output_loop() -> None:
    """The reduction runs down columns: vectorizing the output loop reads rows contiguously
    and keeps the exact order of the reduction; the reduction loop would need gathers."""
    out = run_pass(Vectorize(width=8), kernel(COLUMN_MAX))
    assert_ir(out, """
        kernel @k(%x: f32[100, s0] strides [s0, 1], %out: f32[s0] strides [1]) symbols(s0) {
          for i0_v in 0..s0 // 8 {
            alloc %acc0_v: f32[1, 8] strides [8, 1] local
            %acc0_v[0, ramp(0, 1, 8)] = broadcast(-inf:f32, 8)
            for r0 in 0..100 {
              %acc0_v[0, ramp(0, 1, 8)] = max(%acc0_v[0, ramp(0, 1, 8)], %x[r0, ramp(i0_v * 8, 1, 8)])
            }
            %out[ramp(i0_v * 8, 1, 8)] = %acc0_v[0, ramp(0, 1, 8)]
          }
          for i0 in s0 // 8 * 8..+s0 % 8 {
            alloc %acc0: f32[1] strides [1] local
            %acc0[0] = -inf:f32
            for r0 in 0..100 {
              %acc0[0] = max(%acc0[0], %x[r0, i0])
            }
            %out[i0] = %acc0[0]
          }
        }
    """)
    x = np.random.default_rng(1).standard_normal((100, 21), dtype=np.float32)
    x[3, 5] = np.nan
    r = execute(out, {"x": x, "out": np.zeros(21, np.float32)}, {"s0": 21})
    np.testing.assert_array_equal(r["out"], x.max(0))  # exact, NaN propagates like torch.amax


def test_matmul_vectorizes_the_row_loops() -> None:
    out = run_pass(Vectorize(width=8), kernel(MATMUL))
    assert_ir(out, """
        kernel @k(%a: f32[s0, 32] strides [32, 1], %b: f32[32, s1] strides [s1, 1], %out: f32[s0, s1] strides [s1, 1]) symbols(s0, s1) {
          for i in 0..s0 {
            for j_v in 0..s1 // 8 {
              %out[i, ramp(j_v * 8, 1, 8)] = broadcast(0.0:f32, 8)
            }
            for j in s1 // 8 * 8..+s1 % 8 {
              %out[i, j] = 0.0:f32
            }
            for k in 0..32 {
              let a = %a[i, k]
              for j2_v in 0..s1 // 8 {
                let p_v = broadcast(a, 8) * %b[k, ramp(j2_v * 8, 1, 8)]
                %out[i, ramp(j2_v * 8, 1, 8)] = %out[i, ramp(j2_v * 8, 1, 8)] + p_v
              }
              for j2 in s1 // 8 * 8..+s1 % 8 {
                let p = a * %b[k, j2]
                %out[i, j2] = %out[i, j2] + p
              }
            }
          }
        }
    """)
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((6, 32), dtype=np.float32), rng.standard_normal((32, 37), dtype=np.float32)
    r = execute(run_pass(Vectorize(), kernel(MATMUL)), {"a": a, "b": b, "out": np.zeros((6, 37), np.float32)},
                {"s0": 6, "s1": 37})
    np.testing.assert_allclose(r["out"], a @ b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op, init, dtype, np_fn", [
    ("mul", "1.0:f32", "f32", np.prod),
    ("min", "inf:f32", "f32", np.min),
    ("add", "0:i32", "i32", np.sum),
    ("max", "-2147483648:i32", "i32", np.max),
])
def test_reduction_ops(op: str, init: str, dtype: str, np_fn) -> None:  # type: ignore[no-untyped-def]
    combine = f"%acc0[0] {'*' if op == 'mul' else '+'} %x[r0]" if op in ("mul", "add") else f"{op}(%acc0[0], %x[r0])"
    k = kernel(f"""
        kernel @k(%x: {dtype}[s0] strides [1], %out: {dtype}[1] strides [1]) symbols(s0) {{
          alloc %acc0: {dtype}[1] strides [1] local
          %acc0[0] = {init}
          for r0 in 0..s0 {{
            %acc0[0] = {combine}
          }}
          %out[0] = %acc0[0]
        }}
    """)
    out = run_pass(Vectorize(width=8), k)
    assert f"vreduce_{op}(" in print_kernel(out)
    rng = np.random.default_rng(3)
    x = (rng.uniform(0.9, 1.1, 53) if op == "mul" else rng.integers(-1000, 1000, 53)).astype(dtype.replace("f", "float").replace("i", "int"))
    r = execute(out, {"x": x, "out": np.zeros(1, x.dtype)}, {"s0": 53})
    np.testing.assert_allclose(r["out"][0], np_fn(x), rtol=1e-5)


def test_parallel_loop_keeps_its_kind_on_the_vector_loop() -> None:
    k = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          parallel for i in 0..s0 {
            %out[i] = %x[i] + 1.0:f32
          }
        }
    """)
    assert_ir(run_pass(Vectorize(width=4), k), """
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          parallel for i_v in 0..s0 // 4 {
            %out[ramp(i_v * 4, 1, 4)] = %x[ramp(i_v * 4, 1, 4)] + broadcast(1.0:f32, 4)
          }
          for i in s0 // 4 * 4..+s0 % 4 {
            %out[i] = %x[i] + 1.0:f32
          }
        }
    """)


def test_loop_variable_in_values_and_start_offset() -> None:
    """The loop variable itself (iota) becomes a ramp; a loop start carries into the ramp base."""
    k = kernel("""
        kernel @k(%out: f32[s0] strides [1]) symbols(s0) {
          for i in 2..+s0 - 2 {
            %out[i] = cast<f32>(i * 3)
          }
        }
    """)
    out = run_pass(Vectorize(width=4), k)
    assert_ir(out, """
        kernel @k(%out: f32[s0] strides [1]) symbols(s0) {
          for i_v in 0..(s0 - 2) // 4 {
            %out[ramp(i_v * 4 + 2, 1, 4)] = cast<f32>(ramp((i_v * 4 + 2) * 3, 3, 4))
          }
          for i in 2 + (s0 - 2) // 4 * 4..+(s0 - 2) % 4 {
            %out[i] = cast<f32>(i * 3)
          }
        }
    """)
    r = execute(out, {"out": np.zeros(13, np.float32)}, {"s0": 13})
    np.testing.assert_array_equal(r["out"][2:], np.arange(2, 13) * 3)


@pytest.mark.parametrize("body", [
    "%out[i] = %out[i - 1] + %x[i]",  # a scan: iterations depend on each other
    "%out[i * 2] = %x[i]",             # a strided store
    "%out[0] = %x[i]",                 # every iteration writes one element, not a reduction
])
def test_loops_left_scalar(body: str) -> None:
    k = kernel(f"""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {{
          for i in 1..+s0 - 1 {{
            {body}
          }}
        }}
    """)
    assert run_pass(Vectorize(width=8), k) == k


def test_marked_loop_may_scatter() -> None:
    k = kernel("""
        kernel @k(%x: f32[8] strides [1], %out: f32[16] strides [1]) {
          vectorized for i in 0..8 {
            %out[i * 2] = %x[i]
          }
        }
    """)
    out = run_pass(Vectorize(width=8), k)
    assert_ir(out, """
        kernel @k(%x: f32[8] strides [1], %out: f32[16] strides [1]) {
          %out[ramp(0, 2, 8)] = %x[ramp(0, 1, 8)]
        }
    """)
    x = np.arange(8, dtype=np.float32) + 1
    r = execute(out, {"x": x, "out": np.zeros(16, np.float32)})
    np.testing.assert_array_equal(r["out"][::2], x)
    np.testing.assert_array_equal(r["out"][1::2], 0)


def test_marked_loop_writing_one_element_is_an_error() -> None:
    k = kernel("""
        kernel @k(%x: f32[8] strides [1], %out: f32[1] strides [1]) {
          vectorized for i in 0..8 {
            %out[0] = %x[i]
          }
        }
    """)
    with pytest.raises(PassError, match="marked vectorized.*same element of %out"):
        run_pass(Vectorize(width=8), k)


def test_small_constant_loops_and_argmax_stay_scalar() -> None:
    small = kernel("""
        kernel @k(%x: f32[s0, 3] strides [3, 1], %out: f32[s0, 3] strides [3, 1]) symbols(s0) {
          for i in 0..s0 {
            for j in 0..3 {
              %out[i, j] = %x[i, j]
            }
          }
        }
    """)
    assert run_pass(Vectorize(width=8), small) == small
    argmax = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: i64[1] strides [1]) symbols(s0) {
          alloc %best: f32[1] strides [1] local
          alloc %where: i64[1] strides [1] local
          %best[0] = -inf:f32
          %where[0] = 0
          for r in 0..s0 {
            let take = %x[r] > %best[0]
            %best[0] = select(take, %x[r], %best[0])
            %where[0] = select(take, r, %where[0])
          }
          %out[0] = %where[0]
        }
    """)
    assert run_pass(Vectorize(width=8), argmax) == argmax


def test_marked_loop_becomes_one_vector() -> None:
    k = kernel("""
        kernel @k(%x: f32[s0, 8] strides [8, 1], %out: f32[s0, 8] strides [8, 1]) symbols(s0) {
          for i in 0..s0 {
            vectorized for j in 0..8 {
              %out[i, j] = %x[i, j] * 2.0:f32
            }
          }
        }
    """)
    assert_ir(run_pass(Vectorize(width=16), k), """
        kernel @k(%x: f32[s0, 8] strides [8, 1], %out: f32[s0, 8] strides [8, 1]) symbols(s0) {
          for i in 0..s0 {
            %out[i, ramp(0, 1, 8)] = %x[i, ramp(0, 1, 8)] * broadcast(2.0:f32, 8)
          }
        }
    """)


def test_marked_loop_that_cannot_be_vectorized_is_an_error() -> None:
    k = kernel("""
        kernel @k(%x: f32[s0, 8] strides [8, 1], %out: f32[s0] strides [1]) symbols(s0) {
          vectorized for j in 0..8 {
            for i in 0..j {
              %out[i] = %x[i, j]
            }
          }
        }
    """)
    with pytest.raises(PassError, match="bounds of inner loop i depend on it"):
        run_pass(Vectorize(width=8), k)


def test_width_option_and_target_default() -> None:
    """`width=0` takes the f32 lanes of the target in the pass context, never the host's."""
    from torchburn.ir.target import Target
    from torchburn.passes.base import PassManager

    assert parse_pipeline("vectorize{width=4}") == [Vectorize(width=4)]
    for bits, lanes in ((128, 4), (256, 8), (512, 16)):
        out = PassManager([Vectorize()], target=Target(vector_bits=bits)).run(as_program(kernel(ELEMENTWISE)))
        assert f"ramp(i1_v * {lanes}, 1, {lanes})" in print_kernel(out.kernels[0])
    generic = run_pass(Vectorize(), kernel(ELEMENTWISE))  # no context: the generic target (AVX2)
    assert "ramp(i1_v * 8, 1, 8)" in print_kernel(generic)


def test_zero_dimensional_buffer_is_a_scalar_load() -> None:
    k = kernel("""
        kernel @k(%x: f32[s0] strides [1], %y: f32[] strides [], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..s0 {
            %out[i] = %x[i] + %y[]
          }
        }
    """)
    out = run_pass(Vectorize(width=4), k)
    assert "%x[ramp(i_v * 4, 1, 4)] + broadcast(%y[], 4)" in print_kernel(out)
    x = np.arange(7, dtype=np.float32)
    r = execute(out, {"x": x, "y": np.array(0.5, np.float32), "out": np.zeros_like(x)}, {"s0": 7})
    np.testing.assert_array_equal(r["out"], x + 0.5)


def test_one_vector_and_one_tail_iteration_share_a_block() -> None:
    """9 = 8 + 1: the main loop and the tail both dissolve into the enclosing block; the
    uniform `let b` of the vector copy is renamed so no name is bound twice."""
    k = kernel("""
        kernel @k(%x: f32[4, 9] strides [9, 1], %bias: f32[4] strides [1], %out: f32[4, 9] strides [9, 1]) {
          for r in 0..4 {
            for c in 0..9 {
              let b = %bias[r]
              %out[r, c] = %x[r, c] + b
            }
          }
        }
    """)
    out = run_pass(Vectorize(width=8), k)
    assert_ir(out, """
        kernel @k(%x: f32[4, 9] strides [9, 1], %bias: f32[4] strides [1], %out: f32[4, 9] strides [9, 1]) {
          for r in 0..4 {
            let b_1 = %bias[r]
            %out[r, ramp(0, 1, 8)] = %x[r, ramp(0, 1, 8)] + broadcast(b_1, 8)
            let b = %bias[r]
            %out[r, 8] = %x[r, 8] + b
          }
        }
    """)


def test_reduction_whose_element_moves_inside_the_loop_stays_scalar() -> None:
    """`%acc[c] += ...` over an inner loop c: one vector accumulator cannot hold three sums."""
    k = kernel("""
        kernel @k(%x: f32[s0, 3] strides [3, 1], %out: f32[3] strides [1]) symbols(s0) {
          for r in 0..s0 {
            for c in 0..3 {
              %out[c] = %out[c] + %x[r, c]
            }
          }
        }
    """)
    assert run_pass(Vectorize(width=8), k) == k


def test_loop_annotated_keep_rolled_is_not_chosen() -> None:
    """A unit-stride store loop the pass would vectorize stays scalar when annotated
    `{loop = "keep-rolled"}` (a transposing copy: vectorized, every load would gather)."""
    text = """
        kernel @k(%x: f32[64, 64] strides [64, 1], %out: f32[64, 64] strides [64, 1]) {
          for k in 0..64 {
            for j in 0..64 ATTRS{
              %out[k, j] = %x[j, k]
            }
          }
        }
    """
    plain = kernel(text.replace("ATTRS", ""))
    assert "ramp" in print_kernel(run_pass(Vectorize(width=8), plain))
    rolled = kernel(text.replace("ATTRS", 'attrs {loop = "keep-rolled"} '))
    assert run_pass(Vectorize(width=8), rolled) == rolled
