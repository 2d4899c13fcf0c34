"""`gpu-inline-rows` on the GPU engine (llvmpipe in CI): a one-row RMSNorm or LayerNorm read by
a matrix-vector product is computed inside the product's kernel (one dispatch, not two), with
eager's numbers; where it must not be inlined (two readers, a row of many rows, the norm's
input overwritten in between) it stays a kernel of its own."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from tests.gpu.conftest import check_gpu


def _kernels(reports: list) -> list[str]:
    return [k for r in reports for s in r.subgraphs for k in s.kernels]


def _rms(x: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g


def _data(*shapes: tuple[int, ...], seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=gen) / (s[-1] ** 0.5 if len(s) > 1 else 1.0) for s in shapes]


def test_rms_norm_inside_the_product(gpu) -> None:  # type: ignore[no-untyped-def]
    def f(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _rms(x, g) @ w.t()

    x, g, w = _data((1, 96), (96,), (80, 96))
    reports = check_gpu(f, x * 3, g + 1, w, rtol=1e-4, atol=1e-5)
    assert len(_kernels(reports)) == 1, _kernels(reports)


def test_residual_norm_and_product_of_a_decoder_layer(gpu) -> None:  # type: ignore[no-untyped-def]
    """The residual add stays stored (the next layer reads it); the norm after it is inlined
    into each product, also through the reshape of `[1, 1, d]` rows."""
    def f(h, a, g1, w1, g2, w2):  # type: ignore[no-untyped-def]
        h = h + a
        y = _rms(h, g1) @ w1.t()
        return h + (_rms(h + y, g2) @ w2.t())

    h, a, g1, w1, g2, w2 = _data((1, 1, 64), (1, 1, 64), (64,), (64, 64), (64,), (64, 64), seed=1)
    reports = check_gpu(f, h, a, g1, w1, g2, w2, rtol=1e-4, atol=1e-5)
    assert len(_kernels(reports)) <= 3, _kernels(reports)


def test_layer_norm_inside_the_product(gpu) -> None:  # type: ignore[no-untyped-def]
    def f(x: torch.Tensor, g: torch.Tensor, b: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, (64,), g, b) @ w.t()

    x, g, b, w = _data((1, 64), (64,), (64,), (48, 64), seed=2)
    reports = check_gpu(f, x + 0.5, g, b, w, rtol=1e-4, atol=1e-5)
    assert len(_kernels(reports)) == 1, _kernels(reports)


def test_a_norm_with_two_readers_stays(gpu) -> None:  # type: ignore[no-untyped-def]
    def f(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        n = _rms(x, g)
        return n @ w.t(), n * 2

    x, g, w = _data((1, 64), (64,), (32, 64), seed=3)
    reports = check_gpu(f, x, g, w, rtol=1e-4, atol=1e-5)
    assert len(_kernels(reports)) == 3, _kernels(reports)


def test_many_rows_are_not_recomputed(gpu) -> None:  # type: ignore[no-untyped-def]
    """Eight rows: a norm kernel of its own, not one recomputed per output element."""
    def f(x: torch.Tensor, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return _rms(x, g) @ w.t()

    x, g, w = _data((8, 64), (64,), (32, 64), seed=4)
    reports = check_gpu(f, x, g, w, rtol=1e-4, atol=1e-5)
    assert len(_kernels(reports)) == 2, _kernels(reports)
