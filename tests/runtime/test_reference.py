"""The reference engine (runtime/reference): loop IR interpreted on NumPy, checked against
NumPy written by hand, through `run_arrays` and through the native calling convention."""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import numpy as np
import pytest

from torchburn.cli.opt import kernel_program
from torchburn.ir import dtypes as dt
from torchburn.ir import loop as lp
from torchburn.ir import semantics
from torchburn.ir.parser import parse_all
from torchburn.runtime.reference import ExecutionError, ReferenceEntry, run_arrays
from torchburn.runtime.reference.lanes import accumulator_updates, laneable
from torchburn.runtime.reference.ops import covered


def kernel(text: str) -> lp.Kernel:
    (k,) = parse_all(text, "<test>")
    assert isinstance(k, lp.Kernel)
    return k


def run(text: str, **inputs: np.ndarray) -> dict[str, np.ndarray]:
    return run_arrays(kernel_program(kernel(text)), inputs)


def outer_loop(text: str) -> lp.For:
    body = kernel(text).body
    assert isinstance(body, lp.For)
    return body


ELEMENTWISE = """
kernel @k(%x: f32[s0, 4] strides [4, 1], %out: f32[s0, 4] strides [4, 1]) symbols(s0) {
  parallel for i0 in 0..s0 {
    for i1 in 0..4 {
      %out[i0, i1] = exp(%x[i0, i1]) + 1.0:f32
    }
  }
}
"""


@pytest.mark.parametrize("rows", [0, 1, 5])
def test_elementwise_with_a_symbolic_size(rows: int) -> None:
    x = np.random.default_rng(0).standard_normal((rows, 4)).astype(np.float32)
    out = run(ELEMENTWISE, x=x)["out"]
    assert out.shape == (rows, 4)
    np.testing.assert_allclose(out, np.exp(x) + 1, rtol=1e-6)
    assert laneable(outer_loop(ELEMENTWISE))


REDUCE_ROWS = """
kernel @k(%x: f64[3, 7] strides [7, 1], %out: f64[3] strides [1]) {
  for i0 in 0..3 {
    alloc %acc: f64[1] strides [1] local
    %acc[0] = 0.0:f64
    for r in 0..7 {
      %acc[0] = %acc[0] + %x[i0, r]
    }
    %out[i0] = %acc[0]
  }
}
"""


def test_reduction_with_a_private_accumulator_per_lane() -> None:
    x = np.arange(21, dtype=np.float64).reshape(3, 7)
    np.testing.assert_array_equal(run(REDUCE_ROWS, x=x)["out"], x.sum(1))
    loop = outer_loop(REDUCE_ROWS)
    assert laneable(loop)  # the accumulator is allocated per row
    inner = [s for s in lp.walk_stmts(loop.body) if isinstance(s, lp.For)][0]
    assert not laneable(inner)  # every r writes %acc[0]
    assert accumulator_updates(inner) is not None  # but as a fold: all r at once, folded in order


F16_SUM = """
kernel @k(%x: f16[2, 300] strides [300, 1], %out: f16[2] strides [1]) {
  for i0 in 0..2 {
    alloc %acc: f16[1] strides [1] local
    %acc[0] = 1000.0:f16
    for r in 0..300 {
      %acc[0] = %x[i0, r] + %acc[0]
    }
    %out[i0] = %acc[0]
  }
}
"""


def test_a_folded_reduction_rounds_every_step_in_order() -> None:
    x = np.full((2, 300), 0.3, np.float16)
    x[1, ::7] = -0.6
    expected = []
    for row in x:
        acc = 1000.0
        for v in row:  # serially, with the semantics of each f16 add
            acc = semantics.evaluate("add", dt.f16, float(v), acc)
        expected.append(acc)
    out = run(F16_SUM, x=x)["out"]
    np.testing.assert_array_equal(out, np.array(expected, np.float16))
    assert out[0] != np.float16(1000 + 300 * 0.3)  # per-step rounding shows (1000 + 0.3 rounds to 1000)


PLAIN_GEMM = """
kernel @k(%a: f32[4, 5] strides [5, 1], %b: f32[5, 3] strides [3, 1], %out: f32[4, 3] strides [3, 1]) {
  for i0 in 0..4 {
    for i1 in 0..3 {
      alloc %acc: f32[1] strides [1] local
      %acc[0] = 0.0:f32
      for k in 0..5 {
        let p = %a[i0, k] * %b[k, i1]
        %acc[0] = %acc[0] + p
      }
      %out[i0, i1] = %acc[0]
    }
  }
}
"""


def test_matrix_product_nest() -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((4, 5)).astype(np.float32)
    b = rng.standard_normal((5, 3)).astype(np.float32)
    np.testing.assert_allclose(run(PLAIN_GEMM, a=a, b=b)["out"], a @ b, rtol=1e-5, atol=1e-6)


