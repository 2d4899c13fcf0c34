"""Dynamic shapes: a model whose batch and sequence dims are symbolic compiles once and then
serves every size, with results equal to eager's."""
from __future__ import annotations

import copy
import math
from typing import Optional

import pytest

import torch
import torch.nn as nn

from tests.helpers import assert_fully_compiled, check, train_step_like_eager
from torchburn.backend import report as rep
from torchburn.backend.entry import torchburn_backend


class TinyAttention(nn.Module):
    """One attention-like block over [batch, seq, dim]: projections, scaled scores with a
    softmax over the sequence, a residual, layer norm, GELU, and a mean over the sequence."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = torch.matmul(q, k.transpose(1, 2)) / math.sqrt(self.dim)
        attn = torch.softmax(scores, dim=-1)
        h = self.norm(x + self.out(torch.matmul(attn, v)))
        h = torch.nn.functional.gelu(h)
        return h, h.mean(dim=1)


def test_symbolic_batch_and_sequence_compile_once() -> None:
    torch.manual_seed(0)
    model = TinyAttention().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=torchburn_backend, dynamic=True)
    records = rep.start_recording()
    try:
        with torch.no_grad():
            # 20 lengths. Batch and sequence sizes differ from the first call on, or Dynamo
            # would give them one symbol (and it specializes sizes 0 and 1).
            for i, seq in enumerate(range(5, 45, 2)):
                batch = 2 + i % 3
                x = torch.randn(batch, seq, 16)
                out = compiled(x)
                expected = model(x)
                torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-5)
    finally:
        rep.stop_recording()
    assert len(records) == 1, f"expected one compilation for 20 sequence lengths, got {len(records)}"
    assert_fully_compiled(records)


def test_slices_from_zero_keep_their_traced_length() -> None:
    """`x[:, 0:] * y[:, :x.shape[1]]` with dynamic shapes: both slices have length s0 (Dynamo
    guards s0 <= s1); clamped bounds (`min(s0, s1)`, `max(s0, min(0, s0)) - min(0, s0)`)
    made the broadcast fail with an internal error (transformers' Llama at a dynamic length)."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return x[:, 0:] * y[:, :x.shape[1]]

    for n in (5, 7):
        check(fn, torch.randn(3, n), torch.randn(3, n + 2), dynamic=True)


def _backward_kernel_forms(compiled: torch.nn.Module, model: nn.Module, x: torch.Tensor,
                           dynamic: tuple[int, ...] = ()) -> Optional[list[str]]:
    """Train one step of `compiled` on `x` (its dims `dynamic` marked so, as a second size of
    them makes them), check its output and gradients against eager's on a copy of `model`,
    and return the `gemm` / `conv` notes of the backward program's kernels (None when the step
    compiled nothing: a graph compiled before served it)."""
    from torchburn.backend.kernel_timing import capture_launchers

    eager = copy.deepcopy(model)
    xe = x.clone().requires_grad_()
    x = x.clone()
    for d in dynamic:
        torch._dynamo.mark_dynamic(x, d)
    x.requires_grad_()
    with capture_launchers() as made:
        out = compiled(x)
        out.square().sum().backward()
    want = eager(xe)
    want.square().sum().backward()
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x.grad, xe.grad, rtol=1e-4, atol=1e-4)
    for p, q in zip(model.parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-3)
    if not made:
        return None
    program = made[-1].keepalive.full_program()
    return [dict(k.attrs).get("gemm", "") or dict(k.attrs).get("conv", "") for k in program.kernels]


def test_a_symbolic_batch_keeps_the_convolution_gradient_kernels() -> None:
    """A symbolic batch is only a loop bound (or part of a product's reduction) for a
    convolution's weight gradient: it keeps the GEMM form (rows of 14: `_grad_weight_gemm`) and
    the dot-product kernel (rows of 32: `loopgen/conv_grad_weight.py`), not the per-element nest
    (465 ms against eager's 50 for ResNet's 256-channel layer at batch 4)."""
    for conv, size, form in ((nn.Conv2d(16, 64, 3, padding=1), 14, "mr="), (nn.Conv2d(16, 32, 3, padding=1), 32, "grad-weight")):
        torch.manual_seed(0)
        model = nn.Sequential(conv, nn.ReLU()).train()
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=torchburn_backend, options={"tune": "off"})
        for batch in (3, 5):
            for p in model.parameters():
                p.grad = None
            forms = _backward_kernel_forms(compiled, model, torch.randn(batch, 16, size, size), dynamic=(0,))
            if batch == 5:  # the graph of the symbolic batch serves it: nothing compiled
                assert forms is None
            else:
                assert forms is not None and any(f.startswith(form) for f in forms), forms


