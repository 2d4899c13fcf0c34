"""QuantizedLinear: construction, accuracy against nn.Linear, state_dict round trips."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from torchburn.quant import (
    Int4Weight,
    Int8Weight,
    QuantizedLinear,
    dequantize_int4,
    quantize_weight_int4_grouped,
)

CONFIGS = [
    dict(quant_type="int8"),
    dict(quant_type="int8", group_size=32, scale_dtype=torch.float16),
    dict(quant_type="int4"),
    dict(quant_type="int4", group_size=32, symmetric=False),
    dict(quant_type="int4", group_size=128, scale_dtype=torch.bfloat16),
]


def _linear(in_features: int = 256, out_features: int = 96, bias: bool = True) -> nn.Linear:
    torch.manual_seed(0)
    return nn.Linear(in_features, out_features, bias=bias)


@pytest.mark.parametrize("config", CONFIGS)
def test_state_dict_round_trip_into_a_fresh_module(config):
    source = QuantizedLinear.from_float(_linear(), **config)
    state = source.state_dict()
    fresh = QuantizedLinear(256, 96, bias=True, **config)
    assert set(fresh.state_dict()) == set(state)
    fresh.load_state_dict(state)
    for name, tensor in source.state_dict().items():
        assert fresh.state_dict()[name].dtype == tensor.dtype
        assert torch.equal(fresh.state_dict()[name], tensor), name
    x = torch.randn(4, 256)
    assert torch.equal(fresh(x), source(x))


def test_state_dict_keys_describe_the_format():
    assert set(QuantizedLinear(64, 8, quant_type="int8").state_dict()) == {
        "qweight", "scales", "bias"}
    assert set(QuantizedLinear(64, 8, bias=False, quant_type="int4", group_size=32,
                               symmetric=False).state_dict()) == {"packed", "scales", "mins"}


def test_loading_a_different_config_fails_loudly():
    state = QuantizedLinear.from_float(_linear(), "int4", group_size=64).state_dict()
    with pytest.raises(RuntimeError, match="size mismatch"):
        QuantizedLinear(256, 96, quant_type="int4", group_size=32).load_state_dict(state)
    with pytest.raises(RuntimeError, match="Missing key"):
        QuantizedLinear(256, 96, quant_type="int4", symmetric=False).load_state_dict(state)
    with pytest.raises(RuntimeError, match="Unexpected key"):
        QuantizedLinear(256, 96, quant_type="int8").load_state_dict(state, strict=True)


@pytest.mark.parametrize(
    "config, bound",
    [
        (dict(quant_type="int8"), 0.01),
        (dict(quant_type="int4", group_size=32), 0.10),
        (dict(quant_type="int4", group_size=32, symmetric=False), 0.10),
        (dict(quant_type="int4", group_size=64), 0.11),
    ],
)
def test_output_close_to_float_linear(config, bound):
    linear = _linear(1024, 256)
    layer = QuantizedLinear.from_float(linear, **config)
    x = torch.randn(16, 1024)
    with torch.no_grad():
        expected = linear(x)
        error = float((layer(x) - expected).norm() / expected.norm())
    assert error < bound


def test_bfloat16_activations_and_bias_dtype():
    linear = _linear().to(torch.bfloat16)
    layer = QuantizedLinear.from_float(linear, "int4")
    assert layer.bias.dtype == torch.bfloat16
    x = torch.randn(2, 256, dtype=torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 96)


def test_from_weight_shares_tensors_and_exposes_them():
    weight = quantize_weight_int4_grouped(torch.randn(16, 64), 32, symmetric=False)
    layer = QuantizedLinear.from_weight(weight)
    assert layer.bias is None and layer.packed is weight.packed
    back = layer.quantized_weight()
    assert isinstance(back, Int4Weight) and back.group_size == 32 and not back.symmetric
    assert torch.equal(dequantize_int4(back), dequantize_int4(weight))
    int8 = QuantizedLinear.from_float(_linear(), "int8").quantized_weight()
    assert isinstance(int8, Int8Weight) and int8.per_channel
    assert all(t.device.type == "cpu" for t in layer.state_dict().values())


def test_module_dtype_conversion_keeps_scales_exact():
    layer = QuantizedLinear.from_float(_linear(), "int4", group_size=32, symmetric=False)
    scales, mins = layer.scales.clone(), layer.mins.clone()
    layer.to(torch.bfloat16)
    assert layer.bias.dtype == torch.bfloat16
    assert layer.scales.dtype == layer.mins.dtype == torch.float32
    assert torch.equal(layer.scales, scales) and torch.equal(layer.mins, mins)
    layer.half()
    assert layer.scales.dtype == torch.float32 and layer.bias.dtype == torch.float16
    meta = QuantizedLinear(64, 8, quant_type="int8").to("meta", torch.float16)
    assert meta.scales.device.type == "meta" and meta.scales.dtype == torch.float32


def test_repr_names_the_configuration():
    text = repr(QuantizedLinear(64, 8, quant_type="int4", group_size=32, symmetric=False))
    assert "quant_type=int4" in text and "group_size=32" in text and "symmetric=False" in text


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: QuantizedLinear.from_float(_linear(96, 8), "int4", group_size=64),
         "group_size=64 does not divide in_features=96"),
        (lambda: QuantizedLinear.from_float(_linear(33, 8), "int4", group_size=33), "odd"),
        (lambda: QuantizedLinear.from_float(_linear(), "int2"), "quant_type"),
        (lambda: QuantizedLinear.from_float(_linear(), "int8", symmetric=False), "symmetric"),
        (lambda: QuantizedLinear.from_float(nn.Conv1d(2, 2, 1), "int8"), "nn.Linear"),
        (lambda: QuantizedLinear.from_weight(torch.zeros(2, 2)), "Int8Weight, Int4Weight or BlockWeight"),
        (lambda: QuantizedLinear(64, 8, scale_dtype=torch.float64), "scale_dtype"),
    ],
)
def test_bad_configuration_raises_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()
