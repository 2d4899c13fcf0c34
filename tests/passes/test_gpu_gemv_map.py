"""How `gpu-map` maps a decode step's matrix-vector products (`passes/gpu/rows.py`'s `row_lanes`,
`passes/gpu/block_rows.py`) and how WGSL stores their 8-bit weights (`Caps.packed_bytes`):
annotations and shader text, no device needed."""
from __future__ import annotations

import pytest

from torchburn.codegen.wgsl import Caps, emit_program, program_caps
from torchburn.ir import loop as lp
from torchburn.passes.base import PassError
from torchburn.passes.gpu.map import GpuMap
from torchburn.passes.gpu.rows import row_lanes
from tests.passes.util import as_program, kernel, run_pass

Q8_0 = """
    kernel @k0(%w: u8[64, 544] strides [544, 1], %x: f32[1, 512] strides [512, 1], %out0: f32[1, 64] strides [64, 1]) {{
      for i0 in 0..1 {{
        for i1 in 0..64 {{
          alloc %acc2: f32[1] strides [1] local
          %acc2[0] = 0.0:f32
          for b3 in 0..16 {{
            let x4 = %w[i1, b3 * 34]
            let d6 = cast<f32>(x4)
            for l7 in 0..32 {{
              let x8 = %w[i1, b3 * 34 + (2 + l7)]
              let q9 = cast<i32>(bitcast<i8>(x8))
              let x10 = %x[i0, b3 * 32 + l7]
              let w11 = cast<f32>(q9) * d6
              %acc2[0] = fma(x10, w11, %acc2[0])
            }}
            for l12 in 0..{second} {{
              let x13 = %x[i0, b3 * 32 + l12]
              %acc2[0] = fma(x13, d6, %acc2[0])
            }}
          }}
          let x18 = %acc2[0]
          %out0[i0, i1] = x18
        }}
      }}
    }}
"""

GEMV = """
    kernel @k0(%x: f32[1, {k}] strides [{k}, 1], %w: f32[{n}, {k}] strides [{k}, 1], %out0: f32[1, {n}] strides [{n}, 1]) {{
      for i0 in 0..1 {{
        for i1 in 0..{n} {{
          alloc %acc3: f32[1] strides [1] local
          %acc3[0] = 0.0:f32
          for k2 in 0..{k} {{
            let x4 = %x[i0, k2]
            let x5 = %w[i1, k2]
            %acc3[0] = fma(x4, x5, %acc3[0])
          }}
          let x7 = %acc3[0]
          %out0[i0, i1] = x7
        }}
      }}
    }}
"""

WRITES_BYTES = """
    kernel @k0(%x: u8[64] strides [1], %out0: u8[64] strides [1]) {
      for i0 in 0..64 {
        %out0[i0] = %x[i0] + 1:u8
      }
    }
"""

READS_BYTES = """
    kernel @k0(%x: u8[64] strides [1], %y: i8[64] strides [1], %out0: f32[64] strides [1]) {
      for i0 in 0..64 {
        %out0[i0] = cast<f32>(%x[i0]) + cast<f32>(%y[i0])
      }
    }
"""


def annotation(k: lp.Kernel, key: str) -> list[str]:
    return [s.annotation(key) or "" for s in lp.walk_stmts(k.body) if isinstance(s, lp.For)]


def program(k: lp.Kernel) -> lp.Program:
    return as_program(k, ("out0",))


def test_row_lanes_give_many_rows_a_few_elements_per_invocation() -> None:
    # few rows (a softmax of 8 rows): a lane per element (vec4), up to the workgroup
    assert row_lanes(1000, True, 8, 256) == 256
    assert row_lanes(40, False, 8, 256) == 64
    # a decode step's product: 1536 outputs of 576 inputs, vec4 -> 32 lanes of 18 elements
    assert row_lanes(576, True, 1536, 256) == 32
    assert row_lanes(1536, True, 576, 256) == 64
    assert row_lanes(4864, True, 896, 256) == 256
    assert row_lanes(576, False, 1536, 256, lane_elements=4) == 128
    assert row_lanes(576, True, 1536, 256, lanes=128) == 128  # fixed by the option
    assert row_lanes(None, True, None, 256) == 256  # symbolic: the workgroup


def test_decode_products_are_row_kernels_with_fma_updates() -> None:
    k = run_pass(GpuMap(), kernel(GEMV.format(n=1536, k=576)))
    assert annotation(k, "gpu") == ["rows", "rows", "lanes"]
    assert k.body.annotation("gpu_row_wg") == "32" and k.body.annotation("gpu_wg") == "64"
    assert annotation(k, "gpu_accs")[2] == "acc3=add"
    fixed = run_pass(GpuMap(row_lanes=128), kernel(GEMV.format(n=1536, k=576)))
    assert fixed.body.annotation("gpu_row_wg") == "128"


@pytest.mark.parametrize("bad", [{"row_lanes": 48}, {"row_lanes": 512}, {"row_lane_elements": 0}])
def test_row_options_are_checked(bad: dict) -> None:  # type: ignore[type-arg]
    with pytest.raises(PassError, match="row_lane"):
        GpuMap(**bad)


