"""`split-reductions`: the IR it writes, the loops it leaves alone, and results (IR executed on
the CPU after the rest of the loop pipeline, and whole-tensor reductions through the compiler
against eager)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from torchburn.passes.base import parse_pipeline
from torchburn.passes.loop.split_reductions import SplitReductions
from tests.helpers import run_compiled

from .util import assert_ir, execute, kernel, run_pass

SUM = """
    kernel @k(%x: f32[N] strides [1], %out: f32[1] strides [1]) {
      alloc %acc: f32[1] strides [1] local
      %acc[0] = 0.0:f32
      for r in 0..N {
        let v = %x[r]
        %acc[0] = %acc[0] + v
      }
      %out[0] = %acc[0]
    }
"""

NEST = """
    kernel @k(%x: f32[A, B, C] strides [BC, C, 1], %out: f32[1] strides [1]) {
      alloc %acc: f32[1] strides [1] local
      %acc[0] = -inf:f32
      for r0 in 0..A {
        for r1 in 0..B {
          for r2 in 0..C {
            %acc[0] = max(%acc[0], %x[r0, r1, r2])
          }
        }
      }
      %out[0] = %acc[0]
    }
"""


def _sum(n: int) -> str:
    return SUM.replace("N", str(n))


def _nest(a: int, b: int, c: int) -> str:
    return NEST.replace("BC", str(b * c)).replace("A", str(a)).replace("B", str(b)).replace("C", str(c))


def test_a_whole_sum_is_split_into_parallel_chunks_ir() -> None:
    out = run_pass(SplitReductions(threads=2, min_work=1024, min_chunk=256), kernel(_sum(4096)))
    assert_ir(out, """
        kernel @k(%x: f32[4096] strides [1], %out: f32[1] strides [1]) {
          alloc %acc: f32[1] strides [1] local
          %acc[0] = 0.0:f32
          alloc %acc_parts: f32[8] strides [1] local
          parallel for r_p in 0..8 {
            alloc %acc_p: f32[1] strides [1] local
            %acc_p[0] = -0.0:f32
            for r_1 in 0..512 {
              let v_1 = %x[r_p * 512 + r_1]
              %acc_p[0] = %acc_p[0] + v_1
            }
            %acc_parts[r_p] = %acc_p[0]
          }
          for r_f in 0..8 {
            %acc[0] = %acc[0] + %acc_parts[r_f]
          }
          %out[0] = %acc[0]
        }
    """)


def test_loops_left_alone() -> None:
    k = kernel(_sum(4096))
    assert run_pass(SplitReductions(threads=1, min_work=16, min_chunk=16), k) == k  # one thread
    assert run_pass(SplitReductions(threads=2), k) == k  # too little work
    scan = kernel("""
        kernel @k(%x: f32[4096] strides [1], %out: f32[4096] strides [1]) {
          alloc %acc: f32[1] strides [1] local
          %acc[0] = 0.0:f32
          for r in 0..4096 {
            %acc[0] = %acc[0] + %x[r]
            %out[r] = %acc[0]
          }
        }
    """)
    opts = SplitReductions(threads=2, min_work=16, min_chunk=16)
    assert run_pass(opts, scan) == scan  # a running value is read, and memory written
    argmax = kernel("""
        kernel @k(%x: f32[4096] strides [1], %out: i64[1] strides [1]) {
          alloc %best: f32[1] strides [1] local
          alloc %at: i64[1] strides [1] local
          %best[0] = -inf:f32
          %at[0] = 0:i64
          for r in 0..4096 {
            let v = %x[r]
            %at[0] = select(v > %best[0], cast<i64>(r), %at[0])
            %best[0] = max(%best[0], v)
          }
          %out[0] = %at[0]
        }
    """)
    assert run_pass(opts, argmax) == argmax  # the index follows the value: not one op
    inside = kernel("""
        kernel @k(%x: f32[4, 4096] strides [4096, 1], %out: f32[4] strides [1]) {
          for i in 0..4 {
            alloc %acc: f32[1] strides [1] local
            %acc[0] = 0.0:f32
            for r in 0..4096 {
              %acc[0] = %acc[0] + %x[i, r]
            }
            %out[i] = %acc[0]
          }
        }
    """)
    assert run_pass(opts, inside) == inside  # rows: `parallelize`'s


def _pipeline(threads: int = 2) -> list:  # type: ignore[type-arg]
    return [SplitReductions(threads=threads, min_work=1024, min_chunk=128),
            *parse_pipeline("parallelize,vectorize{width=8},split-accumulators,simplify")]


def _run(text: str) -> object:
    k = kernel(text)
    for p in _pipeline():
        k = run_pass(p, k)
    return k


@pytest.mark.parametrize("n", [1024, 1031, 4096, 5000, 65536 + 17])
def test_sums_of_every_remainder_execute(n: int) -> None:
    k = _run(_sum(n))
    x = np.random.default_rng(n).standard_normal(n, dtype=np.float32)
    r = execute(k, {"x": x, "out": np.zeros(1, np.float32)})
    np.testing.assert_allclose(r["out"][0], x.astype(np.float64).sum(), rtol=1e-4, atol=1e-3)


@settings(max_examples=25, deadline=None)
@given(a=st.integers(1, 5), b=st.integers(1, 300), c=st.integers(1, 70))
def test_max_over_a_nest_executes(a: int, b: int, c: int) -> None:
    """Outer loops fused until there are enough to split, the innermost kept whole; chunks
    balanced where they do not divide; nothing read twice or missed (max is exact)."""
    k = _run(_nest(a, b, c))
    x = np.random.default_rng(a * 1000 + b * 10 + c).standard_normal((a, b, c), dtype=np.float32)
    r = execute(k, {"x": x, "out": np.zeros(1, np.float32)})
    assert r["out"][0] == x.max()


def test_integer_sum_is_exact_after_the_split() -> None:
    k = _run(_sum(10_001).replace("f32", "i32").replace("0.0:i32", "0:i32").replace("let v = %x[r]", "let v = %x[r]"))
    x = np.random.default_rng(1).integers(-1000, 1000, 10_001, dtype=np.int32)
    r = execute(k, {"x": x, "out": np.zeros(1, np.int32)})
    assert r["out"][0] == x.sum()


WHOLE = {
    "sum": lambda x: x.sum(),
    "mean_of_squares": lambda x: (x * x).mean(),
    "amax": lambda x: x.abs().amax(),
    "min": lambda x: x.min(),
    "norm": lambda x: torch.linalg.vector_norm(x),
}


@pytest.mark.parametrize("shape", [(300_001,), (3, 1000, 333), (64, 4099)])
@pytest.mark.parametrize("name", list(WHOLE))
def test_whole_tensor_reductions_match_eager(name: str, shape: tuple[int, ...]) -> None:
    fn = WHOLE[name]
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
    with torch.no_grad():
        got, _ = run_compiled(fn, x)
    torch.testing.assert_close(got, fn(x), rtol=2e-5, atol=1e-3)
