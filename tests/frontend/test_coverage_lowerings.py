"""Lowerings added for operator coverage, checked on argument combinations OpInfo's first
samples may not reach (offsets, negative dims, empty results, dtypes)."""
from __future__ import annotations

from typing import Any, Optional

import pytest
import torch

from tests.helpers import assert_fully_compiled, check


@pytest.mark.parametrize("offset, dims", [(0, (0, 1)), (2, (0, 1)), (-1, (0, 1)), (1, (2, 0)), (-3, (1, 2)),
                                          (9, (0, 1))])
def test_diagonal_and_diagonal_scatter(offset: int, dims: tuple[int, int]) -> None:
    x = torch.randn(4, 5, 3)
    check(lambda t: torch.diagonal(t, offset, *dims) * 2, x)
    src = torch.diagonal(torch.randn(4, 5, 3), offset, *dims).clone().normal_()
    if src.numel():
        check(lambda t, s: torch.diagonal_scatter(t, s, offset, *dims), x, src)


@pytest.mark.parametrize("size, step, dim", [(2, 1, 0), (3, 2, 1), (1, 3, -1), (4, 4, 1)])
def test_unfold(size: int, step: int, dim: int) -> None:
    x = torch.randn(5, 7)
    check(lambda t: t.unfold(dim, size, step) + 1, x)


def test_repeat_split_unbind_narrow() -> None:
    x = torch.randn(3, 4)
    check(lambda t: t.repeat(2, 1, 3) * 1, x)
    check(lambda t: [p * 1 for p in torch.split(t, [1, 3], dim=1)], x)
    check(lambda t: [p * 1 for p in torch.unbind_copy(t, 0)], x)
    check(lambda t: torch.narrow_copy(t, 1, 1, 2), x)


@pytest.mark.parametrize("ord", [2, 1, 0, 3.5, float("inf"), float("-inf")])
def test_vector_norm(ord: float) -> None:
    x = torch.randn(6, 5)
    check(lambda t: torch.linalg.vector_norm(t, ord, dim=1), x, rtol=1e-5, atol=1e-5)
    check(lambda t: torch.linalg.vector_norm(t.half(), ord), x, rtol=2e-3, atol=1e-3)


def test_activations_and_nan_ignoring_extremes() -> None:
    x = torch.randn(64) * 4
    x[3] = float("nan")
    check(torch.nn.functional.elu, x)
    check(lambda t: torch.nn.functional.selu(t) + torch.nn.functional.celu(t, 0.5), x)
    check(lambda t: torch.nn.functional.leaky_relu(t, 0.2), x)
    check(lambda t: torch.nn.functional.hardtanh(t, -2.0, 3.0), x)
    check(lambda t: torch.nn.functional.hardtanh(t.long(), -2, 3), x.nan_to_num())
    y = torch.randn(64)
    y[5] = float("nan")
    check(torch.fmax, x, y)
    check(torch.fmin, x, y)


def test_frexp_ldexp_angle() -> None:
    x = torch.cat([torch.randn(50) * 1e3, torch.tensor([0.0, -0.0, float("inf"), float("nan"), 1e-40])])
    check(torch.frexp, x)
    check(lambda t: torch.ldexp(t, torch.arange(55) % 7 - 3), x)
    check(torch.angle, x)
    check(torch.angle, torch.arange(-3, 3))


def test_addmv_addbmm_bilinear_distances() -> None:
    check(lambda b, m, v: torch.addmv(b, m, v, beta=0.5, alpha=2), torch.randn(4), torch.randn(4, 3), torch.randn(3),
          rtol=1e-5, atol=1e-5)
    check(lambda b, x, y: torch.addbmm(b, x, y), torch.randn(3, 5), torch.randn(2, 3, 4), torch.randn(2, 4, 5),
          rtol=1e-5, atol=1e-5)
    lin = torch.nn.Bilinear(3, 4, 5)
    check(lambda a, c: lin(a, c), torch.randn(6, 3), torch.randn(6, 4), rtol=1e-5, atol=1e-5)
    for p in (1.0, 2.0, 0.0, float("inf")):
        check(lambda a, c: torch.cdist(a, c, p=p), torch.randn(2, 5, 3), torch.randn(2, 4, 3), rtol=1e-5, atol=1e-5)
    check(lambda a: torch.nn.functional.pdist(a), torch.randn(5, 3), rtol=1e-5, atol=1e-5)


