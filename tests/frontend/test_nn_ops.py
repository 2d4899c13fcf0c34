"""Neural-network op coverage against eager: convolutions, pooling, norms, embedding,
gather/scatter/indexing, padding, sorting and scans, attention and losses; forward and,
where differentiable, gradients. Each case must compile with no fallback, in the forward and
in the backward graph.

Shapes are small: compilation dominates the time of these tests.
"""
from __future__ import annotations

import copy
import math
from typing import Any, Callable, Optional

import pytest
import torch
import torch.nn.functional as F

from torchburn.backend import report as rep
from tests.helpers import assert_fully_compiled, check


def _outputs(res: Any) -> tuple[torch.Tensor, ...]:
    return tuple(x for x in torch.utils._pytree.tree_leaves(res) if isinstance(x, torch.Tensor))


def check_grad(fn: Callable[..., Any], *args: Any, rtol: Optional[float] = None, atol: Optional[float] = None,
               dynamic: bool = False) -> None:
    """Outputs, and the gradients of every input that requires grad (for a random cotangent
    on every differentiable output), equal eager's; forward and backward graphs compile
    fully."""
    ref_args = [a.detach().clone().requires_grad_(a.requires_grad) if isinstance(a, torch.Tensor) else a
                for a in args]
    expected = _outputs(fn(*ref_args))
    g = torch.Generator().manual_seed(1)
    cotangents = [torch.randn(o.shape, generator=g, dtype=o.dtype) for o in expected if o.requires_grad]
    wrt = [a for a in ref_args if isinstance(a, torch.Tensor) and a.requires_grad]
    expected_grads = torch.autograd.grad([o for o in expected if o.requires_grad], wrt, cotangents)

    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        out = _outputs(torch.compile(fn, backend="torchburn", dynamic=dynamic, fullgraph=True)(*args))
        grads = torch.autograd.grad([o for o in out if o.requires_grad],
                                    [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad], cotangents)
    finally:
        rep.stop_recording()
    torch.testing.assert_close(out, expected, rtol=rtol, atol=atol, equal_nan=True)
    for i, (a, b) in enumerate(zip(grads, expected_grads)):
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"grad {i}: {m}")
    assert {r.kind for r in records} >= {"forward", "backward"}
    assert_fully_compiled(records)


def t(*shape: int, seed: int = 0, grad: bool = True, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed + 17 * len(shape) + sum(shape))
    return torch.randn(shape, generator=g, dtype=dtype).requires_grad_(grad)


def ints(high: int, *shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, high, shape, generator=torch.Generator().manual_seed(seed))


def perm_index(n: int, rows: int, k: int, seed: int = 0) -> torch.Tensor:
    """`rows` rows of `k` distinct indices below `n` (scatter without duplicates)."""
    g = torch.Generator().manual_seed(seed)
    return torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(rows)])


TOL = dict(rtol=1e-5, atol=1e-5)

# ---- convolution -----------------------------------------------------------------------------------

CONV: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "2d_stride_pad_bias": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1), (t(2, 3, 9, 7), t(4, 3, 3, 3), t(4))),
    "1d_groups_dilation": (lambda x, w: F.conv1d(x, w, padding=2, groups=3, dilation=2), (t(2, 3, 11), t(6, 1, 3))),
    "2d_same_even_kernel": (lambda x, w: F.conv2d(x, w, padding="same"), (t(1, 2, 6, 5), t(3, 2, 4, 2))),
    "2d_f64_asymmetric": (lambda x, w: F.conv2d(x, w, stride=(1, 2), padding=(1, 0)),
                          (t(2, 3, 6, 6, dtype=torch.float64), t(4, 3, 3, 2, dtype=torch.float64))),
    "transposed_2d": (lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
                      (t(2, 4, 4, 5), t(4, 3, 3, 3), t(3))),
    "transposed_1d_groups": (lambda x, w: F.conv_transpose1d(x, w, stride=3, padding=2, groups=2, dilation=2),
                             (t(2, 4, 5), t(4, 3, 3))),
    "3d": (lambda x, w: F.conv3d(x, w, padding=1), (t(1, 2, 4, 4, 3), t(3, 2, 3, 3, 3))),
    # Stride 1: the input gradient is a convolution with the flipped, per-group transposed weight.
    "2d_stride1_groups_dilation": (lambda x, w, b: F.conv2d(x, w, b, padding=(2, 1), dilation=(2, 1), groups=2),
                                   (t(2, 4, 7, 9), t(6, 2, 3, 3), t(6))),
    "2d_depthwise_stride1": (lambda x, w: F.conv2d(x, w, padding=1, groups=8), (t(2, 8, 6, 10), t(8, 1, 3, 3))),
    "transposed_stride1": (lambda x, w: F.conv_transpose2d(x, w, padding=1), (t(2, 4, 5, 6), t(4, 3, 3, 3))),
    # Strides > 1: the input gradient is one stride-1 convolution per phase (sub-kernel w[r::s]).
    "2d_stride3x2_groups_odd_sizes": (lambda x, w: F.conv2d(x, w, stride=(3, 2), padding=(1, 0), groups=2),
                                      (t(1, 4, 13, 12), t(8, 2, 3, 4))),
    "2d_stride2_kernel1_empty_phases": (lambda x, w: F.conv2d(x, w, stride=2), (t(2, 3, 9, 11), t(5, 3, 1, 1))),
    "2d_stride2_depthwise_k5": (lambda x, w: F.conv2d(x, w, stride=2, padding=2, groups=6),
                                (t(1, 6, 12, 10), t(6, 1, 5, 5))),
    "2d_stride_2x1_mixed": (lambda x, w: F.conv2d(x, w, stride=(2, 1), padding=1), (t(1, 4, 10, 9), t(4, 4, 3, 3))),
    "1d_stride5_k10": (lambda x, w: F.conv1d(x, w, stride=5), (t(2, 3, 41), t(5, 3, 10))),
    "1d_stride3_k4_pad2": (lambda x, w: F.conv1d(x, w, stride=3, padding=2), (t(2, 4, 33), t(4, 4, 4))),
    "1d_stride2_dilation2": (lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=2), (t(2, 3, 15), t(4, 3, 3))),
}


