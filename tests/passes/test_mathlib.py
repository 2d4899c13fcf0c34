"""Accuracy of the f32 math implementations, executed through the LLVM codegen.

Each function runs vectorized (host lanes) over about 1.2 million inputs: a dense sweep over
the range where the function is not constant, a fine sweep around 0, random bit patterns
over all of f32 (NaN payloads, subnormals, huge values), and the special values. Results are
compared in ulps with float64 references; the bounds asserted here are what the
implementations achieve (measured maxima over all 2^32 inputs are in mathlib's docstring).
"""
from __future__ import annotations

from typing import Callable

import numpy as np
import pytest
from scipy import special

from torchburn.ir.printer import print_kernel
from torchburn.passes.loop.expand_math import ExpandMath
from torchburn.passes.loop.vectorize import Vectorize

from .util import execute, kernel, run_pass


def ulp_error(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """|got - ref| in units of the f32 spacing at ref (rounded to f32); 0 where both are the
    same infinity or both NaN, inf where only one is NaN."""
    with np.errstate(all="ignore"):
        ref32 = ref.astype(np.float32)
        finite = np.where(np.isinf(ref32), np.float32(3.4e38), ref32)
        spacing = np.maximum(np.spacing(np.abs(finite)).astype(np.float64), 2.0 ** -149)
        err = np.abs(got.astype(np.float64) - ref) / spacing
    err[(np.isnan(got) & np.isnan(ref)) | (np.isinf(ref32) & (got == ref32))] = 0.0
    err[np.isnan(got) != np.isnan(ref)] = np.inf
    return err


SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 1.0, -1.0, 0.5, 2.0, 88.72283, 88.72284, -87.33655,
                     -103.97, -104.0, 1e-30, -1e-30, 1.4e-45, -1.4e-45, 1e-40, 1.17549435e-38, 3.4e38, -3.4e38],
                    np.float32)


def inputs(lo: float, hi: float) -> np.ndarray:
    rng = np.random.default_rng(1234)
    return np.concatenate([
        np.linspace(lo, hi, 1_000_000, dtype=np.float32),
        np.linspace(-1e-3, 1e-3, 20_001, dtype=np.float32),
        np.logspace(-45, 1, 20_000).astype(np.float32),
        -np.logspace(-45, 1, 20_000).astype(np.float32),
        rng.integers(0, 2 ** 32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32),
        SPECIALS,
    ])


def run(fn: str, x: np.ndarray) -> np.ndarray:
    k = kernel(f"""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {{
          for i in 0..s0 {{
            %out[i] = {fn}(%x[i])
          }}
        }}
    """)
    k = run_pass(ExpandMath(), run_pass(Vectorize(), k))
    assert f"{fn}(" not in print_kernel(k)
    return execute(k, {"x": x, "out": np.zeros_like(x)}, {"s0": x.size})["out"]


CASES: list[tuple[str, Callable[[np.ndarray], np.ndarray], tuple[float, float], float]] = [
    # name, float64 reference, dense range, max ulp asserted
    ("exp", np.exp, (-105.0, 90.0), 1.0),
    ("expm1", np.expm1, (-20.0, 90.0), 1.5),
    ("log", np.log, (0.0, 100.0), 1.0),
    ("log1p", np.log1p, (-1.0, 10.0), 2.2),
    ("tanh", np.tanh, (-11.0, 11.0), 2.5),
    ("sigmoid", special.expit, (-105.0, 30.0), 2.5),
    ("erf", special.erf, (-4.5, 4.5), 6.0),
]


@pytest.mark.parametrize("name, ref, lohi, bound", CASES, ids=[c[0] for c in CASES])
def test_accuracy(name: str, ref: Callable[[np.ndarray], np.ndarray], lohi: tuple[float, float],
                  bound: float) -> None:
    x = inputs(*lohi)
    got = run(name, x)
    with np.errstate(all="ignore"):
        expected = ref(x.astype(np.float64))
    err = ulp_error(got, expected)
    worst = int(np.argmax(err))
    assert err[worst] <= bound, f"{name}({x[worst]!r}) = {got[worst]!r}, expected {expected[worst]!r}: {err[worst]:.3f} ulp"


def test_special_values() -> None:
    inf, nan = np.inf, np.nan
    x = np.array([0.0, -0.0, inf, -inf, nan, 89.0, -200.0], np.float32)
    expected = {
        "exp": [1.0, 1.0, inf, 0.0, nan, inf, 0.0],
        "expm1": [0.0, -0.0, inf, -1.0, nan, inf, -1.0],
        "log": [-inf, -inf, inf, nan, nan, np.log(89.0), nan],
        "log1p": [0.0, -0.0, inf, nan, nan, np.log1p(89.0), nan],
        "tanh": [0.0, -0.0, 1.0, -1.0, nan, 1.0, -1.0],
        "sigmoid": [0.5, 0.5, 1.0, 0.0, nan, 1.0, 0.0],
        "erf": [0.0, -0.0, 1.0, -1.0, nan, 1.0, -1.0],
    }
    for name, want in expected.items():
        got = run(name, x)
        np.testing.assert_array_equal(got, np.array(want, np.float32), err_msg=name)
        zeros = [i for i, w in enumerate(want) if w == 0.0]
        np.testing.assert_array_equal(np.signbit(got[zeros]), np.signbit(np.array(want)[zeros]), err_msg=name)


def _operations(builder: Callable[..., object]) -> int:
    """Operations (not names or constants) in a 16-lane expansion: lets and result."""
    from torchburn.ir import dtypes as dt
    from torchburn.ir import expr as ex
    from torchburn.passes.loop.mathlib import LetSink

    sink = LetSink()
    out = builder(ex.Var("x", ex.ScalarType(dt.f32, 16)), sink)
    exprs = [let.value for let in sink.lets] + [out]
    return sum(1 for e in exprs for y in ex.walk(e) if not isinstance(y, (ex.Var, ex.Const, ex.Broadcast)))


def test_erf_is_one_cheap_rational() -> None:
    """GELU's cost is erf's: one rational, cheaper than an exp (the two-branch form it
    replaced took an exp and two polynomials, 63 operations)."""
    from torchburn.passes.loop.mathlib import erf_f32, exp_f32

    assert _operations(erf_f32) <= 22 < _operations(exp_f32)


def test_erf_is_odd_bit_for_bit() -> None:
    x = inputs(-4.5, 4.5)
    x = x[~np.isnan(x)]
    np.testing.assert_array_equal(run("erf", -x), -run("erf", x))
