"""Lowerings added for operator coverage, checked on argument combinations OpInfo's first
samples may not reach (offsets, negative dims, empty results, dtypes)."""
from __future__ import annotations

import pytest
import torch

from tests.helpers import check


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
