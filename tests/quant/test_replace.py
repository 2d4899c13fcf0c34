"""quantize_: in-place replacement of nn.Linear layers in a model."""
from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from torchburn.quant import QuantizedLinear, quantize_


def _mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Linear(128, 256), nn.GELU(), nn.Linear(256, 96), nn.GELU(), nn.Linear(96, 10)
    )


@pytest.mark.parametrize(
    "quant_type, group_size, bound",
    [("int8", None, 0.01), ("int4", 32, 0.12)],
)
def test_small_mlp_is_quantized_in_place_and_stays_accurate(quant_type, group_size, bound):
    model = _mlp()
    x = torch.randn(8, 128)
    with torch.no_grad():
        expected = model(x)
    report = quantize_(model, quant_type=quant_type, group_size=group_size)
    assert report.quantized == ["0", "2", "4"] and report.skipped == []
    assert all(isinstance(model[i], QuantizedLinear) for i in (0, 2, 4))
    with torch.no_grad():
        error = float((model(x) - expected).norm() / expected.norm())
    assert error < bound


def test_layers_the_group_size_does_not_divide_are_skipped_with_a_reason(caplog):
    model = _mlp()
    with caplog.at_level(logging.INFO, logger="torchburn.quant.replace"):
        report = quantize_(model, quant_type="int4", group_size=64)
    assert report.quantized == ["0", "2"]
    assert report.skipped == [("4", "group_size=64 does not divide in_features=96")]
    assert isinstance(model[4], nn.Linear) and not isinstance(model[4], QuantizedLinear)
    assert "skipped 4" in caplog.text and "skipped 4" in str(report)


def test_filter_fn_and_nested_names():
    model = nn.Sequential(nn.Sequential(nn.Linear(64, 64), nn.ReLU()), nn.Linear(64, 4))
    report = quantize_(model, "int8", filter_fn=lambda module, name: name != "1")
    assert report.quantized == ["0.0"] and report.skipped == []
    assert isinstance(model[0][0], QuantizedLinear) and type(model[1]) is nn.Linear


def test_shared_layer_stays_shared():
    shared = nn.Linear(64, 64)
    model = nn.ModuleDict({"a": shared, "b": nn.Sequential(shared)})
    quantize_(model, "int4", group_size=32)
    assert model["a"] is model["b"][0] and isinstance(model["a"], QuantizedLinear)


def test_multihead_attention_projection_is_left_alone():
    model = nn.Sequential(nn.MultiheadAttention(64, 4))
    report = quantize_(model, "int8")
    assert [name for name, _ in report.skipped] == ["0.out_proj"]
    assert "MultiheadAttention" in report.skipped[0][1]


def test_model_that_is_itself_a_linear_is_rejected():
    with pytest.raises(ValueError, match="from_float"):
        quantize_(nn.Linear(64, 8), "int8")


def test_quantized_model_state_dict_round_trip():
    model = _mlp()
    quantize_(model, "int4", group_size=32, symmetric=False)
    fresh = _mlp()
    quantize_(fresh, "int4", group_size=32, symmetric=False)
    torch.manual_seed(1)
    for module in fresh.modules():
        if isinstance(module, QuantizedLinear):
            module.packed.random_(0, 256)  # make sure the load overwrites something
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(2, 128)
    assert torch.equal(fresh(x), model(x))