def test_histc() -> None:
    x = torch.randn(1000)
    x[3] = float("nan")
    check(lambda t: torch.histc(t, bins=10, min=-1, max=1), x)
    check(lambda t: torch.histc(t, bins=7), torch.randn(100))
    check(lambda t: torch.histc(t, bins=7), torch.ones(10))
    check(lambda t: torch.histc(t, bins=4, min=0, max=3), torch.tensor([0.0, 1.0, 2.0, 3.0, 3.0, -1.0, 4.0]))


def test_histogram_and_histogramdd() -> None:
    x = torch.randn(200)
    check(lambda t: torch.histogram(t, bins=9), x)
    check(lambda t: torch.histogram(t, bins=5, range=(-1.0, 1.0), density=True), x)
    check(lambda t, w: torch.histogram(t, bins=torch.tensor([-2.0, -0.5, 0.0, 3.0]), weight=w), x, torch.rand(200))
    pts = torch.randn(50, 2)
    check(lambda t: torch.histogramdd(t, bins=[3, 4]), pts)
    check(lambda t: torch.histogramdd(t, bins=[torch.linspace(-2, 2, 5), torch.tensor([-1.0, 0.0, 1.0])],
                                      density=True), pts)


def test_median_kthvalue_with_nan_and_ties() -> None:
    x = torch.tensor([[3.0, float("nan"), 1.0, float("nan"), 2.0], [2.0, 1.0, 2.0, 3.0, 1.0]])
    check(torch.median, x)
    check(lambda t: torch.median(t, 1), x)
    check(lambda t: torch.nanmedian(t, 1, keepdim=True), x)
    check(lambda t: torch.kthvalue(t, 4, 1), x)
    check(lambda t: torch.kthvalue(t, 2, 0), torch.randn(5, 3))


@pytest.mark.parametrize("right", [False, True])
def test_searchsorted_and_bucketize(right: bool) -> None:
    seq = torch.tensor([1.0, 2.0, 2.0, 4.0])
    vals = torch.tensor([[0.5, 2.0, 2.5], [4.0, 9.0, float("nan")]])
    check(lambda s, v: torch.searchsorted(s, v, right=right), seq, vals)
    check(lambda s, v: torch.searchsorted(s, v, side="right" if right else "left", out_int32=True),
          torch.sort(torch.randn(2, 6))[0], torch.randn(2, 3))
    check(lambda v, s: torch.bucketize(v, s, right=right), vals, seq)


def test_mode_and_nonzero_static() -> None:
    check(lambda t: torch.mode(t, 1), torch.tensor([[3, 1, 3, 1, 2], [2, 2, 5, 5, 5]]))
    check(lambda t: torch.mode(t, 0, keepdim=True), torch.randint(0, 3, (7, 4)).float())
    x = torch.tensor([[0.0, 1.5, 0.0], [2.0, 0.0, 3.0]])
    check(lambda t: torch.nonzero_static(t, size=5, fill_value=-7), x)
    check(lambda t: torch.nonzero_static(t, size=2), x)


