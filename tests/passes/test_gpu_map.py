"""`gpu-map`: the annotations each kind of kernel gets (IR text in, IR text out)."""
from __future__ import annotations

from torchburn.passes.base import parse_pipeline
from torchburn.passes.gpu.map import GpuMap
from tests.passes.util import assert_ir, kernel, matmul_kernel_text, run_pass


def test_elementwise_gets_a_vectorized_grid() -> None:
    k = kernel("""
        kernel @k0(%x: f32[64, 256] strides [256, 1], %out: f32[64, 256] strides [256, 1]) {
          for i0 in 0..64 {
            for i1 in 0..256 {
              let x2 = %x[i0, i1]
              %out[i0, i1] = x2 * 2.0:f32
            }
          }
        }
    """)
    assert_ir(run_pass(GpuMap(), k), """
        kernel @k0(%x: f32[64, 256] strides [256, 1], %out: f32[64, 256] strides [256, 1]) {
          for i0 in 0..64 attrs {gpu = "grid", gpu_wg = "256", gpu_vec = "4"} {
            for i1 in 0..256 attrs {gpu = "grid"} {
              let x2 = %x[i0, i1]
              %out[i0, i1] = x2 * 2.0:f32
            }
          }
        }
    """)


def test_odd_extent_is_not_vectorized_and_options_apply() -> None:
    k = kernel("""
        kernel @k0(%x: f32[s0, 7] strides [7, 1], %out: f32[s0, 7] strides [7, 1]) symbols(s0) {
          for i0 in 0..s0 {
            for i1 in 0..7 {
              %out[i0, i1] = %x[i0, i1]
            }
          }
        }
    """)
    (p,) = parse_pipeline("gpu-map{workgroup=128}")
    out = run_pass(p, k)
    assert out.body.annotations == (("gpu", "grid"), ("gpu_wg", "128"))


REDUCTION = """
    kernel @k0(%x: f32[s0, {n}] strides [{n}, 1], %out: f32[s0] strides [1]) symbols(s0) {{
      for i0 in 0..s0 {{
        alloc %acc1: f32[1] strides [1] local
        %acc1[0] = 0.0:f32
        for r2 in 0..{n} {{
          let x3 = %x[i0, r2]
          %acc1[0] = %acc1[0] + x3
        }}
        let t4 = %acc1[0]
        %out[i0] = t4
      }}
    }}
"""


def test_long_reduction_gets_a_workgroup_per_row() -> None:
    out = run_pass(GpuMap(rows=False), kernel(REDUCTION.format(n=1024)))
    assert_ir(out, """
        kernel @k0(%x: f32[s0, 1024] strides [1024, 1], %out: f32[s0] strides [1]) symbols(s0) {
          for i0 in 0..s0 attrs {gpu = "block"} {
            alloc %acc1: f32[1] strides [1] local
            %acc1[0] = 0.0:f32
            for r2 in 0..1024 attrs {gpu = "threads", gpu_reduce = "add", gpu_acc = "acc1", gpu_wg = "256"} {
              let x3 = %x[i0, r2]
              %acc1[0] = %acc1[0] + x3
            }
            let t4 = %acc1[0]
            %out[i0] = t4
          }
        }
    """)


def test_short_reduction_gets_a_thread_per_row() -> None:
    out = run_pass(GpuMap(), kernel(REDUCTION.format(n=8)))
    assert out.body.annotations == (("gpu", "grid"), ("gpu_wg", "256"))
    assert "gpu" not in dict(out.body.body.stmts[2].annotations)  # type: ignore[union-attr]


def test_workgroup_shrinks_to_the_reduction() -> None:
    out = run_pass(GpuMap(rows=False), kernel(REDUCTION.format(n=100)))
    red = out.body.body.stmts[2]  # type: ignore[union-attr]
    assert red.annotation("gpu_wg") == "128"


