"""Binary operators against Python and torch semantics."""
from __future__ import annotations

import math

import pytest
import torch

from .util import TORCH_DTYPES, dt, elementwise, ex

INTS = torch.tensor([7, -7, 7, -7, 0, 1, -1, 13, -13, 100, -100, 5])
DIVISORS = torch.tensor([2, 2, -2, -2, 3, 3, 3, -5, 5, 7, 7, -1])


def _run2(op: str, dtype, a: torch.Tensor, b: torch.Tensor, out_dtype=None) -> torch.Tensor:
    out_dtype = out_dtype or dtype
    k = elementwise(lambda x, y: ex.binary(op, x, y), dtype, out_dtype, n_inputs=2)
    out = torch.zeros(len(a), dtype=TORCH_DTYPES[out_dtype])
    k(a.to(TORCH_DTYPES[dtype]), b.to(TORCH_DTYPES[dtype]), out, symbols=[len(a)])
    return out


@pytest.mark.parametrize("dtype", [dt.i8, dt.i32, dt.i64], ids=str)
def test_int_floordiv_mod_python_semantics(dtype) -> None:
    q = _run2("floordiv", dtype, INTS, DIVISORS)
    r = _run2("mod", dtype, INTS, DIVISORS)
    assert q.tolist() == [a // b for a, b in zip(INTS.tolist(), DIVISORS.tolist())]
    assert r.tolist() == [a % b for a, b in zip(INTS.tolist(), DIVISORS.tolist())]
    assert _run2("remainder", dtype, INTS, DIVISORS).tolist() == r.tolist()


def test_int_div_truncates_and_fmod_is_c() -> None:
    q = _run2("div", dt.i32, INTS, DIVISORS)
    f = _run2("fmod", dt.i32, INTS, DIVISORS)
    assert q.tolist() == [int(a / b) for a, b in zip(INTS.tolist(), DIVISORS.tolist())]
    assert f.tolist() == [int(math.fmod(a, b)) for a, b in zip(INTS.tolist(), DIVISORS.tolist())]


FA = torch.tensor([7.0, -7.0, 7.0, -7.0, 0.0, -0.0, 5.5, -5.5, 1e10, float("inf"), float("nan"), 3.0, -3.0])
FB = torch.tensor([2.0, 2.0, -2.0, -2.0, 3.0, 3.0, 0.0, 1.5, 3.0, 2.0, 1.0, -1.5, 1.5])


@pytest.mark.parametrize("dtype", [dt.f32, dt.f64], ids=str)
def test_float_floordiv_and_remainder_match_torch(dtype) -> None:
    tdt = TORCH_DTYPES[dtype]
    a, b = FA.to(tdt), FB.to(tdt)
    torch.testing.assert_close(_run2("floordiv", dtype, a, b), torch.floor_divide(a, b), equal_nan=True, rtol=0, atol=0)
    rem = _run2("mod", dtype, a, b)
    expected = torch.remainder(a, b)
    torch.testing.assert_close(rem, expected, equal_nan=True, rtol=0, atol=0)
    finite = ~torch.isnan(expected)
    assert torch.equal(torch.signbit(rem[finite]), torch.signbit(expected[finite]))
    torch.testing.assert_close(_run2("fmod", dtype, a, b), torch.fmod(a, b), equal_nan=True, rtol=0, atol=0)


def test_float_min_max_propagate_nan() -> None:
    a = torch.tensor([float("nan"), 1.0, 2.0, -0.0, float("nan")])
    b = torch.tensor([0.0, float("nan"), 1.0, 0.0, float("nan")])
    torch.testing.assert_close(_run2("min", dt.f32, a, b), torch.minimum(a, b), equal_nan=True)
    torch.testing.assert_close(_run2("max", dt.f32, a, b), torch.maximum(a, b), equal_nan=True)
    assert torch.signbit(_run2("min", dt.f32, a, b))[3]


@pytest.mark.parametrize("op,fn", [("eq", torch.eq), ("ne", torch.ne), ("lt", torch.lt),
                                   ("le", torch.le), ("gt", torch.gt), ("ge", torch.ge)])
def test_float_comparisons_with_nan(op, fn) -> None:
    a = torch.tensor([1.0, float("nan"), 2.0, float("nan"), -0.0])
    b = torch.tensor([1.0, 1.0, float("nan"), float("nan"), 0.0])
    assert torch.equal(_run2(op, dt.f32, a, b, out_dtype=dt.bool_), fn(a, b))


@pytest.mark.parametrize("op,fn", [("lt", torch.lt), ("ge", torch.ge), ("floordiv", torch.floor_divide),
                                   ("mod", torch.remainder), ("max", torch.maximum), ("shr", None)])
def test_unsigned_ops(op, fn) -> None:
    a = torch.tensor([200, 3, 255, 0, 128], dtype=torch.uint8)
    b = torch.tensor([3, 200, 1, 7, 2], dtype=torch.uint8)
    out_dtype = dt.bool_ if op in ("lt", "ge") else dt.u8
    got = _run2(op, dt.u8, a, b, out_dtype=out_dtype)
    expected = (a >> b) if fn is None else fn(a, b)
    assert torch.equal(got, expected)


def test_shifts_match_torch() -> None:
    a = torch.tensor([1, -8, 5, -1, 3], dtype=torch.int32)
    b = torch.tensor([3, 1, 0, 31, 2], dtype=torch.int32)
    assert torch.equal(_run2("shl", dt.i32, a, b), a << b)
    assert torch.equal(_run2("shr", dt.i32, a, b), a >> b)


def test_bitwise_and_bool_ops() -> None:
    a = torch.tensor([0b1100, 0b1010, -1], dtype=torch.int64)
    b = torch.tensor([0b1010, 0b0110, 5], dtype=torch.int64)
    assert torch.equal(_run2("and", dt.i64, a, b), a & b)
    assert torch.equal(_run2("or", dt.i64, a, b), a | b)
    assert torch.equal(_run2("xor", dt.i64, a, b), a ^ b)
    p = torch.tensor([True, True, False, False])
    q = torch.tensor([True, False, True, False])
    assert torch.equal(_run2("and", dt.bool_, p, q), p & q)
    assert torch.equal(_run2("or", dt.bool_, p, q), p | q)
    assert torch.equal(_run2("xor", dt.bool_, p, q), p ^ q)
    assert torch.equal(_run2("ne", dt.bool_, p, q), p != q)


def test_int_pow_like_torch() -> None:
    base = torch.tensor([2, -1, 1, 3, 0, -2, 5, -1, 2, 0])
    exp = torch.tensor([-1, -3, -5, 2, 0, 3, 1, -4, 10, -2])
    assert torch.equal(_run2("pow", dt.i64, base, exp), torch.pow(base, exp))
    assert torch.equal(_run2("pow", dt.i32, base, exp), torch.pow(base.int(), exp.int()))


@pytest.mark.parametrize("op,fn", [("pow", torch.pow), ("atan2", torch.atan2), ("copysign", torch.copysign),
                                   ("hypot", torch.hypot), ("nextafter", torch.nextafter)])
@pytest.mark.parametrize("dtype", [dt.f32, dt.f64, dt.bf16], ids=str)
def test_named_float_binaries(op, fn, dtype) -> None:
    if op == "nextafter" and dtype == dt.bf16:
        pytest.skip("torch has no bf16 nextafter")
    gen = torch.Generator().manual_seed(0)
    tdt = TORCH_DTYPES[dtype]
    a = (torch.rand(40, generator=gen) * 4).to(tdt)
    b = (torch.randn(40, generator=gen) * 2).to(tdt)
    if op == "pow":
        b = b.abs()
    tol = 0 if op in ("copysign", "nextafter") else None
    torch.testing.assert_close(_run2(op, dtype, a, b), fn(a, b), rtol=tol, atol=tol, equal_nan=True)


def test_named_binary_as_call() -> None:
    k = elementwise(lambda x, y: ex.call("copysign", x, y), dt.f32, dt.f32, n_inputs=2)
    a, b = torch.tensor([1.0, 2.0]), torch.tensor([-1.0, 1.0])
    out = torch.empty(2)
    k(a, b, out, symbols=[2])
    assert out.tolist() == [-1.0, 2.0]