@pytest.mark.parametrize("mode", ["bilinear", "nearest"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [False, True])
def test_grid_sample_3d(mode: str, padding: str, align: bool) -> None:
    x = torch.randn(2, 3, 4, 5, 6)
    grid = torch.rand(2, 3, 2, 4, 3) * 2.6 - 1.3  # some points outside the volume
    check(lambda t, g: torch.nn.functional.grid_sample(t, g, mode=mode, padding_mode=padding, align_corners=align),
          x, grid)


def test_grid_sample_2d_bicubic() -> None:
    check(lambda t, g: torch.nn.functional.grid_sample(t, g, mode="bicubic", align_corners=False),
          torch.randn(2, 3, 6, 7), torch.rand(2, 4, 5, 2) * 2.4 - 1.2)


@pytest.mark.parametrize("size, align", [((5, 9), False), ((20, 6), True), ((12, 17), False)])
def test_upsample_bilinear_antialias(size: tuple[int, int], align: bool) -> None:
    x = torch.randn(2, 3, 12, 17) * 5
    check(lambda t: torch.nn.functional.interpolate(t, size=size, mode="bilinear", antialias=True,
                                                    align_corners=align), x)
    # (eager has no bfloat16 kernel for antialiased resizing; float64 is the other dtype it takes)
    check(lambda t: torch.nn.functional.interpolate(t, size=size, mode="bilinear", antialias=True),
          x.to(torch.float64))


def test_as_strided_scatter_and_tri_indices() -> None:
    x = torch.randn(4, 5)
    check(lambda t, s: torch.as_strided_scatter(t, s, (2, 2), (5, 1), 3), x, torch.randn(2, 2))
    check(lambda t, s: torch.as_strided_scatter(t * 2, s, (3,), (6,)), x, torch.randn(3))
    check(lambda t, s: torch.as_strided_scatter(t, s, (2, 3), (1, 2)), x.long(), torch.arange(6).reshape(2, 3))
    check(lambda: torch.tril_indices(0, 3))
    check(lambda: torch.triu_indices(4, 3, 1) + torch.tril_indices(3, 4, -1)[:, :4])


def test_merge_sort_is_stable_with_nan_and_long_rows() -> None:
    x = torch.randn(3, 300)
    x[0, ::7] = float("nan")
    x[1, :150] = 0.5  # long runs of ties keep their order
    check(lambda t: torch.sort(t, stable=True), x)
    check(lambda t: torch.sort(t * 2, dim=1, descending=True, stable=True), x)
    check(lambda t: torch.sort(t, dim=0, stable=True), x)
    check(lambda t: torch.argsort(t, dim=-1, stable=True), torch.randint(0, 4, (2, 3, 1000)))
    check(lambda t: torch.sort(t, stable=True), torch.randint(0, 2, (777,)).bool())
    check(lambda t: torch.topk(t, 7, dim=0), torch.randn(129, 3))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_reductions_that_fold_to_their_input_after_a_cache_hit(dtype: torch.dtype) -> None:
    """A reduction of a 0-d half tensor over dim 0 is `cast(cast(x))`, which the passes fold
    to `x`: the program computes nothing and returns its input. `sum` and `amax` import to the
    same graph, so the second compiles from the cache without the passes: its launcher must
    read what the program returns, not the imported graph."""
    x = torch.randn((), dtype=dtype)
    check(lambda t: torch.amax(t, 0, keepdim=True), x)
    check(lambda t: torch.sum(t, -1), x)
    check(lambda t: torch.amin(t, (0,)), x)
    check(lambda t: (torch.sum(t, 0), torch.amax(t, -1), t * 2), x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8, torch.bool])
def test_integer_copysign_signbit_any(dtype: torch.dtype) -> None:
    """`copysign` of integers is a float32 tensor; `signbit` of an integer is `x < 0`; `any`
    and `all` of uint8 stay uint8."""
    if dtype is torch.bool:
        x, y = torch.rand(4, 5) > 0.5, torch.rand(4, 5) > 0.5
    else:
        lo = 0 if dtype is torch.uint8 else -9
        x, y = torch.randint(lo, 9, (4, 5), dtype=dtype), torch.randint(lo, 9, (4, 5), dtype=dtype)
    check(lambda a, b: torch.copysign(a, b), x, y)
    check(lambda a: torch.copysign(a, -2.5), x)
    check(lambda a: torch.signbit(a), x)
    check(lambda a: (torch.any(a), torch.all(a, 1), torch.any(a, 0, keepdim=True)), x)


