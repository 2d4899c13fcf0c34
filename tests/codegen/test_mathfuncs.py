"""Every unary function of the IR against torch, for float and integer dtypes."""
from __future__ import annotations

import pytest
import torch

from torchburn.ir.expr import UNARY_FUNCS

from .util import TORCH_DTYPES, dt, elementwise, ex

PREDICATES = {"isnan", "isinf", "isfinite", "signbit"}

#: torch reference and an input range (low, high) per function.
REFERENCE = {
    "neg": (torch.neg, (-10, 10)), "abs": (torch.abs, (-10, 10)), "exp": (torch.exp, (-20, 20)),
    "exp2": (torch.exp2, (-20, 20)), "expm1": (torch.expm1, (-3, 3)), "log": (torch.log, (0.01, 100)),
    "log2": (torch.log2, (0.01, 100)), "log10": (torch.log10, (0.01, 100)), "log1p": (torch.log1p, (-0.9, 10)),
    "sqrt": (torch.sqrt, (0, 100)), "rsqrt": (torch.rsqrt, (0.01, 100)), "sin": (torch.sin, (-10, 10)),
    "cos": (torch.cos, (-10, 10)), "tan": (torch.tan, (-1.5, 1.5)), "asin": (torch.asin, (-1, 1)),
    "acos": (torch.acos, (-1, 1)), "atan": (torch.atan, (-10, 10)), "sinh": (torch.sinh, (-5, 5)),
    "cosh": (torch.cosh, (-5, 5)), "tanh": (torch.tanh, (-10, 10)), "asinh": (torch.asinh, (-10, 10)),
    "acosh": (torch.acosh, (1, 10)), "atanh": (torch.atanh, (-0.99, 0.99)), "erf": (torch.erf, (-3, 3)),
    "erfc": (torch.erfc, (-3, 3)), "erfinv": (torch.erfinv, (-0.999, 0.999)),
    "sigmoid": (torch.sigmoid, (-20, 20)), "floor": (torch.floor, (-10, 10)), "ceil": (torch.ceil, (-10, 10)),
    "round": (torch.round, (-10, 10)), "trunc": (torch.trunc, (-10, 10)), "sign": (torch.sign, (-3, 3)),
    "reciprocal": (torch.reciprocal, (0.1, 10)), "isnan": (torch.isnan, (-1, 1)),
    "isinf": (torch.isinf, (-1, 1)), "isfinite": (torch.isfinite, (-1, 1)),
    "lgamma": (torch.lgamma, (0.1, 10)), "digamma": (torch.digamma, (-5, 10)),
    "signbit": (torch.signbit, (-1, 1)),
}
FLOAT_FUNCS = sorted(REFERENCE)
SPECIALS = torch.tensor([0.0, -0.0, float("inf"), float("-inf"), float("nan"), 0.5, -0.5, 1.5, 2.5, -2.5])


def test_table_covers_every_function() -> None:
    assert set(REFERENCE) | {"not"} == set(UNARY_FUNCS)


def _inputs(name: str, tdt: torch.dtype) -> torch.Tensor:
    lo, hi = REFERENCE[name][1]
    x = torch.linspace(lo, hi, 97, dtype=torch.float64)
    if name in ("round", "floor", "ceil", "trunc", "sign", "isnan", "isinf", "isfinite", "signbit", "abs", "neg"):
        x = torch.cat([x, SPECIALS.double()])
    return x.to(tdt)


def _run(name: str, dtype, x: torch.Tensor) -> torch.Tensor:
    out_dtype = dt.bool_ if name in PREDICATES else dtype
    k = elementwise(lambda a: ex.call(name, a), dtype, out_dtype)
    out = torch.zeros(len(x), dtype=TORCH_DTYPES[out_dtype])
    k(x, out, symbols=[len(x)])
    return out


@pytest.mark.parametrize("name", FLOAT_FUNCS)
@pytest.mark.parametrize("dtype", [dt.f32, dt.f64, dt.bf16], ids=str)
def test_float_function(name, dtype) -> None:
    fn = REFERENCE[name][0]
    x = _inputs(name, TORCH_DTYPES[dtype])
    got = _run(name, dtype, x)
    if dtype == dt.bf16:
        expected = fn(x.float()).to(got.dtype)  # torch computes bf16 math in f32 as well
        torch.testing.assert_close(got, expected, equal_nan=True, rtol=1e-2, atol=1e-2)
    else:
        expected = fn(x)
        rtol = 1e-5 if dtype == dt.f32 else 1e-12
        torch.testing.assert_close(got, expected, equal_nan=True, rtol=rtol, atol=rtol)


def test_erfinv_edges() -> None:
    x = torch.tensor([1.0, -1.0, 1.5, -2.0, 0.0, float("nan"), 0.9999999, -0.5], dtype=torch.float64)
    got = _run("erfinv", dt.f64, x)
    torch.testing.assert_close(got, torch.erfinv(x), equal_nan=True, rtol=1e-10, atol=1e-12)


def test_digamma_poles() -> None:
    x = torch.tensor([0.0, -0.0, -1.0, -2.0, float("inf"), float("-inf"), 10.0, 1e18])
    torch.testing.assert_close(_run("digamma", dt.f32, x), torch.digamma(x), equal_nan=True)


INT_REFERENCE = {
    "neg": torch.neg, "abs": torch.abs, "sign": torch.sign, "not": torch.bitwise_not,
    "floor": torch.floor, "ceil": torch.ceil, "round": torch.round, "trunc": torch.trunc,
    "isnan": torch.isnan, "isinf": torch.isinf, "isfinite": torch.isfinite, "signbit": torch.signbit,
}

BOOL_REFERENCE = {
    "not": torch.logical_not, "isnan": torch.isnan, "isinf": torch.isinf,
    "isfinite": torch.isfinite, "signbit": torch.signbit,
}


@pytest.mark.parametrize("name", sorted(INT_REFERENCE))
@pytest.mark.parametrize("dtype", [dt.i32, dt.u8, dt.bool_], ids=str)
def test_integer_function(name, dtype) -> None:
    if dtype == dt.bool_ and name == "neg":
        pytest.skip("torch rejects neg on bool")
    if dtype == dt.u8 and name in ("neg",):
        pytest.skip("torch wraps neg on u8 too, but warns")
    x = torch.tensor([-5, -1, 0, 1, 2, 100, 127, -128]).to(TORCH_DTYPES[dtype])
    got = _run(name, dtype, x)
    if dtype == dt.bool_:
        # torch lacks most of these on bool; as numbers 0/1 they are the identity.
        expected = BOOL_REFERENCE.get(name, lambda v: v)(x)
    else:
        expected = INT_REFERENCE[name](x)
    assert torch.equal(got, expected.to(got.dtype)), (got, expected)


def test_float_not_is_an_error() -> None:
    from torchburn.codegen import CodegenError

    with pytest.raises(CodegenError, match="'not' is not defined on f32"):
        elementwise(lambda a: ex.call("not", a), dt.f32, dt.f32)


@pytest.mark.parametrize("dtype", [dt.f32, dt.f16, dt.i32], ids=str)
def test_fma(dtype) -> None:
    k = elementwise(lambda a, b, c: ex.call("fma", a, b, c), dtype, dtype, n_inputs=3)
    tdt = TORCH_DTYPES[dtype]
    a, b, c = ((torch.randn(20) * 5).to(tdt) for _ in range(3))
    out = torch.zeros(20, dtype=tdt)
    k(a, b, c, out, symbols=[20])
    expected = (a.double() * b.double() + c.double()).to(tdt)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
