"""`dedup-kernels` (passes/loop/dedup_kernels.py): kernels equal up to names merge, anything else
that changes the code keeps them apart."""
from __future__ import annotations

import pytest

from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_program
from torchburn.ir.verifier import verify
from torchburn.passes.loop.dedup_kernels import DedupKernels


def program(second: str, symbols: str = "") -> lp.Program:
    """Two calls: kernel @k0 (exp of an f32[4, 8] row-major buffer) and `second`."""
    return parse_program(f"""program @p(%x: f32[4, 8] strides [8, 1]) -> (%z: f32[4, 8] strides [8, 1]) {{
  temp %t: f32[4, 8] strides [8, 1]
  call @k0(%x, %t)
  call @k1(%t, %z)
}}
kernel @k0(%a: f32[4, 8] strides [8, 1], %b: f32[4, 8] strides [8, 1]) {{
  for i0 in 0..4 {{
    for i1 in 0..8 {{
      %b[i0, i1] = exp(%a[i0, i1])
    }}
  }}
}}
{second}""")


SAME = """kernel @k1(%c: f32[4, 8] strides [8, 1], %d: f32[4, 8] strides [8, 1]) {
  for j0 in 0..4 {
    for j1 in 0..8 {
      %d[j0, j1] = exp(%c[j0, j1])
    }
  }
}"""


def test_kernels_equal_up_to_names_merge() -> None:
    out = DedupKernels().run(program(SAME))
    verify(out)
    assert [k.name for k in out.kernels] == ["k0"]
    assert [(c.kernel, c.args) for c in out.calls] == [("k0", ("x", "t")), ("k0", ("t", "z"))]


@pytest.mark.parametrize("change", [
    ("exp(", "tanh("),                          # the op
    ("f32[4, 8] strides [8, 1], %d", "f32[4, 8] strides [1, 4], %d"),  # a parameter's strides
    ("0..8", "0..7"),                           # a loop extent
    ("for j1 in 0..8", "parallel for j1 in 0..8"),  # a loop kind
])
def test_kernels_that_differ_stay_apart(change: tuple[str, str]) -> None:
    second = SAME.replace(*change)
    assert second != SAME
    p = program(second)
    out = DedupKernels().run(p)
    assert out is p and len(out.kernels) == 2


def test_dtype_and_shape_keep_kernels_apart() -> None:
    f64 = parse_program("""program @p(%x: f32[4] strides [1], %y: f64[4] strides [1]) -> (%z: f32[4] strides [1], %w: f64[4] strides [1]) {
  call @k0(%x, %z)
  call @k1(%y, %w)
}
kernel @k0(%a: f32[4] strides [1], %b: f32[4] strides [1]) {
  for i0 in 0..4 {
    %b[i0] = exp(%a[i0])
  }
}
kernel @k1(%a: f64[4] strides [1], %b: f64[4] strides [1]) {
  for i0 in 0..4 {
    %b[i0] = exp(%a[i0])
  }
}""")
    assert len(DedupKernels().run(f64).kernels) == 2


def test_different_program_symbols_keep_kernels_apart() -> None:
    """Symbols bind by name: the same body over `s0` and over `s1` are two kernels."""
    text = """program @p(%x: f32[s0] strides [1], %y: f32[s1] strides [1]) -> (%z: f32[s0] strides [1], %w: f32[s1] strides [1]) {
  call @k0(%x, %z)
  call @k1(%y, %w)
}
kernel @k0(%a: f32[s0] strides [1], %b: f32[s0] strides [1]) symbols(s0) {
  for i0 in 0..s0 {
    %b[i0] = exp(%a[i0])
  }
}
kernel @k1(%a: f32[s1] strides [1], %b: f32[s1] strides [1]) symbols(s1) {
  for i0 in 0..s1 {
    %b[i0] = exp(%a[i0])
  }
}"""
    p = parse_program(text)
    assert len(DedupKernels().run(p).kernels) == 2
    same = parse_program(text.replace("s1", "s0").replace("%y: f32[s0]", "%y: f32[s0]"))
    assert len(DedupKernels().run(same).kernels) == 1