def test_row_reduction_gets_the_rows_mapping() -> None:
    """The same reduction with the default `rows=True`: a workgroup per row, the row loop shared
    by its invocations (`gpu_rows.py`); 1024 = 256 invocations x vec4, 100 = 32 x 4 (2 rows
    of 32 invocations in a workgroup of 64)."""
    out = run_pass(GpuMap(), kernel(REDUCTION.format(n=1024)))
    assert out.body.annotations == (("gpu", "rows"), ("gpu_wg", "256"), ("gpu_row_wg", "256"))
    red = out.body.body.stmts[2]  # type: ignore[union-attr]
    assert red.annotations == (("gpu", "lanes"), ("gpu_vec", "4"), ("gpu_accs", "acc1=add"))
    short = run_pass(GpuMap(), kernel(REDUCTION.format(n=100)))
    assert dict(short.body.annotations)["gpu_row_wg"] == "32" and dict(short.body.annotations)["gpu_wg"] == "64"


def test_matrix_product_gets_a_gemm_tile_that_fills_the_device() -> None:
    big = run_pass(GpuMap(), kernel(matmul_kernel_text(4096, 4096)))
    assert big.body.annotations == (("gpu", "gemm"), ("gpu_tile", "128x128x16/8x8/sw/w"))
    middle = run_pass(GpuMap(), kernel(matmul_kernel_text(512, 768)))
    assert middle.body.annotation("gpu_tile") == "64x64x16/4x4/s2/sw/w"
    small = run_pass(GpuMap(), kernel(matmul_kernel_text(32, 256)))
    assert small.body.annotation("gpu_tile") == "32x32x16/4x4"
    forced = run_pass(GpuMap(gemm_tile="64x64x16/4x4"), kernel(matmul_kernel_text(4096, 4096)))
    assert forced.body.annotation("gpu_tile") == "64x64x16/4x4"


def test_a_sequential_loop_is_not_parallelized() -> None:
    """A loop whose iterations all write the same element is not a grid loop."""
    k = kernel("""
        kernel @k0(%x: f32[16] strides [1], %out: f32[1] strides [1]) {
          for i0 in 0..16 {
            %out[0] = %out[0] + %x[i0]
          }
        }
    """)
    out = run_pass(GpuMap(), k)
    assert "gpu" not in dict(out.body.annotations)  # type: ignore[union-attr]


def test_a_matrix_vector_product_gets_a_workgroup_per_output_not_a_gemm_tile() -> None:
    """A decode step's product (one output row) would fill 1 of a tile's 32 rows: it is mapped
    as a reduction instead; from `gemv_rows + 1` rows on it is a GEMM again."""
    one = run_pass(GpuMap(), kernel(matmul_kernel_text(1, 256)))
    assert one.body.annotation("gpu") != "gemm"
    gpu = {f.annotation("gpu") for f in _loops(one.body)}
    assert gpu & {"rows", "block"} and gpu & {"lanes", "threads"}, gpu
    five = run_pass(GpuMap(), kernel(matmul_kernel_text(5, 256)))
    assert five.body.annotation("gpu") == "gemm"


def _loops(s):  # type: ignore[no-untyped-def]
    from torchburn.ir import loop as lp

    return [x for x in lp.walk_stmts(s) if isinstance(x, lp.For)]


TASKS = """
    kernel @k0(%x: f32[{n}, 4] strides [4, 1], %out: f32[{n}, 4] strides [4, 1]) {{
      parallel for r0 in 0..{n} attrs {{tasks = "independent"}} {{
        let h1 = r0 % {n}
        for d2 in 0..4 {{
          %out[h1, d2] = %x[h1, d2]
        }}
      }}
    }}
"""


def test_independent_tasks_get_one_invocation_each() -> None:
    """The attention kernel's task loop (stores through `let`s the parallel-prefix test cannot
    follow) is a grid loop, in a workgroup sized to the task count; unmarked, it stays serial
    (one invocation runs everything)."""
    few = run_pass(GpuMap(), kernel(TASKS.format(n=9)))
    assert few.body.annotations == (("tasks", "independent"), ("gpu", "grid"), ("gpu_wg", "32"))
    many = run_pass(GpuMap(), kernel(TASKS.format(n=4096)))
    assert many.body.annotation("gpu_wg") == "256"
    plain = run_pass(GpuMap(), kernel(TASKS.format(n=9).replace(' attrs {tasks = "independent"}', "")))
    assert plain.body.annotation("gpu") is None