@pytest.mark.parametrize("case", sorted(CONV))
def test_convolution(case: str) -> None:
    fn, args = CONV[case]
    check_grad(fn, *args, **TOL)


def test_strided_input_gradient_is_one_convolution_per_phase() -> None:
    """The input gradient of a 3x3 stride-2 convolution: four stride-1 convolutions with the
    2x2, 2x1, 1x2 and 1x1 sub-kernels, on the gradient itself (nothing zero-inserted)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.importer import import_graph

    def bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return torch.ops.aten.convolution_backward(g, x, w, [8], [2, 2], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [True, True, True])

    gm = make_fx(bwd, tracing_mode="fake")(torch.randn(2, 8, 8, 8), torch.randn(2, 4, 16, 16), torch.randn(8, 4, 3, 3))
    graph = import_graph(gm)
    convs = [op for op in graph.ops if op.name == "conv"]
    assert sorted(tuple(int(d.value) for d in op.operands[1].type.shape[2:]) for op in convs) == [
        (1, 1), (1, 2), (2, 1), (2, 2)]
    for op in convs:
        assert op.operands[0] is graph.inputs[0]  # the gradient itself
        assert tuple(op.attrs["stride"]) == (1, 1)
    # the only padding is the weight gradient's im2col of the input
    assert all(op.operands[0] is graph.inputs[1] for op in graph.ops if op.name == "pad")


@pytest.mark.parametrize("shape, weight, stride, padding, dilation", [
    ((2, 4, 9, 8), (6, 4, 3, 3), 1, 1, 1),
    ((2, 4, 19, 18), (6, 4, 3, 2), 2, (1, 0), 1),
    ((3, 5, 12, 12), (4, 5, 3, 3), 1, 2, 2),
    ((2, 6, 100), (3, 6, 5), 3, 2, 1),
    ((1, 3, 5, 6, 7), (2, 3, 2, 3, 2), (1, 2, 1), 1, 1),
    ((1, 8, 4, 10, 12), (16, 8, 3, 3, 3), 1, 1, 1),  # the 3-D net's cube window (the GEMM reads `[C*T, P]` in place)
])
def test_weight_gradient_as_one_matrix_product(shape: tuple[int, ...], weight: tuple[int, ...], stride: Any,
                                               padding: Any, dilation: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ungrouped weight gradients are an im2col of the padded input and one matmul
    (`_grad_weight_gemm`): 1-D, 2-D and 3-D, strided, dilated, asymmetric kernels."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.lowerings import nn as nn_lowerings

    monkeypatch.setattr(nn_lowerings, "GEMM_GRAD_WEIGHT_MIN_MACS", 0)  # small sizes, the large layers' form
    monkeypatch.setattr(nn_lowerings, "GEMM_GRAD_WEIGHT_MIN_COUT", 0)

    from torchburn.frontend.importer import import_graph

    conv = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}[len(shape)]
    x, w = t(*shape, grad=False), t(*weight)
    check_grad(lambda a, b: conv(a, b, stride=stride, padding=padding, dilation=dilation), x, w, rtol=1e-4, atol=1e-4)
    out = conv(x, w.detach(), stride=stride, padding=padding, dilation=dilation)
    nsp = len(shape) - 2

    def spatial(v: Any) -> list[int]:
        return list(v) if isinstance(v, tuple) else [v] * nsp

    def bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return torch.ops.aten.convolution_backward(g, x, w, [w.shape[0]], spatial(stride), spatial(padding),
                                                   spatial(dilation), False, [0] * nsp, 1, [True, True, True])

    graph = import_graph(make_fx(bwd, tracing_mode="fake")(torch.randn(out.shape), x, w.detach()))
    assert [op.name for op in graph.ops if op.name in ("matmul", "conv_grad_weight")] == ["matmul"]
    # the columns keep the output's spatial dims (`[N, C, T, *O]`, flattened by a view after
    # them): their kernel runs along output rows, not through a div/mod of flat positions
    taps = math.prod(weight[2:])
    assert [op.result.type.rank for op in graph.ops
            if op.name == "concat" and op.attrs["dim"] == 2 and len(op.operands) == taps] == [3 + nsp]


@pytest.mark.parametrize("groups, min_macs, min_cout", [(2, 0, 0), (1, None, 0), (1, 0, None)],
                         ids=["grouped", "small", "few-output-channels"])
def test_weight_gradients_that_keep_their_kernel(groups: int, min_macs: Optional[int], min_cout: Optional[int],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Grouped weight gradients (at any size), small ones (under `GEMM_GRAD_WEIGHT_MIN_MACS`)
    and those of a 3x3 window with few output channels (under `GEMM_GRAD_WEIGHT_MIN_COUT`:
    the im2col would cost what the product saves) keep `conv_grad_weight`."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.importer import import_graph
    from torchburn.frontend.lowerings import nn as nn_lowerings

    if min_macs is not None:
        monkeypatch.setattr(nn_lowerings, "GEMM_GRAD_WEIGHT_MIN_MACS", min_macs)
    if min_cout is not None:
        monkeypatch.setattr(nn_lowerings, "GEMM_GRAD_WEIGHT_MIN_COUT", min_cout)

    def bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return torch.ops.aten.convolution_backward(g, x, w, [4], [1, 1], [1, 1], [1, 1], False, [0, 0], groups,
                                                   [True, True, True])

    graph = import_graph(make_fx(bwd, tracing_mode="fake")(torch.randn(2, 4, 8, 8), torch.randn(2, 4, 8, 8),
                                                           torch.randn(4, 4 // groups, 3, 3)))
    assert [op.name for op in graph.ops if op.name in ("matmul", "conv_grad_weight")] == ["conv_grad_weight"]


@pytest.mark.parametrize("width, form", [(32, "conv_grad_weight"), (64, "conv_grad_weight"), (28, "matmul"),
                                         (16, "matmul")])
def test_weight_gradient_over_rows_of_whole_vectors_keeps_its_kernel(width: int, form: str) -> None:
    """A 3x3 weight gradient with many output channels over rows of at least
    `DOT_GRAD_WEIGHT_MIN_WIDTH` positions, a multiple of `DOT_GRAD_WEIGHT_WIDTH_STEP`, keeps
    the dot-product kernel (faster than the columns and the product); rows of 28 or 16 take
    the product (the kernel pads them to whole vectors, but on two threads the product is
    faster there: `DOT_GRAD_WEIGHT_MIN_WIDTH`)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.importer import import_graph

    def bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return torch.ops.aten.convolution_backward(g, x, w, [64], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [True, True, True])

    graph = import_graph(make_fx(bwd, tracing_mode="fake")(torch.randn(1, 64, 24, width), torch.randn(1, 64, 24, width),
                                                           torch.randn(64, 64, 3, 3)))
    assert [op.name for op in graph.ops if op.name in ("matmul", "conv_grad_weight")] == [form]


