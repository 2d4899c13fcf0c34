"""Quantizers: error bounds per element (hypothesis), accuracy on Gaussian weights, bad input.

Accuracy bounds (relative Frobenius error ||deq(quant(W)) - W|| / ||W||, W ~ N(0, 1) of shape
[256, 1024]; the figures measured when writing this are in docs/quantization.md):

=============================  =========  ========
format                         measured   bound
=============================  =========  ========
int8 per channel               ~0.8%      1%
int8 group 32                  ~0.5%      1%
int4 symmetric,  group 32      ~8.6%      10%
int4 asymmetric, group 32      ~7.9%      10%
int4 symmetric,  group 128     ~10.5%     12%
=============================  =========  ========
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchburn.quant import (
    dequantize_int4,
    dequantize_int8,
    quantize_weight_int4_grouped,
    quantize_weight_int8,
    unpack_int4,
)


def _rel_error(approx: torch.Tensor, exact: torch.Tensor) -> float:
    return float((approx - exact).norm() / exact.norm())


def _weights(seed: int, out_features: int, in_features: int, scale: float) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(out_features, in_features, generator=gen) * scale


shapes = st.tuples(st.integers(1, 6), st.integers(1, 4), st.sampled_from([32, 64, 128]))
seeds = st.integers(0, 2**31 - 1)
magnitudes = st.sampled_from([1e-3, 1.0, 300.0])
scale_dtypes = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=seeds, magnitude=magnitudes, scale_dtype=scale_dtypes,
       grouped=st.booleans())
def test_int8_error_is_at_most_half_a_step(shape, seed, magnitude, scale_dtype, grouped):
    out_features, n_groups, group_size = shape
    w = _weights(seed, out_features, n_groups * group_size, magnitude)
    q = quantize_weight_int8(w, group_size if grouped else None, scale_dtype)
    assert q.qweight.dtype == torch.int8 and q.qweight.shape == w.shape
    assert q.scales.dtype == scale_dtype
    assert q.scales.shape == ((out_features, n_groups) if grouped else (out_features,))
    assert int(q.qweight.abs().max()) <= 127
    deq = dequantize_int8(q)
    step = q.scales.float().abs().reshape(out_features, -1, 1)
    err = (deq - w).abs().reshape(out_features, step.shape[1], -1)
    # Half a step, plus slack for the stored scale being rounded (bf16: 2^-8 relative).
    assert bool((err <= step * 0.5 + step * 127 * 2**-7 + 1e-30).all())


@settings(max_examples=40, deadline=None)
@given(shape=shapes, seed=seeds, magnitude=magnitudes, scale_dtype=scale_dtypes,
       symmetric=st.booleans())
def test_int4_error_is_bounded_by_the_step(shape, seed, magnitude, scale_dtype, symmetric):
    out_features, n_groups, group_size = shape
    w = _weights(seed, out_features, n_groups * group_size, magnitude)
    q = quantize_weight_int4_grouped(w, group_size, symmetric, scale_dtype)
    assert q.packed.shape == (out_features, n_groups * group_size // 2)
    assert q.scales.shape == (out_features, n_groups) and q.scales.dtype == scale_dtype
    assert (q.mins is None) == symmetric
    deq = dequantize_int4(q).reshape(out_features, n_groups, group_size)
    step = q.scales.float().abs()[..., None]
    err = (deq - w.reshape(deq.shape)).abs()
    # Symmetric: half a step, except the element opposite the extreme, clipped by one step.
    # Asymmetric: half a step.  Both plus slack for rounded scales/mins (bf16).
    groups = w.reshape(deq.shape)
    span = groups.abs().amax(-1, keepdim=True) if symmetric else (
        groups.amax(-1, keepdim=True) - groups.amin(-1, keepdim=True))
    allowed = step * (1.0 if symmetric else 0.5) + span * 2**-6 + 1e-30
    assert bool((err <= allowed).all())
    if symmetric:
        # The element of largest magnitude is represented exactly up to scale rounding.
        index = groups.abs().argmax(-1, keepdim=True)
        codes = unpack_int4(q.packed, group_size).reshape(deq.shape)
        assert bool((torch.gather(codes, -1, index) == 0).all())


def test_values_on_the_grid_are_reproduced_exactly():
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(-127, 128, (4, 64), generator=gen)
    codes[:, 0] = 127  # pin absmax, so the quantizer finds scale 2^-3 again
    w = codes.float() * 0.125
    assert torch.equal(dequantize_int8(quantize_weight_int8(w)), w)
    codes4 = torch.randint(0, 16, (4, 64), generator=gen)
    codes4[:, ::32] = 0  # each group's extreme is -8 * scale
    w4 = (codes4.float() - 8) * -0.25
    assert torch.equal(dequantize_int4(quantize_weight_int4_grouped(w4, 32)), w4)


def test_zero_weights_stay_zero():
    w = torch.zeros(3, 64)
    assert torch.equal(dequantize_int8(quantize_weight_int8(w)), w)
    for symmetric in (True, False):
        assert torch.equal(dequantize_int4(quantize_weight_int4_grouped(w, 32, symmetric)), w)


@pytest.mark.parametrize(
    "quantize, bound",
    [
        (lambda w: dequantize_int8(quantize_weight_int8(w)), 0.01),
        (lambda w: dequantize_int8(quantize_weight_int8(w, 32)), 0.01),
        (lambda w: dequantize_int8(quantize_weight_int8(w, scale_dtype=torch.float16)), 0.01),
        (lambda w: dequantize_int4(quantize_weight_int4_grouped(w, 32, True)), 0.10),
        (lambda w: dequantize_int4(quantize_weight_int4_grouped(w, 32, False)), 0.10),
        (lambda w: dequantize_int4(quantize_weight_int4_grouped(w, 64, True)), 0.11),
        (lambda w: dequantize_int4(quantize_weight_int4_grouped(w, 128, True)), 0.12),
        (lambda w: dequantize_int4(quantize_weight_int4_grouped(w, 128, False)), 0.12),
    ],
)
def test_relative_error_on_gaussian_weights(quantize, bound):
    w = _weights(0, 256, 1024, 0.02)
    assert _rel_error(quantize(w), w) < bound


def test_accepts_half_precision_input():
    w = _weights(2, 8, 64, 1.0)
    for dtype in (torch.float16, torch.bfloat16):
        assert _rel_error(dequantize_int8(quantize_weight_int8(w.to(dtype))), w) < 0.02
        assert _rel_error(dequantize_int4(quantize_weight_int4_grouped(w.to(dtype), 32)), w) < 0.15


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: quantize_weight_int8(torch.ones(4, 6, dtype=torch.int32)), "floating-point"),
        (lambda: quantize_weight_int8(torch.ones(8)), "2-D"),
        (lambda: quantize_weight_int8(torch.tensor([[1.0, float("nan")]])), "NaN"),
        (lambda: quantize_weight_int8(torch.ones(2, 48), group_size=32), "does not divide"),
        (lambda: quantize_weight_int8(torch.full((2, 4), 1e7), scale_dtype=torch.float16),
         "overflow"),
        (lambda: quantize_weight_int8(torch.ones(2, 4), scale_dtype=torch.float64), "scale_dtype"),
        (lambda: quantize_weight_int4_grouped(torch.ones(2, 63), 32), "odd"),
        (lambda: quantize_weight_int4_grouped(torch.ones(2, 96), 64), "does not divide"),
        (lambda: quantize_weight_int4_grouped(torch.ones(2, 96), 0), "positive even"),
    ],
)
def test_bad_input_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