PREFIX_SUM = """
kernel @k(%x: i32[6] strides [1], %out: i32[6] strides [1]) {
  %out[0] = %x[0]
  for i in 1..+5 {
    %out[i] = %out[i - 1] + %x[i]
  }
}
"""


def test_a_loop_carried_dependency_runs_in_order() -> None:
    x = np.arange(1, 7, dtype=np.int32)
    assert not laneable([s for s in lp.walk_stmts(kernel(PREFIX_SUM).body) if isinstance(s, lp.For)][0])
    np.testing.assert_array_equal(run(PREFIX_SUM, x=x)["out"], np.cumsum(x))


MASKED = """
kernel @k(%x: f32[4, 4] strides [4, 1], %out: f32[4, 4] strides [4, 1]) {
  for i0 in 0..4 {
    for j in 0..i0 + 1 {
      if j < 2 {
        %out[i0, j] = %x[i0, j]
      } else {
        %out[i0, j] = 0.0:f32 - %x[i0, j]
      }
    }
  }
}
"""


def test_lane_varying_bounds_and_conditions_are_masked() -> None:
    x = np.arange(1, 17, dtype=np.float32).reshape(4, 4)
    expected = np.zeros_like(x)
    for i in range(4):
        for j in range(i + 1):
            expected[i, j] = x[i, j] if j < 2 else -x[i, j]
    np.testing.assert_array_equal(run(MASKED, x=x)["out"], expected)


GUARDED = """
kernel @k(%x: f32[3] strides [1], %out: f32[4] strides [1]) {
  for i in 0..4 {
    if i < 3 {
      %out[i] = %x[i]
    } else {
      %out[i] = 9.0:f32
    }
  }
}
"""


def test_masked_out_lanes_do_not_read_outside_the_buffer() -> None:
    x = np.array([1, 2, 3], np.float32)
    np.testing.assert_array_equal(run(GUARDED, x=x)["out"], [1, 2, 3, 9])


def test_an_access_outside_a_buffer_is_an_error() -> None:
    text = """
    kernel @k(%x: f32[3] strides [1], %out: f32[4] strides [1]) {
      for i in 0..4 {
        %out[i] = %x[i]
      }
    }
    """
    with pytest.raises(ExecutionError, match="load from %x: element 3 is outside the buffer"):
        run(text, x=np.zeros(3, np.float32))


VECTORS = """
kernel @k(%x: f32[2, 8] strides [8, 1], %out: f32[2, 8] strides [8, 1], %sum: f32[2] strides [1]) {
  for i0 in 0..2 {
    for c in 0..2 {
      let v = %x[i0, ramp(c * 4, 1, 4)] * broadcast(2.0:f32, 4)
      %out[i0, ramp(c * 4, 1, 4)] = v
    }
    %sum[i0] = vreduce_add(%x[i0, ramp(0, 2, 4)])
  }
}
"""


def test_ramps_broadcasts_and_vector_reductions() -> None:
    x = np.arange(16, dtype=np.float32).reshape(2, 8)
    res = run(VECTORS, x=x)
    np.testing.assert_array_equal(res["out"], x * 2)
    np.testing.assert_array_equal(res["sum"], x[:, ::2].sum(1))
    inner = [s for s in lp.walk_stmts(kernel(VECTORS).body) if isinstance(s, lp.For)][1]
    assert laneable(inner)  # ramp(c * 4, 1, 4): 4 lanes, c's coefficient 4


def test_overlapping_ramps_are_not_lanes() -> None:
    text = """
    kernel @k(%out: f32[8] strides [1]) {
      for c in 0..4 {
        %out[ramp(c, 1, 4)] = broadcast(cast<f32>(c), 4)
      }
    }
    """
    loop = outer_loop(text)
    assert not laneable(loop)
    program = kernel_program(kernel(text))
    np.testing.assert_array_equal(run_arrays(program, {})["out"], [0, 1, 2, 3, 3, 3, 3, 0])


STRIDED = """
kernel @k(%x: f32[3, 2] strides [1, 3], %out: f32[3, 2] strides [2, 1]) {
  for i0 in 0..3 {
    for i1 in 0..2 {
      %out[i0, i1] = %x[i0, i1] * 10.0:f32
    }
  }
}
"""


def test_strides_are_honoured() -> None:
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_array_equal(run(STRIDED, x=x)["out"], x * 10)