def test_weight_gradient_of_a_7x7_feature_map_is_a_matrix_product() -> None:
    """ResNet's last stage at batch 1 (512 channels at 7x7: a reduction of 49 per weight
    element) takes the GEMM form: the dot-product kernel took 8x its time there."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.importer import import_graph

    def bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return torch.ops.aten.convolution_backward(g, x, w, [128], [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
                                                   [True, True, True])

    graph = import_graph(make_fx(bwd, tracing_mode="fake")(torch.randn(1, 128, 7, 7), torch.randn(1, 64, 7, 7),
                                                           torch.randn(128, 64, 3, 3)))
    assert [op.name for op in graph.ops if op.name in ("matmul", "conv_grad_weight")] == ["matmul"]


@pytest.mark.parametrize("shape, weight, stride, padding, output_padding, groups, form", [
    ((1, 16, 8, 8), (16, 8, 2, 2), 2, 0, 0, 1, "matmul"),          # the U-Net's 2x2/2 up-sampling
    ((2, 12, 5, 6), (12, 6, 4, 3), 2, 1, 1, 1, "matmul"),          # overlapping taps, output padding
    ((2, 8, 20), (8, 5, 3), 3, 1, 2, 1, "matmul"),                 # 1-D
    ((1, 8, 6, 6), (8, 3, 3, 3), 2, 1, 0, 2, "conv_grad_weight"),  # grouped: the dot-product kernel
])
def test_transposed_weight_gradient_as_one_matrix_product(shape: tuple[int, ...], weight: tuple[int, ...], stride: int,
                                                          padding: int, output_padding: int, groups: int, form: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The weight gradient of a transposed convolution is a convolution's with grad and input
    swapped (`gw[ci, co, *k] = sum x[n, ci, o] * g[n, co, o*s - p + k*d]`): the same GEMM form
    (`_grad_weight_gemm`, the grad's strided columns) where the convolution is ungrouped, the
    dot-product kernel otherwise; against eager, with output padding, 1-D and 2-D."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.importer import import_graph
    from torchburn.frontend.lowerings import nn as nn_lowerings

    monkeypatch.setattr(nn_lowerings, "GEMM_GRAD_WEIGHT_MIN_MACS", 0)  # small sizes, the large layers' form
    monkeypatch.setattr(nn_lowerings, "GEMM_GRAD_WEIGHT_MIN_COUT", 0)
    conv = {3: F.conv_transpose1d, 4: F.conv_transpose2d}[len(shape)]
    x, w = t(*shape), t(*weight)

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return conv(a, b, stride=stride, padding=padding, output_padding=output_padding, groups=groups)

    check_grad(fn, x, w, rtol=1e-4, atol=1e-4)
    out = fn(x.detach(), w.detach())
    nsp = len(shape) - 2

    def bwd(g: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> Any:
        return torch.ops.aten.convolution_backward(g, x, w, [g.shape[1]], [stride] * nsp, [padding] * nsp, [1] * nsp,
                                                   True, [output_padding] * nsp, groups, [True, True, True])

    graph = import_graph(make_fx(bwd, tracing_mode="fake")(torch.randn(out.shape), x.detach(), w.detach()))
    assert [op.name for op in graph.ops if op.name in ("matmul", "conv_grad_weight")] == [form]


def test_convolution_bf16_forward() -> None:
    x = t(1, 2, 5, 5, grad=False).bfloat16()
    w = t(3, 2, 3, 3, grad=False).bfloat16()
    check(lambda a, b: F.conv2d(a, b, padding=1), x, w, rtol=2e-2, atol=2e-2)


# ---- pooling ----------------------------------------------------------------------------------------

POOL: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "max_k3s2p1": (lambda x: F.max_pool2d(x, 3, 2, 1), (t(2, 3, 9, 7),)),
    "max_dilated_ceil_indices": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True, return_indices=True),
                                 (t(2, 2, 9, 8),)),
    "max_1d": (lambda x: F.max_pool1d(x, 3, 2, 1), (t(2, 3, 10),)),
    # ties: an input is the argmax of several overlapping windows, its gradient their sum
    "max_overlapping_ties": (lambda x: F.max_pool2d(x, 3, 1, 1),
                             ((t(2, 3, 6, 7, grad=False) * 0.6).round().requires_grad_(),)),
    "max_unbatched_ceil": (lambda x: F.max_pool2d(x, 3, 2, ceil_mode=True), (t(3, 8, 9),)),
    "avg_k3s2p1": (lambda x: F.avg_pool2d(x, 3, 2, 1), (t(2, 3, 9, 7),)),
    "avg_ceil_exclude_pad": (lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
                             (t(2, 3, 8, 7),)),
    "avg_divisor_override": (lambda x: F.avg_pool2d(x, 2, divisor_override=3), (t(1, 2, 6, 6),)),
    "avg_1d": (lambda x: F.avg_pool1d(x, 4, 3, 2), (t(2, 3, 11),)),
    "adaptive_avg_uneven": (lambda x: F.adaptive_avg_pool2d(x, (3, 5)), (t(2, 3, 8, 7),)),
    "adaptive_avg_upsample": (lambda x: F.adaptive_avg_pool2d(x, (5, 7)), (t(1, 2, 3, 4),)),
    "adaptive_avg_global": (lambda x: F.adaptive_avg_pool2d(x, 1), (t(2, 3, 5, 5),)),
    "adaptive_max_indices": (lambda x: F.adaptive_max_pool2d(x, (3, 2), return_indices=True), (t(2, 2, 7, 8),)),
    "3d_max_avg_adaptive": (lambda x: (F.max_pool3d(x, 2, 2, 1), F.avg_pool3d(x, 3, 2, 1, count_include_pad=False),
                                       F.adaptive_avg_pool3d(x, (2, 3, 2)), F.adaptive_max_pool3d(x, (2, 3, 2))),
                            (t(1, 2, 5, 4, 5),)),
}


@pytest.mark.parametrize("case", sorted(POOL))
def test_pooling(case: str) -> None:
    fn, args = POOL[case]
    check_grad(fn, *args, **TOL)


def test_max_pool_nan_and_inf_follow_eager() -> None:
    x = torch.randn(1, 2, 6, 6)
    x[0, 0, 1, 1] = float("nan")
    x[0, 1, :3, :3] = float("-inf")
    check(lambda a: F.max_pool2d(a, 3, 1, 1, return_indices=True), x)
    check(lambda a: F.adaptive_max_pool2d(a, 2, return_indices=True), x)


# ---- norms and variance -------------------------------------------------------------------------------

def test_batch_norm_training_updates_running_stats() -> None:
    torch.manual_seed(0)
    eager = torch.nn.BatchNorm2d(3, momentum=0.2)
    with torch.no_grad():
        eager.weight.uniform_(0.5, 1.5)
        eager.bias.uniform_(-0.5, 0.5)
    model = copy.deepcopy(eager)
    x = t(4, 3, 5, 5)
    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        out = torch.compile(model, backend="torchburn")(x)
        out.pow(2).sum().backward()
    finally:
        rep.stop_recording()
    expected = eager(x)
    expected.pow(2).sum().backward()
    torch.testing.assert_close(out, expected, **TOL)
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        torch.testing.assert_close(getattr(model, name), getattr(eager, name), msg=name)
    torch.testing.assert_close(model.weight.grad, eager.weight.grad, **TOL)
    torch.testing.assert_close(model.bias.grad, eager.bias.grad, **TOL)
    assert_fully_compiled(records)


NORMS: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "batch_norm_eval": (lambda x, w, b: F.batch_norm(x, torch.full((3,), 0.1), torch.full((3,), 2.0), w, b),
                        (t(4, 3, 5, 5), t(3), t(3))),
    "batch_norm_1d_no_affine": (lambda x: F.batch_norm(x, None, None, training=True), (t(6, 4),)),
    "group_norm": (lambda x, w, b: F.group_norm(x, 3, w, b), (t(2, 6, 4, 3), t(6), t(6))),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4, 5), w, b), (t(3, 4, 5), t(4, 5), t(4, 5))),
    "rms_norm": (lambda x, w: F.rms_norm(x, (8,), w, eps=1e-6), (t(3, 5, 8), t(8))),
    "var_std_corrections": (lambda x: (torch.var(x, 1), torch.std(x, (0, 2), keepdim=True),
                                       torch.var(x, correction=0)), (t(3, 4, 5),)),
    "var_mean": (lambda x: torch.var_mean(x, -1, correction=2), (t(4, 6),)),
}


@pytest.mark.parametrize("case", sorted(NORMS))
def test_norms(case: str) -> None:
    fn, args = NORMS[case]
    check_grad(fn, *args, **TOL)


# ---- embedding, gather, scatter, indexing --------------------------------------------------------------

INDEXING: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "embedding": (lambda i, w: F.embedding(i, w), (ints(10, 4, 5), t(10, 6))),
    "embedding_padding_idx": (lambda i, w: F.embedding(i, w, padding_idx=0),
                              (torch.tensor([[0, 1, 2], [2, 0, 3]]), t(5, 3))),
    "gather": (lambda x, i: torch.gather(x, 1, i), (t(4, 6), ints(6, 4, 3))),
    "gather_last_dim_3d": (lambda x, i: torch.gather(x, -1, i), (t(3, 4, 5), ints(5, 3, 4, 2))),
    "scatter_src": (lambda x, i, s: x.scatter(1, i, s), (t(4, 6), perm_index(6, 4, 3), t(4, 3))),
    "scatter_value": (lambda x, i: x.scatter(0, i, 1.5), (t(4, 3), perm_index(4, 3, 2).t())),
    "scatter_add_duplicates": (lambda x, i, s: x.scatter_add(0, i, s), (t(3, 4), ints(3, 6, 4), t(6, 4))),
    "index_rows_negative": (lambda x, i: x[i], (t(5, 4), torch.tensor([0, 2, -1, 2]))),
    "index_non_adjacent": (lambda x, i, j: x[i, :, j], (t(5, 4, 3), torch.tensor([0, 2, 4]), torch.tensor([1, 2, 0]))),
    "index_broadcast_middle": (lambda x, i, j: x[:, i, j], (t(2, 4, 3), torch.tensor([[0, 3], [1, 1]]),
                                                           torch.tensor([2, 0]))),
    "index_put_accumulate": (lambda x, i, v: x.index_put((i,), v, accumulate=True),
                             (t(5, 4), torch.tensor([0, 2, 0, 4]), t(4, 4))),
    "index_put_two_indices": (lambda x, i, j, v: torch.index_put(x, (i, j), v),
                              (t(5, 4), torch.tensor([0, 2, 4]), torch.tensor([1, 3, 0]), t(3))),
    "index_select": (lambda x, i: torch.index_select(x, 1, i), (t(5, 4), torch.tensor([0, 2, 3, 2]))),
    "select_slice_scatter": (lambda x, s: torch.select_scatter(x, s, 0, 1)
                             + torch.slice_scatter(x, x[:2] * 2, 0, 1, 5, 2), (t(6, 6), t(6))),
    "pad_constant": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), (t(2, 3, 4),)),
    "pad_negative_crops": (lambda x: F.pad(x, (-1, 2, 1, -2)), (t(3, 5, 6),)),
    "pad_reflect_replicate_circular": (lambda x: (F.pad(x, (1, 2, 2, 1), mode="reflect"),
                                                  F.pad(x, (1, 2, 3, 1), mode="replicate"),
                                                  F.pad(x, (2, 1, 0, 1), mode="circular")), (t(2, 3, 5, 4),)),
    "triu_tril": (lambda x: torch.triu(x, 1) + torch.tril(x, -1) * 2, (t(5, 6),)),
    "flip": (lambda x: torch.flip(x, (0, 2)) * 2, (t(3, 4, 5),)),
    "masked_fill": (lambda x, m: x.masked_fill(m, -1.0), (t(4, 6), torch.rand(4, 6) > 0.5)),
    "masked_scatter": (lambda x, m, s: x.masked_scatter(m, s), (t(4, 6), torch.rand(6) > 0.5, t(5, 6))),
    "index_reduce_amax": (lambda x, i, s: x.index_reduce(0, i, s, "amax", include_self=False),
                          (t(4, 3), torch.tensor([0, 2, 0, 1, 3]), t(5, 3))),
    "take_put": (lambda x, i, s: (torch.take(x, i), x.put(i, s, accumulate=True)),
                 (t(3, 4), torch.tensor([[0, 5], [11, -1]]), t(2, 2))),
}


@pytest.mark.parametrize("case", sorted(INDEXING))
def test_indexing(case: str) -> None:
    fn, args = INDEXING[case]
    check_grad(fn, *args)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin", "mean"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reduce(reduce: str, include_self: bool) -> None:
    x, src, idx = t(4, 5, grad=False), t(6, 5, grad=False), ints(4, 6, 5, seed=3)
    check(lambda a, i, s: a.scatter_reduce(0, i, s, reduce, include_self=include_self), x, idx, src, **TOL)


def test_bool_mask_index_put_is_a_where() -> None:
    # (Its gradient for the values, `grad[mask]`, has a data-dependent shape: PyTorch's.)
    x, mask = t(4, 6, grad=False), torch.tensor([True, False, True, True])
    check(lambda a, m, v: (a.index_put((m,), v, accumulate=True), a.masked_fill(m[:, None], 2.0),
                           torch.index_put(a, (m[:, None].expand(4, 6),), torch.tensor(-1.0))),
          x, mask, t(6, grad=False))


def test_scatter_add_integers_and_pad_integers() -> None:
    x = torch.arange(12).reshape(3, 4)
    check(lambda a, i: (a.scatter_add(1, i, a), F.pad(a, (1, 1), value=7)), x, ints(4, 3, 4))


# ---- sorting and scans --------------------------------------------------------------------------------

SORTING: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "sort_last_dim": (lambda x: torch.sort(x, dim=-1), (t(4, 7),)),
    "sort_descending_dim0": (lambda x: torch.sort(x, dim=0, descending=True), (t(6, 3),)),
    "topk_largest": (lambda x: torch.topk(x, 3), (t(4, 7),)),
    "topk_smallest_dim0": (lambda x: torch.topk(x, 2, dim=0, largest=False), (t(5, 4),)),
    "cumsum": (lambda x: torch.cumsum(x, 1), (t(4, 7),)),
    "cumprod": (lambda x: torch.cumprod(x, 0), (t(5, 3),)),
    "max_min_dim": (lambda x: (torch.max(x, 1), torch.min(x, 0, keepdim=True)), (t(4, 6),)),
    "logsumexp": (lambda x: torch.logsumexp(x, 1), (t(4, 6),)),
    "logcumsumexp": (lambda x: torch.logcumsumexp(x, 1), (t(4, 6),)),
    "cummax_cummin": (lambda x: (torch.cummax(x, 1), torch.cummin(x, 0)), (t(4, 6),)),
}


@pytest.mark.parametrize("case", sorted(SORTING))
def test_sorting(case: str) -> None:
    fn, args = SORTING[case]
    check_grad(fn, *args, **TOL)


def test_sort_nan_and_stable_ties() -> None:
    nan = float("nan")
    x = torch.tensor([[3.0, nan, 1.0, -2.0, 1.0], [nan, 0.0, 5.0, float("-inf"), nan]])
    check(lambda a: (torch.sort(a, 1), torch.sort(a, dim=1, descending=True, stable=True)), x)
    ties = torch.tensor([[3, 1, 3, 1, 2, 3], [0, 0, 0, 1, 1, 0]])
    check(lambda a: torch.sort(a, dim=1, stable=True), ties)
    # cummax/cummin keep the last index among equals; NaN takes over and stays.
    check(lambda a: (torch.cummax(a, 1), torch.cummin(a, 1), torch.cummax(ties, 1)), x)


def test_integer_and_bool_cumsum() -> None:
    check(lambda a: (torch.cumsum(a, 0), torch.cumsum(a > 0, 1)), torch.randint(-5, 5, (6, 3)))


# ---- attention -----------------------------------------------------------------------------------------

ATTENTION: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
               (t(2, 2, 5, 4), t(2, 2, 5, 4, seed=1), t(2, 2, 5, 4, seed=2))),
    "float_mask": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                   (t(2, 2, 5, 4), t(2, 2, 5, 4, seed=1), t(2, 2, 5, 4, seed=2), t(5, 5, grad=False))),
    "bool_mask_longer_keys_scale": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3),
                                    (t(1, 2, 4, 4), t(1, 2, 6, 4, seed=1), t(1, 2, 6, 4, seed=2),
                                     torch.tensor([[True, False, True, True, False, True]] * 4))),
    "grouped_query": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                      (t(1, 4, 5, 4), t(1, 2, 5, 4, seed=1), t(1, 2, 5, 4, seed=2))),
}


@pytest.mark.parametrize("case", sorted(ATTENTION))
def test_scaled_dot_product_attention(case: str) -> None:
    fn, args = ATTENTION[case]
    check_grad(fn, *args, **TOL)


# ---- losses -------------------------------------------------------------------------------------------

LOSSES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "cross_entropy_ignore_index": (lambda x, y: F.cross_entropy(x, y, ignore_index=1), (t(6, 5), ints(5, 6))),
    "cross_entropy_spatial_none": (lambda x, y: F.cross_entropy(x, y, reduction="none"), (t(2, 5, 3, 3), ints(5, 2, 3, 3))),
    "cross_entropy_weight_smoothing": (lambda x, y, w: F.cross_entropy(x, y, weight=w, label_smoothing=0.1),
                                       (t(4, 6), ints(6, 4), torch.rand(6))),
    "cross_entropy_probabilities": (lambda x, p: F.cross_entropy(x, p), (t(4, 6), torch.softmax(t(4, 6, grad=False), -1))),
    "nll_loss_sum": (lambda x, y: F.nll_loss(F.log_softmax(x, 1), y, reduction="sum"), (t(4, 6), ints(6, 4))),
    "mse": (lambda x, y: F.mse_loss(x, y), (t(4, 6), t(4, 6, grad=False, seed=1))),
    "smooth_l1": (lambda x, y: F.smooth_l1_loss(x, y, beta=0.5), (t(4, 6), t(4, 6, grad=False, seed=1))),
    "kl_div_batchmean": (lambda x, y: F.kl_div(F.log_softmax(x, 1), y, reduction="batchmean"),
                         (t(4, 6), torch.softmax(t(4, 6, grad=False, seed=1), 1))),
    "binary_cross_entropy": (lambda x, y: F.binary_cross_entropy(torch.sigmoid(x), y), (t(4, 6), torch.rand(4, 6))),
    "bce_with_logits_pos_weight": (lambda x, y, w: F.binary_cross_entropy_with_logits(x, y, pos_weight=w),
                                   (t(4, 6), torch.rand(4, 6), torch.rand(6) + 0.5)),
}


@pytest.mark.parametrize("case", sorted(LOSSES))
def test_losses(case: str) -> None:
    fn, args = LOSSES[case]
    check_grad(fn, *args, **TOL)


# ---- symbolic shapes ------------------------------------------------------------------------------------

def test_dynamic_shapes_reuse_one_compilation() -> None:
    def fn(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = F.conv2d(x, w, stride=2, padding=1)
        return (F.max_pool2d(y, 3, 2, 1, ceil_mode=True), F.adaptive_avg_pool2d(y, 3),
                torch.sort(x.flatten(1), 1)[0], torch.cumsum(x, 3))

    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        compiled = torch.compile(fn, backend="torchburn", dynamic=True)
        for shape in ((5, 2, 9, 7), (6, 2, 12, 10)):  # no size equal to another (duck sizing)
            x, w = t(*shape, grad=False), t(4, 2, 3, 3, grad=False)
            torch.testing.assert_close(compiled(x, w), fn(x, w), **TOL)
    finally:
        rep.stop_recording()
    assert len(records) == 1
    assert_fully_compiled(records)


# ---- the IR of the new op families ------------------------------------------------------------------

NEW_OPS_IR = """
graph @main(%x: f32[2, 3, 8, 8], %w: f32[4, 3, 3, 3], %i: i64[2, 5]) {
  %0 = conv(%x, %w) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[2, 4, 8, 8]
  %1 = pool(%0) {kind = "max", window = [2, 2], stride = [2, 2], padding = [0, 0], dilation = [1, 1], out_size = [4, 4], adaptive = false, count_include_pad = true, divisor_override = none} : f32[2, 4, 4, 4]
  %2 = reshape(%1) {shape = [2, 64]} : f32[2, 64]
  %3 = scatter(%2, %i, %2) {dim = 1, reduce = "add", include_self = true} : f32[2, 64]
  %4 = argsort(%3) {dim = 1, descending = false} : i64[2, 64]
  %5 = scan(%3) {dim = 1, kind = "add"} : f32[2, 64]
  %6 = gather(%3, %4) {dim = 1} : f32[2, 64]
  return %5, %6
}
"""


def test_new_ops_parse_print_and_lower() -> None:
    from torchburn.ir import parse_graph, print_ir, verify
    from torchburn.ir import loop as lp
    from torchburn.passes.base import get_pass

    graph = parse_graph(NEW_OPS_IR)
    verify(graph)
    assert print_ir(graph).strip() == NEW_OPS_IR.strip()
    program = get_pass("lower-to-loops")().run(get_pass("fuse")().run(graph))
    verify(program)
    # One kernel per root: conv, pool, scatter, argsort, scan, gather (the reshape is inlined).
    assert len(program.kernels) == 6
    scatter = program.kernels[2]
    # The scatter kernel copies its input, then updates through the index in a second nest.
    assert isinstance(scatter.body, lp.Block) and len(scatter.body.stmts) == 2
    assert all(isinstance(n, lp.For) for n in scatter.body.stmts)


@pytest.mark.parametrize("kind", ["lstm", "lstm_bidirectional_batch_first", "lstm_no_bias_given_state", "gru"])
def test_recurrent_layers_without_grad(kind: str) -> None:
    """Without grad, torch's `lstm` decomposition runs each layer as oneDNN's fused
    `mkldnn_rnn_layer` (decomposed here into the recurrence, once left to PyTorch); its zero
    initial state times W_hh is a GEMM with a constant operand (once an internal error)."""
    torch.manual_seed(0)
    bidirectional = kind == "lstm_bidirectional_batch_first"
    cls = torch.nn.GRU if kind == "gru" else torch.nn.LSTM
    rnn = cls(6, 5, num_layers=2, bias=kind != "lstm_no_bias_given_state", batch_first=bidirectional,
              bidirectional=bidirectional).eval()
    x = torch.randn((3, 4, 6) if bidirectional else (4, 3, 6))
    state = (torch.randn(2, 3, 5), torch.randn(2, 3, 5)) if kind == "lstm_no_bias_given_state" else None
    with torch.no_grad(), torch._dynamo.config.patch(allow_rnn=True):
        check(lambda x: rnn(x, state), x, **TOL)


@pytest.mark.parametrize("shape, weight, stride, padding, dilation", [
    ((2, 8, 12, 12), (16, 8, 1, 1), 2, 0, 1),
    ((2, 6, 7, 7), (5, 6, 3, 3), 1, 2, 2),
    ((2, 4, 9), (3, 4, 3), 2, 1, 1),
])
def test_convolution_in_gemm_form(shape: tuple[int, ...], weight: tuple[int, ...], stride: int, padding: int,
                                  dilation: int) -> None:
    """`node.meta[CONV_FORM] = "gemm"` (the tuner's choice) lowers a convolution as im2col and
    one batched matmul, with the bias added after; results equal eager's."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from torchburn.frontend.importer import import_graph
    from torchburn.frontend.lowerings.nn import CONV_FORM

    x, w, bias = t(*shape, grad=False), t(*weight, grad=False), t(weight[0], grad=False)
    nsp = len(shape) - 2

    def conv(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten.convolution(x, w, bias, [stride] * nsp, [padding] * nsp, [dilation] * nsp, False,
                                          [0] * nsp, 1)

    gm = make_fx(conv, tracing_mode="fake")(x, w, bias)
    for node in gm.graph.nodes:
        if node.target is torch.ops.aten.convolution.default:
            node.meta[CONV_FORM] = "gemm"
    graph = import_graph(gm)
    names = [op.name for op in graph.ops]
    assert "matmul" in names and "conv" not in names
    from torchburn.backend.launcher import Launcher
    from torchburn.backend.launcher_gen import launcher_spec
    from torchburn.compiler.driver import compile_graph

    compiled, _ = compile_graph(graph)
    launcher = Launcher(launcher_spec(graph, compiled.signature()), compiled.entry, gm.forward, keepalive=compiled)
    (got,) = launcher(x, w, bias)
    torch.testing.assert_close(got, conv(x, w, bias), rtol=1e-4, atol=1e-4)