def test_block_products_take_the_blocks_form() -> None:
    k = run_pass(GpuMap(), kernel(Q8_0.format(second=32)))
    assert annotation(k, "gpu") == ["rows", "rows", "blocks", "block_lanes", "block_lanes"]
    assert annotation(k, "gpu_accs")[2] == "acc2=add"
    assert k.body.annotation("gpu_row_wg") == "32"
    src = emit_program(program(k), Caps()).pop().source
    assert "let tb_sub = tb_lane / 32u;" in src and "tb_bo" in src
    wide = run_pass(GpuMap(row_lanes=128), kernel(Q8_0.format(second=32)))
    src = emit_program(program(wide), Caps(subgroups=True)).pop().source
    assert "tb_bo * 4u + tb_sub" in src  # 4 blocks a step
    assert "subgroupAdd" in src  # a row is the whole workgroup: subgroups, then one memory step


def test_block_loops_of_unequal_elements_stay_on_the_grid() -> None:
    k = run_pass(GpuMap(), kernel(Q8_0.format(second=16)))
    assert "blocks" not in annotation(k, "gpu") and annotation(k, "gpu")[:2] == ["grid", "grid"]


NORM_Q8_0 = """
    kernel @k0(%w: u8[64, 544] strides [544, 1], %x: f32[1, 512] strides [512, 1], %out0: f32[1, 64] strides [64, 1]) {{
      for i0 in 0..1 {{
        for i1 in 0..64 {{
          alloc %acc2: f32[1] strides [1] local
          %acc2[0] = 0.0:f32
          alloc %acc5: f32[1] strides [1] local
          %acc5[0] = 0.0:f32
          alloc %acc6: f32[1] strides [1] local
          %acc6[0] = 0.0:f32
          for r4 in 0..512 {{
            let x5 = %x[i0, r4]
            %acc5[0] = %acc5[0] + x5 * x5
          }}
          for r7 in 0..{other} {{
            let x8 = %x[i0, r7]
            %acc6[0] = max(%acc6[0], x8)
          }}
          let t9 = rsqrt(%acc5[0] / 512.0:f32 + 0.00001:f32) + %acc6[0]
          for b3 in 0..16 {{
            let x4 = %w[i1, b3 * 34]
            let d6 = cast<f32>(x4)
            for l7 in 0..32 {{
              let x8 = %w[i1, b3 * 34 + (2 + l7)]
              let q9 = cast<i32>(bitcast<i8>(x8))
              let x10 = %x[i0, b3 * 32 + l7] * t9
              %acc2[0] = fma(x10, cast<f32>(q9) * d6, %acc2[0])
            }}
          }}
          let x18 = %acc2[0]
          %out0[i0, i1] = x18
        }}
      }}
    }}
"""


def test_a_norm_before_the_blocks_runs_over_the_same_row() -> None:
    """`gpu-inline-rows` puts a norm's statistics before a block product's loop: those loops
    take the rows mapping's lanes, the product the blocks form, in one row kernel."""
    k = run_pass(GpuMap(), kernel(NORM_Q8_0.format(other=512)))
    assert annotation(k, "gpu") == ["rows", "rows", "lanes", "lanes", "blocks", "block_lanes"]
    assert annotation(k, "gpu_accs")[2:5] == ["acc5=add", "acc6=max", "acc2=add"]
    assert annotation(k, "gpu_vec")[2:4] == ["4", "4"]
    src = emit_program(program(k), Caps()).pop().source
    assert src.index("tb_va_acc5") < src.index("tb_bo")  # the norm's sum, then the blocks
    # reductions of unequal extents cannot share the row's lane steps: the grid mapping
    other = run_pass(GpuMap(), kernel(NORM_Q8_0.format(other=256)))
    assert "blocks" not in annotation(other, "gpu")


def test_bytes_are_packed_where_no_kernel_writes_them() -> None:
    reads = program(kernel(READS_BYTES))
    assert program_caps(reads, Caps()).packed_bytes
    src = emit_program(run_program_map(reads), Caps()).pop().source
    assert "var<storage, read> b_x: array<u32>;" in src and "var<storage, read> b_y: array<u32>;" in src
    assert "extractBits(bitcast<i32>(b_y[u32(i) >> 2u])" in src  # i8: sign-extended
    writes = program(kernel(WRITES_BYTES))
    assert not program_caps(writes, Caps()).packed_bytes
    src = emit_program(run_program_map(writes), Caps()).pop().source
    assert "extractBits" not in src and "array<u32>" not in src and "b_out0: array<vec4<i32>>" in src


def run_program_map(p: lp.Program) -> lp.Program:
    return p.with_kernels(tuple(run_pass(GpuMap(), k) for k in p.kernels))


def test_rows_written_whole_keep_a_lane_per_element() -> None:
    """A softmax of 1024 rows writes its rows: a lane per (vec4) element as before, so the row
    stays in registers between its loops; only per-row reductions spread fewer lanes."""
    from tests.gpu.test_rows import SOFTMAX

    k = run_pass(GpuMap(), kernel(SOFTMAX.format(n=1000, d="f32").replace("0..8 {", "0..1024 {")
                                  .replace("[8, 1000]", "[1024, 1000]")))
    assert k.body.annotation("gpu") == "rows" and k.body.annotation("gpu_row_wg") == "256"