@pytest.mark.parametrize("dtype, a, b, op, expected", [
    ("i8", 100, 100, "+", -56),
    ("u8", 250, 10, "+", 4),
    ("i32", -7, 2, "//", -4),
    ("i32", -7, 2, "%", 1),
    ("i64", 2 ** 62, 4, "*", 0),
    ("f16", 1.0, 0.0001, "+", 1.0),
    ("bf16", 1.0, 0.001, "+", 1.0),
    ("f32", 1.0, 0.0, "/", float("inf")),
])
def test_scalar_ops_follow_the_semantics(dtype: str, a: float, b: float, op: str, expected: float) -> None:
    text = f"""
    kernel @k(%a: {dtype}[1] strides [1], %b: {dtype}[1] strides [1], %out: {dtype}[1] strides [1]) {{
      %out[0] = %a[0] {op} %b[0]
    }}
    """
    nd = np.float32 if dtype == "bf16" else np.dtype(semantics.storage(dt.dtype_from_name(dtype)))
    out = run(text, a=np.array([a], nd), b=np.array([b], nd))["out"]
    assert out[0] == expected


def test_integer_division_by_zero_raises() -> None:
    text = """
    kernel @k(%a: i32[2] strides [1], %out: i32[2] strides [1]) {
      for i in 0..2 {
        %out[i] = %a[i] // 0:i32
      }
    }
    """
    with pytest.raises(semantics.DivisionByZero):
        run(text, a=np.array([1, 2], np.int32))


def test_casts_bitcasts_selects_and_dtypes_of_every_width() -> None:
    text = """
    kernel @k(%x: f32[4] strides [1], %i: i32[4] strides [1], %h: bf16[4] strides [1], %u: u8[4] strides [1],
              %b: bool[4] strides [1]) {
      for j in 0..4 {
        %i[j] = bitcast<i32>(%x[j])
        %h[j] = cast<bf16>(%x[j])
        %u[j] = cast<u8>(%x[j])
        %b[j] = select(%x[j] > 0.0:f32, true, false)
      }
    }
    """
    x = np.array([1.0, -1.0, 300.7, 3.14159], np.float32)
    res = run(text, x=x)
    np.testing.assert_array_equal(res["i"], x.view(np.int32))
    np.testing.assert_array_equal(res["h"], np.asarray(semantics.round_bf16(x)))
    np.testing.assert_array_equal(res["u"], [semantics.cast_value(float(v), dt.f32, dt.u8) for v in x])
    np.testing.assert_array_equal(res["b"], x > 0)


def test_byte_dot_products() -> None:
    text = """
    kernel @k(%a: u8[8] strides [1], %w: i8[8] strides [1], %out: i32[2] strides [1]) {
      %out[ramp(0, 1, 2)] = dot4_u8i8_acc(broadcast(5:i32, 2), %a[ramp(0, 1, 8)], %w[ramp(0, 1, 8)])
    }
    """
    a = np.arange(200, 208, dtype=np.uint8)
    w = np.array([-128, 127, -1, 1, 3, -3, 0, 100], np.int8)
    prod = a.astype(np.int64) * w.astype(np.int64)
    np.testing.assert_array_equal(run(text, a=a, w=w)["out"], 5 + prod.reshape(2, 4).sum(1))


def test_the_interpretation_covers_every_scalar_op() -> None:
    assert semantics.missing_ops(covered()) == set()
    assert semantics.missing(semantics.interpretations()["reference"]) == set()


# ---- programs and the native calling convention ---------------------------------------------------

PROGRAM = """
program @main(%x: f32[s0, 4] strides [4, 1]) -> (%out: f32[s0] strides [1]) symbols(s0) {
  temp %t: f32[s0, 4] strides [4, 1] offset 0
  workspace s0 * 16
  call @k0(%x, %t)
  call @k1(%t, %out)
}
kernel @k0(%x: f32[s0, 4] strides [4, 1], %t: f32[s0, 4] strides [4, 1]) symbols(s0) {
  for i0 in 0..s0 {
    for i1 in 0..4 {
      %t[i0, i1] = %x[i0, i1] * %x[i0, i1]
    }
  }
}
kernel @k1(%t: f32[s0, 4] strides [4, 1], %out: f32[s0] strides [1]) symbols(s0) {
  for i0 in 0..s0 {
    alloc %acc: f32[1] strides [1] local
    %acc[0] = 0.0:f32
    for r in 0..4 {
      %acc[0] = %acc[0] + %t[i0, r]
    }
    %out[i0] = %acc[0]
  }
}
"""


def _program() -> lp.Program:
    from torchburn.ir.printer import print_ir

    items = parse_all(PROGRAM, "<test>")
    program = items[0]
    assert isinstance(program, lp.Program) and program.temps, print_ir(program)
    return program


def test_the_entry_runs_on_raw_pointers_with_the_native_convention() -> None:
    program = _program()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.full(3, np.nan, np.float32)
    workspace = np.zeros(3 * 16, np.uint8)
    pointers = (ctypes.c_void_p * 2)(x.ctypes.data, out.ctypes.data)
    symbols = (ctypes.c_int64 * 1)(3)
    ReferenceEntry(program)(pointers, symbols, workspace.ctypes.data)
    np.testing.assert_array_equal(out, (x * x).sum(1))
    np.testing.assert_array_equal(run_arrays(program, {"x": x})["out"], out)