@pytest.mark.parametrize("reduce", ["sum", "prod", "amax", "amin"])
@pytest.mark.parametrize("include_self", [True, False])
def test_scatter_reductions_of_bools(reduce: str, include_self: bool) -> None:
    """Bools reduce as or (sum, amax) and and (prod, amin), with repeated indices."""
    x = torch.rand(4, 6) > 0.5
    src = torch.rand(4, 6) > 0.5
    index = torch.randint(0, 6, (4, 6))
    check(lambda t, i, s: torch.scatter_reduce(t, 1, i, s, reduce, include_self=include_self), x, index, src)
    check(lambda t, i, s: torch.scatter_add(t, 1, i, s), x, index, src)


def test_index_put_accumulate_on_bools() -> None:
    x = torch.rand(5, 3) > 0.5
    vals = torch.rand(7, 3) > 0.5
    rows = torch.tensor([0, 2, 2, 4, 0, 0, 1])
    check(lambda t, i, v: torch.index_put(t, (i,), v, accumulate=True), x, rows, vals)
    check(lambda t, i, v: torch.index_add(t, 0, i, v), x, rows, vals)
    mask = torch.tensor([True, False, True, False, True])
    check(lambda t, m: torch.index_put(t, (m,), torch.tensor(True), accumulate=True), x, mask)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_item_returned_as_a_tensor_is_compiled(dtype: torch.dtype) -> None:
    """`t.item()` reads the value into Python and makes a tensor of it again; the pair folds
    to a conversion of `t` (frontend/item_fold.py), so nothing falls back."""
    x = torch.randn(1, 1, dtype=dtype)
    out = check(lambda t: t.item(), x)
    assert isinstance(out, float)
    check(lambda t: (t * 3).sum().item(), x)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8])
def test_gcd_lcm_on_every_8_bit_pair(dtype: torch.dtype) -> None:
    """Every pair of the dtype, its minimum included: the fixed number of Euclid steps is
    enough, and the wrapping matches PyTorch's."""
    info = torch.iinfo(dtype)
    values = torch.arange(info.min, info.max + 1, dtype=torch.int64).to(dtype)
    x, y = values.repeat_interleave(len(values)), values.repeat(len(values))
    check(lambda a, b: (torch.gcd(a, b), torch.lcm(a, b)), x, y)


@pytest.mark.parametrize("dtype", [torch.int16, torch.int32, torch.int64])
def test_gcd_lcm_wide_integers(dtype: torch.dtype) -> None:
    info = torch.iinfo(dtype)
    fib = [1, 2]
    while fib[-1] + fib[-2] <= info.max:
        fib.append(fib[-1] + fib[-2])
    # consecutive Fibonacci numbers take the most steps; the extremes and zeros test the edges
    x = torch.tensor([fib[-1], fib[-2], info.min, info.max, 0, 0, -12, 35, info.min, 7], dtype=dtype)
    y = torch.tensor([fib[-2], fib[-1], 6, info.min, 0, -9, 18, -14, 0, info.max], dtype=dtype)
    x = torch.cat([x, torch.randint(info.min, info.max, (200,), dtype=dtype)])
    y = torch.cat([y, torch.randint(-1000, 1000, (200,), dtype=dtype)])
    check(lambda a, b: (torch.gcd(a, b), torch.lcm(a, b)), x, y)
    check(lambda a, b: torch.gcd(a.view(-1, 1)[:10], b[:10]), x, y)


