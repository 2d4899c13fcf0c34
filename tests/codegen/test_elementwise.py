"""Elementwise kernels over strided tensors: layouts, symbolic sizes, every dtype, casts."""
from __future__ import annotations

import pytest
import torch

from .util import (
    TORCH_DTYPES,
    Compiled,
    Const,
    Var,
    buf,
    dt,
    elementwise,
    ex,
    load,
    loop,
    program,
    st,
    store,
)


def test_add_contiguous() -> None:
    k = elementwise(lambda a, b: ex.add(a, b), dt.f32, dt.f32, n_inputs=2)
    x, y = torch.randn(100), torch.randn(100)
    out = torch.empty(100)
    k(x, y, out, symbols=[100])
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_zero_size_extent() -> None:
    k = elementwise(lambda a: ex.call("exp", a), dt.f32, dt.f32)
    x, out = torch.randn(4), torch.full((4,), 7.0)
    k(x, out, symbols=[0])
    assert torch.equal(out, torch.full((4,), 7.0))


def test_transposed_input_symbolic_2d() -> None:
    """out[i, j] = x[i, j] * 2 where x is a transposed view: strides [1, s0] for shape [s1, s0]."""
    s0, s1 = Var("s0"), Var("s1")
    x = buf("x", dt.f32, (s1, s0), (1, s1))
    out = buf("out", dt.f32, (s1, s0), (s0, 1))
    i, j = Var("i"), Var("j")
    body = loop(i, s1, loop(j, s0, store(out, (i, j), ex.mul(load(x, i, j), ex.const(2.0, dt.f32)))))
    k = Compiled(program(body, [x], [out], [s0, s1]))
    base = torch.randn(5, 3)
    xt = base.t()  # shape [3, 5], strides [1, 3]
    assert xt.stride() == (1, 3)
    res = torch.empty(3, 5)
    k(xt, res, symbols=[5, 3])
    torch.testing.assert_close(res, xt * 2, rtol=0, atol=0)


def test_loop_with_start_offset() -> None:
    s0 = Var("s0")
    x, out = buf("x", dt.i64, (s0,)), buf("out", dt.i64, (s0,))
    i = Var("i")
    body = loop(i, ex.sub(s0, 2), store(out, (i,), ex.add(load(x, i), i)), start=2)
    k = Compiled(program(body, [x], [out], [s0]))
    x_t, out_t = torch.arange(10), torch.zeros(10, dtype=torch.int64)
    k(x_t, out_t, symbols=[10])
    expected = torch.cat([torch.zeros(2, dtype=torch.int64), 2 * torch.arange(2, 10)])
    assert torch.equal(out_t, expected)


@pytest.mark.parametrize("dtype", list(TORCH_DTYPES), ids=str)
def test_copy_every_dtype(dtype) -> None:
    k = elementwise(lambda a: a, dtype, dtype)
    src = (torch.randn(33) * 50).to(TORCH_DTYPES[dtype])
    out = torch.zeros(33, dtype=TORCH_DTYPES[dtype])
    k(src, out, symbols=[33])
    assert torch.equal(out, src)


@pytest.mark.parametrize("dtype", [dt.f16, dt.bf16], ids=str)
def test_half_arithmetic_rounds_like_torch(dtype) -> None:
    k = elementwise(lambda a, b: ex.add(ex.mul(a, b), a), dtype, dtype, n_inputs=2)
    tdt = TORCH_DTYPES[dtype]
    x, y = torch.randn(64).to(tdt), torch.randn(64).to(tdt)
    out = torch.empty(64, dtype=tdt)
    k(x, y, out, symbols=[64])
    assert torch.equal(out, x * y + x)


CAST_DTYPES = [dt.bool_, dt.i8, dt.i32, dt.i64, dt.u8, dt.f16, dt.bf16, dt.f32, dt.f64]


@pytest.mark.parametrize("src", CAST_DTYPES, ids=str)
@pytest.mark.parametrize("dst", CAST_DTYPES, ids=str)
def test_cast(src, dst) -> None:
    values = torch.tensor([0.0, 1.0, -1.0, 2.5, -2.5, 100.0, -100.0, 0.4, 7.0, -0.0, 3.75, 126.0])
    x = values.to(TORCH_DTYPES[src])
    if src.is_float and dst.is_int and dst.kind == "u":
        x = x.abs()  # float -> u8 of negatives is implementation-defined in C; torch wraps
    k = elementwise(lambda a: ex.cast(a, dst), src, dst)
    out = torch.zeros(len(values), dtype=TORCH_DTYPES[dst])
    k(x, out, symbols=[len(values)])
    assert torch.equal(out, x.to(TORCH_DTYPES[dst])), (x, out)


def test_float_to_u8_wraps_like_torch() -> None:
    x = torch.tensor([300.0, -1.0, -129.0, 255.0])
    k = elementwise(lambda a: ex.cast(a, dt.u8), dt.f32, dt.u8)
    out = torch.zeros(4, dtype=torch.uint8)
    k(x, out, symbols=[4])
    assert torch.equal(out, x.to(torch.uint8))


def test_nan_to_bool_is_true() -> None:
    x = torch.tensor([float("nan"), 0.0, -0.0, 1e-30])
    k = elementwise(lambda a: ex.cast(a, dt.bool_), dt.f32, dt.bool_)
    out = torch.zeros(4, dtype=torch.bool)
    k(x, out, symbols=[4])
    assert out.tolist() == [True, False, False, True]


def test_bitcast_f32_i32() -> None:
    x = torch.tensor([1.0, -2.0, float("inf")])
    k = elementwise(lambda a: ex.Bitcast(a, st(dt.i32)), dt.f32, dt.i32)
    out = torch.zeros(3, dtype=torch.int32)
    k(x, out, symbols=[3])
    assert torch.equal(out, x.view(torch.int32))


def test_select_and_constants() -> None:
    def fn(a):
        return ex.select(ex.binary("gt", a, ex.const(0.0, dt.f64)), a, ex.const(-1.5, dt.f64))
    k = elementwise(fn, dt.f64, dt.f64)
    x = torch.randn(50, dtype=torch.float64)
    out = torch.empty_like(x)
    k(x, out, symbols=[50])
    assert torch.equal(out, torch.where(x > 0, x, torch.tensor(-1.5, dtype=torch.float64)))


def test_half_constant_out_of_range_rounds_to_inf() -> None:
    k = elementwise(lambda a: ex.add(a, ex.const(1e6, dt.f16)), dt.f16, dt.f16)
    x = torch.zeros(2, dtype=torch.float16)
    out = torch.empty_like(x)
    k(x, out, symbols=[2])
    assert torch.isinf(out).all()


def test_unused_const_index() -> None:
    """A scalar broadcast: every element gets x[0]."""
    s0 = Var("s0")
    x, out = buf("x", dt.f32, (s0,)), buf("out", dt.f32, (s0,))
    i = Var("i")
    k = Compiled(program(loop(i, s0, store(out, (i,), load(x, Const(0)))), [x], [out], [s0]))
    xt, o = torch.randn(5), torch.empty(5)
    k(xt, o, symbols=[5])
    assert torch.equal(o, xt[0].expand(5))
