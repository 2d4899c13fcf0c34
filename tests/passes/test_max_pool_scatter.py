"""`max-pool-grad-to-scatter` (`passes/tensor/max_pool_scatter.py`): max pooling's input
gradient as a scatter to the argmaxes on the CPU, left as `pool_grad` on the GPU."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify
from torchburn.passes.pipeline import Pipeline
from torchburn.passes.tensor.max_pool_scatter import MaxPoolScatter

BEFORE = """graph @main(%g: f32[2, 3, 4, 4], %i: i64[2, 3, 4, 4], %a: f32[2, 3, 2, 2]) {
  %0 = pool_grad(%g, %i) {kind = "max", window = [3, 3], stride = [2, 2], padding = [1, 1], dilation = [1, 1], in_size = [8, 8], adaptive = false, count_include_pad = true, divisor_override = none} : f32[2, 3, 8, 8]
  %1 = pool_grad(%a) {kind = "avg", window = [2, 2], stride = [2, 2], padding = [0, 0], dilation = [1, 1], in_size = [4, 4], adaptive = false, count_include_pad = true, divisor_override = none} : f32[2, 3, 4, 4]
  return %0, %1
}"""


def test_max_gradients_become_scatters_and_average_ones_stay() -> None:
    g = MaxPoolScatter().run(parse_graph(BEFORE))
    verify(g)
    ops = [op.name for op in g.ops]
    assert ops.count("pool_grad") == 1 and ops.count("scatter") == 1
    scatter = next(op for op in g.ops if op.name == "scatter")
    assert scatter.attrs["dim"] == 2 and scatter.attrs["reduce"] == "add"
    assert "scatter(" in print_ir(g) and ": f32[2, 3, 64]" in print_ir(g)
    assert "f32[2, 3, 8, 8]" in print_ir(g)


def test_in_the_cpu_pipeline_not_the_gpu_one() -> None:
    from torchburn.passes.gpu.pipeline import gpu_pipeline

    cpu = [p.name for p in Pipeline.default().tensor]
    assert cpu.index("max-pool-grad-to-scatter") < cpu.index("fuse")
    assert "max-pool-grad-to-scatter" not in [p.name for p in gpu_pipeline(Pipeline.default()).tensor]


def test_scatter_gradient_equals_eager_bit_for_bit() -> None:
    """Ties between overlapping windows (a constant input) sum in eager's order."""
    x = torch.zeros(2, 4, 9, 9).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    torch._dynamo.reset()
    y = torch.compile(lambda a: F.max_pool2d(a, 3, 1, 1), backend="torchburn")(x)
    cot = torch.randn(y.shape, generator=torch.Generator().manual_seed(0))
    y.backward(cot)
    F.max_pool2d(x2, 3, 1, 1).backward(cot)
    assert torch.equal(x.grad, x2.grad)
