"""`gpu-split-wide`: a kernel binding more buffers than a shader stage may see becomes
consecutive kernels over chunks of its outer loop, each binding only what it uses."""
from __future__ import annotations

import torch

from torchburn.ir.parser import parse_program
from torchburn.ir.printer import print_program
from torchburn.passes.gpu_split import GpuSplitWide

from tests.gpu.conftest import check_gpu, gpu  # noqa: F401  (the fixture)

PIECES = """program @f({ins}) -> (%out0: f32[{n}, 4] strides [4, 1]) {{
  call @k0({args}, %out0)
}}
kernel @k0({ins}, %out0: f32[{n}, 4] strides [4, 1]) {{
  for j0 in 0..{n} {{
    for j1 in 0..4 {{
{loads}
      %out0[j0, j1] = {value}
    }}
  }}
}}
"""


def pieces(n: int):  # type: ignore[no-untyped-def]
    """`out[j0] = x{j0}` for n inputs: a cat, as lowering writes it (a select chain on j0)."""
    ins = ", ".join(f"%x{i}: f32[4] strides [1]" for i in range(n))
    args = ", ".join(f"%x{i}" for i in range(n))
    loads = "\n".join(f"      let v{i} = %x{i}[j1]" for i in range(n))
    value = f"v{n - 1}"
    for i in reversed(range(n - 1)):
        value = f"select(j0 < {i + 1}, v{i}, {value})"
    return parse_program(PIECES.format(ins=ins, args=args, loads=loads, value=value, n=n), "pieces")


def test_a_wide_cat_is_split_into_kernels_within_the_limit() -> None:
    out = GpuSplitWide(max_buffers=4).run(pieces(7))
    assert [len(k.params) for k in out.kernels] == [4, 4, 2]
    assert [c.kernel for c in out.calls] == ["k0_0", "k0_1", "k0_2"]
    assert out.calls[1].args == ("x3", "x4", "x5", "out0")
    # each chunk stores its own rows: j0 is offset by the chunk's start
    text = print_program(out)
    assert "%out0[j0 + 3, j1] = select(j0 + 3 < 4, v3, select(j0 + 3 < 5, v4, v5))" in text
    # a one-iteration chunk loses its loop and its selects
    assert "%out0[6, j1] = v6" in text


def test_narrow_kernels_and_unsplittable_ones_are_left_alone() -> None:
    p = pieces(3)
    assert GpuSplitWide(max_buffers=8).run(p) is p
    # one iteration already needs 2 buffers (its input and the output): no split within 1
    assert GpuSplitWide(max_buffers=1).run(p).kernels == p.kernels


def test_a_cat_of_many_inputs_runs_on_the_gpu_engine(gpu) -> None:  # noqa: F811
    """19 inputs and the output exceed every adapter's guaranteed 8 storage buffers (llvmpipe
    offers 16): before the split the graph ran on the CPU engine."""
    xs = [torch.randn(1, 8) + i for i in range(19)]
    reports = check_gpu(lambda *a: torch.cat(a) * 2.0, *xs)
    kernels = [k for r in reports for s in r.subgraphs for k in s.kernels]
    assert len(kernels) >= 3, kernels
