"""`expand-math`: where the expansions go, what is left alone, and that scalar and vector
code agree bit for bit."""
from __future__ import annotations

import numpy as np

from torchburn.ir.printer import print_kernel
from torchburn.passes.loop.expand_math import ExpandMath
from torchburn.passes.loop.vectorize import Vectorize

from .util import assert_ir, execute, kernel, run_pass


def unary(fn: str, dtype: str = "f32") -> str:
    return f"""
        kernel @k(%x: {dtype}[s0] strides [1], %out: {dtype}[s0] strides [1]) symbols(s0) {{
          for i in 0..s0 {{
            %out[i] = {fn}
          }}
        }}
    """


def test_exp_expansion_text() -> None:
    assert_ir(run_pass(ExpandMath(), kernel(unary("exp(%x[i])"))), """
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..s0 {
            let exp_x = %x[i]
            let exp_xh = select(exp_x > 89.0:f32, 89.0:f32, exp_x)
            let exp_xc = select(exp_xh < -104.0:f32, -104.0:f32, exp_xh)
            let exp_t = fma(exp_xc, 1.4426950216293335:f32, 12582912.0:f32)
            let exp_nf = exp_t - 12582912.0:f32
            let exp_n = bitcast<i32>(exp_t) - 1262485504:i32
            let exp_r = fma(exp_nf, 0.00021219444170128554:f32, fma(exp_nf, -0.693359375:f32, exp_xc))
            let exp_u = fma(exp_r * exp_r, fma(fma(fma(fma(fma(0.00019845923816319555:f32, exp_r, 0.0013941213255748153:f32), exp_r, 0.008333390578627586:f32), exp_r, 0.04166635498404503:f32), exp_r, 0.1666666567325592:f32), exp_r, 0.5:f32), exp_r)
            let exp_n1 = exp_n >> 1:i32
            %out[i] = (1.0:f32 + exp_u) * bitcast<f32>(exp_n1 + 127:i32 << 23:i32) * bitcast<f32>(exp_n - exp_n1 + 127:i32 << 23:i32)
          }
        }
    """)


def test_scalar_option_and_untouched_calls() -> None:
    scalar = kernel(unary("exp(%x[i])"))
    assert run_pass(ExpandMath(scalar=False), scalar) == scalar
    for untouched in (unary("sin(%x[i])"), unary("exp(%x[i])", "f64")):
        k = kernel(untouched)
        assert run_pass(ExpandMath(), k) == k


def test_vector_calls_expand_with_scalar_false() -> None:
    k = run_pass(Vectorize(width=8), kernel(unary("tanh(%x[i])")))
    text = print_kernel(run_pass(ExpandMath(scalar=False), k))
    assert "tanh(%x[ramp(" not in text      # the vector call is gone
    assert "%out[i] = tanh(%x[i])" in text    # the scalar tail keeps its call


def test_nested_calls_and_lets_expand_inside_out() -> None:
    k = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..s0 {
            let y = sigmoid(exp(%x[i]) - 1.0:f32)
            if y < 0.5:f32 {
              %out[i] = log(y)
            }
          }
        }
    """)
    text = print_kernel(run_pass(ExpandMath(), k))
    for name in ("exp(", "sigmoid(", "log("):
        assert name not in text
    lines = [line.strip() for line in text.splitlines()]
    # exp's lets come before sigmoid's, which use its result; `y` is bound after both
    assert lines.index("let exp_x = %x[i]") < lines.index(next(s for s in lines if s.startswith("let sigmoid_x")))
    assert next(s for s in lines if s.startswith("let y = ")).startswith("let y = ")
    x = np.array([-3.0, -1.0, 0.0, 0.1, 2.0], np.float32)
    ref = 1 / (1 + np.exp(-(np.exp(x.astype(np.float64)) - 1)))
    r = execute(run_pass(ExpandMath(), k), {"x": x, "out": np.full_like(x, 7.0)}, {"s0": 5})
    expected = np.where(ref < 0.5, np.log(ref), 7.0)
    np.testing.assert_allclose(r["out"], expected, rtol=1e-6)


def test_vector_body_and_scalar_tail_agree_bit_for_bit() -> None:
    for fn in ("exp", "expm1", "log", "log1p", "tanh", "sigmoid", "erf"):
        k = kernel(unary(f"{fn}(%x[i])"))
        vec = run_pass(ExpandMath(), run_pass(Vectorize(width=8), k))
        scalar = run_pass(ExpandMath(), k)
        x = np.random.default_rng(0).uniform(-5, 5, 1003).astype(np.float32)
        if fn == "log":
            x = np.abs(x)
        a = execute(vec, {"x": x, "out": np.zeros_like(x)}, {"s0": x.size})["out"]
        b = execute(scalar, {"x": x, "out": np.zeros_like(x)}, {"s0": x.size})["out"]
        np.testing.assert_array_equal(a.view(np.int32), b.view(np.int32), err_msg=fn)