def test_missing_inputs_and_symbols_are_clear_errors() -> None:
    with pytest.raises(ExecutionError, match="no value for input %x"):
        run_arrays(_program(), {})


# ---- through torch.compile -----------------------------------------------------------------------

SCRIPT = r"""
import sys, torch, torchburn
from torchburn.backend import report as rep
def f(x, w, b):
    return torch.relu(x @ w + b).sum(-1), torch.softmax(x, -1), (x.t().contiguous() * 2).to(torch.bfloat16)
x, w, b = torch.randn(5, 7), torch.randn(7, 3), torch.randn(3)
records = rep.start_recording()
out = torch.compile(f, backend="torchburn", fullgraph=True, dynamic=False)(x, w, b)
rep.stop_recording()
for o, e in zip(out, f(x, w, b)):
    torch.testing.assert_close(o, e)
engines = {s.engine for r in records for s in r.subgraphs if s.compiled}
print(torchburn.active_engine(), torchburn.active_engine(alias=True), sorted(engines),
      "llvmlite" in sys.modules, "wgpu" in sys.modules)
"""


@pytest.mark.parametrize("spelling", ["reference", "burn_ndarray"])
def test_torch_compile_runs_on_the_reference_engine_without_llvm(spelling: str) -> None:
    env = dict(os.environ, TORCHBURN_ENGINE=spelling, TORCHBURN_CACHE_DIR="off")
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["reference", "burn_ndarray", "['reference']", "False", "False"]


# ---- random kernels: lanes change nothing -----------------------------------------------------------

from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tests.ir.strategies import kernels  # noqa: E402
from torchburn.ir import expr as ex  # noqa: E402
from torchburn.runtime.reference import interp  # noqa: E402

SYMBOLS = {"s0": 3, "s1": 2, "s2": 5}


def _small_loops(k: lp.Kernel) -> bool:
    """Every loop's bounds are small numbers of the symbols alone (random IR may ask for 2**62
    iterations), and the whole nest runs at most a few thousand iterations."""
    total = 1
    for s in lp.walk_stmts(k.body):
        if isinstance(s, lp.For):
            try:
                start, extent = (ex.evaluate_index(e, SYMBOLS) for e in (s.start, s.extent))
            except (KeyError, ValueError, ZeroDivisionError, OverflowError):  # cast<i64>(inf): no loop to run
                return False
            if abs(start) > 64 or abs(extent) > 64:
                return False
            total *= max(extent, 1)
    return total <= 4096


def _run(program: lp.Program, inputs: dict[str, np.ndarray], monkeypatch: pytest.MonkeyPatch, serial: bool) -> dict:
    interp._CACHE.clear()
    with monkeypatch.context() as m:
        if serial:
            m.setattr(interp, "laneable", lambda loop: False)
            m.setattr(interp, "accumulator_updates", lambda loop: None)
        return run_arrays(program, inputs, SYMBOLS)


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(k=kernels(max_depth=3), seed=st.integers(0, 2 ** 16))
def test_random_kernels_give_the_same_results_in_lanes_and_serially(k: lp.Kernel, seed: int,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    assume(_small_loops(k))
    program = kernel_program(k)
    rng = np.random.default_rng(seed)
    inputs = {}
    for b in program.inputs:
        shape = tuple(ex.evaluate_index(d, SYMBOLS) for d in b.shape)
        inputs[b.name] = (rng.standard_normal(shape) * 4 if b.dtype.is_float else rng.integers(-9, 9, shape)).astype(
            np.float32 if b.dtype == dt.bf16 else semantics.storage(b.dtype))
    undefined = (ExecutionError, semantics.DivisionByZero, semantics.UndefinedOp)
    try:
        serial = _run(program, inputs, monkeypatch, serial=True)
    except undefined:
        assume(False)
    laned = _run(program, inputs, monkeypatch, serial=False)
    assert serial.keys() == laned.keys()
    for name in serial:
        np.testing.assert_array_equal(laned[name], serial[name], err_msg=f"%{name}")


def test_a_reduction_outside_any_lanes() -> None:
    text = """
    kernel @k(%x: f32[5] strides [1], %out: f32[] strides []) {
      alloc %acc: f32[1] strides [1] local
      %acc[0] = 0.0:f32
      for r in 0..5 {
        %acc[0] = %acc[0] + %x[r]
      }
      %out[] = %acc[0]
    }
    """
    x = np.arange(5, dtype=np.float32)
    assert run(text, x=x)["out"] == 10