def _bags(include_last_offset: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Indices with an empty bag in the middle, a repeated row and padding candidates (row 4)."""
    indices = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 4, 4])
    offsets = torch.tensor([0, 4, 4, 6, 8] + ([10] if include_last_offset else []))
    return indices, offsets


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("padding_idx", [-1, 4])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_all_four_results(dtype: torch.dtype, mode: int, padding_idx: int,
                                        include_last_offset: bool) -> None:
    # offset2bag, bag_size and max_indices as eager's CPU kernel fills them for the mode; the
    # last bag (two padding rows when padding_idx=4) is empty of counted rows
    weight = torch.randn(10, 3).to(dtype)
    indices, offsets = _bags(include_last_offset)
    aten = torch.ops.aten
    check(lambda w, i, o: aten._embedding_bag(w, i, o, False, mode, False, None, include_last_offset, padding_idx),
          weight, indices, offsets)
    if not include_last_offset:  # forward_only's meta gives bag_size one entry per offset
        check(lambda w, i, o: aten._embedding_bag_forward_only(w, i, o, False, mode, False, None, False,
                                                               padding_idx), weight, indices, offsets)


@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_forward_only_with_last_offset(include_last_offset: bool) -> None:
    weight = torch.randn(10, 3)
    indices, offsets = _bags(include_last_offset)
    for mode in (0, 1, 2):
        expected = torch.ops.aten._embedding_bag_forward_only(weight, indices, offsets, False, mode, False, None,
                                                              include_last_offset, 4)
        got = check(lambda w, i, o: torch.ops.aten._embedding_bag_forward_only(
            w, i, o, False, mode, False, None, include_last_offset, 4)[:2], weight, indices, offsets)
        bags = got[0].shape[0]
        compiled = torch.compile(lambda w, i, o: torch.ops.aten._embedding_bag_forward_only(
            w, i, o, False, mode, False, None, include_last_offset, 4)[2:], backend="torchburn", fullgraph=True)
        bag_size, max_indices = compiled(weight, indices, offsets)
        # where eager's shapes differ from the meta's, the bags' entries still agree
        torch.testing.assert_close(bag_size[:bags], expected[2][:bags])
        torch.testing.assert_close(max_indices[:bags], expected[3][:bags])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_per_sample_weights(dtype: torch.dtype, include_last_offset: bool) -> None:
    weight = torch.randn(10, 4).to(dtype)
    indices, offsets = _bags(include_last_offset)
    psw = torch.randn(indices.shape[0]).to(dtype)
    for padding_idx in (None, 4):
        check(lambda w, i, o, p: torch.nn.functional.embedding_bag(
            i, w, o, mode="sum", per_sample_weights=p, include_last_offset=include_last_offset,
            padding_idx=padding_idx), weight, indices, offsets, psw)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_2d_input_and_max_norm(mode: str) -> None:
    weight = torch.randn(12, 5) * 3
    bags = torch.tensor([[0, 3, 3, 11], [7, 2, 0, 5], [4, 4, 4, 4]])
    check(lambda w, i: torch.nn.functional.embedding_bag(i, w, mode=mode, padding_idx=4), weight, bags)
    check(lambda w, i: torch.nn.functional.embedding_bag(i, w, mode=mode, max_norm=2.0), weight.clone(), bags)


def test_embedding_bag_all_bags_empty_and_ties() -> None:
    # equal rows tie in max mode: the first of them is the one eager reports
    weight = torch.zeros(6, 2)
    weight[3] = 1.0
    weight[5] = 1.0
    aten = torch.ops.aten
    check(lambda w, i, o: aten._embedding_bag(w, i, o, False, 2, False, None, False, -1),
          weight, torch.tensor([5, 1, 3, 0]), torch.tensor([0, 0, 3]))
    for mode in (0, 1, 2):
        check(lambda w, i, o: aten._embedding_bag(w, i, o, False, mode, False, None, False, -1),
              weight, torch.zeros(0, dtype=torch.int64), torch.tensor([0, 0, 0]))


def _grads(fn: Any, *args: torch.Tensor) -> tuple[list[torch.Tensor], list[Any]]:
    """Gradients of `(fn(*args) * r).sum()` for a fixed random `r` (eager when `fn` is
    uncompiled), w.r.t. the float arguments that require grad."""
    from torchburn.backend import report as rep

    wrt = [a for a in args if a.requires_grad]
    records = rep.start_recording()
    try:
        out = fn(*args)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(2), dtype=out.dtype)
        grads = list(torch.autograd.grad((out * cot).sum(), wrt))
    finally:
        rep.stop_recording()
    return grads, list(records)


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 4])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_backward(mode: str, padding_idx: Optional[int], include_last_offset: bool) -> None:
    """The weight's gradient (and the per-sample weights', in sum mode) compiles in the backward
    graph (`_embedding_bag_backward` was left to PyTorch) and equals eager's: empty bags, a
    repeated index, padding rows. With `scale_grad_by_freq` the backward stays with PyTorch
    (its kernel's scaling is not the documented one, see the decomposition) and still equals
    eager's (max mode refuses it)."""
    indices, offsets = _bags(include_last_offset)
    for freq in (False,) if mode == "max" else (False, True):
        def fn(w: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.embedding_bag(indices, w, offsets, mode=mode, scale_grad_by_freq=freq,
                                                     include_last_offset=include_last_offset,
                                                     padding_idx=padding_idx,
                                                     per_sample_weights=p if mode == "sum" else None)

        weight = torch.randn(10, 3, requires_grad=True)
        psw = torch.randn(indices.shape[0], requires_grad=mode == "sum")
        args = (weight, psw) if mode == "sum" else (weight, psw.detach())
        expected, _ = _grads(fn, *args)
        torch._dynamo.reset()
        got, records = _grads(torch.compile(fn, backend="torchburn", fullgraph=True), *args)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b)
        assert {r.kind for r in records} >= {"forward", "backward"}
        if freq:
            assert [op for r in records for op in r.fallback_ops] == ["aten._embedding_bag_backward.default"]
        else:
            assert_fully_compiled(records)


@pytest.mark.parametrize("dim", [0, 2, -1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weight_norm_backward(dim: int, dtype: torch.dtype) -> None:
    """`w = g * v / ||v||` (`torch._weight_norm`, which `nn.utils.weight_norm` and its
    parametrization call): the gradients of `v` and `g` compile (`_weight_norm_interface_backward`
    was left to PyTorch) and equal eager's; dims 0 and last take the fused interface, -1 (the
    norm of the whole tensor) torch's own decomposition."""
    v = torch.randn(6, 4, 5, dtype=dtype, requires_grad=True)
    g = torch.randn([6, 1, 1] if dim == 0 else [1, 1, 5] if dim == 2 else [], dtype=dtype).requires_grad_()

    def fn(v: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        return torch._weight_norm(v, g, dim) * 2

    expected, _ = _grads(fn, v, g)
    torch._dynamo.reset()
    got, records = _grads(torch.compile(fn, backend="torchburn", fullgraph=True), v, g)
    tol = dict(rtol=1.6e-2, atol=1e-2) if dtype == torch.bfloat16 else {}
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, **tol)
    assert {r.kind for r in records} >= {"forward", "backward"}
    assert_fully_compiled(records)


@pytest.mark.parametrize("p", [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, float("inf")])
def test_cdist_backward(p: float) -> None:
    """Both inputs' gradients of `torch.cdist` compile (`_cdist_backward` was left to PyTorch)
    and equal eager's, a zero distance (a row of `x1` repeated in `x2`) and a zero difference
    in one coordinate included."""
    x1 = torch.randn(2, 5, 3)
    x2 = torch.randn(2, 4, 3)
    x2[:, 1] = x1[:, 2]
    x2[:, 3, 0] = x1[:, 0, 0]
    x1.requires_grad_()
    x2.requires_grad_()

    def fn(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.cdist(a, b, p=p)

    expected, _ = _grads(fn, x1, x2)
    torch._dynamo.reset()
    got, records = _grads(torch.compile(fn, backend="torchburn", fullgraph=True), x1, x2)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert {r.kind for r in records} >= {"forward", "backward"}
    assert_fully_compiled(records)
