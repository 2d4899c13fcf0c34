"""`gpu-split-wide`: a kernel binding more buffers than a shader stage may see becomes
consecutive kernels over chunks of its outer loop, each binding only what it uses."""
from __future__ import annotations

import pytest
import torch

from torchburn.ir.parser import parse_program
from torchburn.ir.printer import print_program
from torchburn.passes.gpu.split import GpuSplitWide

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
    """19 inputs and the output exceed the 16 storage buffers llvmpipe offers (WebGPU
    guarantees 8): before the split the graph ran on the CPU engine. The chunks are as wide as
    the device allows (the limit is requested from the adapter and reaches the pass through
    the target): each binds the output and up to limit - 1 inputs."""
    limit = gpu.get_device().caps.max_storage_buffers
    if limit >= 20:
        pytest.skip(f"the adapter allows {limit} storage buffers: nothing to split")
    xs = [torch.randn(1, 8) + i for i in range(19)]
    reports = check_gpu(lambda *a: torch.cat(a) * 2.0, *xs)
    kernels = [k for r in reports for s in r.subgraphs for k in s.kernels]
    assert len(kernels) == -(-19 // (limit - 1)), kernels


def test_the_limit_comes_from_the_target_and_8_still_splits() -> None:
    """The device's storage-buffer limit reaches the pass through the target: a device with a
    high limit (NVIDIA's Vulkan driver) keeps the kernel whole, WebGPU's 8 still splits it."""
    from torchburn.codegen.target import gpu_target
    from torchburn.passes.base import PassManager

    p = pieces(11)  # 11 inputs and the output: 12 buffers
    at8 = PassManager([GpuSplitWide()], target=gpu_target(storage_buffers=8)).run(p)
    assert [len(k.params) for k in at8.kernels] == [8, 5]
    assert PassManager([GpuSplitWide()], target=gpu_target(storage_buffers=64)).run(p) is p
    # outside a pipeline the generic target plans for WebGPU's guarantee, 8
    assert [len(k.params) for k in GpuSplitWide().run(p).kernels] == [8, 5]
    # the option, when given, wins over the target
    out = PassManager([GpuSplitWide(max_buffers=4)], target=gpu_target(storage_buffers=64)).run(p)
    assert max(len(k.params) for k in out.kernels) == 4


def test_a_limit_below_one_buffer_is_refused() -> None:
    from torchburn.passes.base import PassError

    with pytest.raises(PassError, match="at least one buffer"):
        GpuSplitWide(max_buffers=-1).run(pieces(3))


def test_the_gpu_target_of_a_compile_carries_the_device_limit(gpu) -> None:  # noqa: F811
    """What the compile asks for is the device's limit (requested at the adapter's value)."""
    from unittest import mock

    from torchburn.backend import gpu_launcher

    dev = gpu.get_device()
    adapter_limit = dev.adapter.limits["max-storage-buffers-per-shader-stage"]
    assert dev.requested_limits["max-storage-buffers-per-shader-stage"] == adapter_limit
    assert dev.caps.max_storage_buffers == adapter_limit
    with mock.patch.object(gpu_launcher, "compile_graph", return_value=("compiled", False)) as cg:
        gpu_launcher.compile_graph_gpu(object())  # type: ignore[arg-type]
    assert cg.call_args.kwargs["target"].gpu_storage_buffers == adapter_limit
