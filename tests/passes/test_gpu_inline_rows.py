"""`gpu-inline-rows` on loop IR: the module docstring's program, run by the reference
interpreter before and after (the same numbers, one call fewer), and the cases it must leave
alone."""
from __future__ import annotations

import numpy as np
import pytest

from torchburn.ir.parser import parse_program
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify_program
from torchburn.passes.base import PassError, parse_pipeline
from torchburn.passes.gpu.inline_rows import GpuInlineRows

NORM = """
kernel @norm(%x: f32[1, 64] strides [64, 1], %g: f32[64] strides [1], %n: f32[1, 64] strides [64, 1]) {
  for i0 in 0..1 {
    alloc %acc: f32[1] strides [1] local
    %acc[0] = 0.0:f32
    for r in 0..64 {
      let a = %x[i0, r]
      let aa = a * a
      %acc[0] = %acc[0] + aa
    }
    let m = %acc[0]
    let m2 = m / 64.0:f32
    let m3 = m2 + 1e-05:f32
    let s = rsqrt(m3)
    for i1 in 0..64 {
      let xv = %x[i0, i1]
      let gv = %g[i1]
      let xs = xv * s
      let y = gv * xs
      %n[i0, i1] = y
    }
  }
}
kernel @gemv(%n: f32[1, 64] strides [64, 1], %w: f32[32, 64] strides [64, 1], %out0: f32[32] strides [1]) {
  for j in 0..32 {
    alloc %dot: f32[1] strides [1] local
    %dot[0] = 0.0:f32
    for k in 0..64 {
      let nv = %n[0, k]
      let wv = %w[j, k]
      let p = nv * wv
      %dot[0] = %dot[0] + p
    }
    let d = %dot[0]
    %out0[j] = d
  }
}
"""


def _program(calls: str, temps: str = "  temp %n: f32[1, 64] strides [64, 1]\n",
             outputs: str = "%out0: f32[32] strides [1]") -> str:
    return ("program @main(%x: f32[1, 64] strides [64, 1], %g: f32[64] strides [1], "
            f"%w: f32[32, 64] strides [64, 1]) -> ({outputs}) {{\n{temps}{calls}}}\n{NORM}")


def _run(program, x, g, w):  # type: ignore[no-untyped-def]
    from torchburn.runtime.reference.entry import run_arrays

    return run_arrays(program, {"x": x, "g": g, "w": w})


def test_norm_computed_inside_the_product() -> None:
    before = parse_program(_program("  call @norm(%x, %g, %n)\n  call @gemv(%n, %w, %out0)\n"))
    after = GpuInlineRows().run(before)
    verify_program(after)
    assert len(after.calls) == 1 and after.temps == () and len(after.kernels) == 1
    assert after.calls[0].args == ("w", "x", "g", "out0")  # the written buffer stays last
    assert parse_program(print_ir(after)) == after
    rng = np.random.default_rng(0)
    x, g, w = (rng.standard_normal(s).astype(np.float32) for s in ((1, 64), (64,), (32, 64)))
    n = x.astype(np.float64) / np.sqrt((x.astype(np.float64) ** 2).mean() + 1e-5) * g
    want, scale = (n @ w.T).reshape(32), (np.abs(n) @ np.abs(w.T)).reshape(32)
    got = _run(after, x, g, w)["out0"]
    # the same float operations in the same order: the same bits as the two kernels
    np.testing.assert_array_equal(got, _run(before, x, g, w)["out0"])
    assert np.all(np.abs(got - want) <= 1e-6 * scale + 1e-7), np.max(np.abs(got - want) / scale)


@pytest.mark.parametrize("calls", [
    # the row is read by a second kernel
    "  call @norm(%x, %g, %n)\n  call @gemv(%n, %w, %out0)\n  call @gemv(%n, %w, %out1)\n",
    # the norm's input is overwritten between the two calls
    "  call @norm(%x, %g, %n)\n  call @norm(%n, %g, %x)\n  call @gemv(%n, %w, %out0)\n",
])
def test_left_alone(calls: str) -> None:
    text = _program(calls, outputs="%out0: f32[32] strides [1], %out1: f32[32] strides [1]")
    program = parse_program(text)
    assert len(GpuInlineRows().run(program).calls) == len(program.calls)


def test_a_returned_row_is_not_inlined() -> None:
    program = parse_program(_program("  call @norm(%x, %g, %n)\n  call @gemv(%n, %w, %out0)\n", temps="",
                                     outputs="%out0: f32[32] strides [1], %n: f32[1, 64] strides [64, 1]"))
    assert len(GpuInlineRows().run(program).calls) == 2


def test_max_recompute_bounds_and_turns_it_off() -> None:
    program = parse_program(_program("  call @norm(%x, %g, %n)\n  call @gemv(%n, %w, %out0)\n"))
    # the prefix (64 iterations) against the product's loop over the row (64): a ratio of 1
    assert len(GpuInlineRows(max_recompute=0.5).run(program).calls) == 2
    assert len(GpuInlineRows(max_recompute=1.0).run(program).calls) == 1
    assert len(GpuInlineRows(max_recompute=0).run(program).calls) == 2
    assert parse_pipeline("gpu-inline-rows{max_recompute=0}") == [GpuInlineRows(max_recompute=0)]
    with pytest.raises(PassError, match="max_recompute"):
        GpuInlineRows(max_recompute=-1)