@pytest.mark.parametrize("norm", [nn.BatchNorm2d, nn.BatchNorm1d])
def test_batch_norm_training_at_a_symbolic_batch_stays_one_subgraph(norm: type) -> None:
    """Batch norm's running variance is corrected by `n / (n - 1)` and its backward divides
    by `n`: at a symbolic batch both are SymFloats (`frontend/symfloat_args.py` makes them 0-d
    float32 tensors), and `n` is read from the convolution's output (`sym_numel`, rebuilt from
    the inputs by `frontend/size_nodes.py`). Before, each such `mul` stayed in PyTorch and cut
    the forward and the backward into pieces. The running statistics, outputs and gradients
    equal eager's at every batch size."""
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1) if norm is nn.BatchNorm2d else nn.Conv1d(3, 8, 3, padding=1)
    model = nn.Sequential(conv, norm(8), nn.ReLU()).train()
    eager = copy.deepcopy(model)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=torchburn_backend, options={"tune": "off"})
    for batch in (4, 5, 7):
        shape = (batch, 3, 6, 6) if norm is nn.BatchNorm2d else (batch, 3, 10)
        records = train_step_like_eager(compiled, model, eager, torch.randn(shape))
        for a, b in zip(model.buffers(), eager.buffers()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        if batch == 5:  # the symbolic batch's forward and backward: whole
            assert len(records) == 2, records
            assert_fully_compiled(records)
            assert all(len(r.subgraphs) == 1 for r in records), [len(r.subgraphs) for r in records]
        if batch == 7:
            assert not records  # served by the symbolic graphs


DYNAMIC_CONVS = [  # (convolution, input channels, sizes tried): every stride / padding phase edge
    (nn.Conv1d(4, 8, 3, stride=2), 4, (23, 30, 41)),
    (nn.Conv1d(4, 8, 10, stride=5), 4, (57, 64, 81)),  # wav2vec2's first layer, smaller
    (nn.Conv1d(4, 8, 4, stride=3, padding=2), 4, (19, 20, 33)),
    (nn.Conv1d(16, 16, 3, padding=2, dilation=2, groups=2), 16, (17, 26, 31)),
    (nn.Conv1d(4, 8, 3, stride=2, padding=2, dilation=2), 4, (17, 26, 31)),  # the zero-inserted form
    (nn.Conv2d(4, 8, 3, stride=(2, 1), padding=(1, 2), dilation=(1, 2)), 4, (10, 13, 9)),  # zeros, not phases
    (nn.ConvTranspose2d(8, 8, 3, stride=2, padding=1, output_padding=1), 8, (9, 12, 7)),  # the phases
    (nn.ConvTranspose1d(4, 8, 3, dilation=2, output_padding=1), 4, (9, 13, 10)),  # output padding >= stride
    (nn.ConvTranspose1d(4, 8, 3, stride=2, dilation=3, output_padding=2), 4, (9, 13, 10)),  # the nest
    (nn.Conv2d(8, 16, 7, stride=2, padding=3), 8, (15, 18, 21)),  # a stem-like 7x7 s2
    (nn.Conv2d(4, 8, 3, stride=2, padding=1), 4, (9, 12, 15)),
    (nn.Conv2d(4, 8, 1, stride=2), 4, (9, 12, 15)),
    (nn.Conv2d(4, 8, 3, padding=1), 4, (7, 10, 13)),
    # the width form (depthwise, and fewer output channels than lanes) at a symbolic width:
    # rows narrower and wider than its planned tile
    (nn.Conv2d(8, 8, 3, padding=1, groups=8), 8, (6, 9, 3)),
    (nn.Conv1d(8, 8, 5, stride=2, padding=2, groups=8), 8, (20, 37, 7)),
    (nn.Conv1d(4, 2, 3), 4, (40, 75, 5)),
]


@pytest.mark.parametrize("case", range(len(DYNAMIC_CONVS)))
def test_convolution_gradients_at_symbolic_sizes(case: int) -> None:
    """Symbolic batch and spatial sizes (Dynamo's dynamic shapes, as variable-length audio
    gives them): the input gradient's phase form, the weight gradient's dot-product kernel and
    the forward kernel take the sizes as expressions, so the backward has as many kernels in a
    convolution form as at static sizes (none falls to the per-element nest: 30x slower), and
    every gradient matches eager's at every size the one compiled graph serves. Transposed
    convolutions take the same forms for their forward (an output padding of a stride or more,
    which PyTorch allows below the dilation, keeps the nest)."""
    conv, cin, sizes = DYNAMIC_CONVS[case]
    spatial = conv.weight.dim() - 2
    torch.manual_seed(case)
    model = nn.Sequential(copy.deepcopy(conv), nn.GELU()).train()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=torchburn_backend, options={"tune": "off"})
    static = _backward_kernel_forms(compiled, model, torch.randn(2, cin, *(sizes[0],) * spatial))
    assert static is not None
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=torchburn_backend, options={"tune": "off"})
    records = rep.start_recording()
    try:
        for batch, size in zip((2, 3, 4), sizes):
            for p in model.parameters():
                p.grad = None
            forms = _backward_kernel_forms(compiled, model, torch.randn(batch, cin, *(size,) * spatial),
                                           dynamic=tuple(range(2, 2 + spatial)))
            if batch == 4:  # the graph of the symbolic batch serves it: nothing compiled
                assert forms is None
                continue
            assert forms is not None and sum(map(bool, forms)) >= sum(map(bool, static)), (forms, static)
    finally:
        rep.stop_recording()
    assert not [s.name for r in records for s in r.internal_errors]
