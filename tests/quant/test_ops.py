"""The custom ops: eager reference semantics, validation, fake/meta, autograd, torch.compile."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import torchburn.quant.kernels as kernels
from torchburn.quant import (
    dequantize_int4,
    dequantize_int8,
    quantize_weight_int4_grouped,
    quantize_weight_int8,
)

OUT, IN = 48, 128


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _int8(grouped: bool = False, scale_dtype: torch.dtype = torch.float32):
    w = torch.randn(OUT, IN, generator=_gen(1))
    return quantize_weight_int8(w, 32 if grouped else None, scale_dtype)


def _int4(symmetric: bool = True, group_size: int = 32, scale_dtype: torch.dtype = torch.float16):
    w = torch.randn(OUT, IN, generator=_gen(2))
    return quantize_weight_int4_grouped(w, group_size, symmetric, scale_dtype)


def _call_int8(x, weight, bias=None):
    return torch.ops.torchburn.linear_int8(x, weight.qweight, weight.scales, bias)


def _call_int4(x, weight, bias=None):
    return torch.ops.torchburn.linear_int4(
        x, weight.packed, weight.scales, weight.mins, bias, weight.group_size
    )


def _reference(x, w_f32, bias):
    b = None if bias is None else bias.float()
    return F.linear(x.float(), w_f32, b).to(x.dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("x_shape", [(IN,), (1, IN), (2, 3, IN)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_eager_equals_dequantize_then_linear(dtype, x_shape, with_bias):
    x = torch.randn(x_shape, generator=_gen(3)).to(dtype)
    bias = torch.randn(OUT, generator=_gen(4)).to(dtype) if with_bias else None
    tol = {"atol": 1e-4, "rtol": 1e-5} if dtype == torch.float32 else {}
    for weight, call, deq in [
        (_int8(), _call_int8, dequantize_int8),
        (_int8(grouped=True, scale_dtype=torch.float16), _call_int8, dequantize_int8),
        (_int4(symmetric=True), _call_int4, dequantize_int4),
        (_int4(symmetric=False, group_size=64, scale_dtype=torch.bfloat16), _call_int4,
         dequantize_int4),
    ]:
        out = call(x, weight, bias)
        assert out.dtype == dtype and out.shape == (*x_shape[:-1], OUT)
        torch.testing.assert_close(out, _reference(x, deq(weight), bias), **tol)


def test_slices_give_the_same_result_as_one_block(monkeypatch):
    x = torch.randn(5, IN, generator=_gen(5))
    weights = [(_int8(), _call_int8), (_int4(symmetric=False), _call_int4)]
    whole = [call(x, w) for w, call in weights]
    monkeypatch.setattr(kernels, "SLICE_ELEMENTS", IN * 7)  # 7 rows per slice, ragged end
    for (w, call), expected in zip(weights, whole, strict=True):
        torch.testing.assert_close(call(x, w), expected, atol=1e-5, rtol=1e-6)


def test_fake_tensors_and_meta_device():
    from torch._subclasses.fake_tensor import FakeTensorMode

    w4, w8 = _int4(symmetric=False), _int8(grouped=True)
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x = mode.from_tensor(torch.randn(2, 7, IN, dtype=torch.bfloat16))
        for out in (_call_int4(x, w4), _call_int8(x, w8)):
            assert out.shape == (2, 7, OUT) and out.dtype == torch.bfloat16
    meta = lambda t: None if t is None else t.to("meta")  # noqa: E731
    x = torch.empty(3, IN, device="meta")
    out = torch.ops.torchburn.linear_int4(
        x, meta(w4.packed), meta(w4.scales), meta(w4.mins), None, 32
    )
    assert out.device.type == "meta" and out.shape == (3, OUT)


# AOT dispatch is covered by the torch.compile tests below, at a fraction of opcheck's cost.
OPCHECK_UTILS = ("test_schema", "test_autograd_registration", "test_faketensor")


def test_opcheck():
    x = torch.randn(3, IN, generator=_gen(6), requires_grad=True)
    bias = torch.randn(OUT, generator=_gen(7), requires_grad=True)
    w8, w4 = _int8(), _int4(symmetric=False)
    torch.library.opcheck(torch.ops.torchburn.linear_int8.default,
                          (x, w8.qweight, w8.scales, bias), test_utils=OPCHECK_UTILS)
    torch.library.opcheck(torch.ops.torchburn.linear_int4.default,
                          (x, w4.packed, w4.scales, w4.mins, bias, 32),
                          test_utils=OPCHECK_UTILS)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_gradients_match_float_linear(kind):
    weight = _int8() if kind == "int8" else _int4()
    call = _call_int8 if kind == "int8" else _call_int4
    w_f32 = dequantize_int8(weight) if kind == "int8" else dequantize_int4(weight)
    x = torch.randn(4, IN, generator=_gen(8), requires_grad=True)
    bias = torch.randn(OUT, generator=_gen(9), requires_grad=True)
    grad = torch.randn(4, OUT, generator=_gen(10))
    call(x, weight, bias).backward(grad)
    x_ref, bias_ref = x.detach().clone().requires_grad_(), bias.detach().clone().requires_grad_()
    F.linear(x_ref, w_f32, bias_ref).backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad)
    torch.testing.assert_close(bias.grad, bias_ref.grad)


def _bad(kind: str, **changes):
    w8, w4 = _int8(), _int4(symmetric=False)
    args = dict(x=torch.randn(2, IN), bias=None)
    if kind == "int8":
        args.update(qweight=w8.qweight, scales=w8.scales)
        args.update(changes)
        return lambda: torch.ops.torchburn.linear_int8(**args)
    args.update(packed=w4.packed, scales=w4.scales, mins=w4.mins, group_size=32)
    args.update(changes)
    return lambda: torch.ops.torchburn.linear_int4(**args)


@pytest.mark.parametrize(
    "call, message",
    [
        (_bad("int8", x=torch.randn(2, IN + 1)), "in_features=128"),
        (_bad("int8", x=torch.ones(2, IN, dtype=torch.int64)), "x must be a floating-point"),
        (_bad("int8", qweight=torch.zeros(OUT, IN, dtype=torch.uint8)), "int8"),
        (_bad("int8", scales=torch.ones(OUT, 3)), "does not divide"),
        (_bad("int8", bias=torch.zeros(OUT + 1)), r"bias must have shape \[48\]"),
        (_bad("int4", group_size=48), "group_size=48 does not divide"),
        (_bad("int4", group_size=31), "positive even"),
        (_bad("int4", packed=torch.zeros(OUT, IN // 2, dtype=torch.int8)), "uint8"),
        (_bad("int4", scales=torch.ones(OUT, 4, dtype=torch.float64)), "scales must have dtype"),
        (_bad("int4", mins=torch.ones(OUT, 2, dtype=torch.float16)), r"mins must have shape"),
        (_bad("int4", x=torch.randn(2, IN // 2)), "in_features=128"),
    ],
)
def test_bad_operands_raise_value_error(call, message):
    with pytest.raises(ValueError, match=message):
        call()


class _Chain(torch.nn.Module):
    """int8, int4 (symmetric), int4 (asymmetric) in a row, with nothing else in the graph,
    so Inductor has no C++ kernel to build and the test stays fast."""

    def __init__(self) -> None:
        super().__init__()
        self.w8 = _int8(grouped=True)  # IN -> OUT
        self.back = quantize_weight_int4_grouped(torch.randn(IN, OUT, generator=_gen(11)), 16)
        self.w4 = _int4(symmetric=False)  # IN -> OUT
        self.bias = torch.randn(OUT, generator=_gen(12))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = _call_int8(x, self.w8, self.bias)
        y = _call_int4(y, self.back)
        return _call_int4(y, self.w4, self.bias)


# Inductor's own imports trip a torch.jit deprecation warning; not ours to fix.
@pytest.mark.filterwarnings("ignore:.*script_method.*:DeprecationWarning")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_torch_compile_fullgraph_matches_eager(backend):
    torch._dynamo.reset()
    model = _Chain()
    x = torch.randn(3, IN, generator=_gen(13))
    with torch.no_grad():
        expected = model(x)
        compiled = torch.compile(model, backend=backend, fullgraph=True)
        torch.testing.assert_close(compiled(x), expected)


def test_torch_compile_dynamic_batch_and_autograd():
    torch._dynamo.reset()
    model = _Chain()
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True, dynamic=True)
    for batch in (1, 5):
        x = torch.randn(batch, IN, generator=_gen(batch), requires_grad=True)
        out = compiled(x)
        torch.testing.assert_close(out, model(x))
        (grad,) = torch.autograd.grad(out.sum(), x)
        (expected,) = torch.autograd.grad(model(x).sum(), x)
        torch.testing.assert_close(grad, expected)