def test_a_product_whose_factors_share_a_let_is_not_claimed_as_a_gemm() -> None:
    """WGSL's GEMM codegen tiles A and B from disjoint lets; a let both factors read would be
    refused there, sending the whole graph to the CPU engine. gpu-map maps it as a reduction
    (a workgroup per output element) instead, so only this kernel gives up the GEMM tiles."""
    shared = matmul_kernel_text(64, 256).replace(
        "let x4 = %a[i0, k3]", "let t3 = k3 + 0\n            let x4 = %a[i0, t3]").replace(
        "let x5 = %b[k3, i1]", "let x5 = %b[t3, i1]")
    out = run_pass(GpuMap(), kernel(shared))
    assert out.body.annotation("gpu") != "gemm"
    assert {f.annotation("gpu") for f in _loops(out.body)} & {"block", "rows", "threads", "lanes"}
    # the same product with its own index per factor is a GEMM
    assert run_pass(GpuMap(), kernel(matmul_kernel_text(64, 256))).body.annotation("gpu") == "gemm"


def test_an_fma_accumulation_is_a_shared_reduction() -> None:
    """The quantized matrix-vector kernels accumulate with `fma(x, w, acc)`: an add reduction,
    so a long one gets a workgroup per output (it had one invocation per output, each walking
    its whole weight row alone)."""
    k = kernel(REDUCTION.format(n=256).replace("%acc1[0] = %acc1[0] + x3", "%acc1[0] = fma(x3, x3, %acc1[0])"))
    out = run_pass(GpuMap(), k)
    gpu = {f.annotation("gpu") for f in _loops(out.body)}
    assert gpu & {"block", "rows"} and gpu & {"threads", "lanes"}, gpu
    # the accumulator read anywhere else than as fma's addend: not a reduction
    bad = kernel(REDUCTION.format(n=256).replace("%acc1[0] = %acc1[0] + x3",
                                                 "%acc1[0] = fma(%acc1[0], x3, %acc1[0])"))
    assert not {f.annotation("gpu") for f in _loops(run_pass(GpuMap(), bad).body)} & {"threads", "lanes"}


REGROUPED = """
    kernel @k0(%x: f32[32, 64] strides [64, 1], %w: f32[64, 48] strides [48, 1], %r: f32[2, 16, 48] strides [768, 48, 1],
               %out: f32[2, 16, 48] strides [768, 48, 1]) {{
      for i0 in 0..32 {{
        for i1 in 0..48 {{
          alloc %acc: f32[1] strides [1] local
          %acc[0] = 0.0:f32
          for k2 in 0..64 {{
            let x3 = %x[i0, k2]
            let x4 = %w[k2, i1]
            %acc[0] = %acc[0] + x3 * x4
          }}
          let t5 = %acc[0]
          let x6 = %r[{index}]
          %out[{index}] = t5 + x6
        }}
      }}
    }}
"""


def test_product_stored_through_a_row_regroup_is_a_gemm() -> None:
    """A linear layer's epilogue after a reshape of its rows (`[32, 48] -> [2, 16, 48]`, the
    residual add) stores at the regrouped index: still one element per (i, j), a GEMM."""
    out = run_pass(GpuMap(), kernel(REGROUPED.format(index="i0 // 16, i0 % 16, i1")))
    assert out.body.annotation("gpu") == "gemm", out
    # not a regroup (two rows to one element): no parallel loop over i0, not a GEMM
    other = run_pass(GpuMap(), kernel(REGROUPED.format(index="i0 // 16, i0 // 16, i1")))
    assert other.body.annotation("gpu") != "gemm", other
