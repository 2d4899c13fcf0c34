"""Layouts: nibble order, pack/unpack, validation of Int8Weight/Int4Weight, dequantization."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchburn.quant import (
    Int4Weight,
    Int8Weight,
    dequantize_int4,
    dequantize_int8,
    pack_int4,
    unpack_int4,
)


def test_nibble_order_is_group_halves():
    # One row, one group of 4: elements 0,1 in the low nibbles, 2,3 in the high nibbles.
    q = torch.tensor([[1, 2, 3, 4]], dtype=torch.uint8)
    packed = pack_int4(q, group_size=4)
    assert packed.tolist() == [[1 | (3 << 4), 2 | (4 << 4)]]
    # Two groups of 2: each group is packed on its own.
    assert pack_int4(q, group_size=2).tolist() == [[1 | (2 << 4), 3 | (4 << 4)]]


def test_group_32_matches_ggml_order():
    q = torch.arange(32, dtype=torch.uint8).remainder(16).reshape(1, 32)
    packed = pack_int4(q, group_size=32)
    for j in range(16):
        byte = int(packed[0, j])
        assert byte & 0xF == int(q[0, j])
        assert byte >> 4 == int(q[0, j + 16])


@settings(max_examples=40, deadline=None)
@given(
    out_features=st.integers(1, 5),
    n_groups=st.integers(1, 4),
    half_group=st.sampled_from([1, 2, 16, 32, 64]),
    seed=st.integers(0, 2**31 - 1),
)
def test_pack_unpack_round_trip(out_features, n_groups, half_group, seed):
    group_size = 2 * half_group
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_features, n_groups * group_size), dtype=torch.uint8,
                      generator=gen)
    packed = pack_int4(q, group_size)
    assert packed.shape == (out_features, n_groups * group_size // 2)
    assert torch.equal(unpack_int4(packed, group_size), q)


def test_pack_rejects_out_of_range_codes():
    with pytest.raises(ValueError, match=r"\[0, 15\]"):
        pack_int4(torch.full((1, 4), 16, dtype=torch.uint8), 4)


def test_dequantize_int4_formulas():
    q = torch.tensor([[0, 15, 8, 3]], dtype=torch.uint8)
    packed = pack_int4(q, 4)
    scales = torch.tensor([[0.5]], dtype=torch.float16)
    sym = dequantize_int4(Int4Weight(packed, scales, None, 4))
    assert sym.dtype == torch.float32
    assert sym.tolist() == [[-4.0, 3.5, 0.0, -2.5]]
    mins = torch.tensor([[-1.0]], dtype=torch.float16)
    asym = dequantize_int4(Int4Weight(packed, scales, mins, 4))
    assert asym.tolist() == [[-1.0, 6.5, 3.0, 0.5]]


def test_dequantize_int8_per_channel_and_grouped():
    qweight = torch.tensor([[1, -2, 3, -128]], dtype=torch.int8)
    per_channel = dequantize_int8(Int8Weight(qweight, torch.tensor([0.5])))
    assert per_channel.tolist() == [[0.5, -1.0, 1.5, -64.0]]
    grouped = Int8Weight(qweight, torch.tensor([[1.0, 2.0]], dtype=torch.bfloat16))
    assert grouped.group_size == 2 and not grouped.per_channel
    assert dequantize_int8(grouped).tolist() == [[1.0, -2.0, 6.0, -256.0]]


def test_non_contiguous_operands_dequantize_like_contiguous():
    gen = torch.Generator().manual_seed(0)
    packed = torch.randint(0, 256, (8, 32), dtype=torch.uint8, generator=gen)
    scales = torch.randn(8, 2, generator=gen)
    ref = dequantize_int4(Int4Weight(packed, scales, None, 32))
    wide = torch.zeros(8, 64, dtype=torch.uint8)
    wide[:, ::2] = packed
    strided = dequantize_int4(Int4Weight(wide[:, ::2], scales, None, 32))
    assert torch.equal(ref, strided)


I8 = torch.zeros(2, 4, dtype=torch.int8)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: Int8Weight(torch.zeros(2, 4), torch.ones(2)), "qweight must have dtype int8"),
        (lambda: Int8Weight(torch.zeros(4, dtype=torch.int8), torch.ones(2)), "2-D"),
        (lambda: Int8Weight(torch.zeros(2, 4, dtype=torch.int8), torch.ones(3)), r"shape \[2\]"),
        (lambda: Int8Weight(I8, torch.ones(2, 3)), "does not divide"),
        (lambda: Int8Weight(I8, torch.ones(2, dtype=torch.float64)), "scales must have dtype"),
        (lambda: Int4Weight(torch.zeros(2, 4, dtype=torch.int8), torch.ones(2, 1), None, 8),
         "packed must have dtype uint8"),
        (lambda: Int4Weight(torch.zeros(2, 4, dtype=torch.uint8), torch.ones(2, 1), None, 3),
         "positive even integer"),
        (lambda: Int4Weight(torch.zeros(2, 5, dtype=torch.uint8), torch.ones(2, 1), None, 4),
         "does not divide in_features=10"),
        (lambda: Int4Weight(torch.zeros(2, 4, dtype=torch.uint8), torch.ones(2, 2), None, 8),
         r"scales must have shape \[2, 1\]"),
        (lambda: Int4Weight(torch.zeros(2, 4, dtype=torch.uint8), torch.ones(2, 1),
                            torch.ones(2, 1, dtype=torch.float16), 8),
         "mins must have the dtype of scales"),
    ],
)
def test_invalid_layouts_raise_value_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_results_unpack_like_the_seed_readme():
    """`packed, scales = quantize_weight_int4_grouped(w)` (the seed's example), with the
    attributes kept; asymmetric adds the minimums; INT8 gives (qweight, scales)."""
    from torchburn.quant import quantize_weight_int4_grouped, quantize_weight_int8

    w = torch.randn(8, 128)
    sym = quantize_weight_int4_grouped(w, group_size=64)
    packed, scales = sym
    assert packed is sym.packed and scales is sym.scales and len(sym) == 2
    assert sym[0] is sym.packed and sym.group_size == 64
    asym = quantize_weight_int4_grouped(w, group_size=64, symmetric=False)
    packed, scales, mins = asym
    assert mins is asym.mins and len(asym) == 3
    with pytest.raises(ValueError):
        packed, scales = asym  # three parts: the minimums are not dropped silently
    q8 = quantize_weight_int8(w)
    qweight, scales = q8
    assert qweight is q8.qweight and scales is q8.scales and tuple(q8) == (q8.qweight, q8.scales)
