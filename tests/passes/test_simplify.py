"""`simplify`: the rewrite table on expressions, and the statement clean-ups."""
from __future__ import annotations

import numpy as np
import pytest

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir.expr import Binary, Const, ScalarType, Var, substitute
from torchburn.ir.parser import parse_expr
from torchburn.ir.printer import print_expr
from torchburn.passes.loop.bounds import Bounds
from torchburn.passes.loop.simplify import Simplify, simplify_expr

from .util import assert_ir, execute, kernel, run_pass


def simp(text: str, bounds: Bounds | None = None) -> str:
    return print_expr(simplify_expr(parse_expr(text), bounds))


@pytest.mark.parametrize("before, after", [
    # constant folding, in the operand dtype
    ("3 + 4 * 2", "11"),
    ("7 // -2", "-4"),
    ("-7 % 3", "2"),
    ("100:i8 + 100:i8", "-56:i8"),
    ("1.5:f32 * 2.0:f32", "3.0:f32"),
    ("0.1:f32 + 0.2:f32", "0.30000001192092896:f32"),
    ("1.0:f32 / 0.0:f32", "inf:f32"),
    ("2 < 3", "true"),
    ("cast<f32>(0.1:f64)", "0.10000000149011612:f32"),
    ("cast<i32>(-2.7:f32)", "-2:i32"),
    # identities (float ones only where IEEE-exact)
    ("x * 1", "x"),
    ("x + 0", "x"),
    ("x * 0", "0"),
    ("x - x", "0"),
    ("x // 1", "x"),
    ("x % 1", "0"),
    ("min(x, x)", "x"),
    ("select(true, x, y)", "x"),
    ("select(x < y, z, z)", "z"),
    # polynomial normal form
    ("(i0 + 1) * 4 - 4", "i0 * 4"),
    ("(i0 * 4 + 1) * 2 - i0 * 8", "2"),
    ("s0 - 1 - i0", "s0 - i0 - 1"),
    ("i1 + i0 * s1 + 0", "i0 * s1 + i1"),
    # division and remainder
    ("(a * 8) // 4", "a * 2"),
    ("(a * 8 + b) % 4", "b % 4"),
    ("(x // 4) // 8", "x // 32"),
    ("(x % 12) % 4", "x % 4"),
    ("(x // 4) * 4 + x % 4", "x"),
    ("(x // 4) * 8 + (x % 4) * 2 + 1", "x * 2 + 1"),
    ("(a * 8 + b * 4 + 6) // 4", "a * 2 + b + 1"),
    ("(a * s0) // s0", "a"),
    ("(a * s0 + b) % s0", "b % s0"),
])
def test_expression_rules(before: str, after: str) -> None:
    assert simp(before) == after


def test_float_rules_respect_signed_zero() -> None:
    x = Var("x", ScalarType(dt.f32))
    assert simplify_expr(Binary("add", x, Const(-0.0, x.type), x.type)) == x
    assert simplify_expr(Binary("sub", x, Const(0.0, x.type), x.type)) == x
    assert simplify_expr(Binary("mul", x, Const(1.0, x.type), x.type)) == x
    plus_zero = Binary("add", x, Const(0.0, x.type), x.type)
    assert simplify_expr(plus_zero) == plus_zero  # -0.0 + 0.0 is +0.0, not x
    times_zero = Binary("mul", x, Const(0.0, x.type), x.type)
    assert simplify_expr(times_zero) == times_zero  # nan * 0 is nan


def loop_bounds() -> Bounds:
    b = Bounds(["s0", "s1"])
    b = b.bind_loop(Var("i"), Const(0), Const(4))
    b = b.bind_loop(Var("j"), Const(0), Var("s1"))
    return b


@pytest.mark.parametrize("before, after", [
    ("(q * 4 + i) // 4", "q"),          # 0 <= i < 4
    ("(q * 4 + i) % 4", "i"),
    ("(i + 4) // 4", "1"),
    ("(q * s1 + j) // s1", "q"),         # 0 <= j < s1, symbolic
    ("(q * s1 + j) % s1", "j"),
    ("i < 4", "true"),
    ("i >= 4", "false"),
    ("j < s1", "true"),
    ("i == 5", "false"),
    ("min(i, 7)", "i"),
    ("max(i, 3)", "3"),
    ("max(i, 2)", "max(i, 2)"),
    ("max(j, s1)", "s1"),
    ("select(i < 4, a, b)", "a"),
])
def test_rules_using_loop_bounds(before: str, after: str) -> None:
    assert simp(before, loop_bounds()) == after


def test_docstring_example() -> None:
    k = kernel("""
        kernel @k(%x: f32[64] strides [1], %out: f32[16, 4] strides [4, 1]) {
          for i0 in 0..16 {
            for i1 in 0..4 {
              for i2 in 0..1 {
                let t = 0
                %out[(i0 * 4 + i1 + i2) // 4, (i0 * 4 + i1) % 4] = %x[i0 * 4 + i1 + t] * 1.0:f32
              }
            }
          }
        }
    """)
    out = run_pass(Simplify(), k)
    assert_ir(out, """
        kernel @k(%x: f32[64] strides [1], %out: f32[16, 4] strides [4, 1]) {
          for i0 in 0..16 {
            for i1 in 0..4 {
              %out[i0, i1] = %x[i0 * 4 + i1]
            }
          }
        }
    """)
    x = np.arange(64, dtype=np.float32)
    for kk in (k, out):
        r = execute(kk, {"x": x, "out": np.zeros((16, 4), np.float32)})
        np.testing.assert_array_equal(r["out"].ravel(), x)


def test_statement_cleanups() -> None:
    k = kernel("""
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..s0 {
            let unused = %x[i] * 2.0:f32
            alloc %dead: f32[4] strides [1] local
            let c = 3
            for e in 0..0 {
              %out[e] = 1.0:f32
            }
            for z in 0..s0 - s0 {
              %out[z] = 1.0:f32
            }
            if i < s0 {
              %out[i] = %x[i + c - 3]
            } else {
              %out[i] = 0.0:f32
            }
          }
        }
    """)
    assert_ir(run_pass(Simplify(), k), """
        kernel @k(%x: f32[s0] strides [1], %out: f32[s0] strides [1]) symbols(s0) {
          for i in 0..s0 {
            %out[i] = %x[i]
          }
        }
    """)


def test_extent_one_loop_keeps_its_names_local() -> None:
    """Two one-iteration loops with a `let t` each dissolve into one block: one `t` is renamed
    (the verifier forbids binding a name twice in one scope; the first, since the second loop
    still binds `t` when the first dissolves)."""
    k = kernel("""
        kernel @k(%x: f32[4] strides [1], %out: f32[4, 2] strides [2, 1]) {
          for i in 0..4 {
            for j in 0..1 {
              let t = %x[i] * 2.0:f32
              %out[i, j] = t
            }
            for j in 1..+1 {
              let t = %x[i] * 3.0:f32
              %out[i, j] = t
            }
          }
        }
    """)
    out = run_pass(Simplify(), k)
    assert_ir(out, """
        kernel @k(%x: f32[4] strides [1], %out: f32[4, 2] strides [2, 1]) {
          for i in 0..4 {
            let t_1 = %x[i] * 2.0:f32
            %out[i, 0] = t_1
            let t = %x[i] * 3.0:f32
            %out[i, 1] = t
          }
        }
    """)


def test_extent_one_loop_before_a_loop_binding_its_names() -> None:
    """A one-iteration loop dissolved before a loop whose body binds the same name (a
    vectorized loop of one iteration and its scalar tail): the dissolved `t` is renamed, so
    the later `t` does not bind a name already in scope (a verifier error before: a biased
    5x5 convolution 36 wide on AVX2)."""
    from torchburn.ir.verifier import verify_kernel

    k = kernel("""
        kernel @k(%x: f32[4] strides [1], %out: f32[4, 3] strides [3, 1]) {
          for i in 0..4 {
            for j in 0..1 {
              let t = %x[i] * 2.0:f32
              %out[i, j] = t
            }
            for j in 1..+2 {
              let t = %x[i] * 3.0:f32
              %out[i, j] = t
            }
          }
        }
    """)
    out = run_pass(Simplify(), k)
    verify_kernel(out)
    assert_ir(out, """
        kernel @k(%x: f32[4] strides [1], %out: f32[4, 3] strides [3, 1]) {
          for i in 0..4 {
            let t_1 = %x[i] * 2.0:f32
            %out[i, 0] = t_1
            for j in 1..+2 {
              let t = %x[i] * 3.0:f32
              %out[i, j] = t
            }
          }
        }
    """)


def test_idempotent_on_its_output() -> None:
    k = kernel("""
        kernel @k(%x: f32[s0, 8] strides [8, 1], %out: f32[s0, 8] strides [8, 1]) symbols(s0) {
          for i in 0..s0 * 8 {
            %out[i // 8, i % 8] = %x[(i // 8 * 8 + i % 8) // 8, i % 8]
          }
        }
    """)
    once = run_pass(Simplify(), k)
    assert run_pass(Simplify(), once) == once
    assert_ir(once, """
        kernel @k(%x: f32[s0, 8] strides [8, 1], %out: f32[s0, 8] strides [8, 1]) symbols(s0) {
          for i in 0..s0 * 8 {
            %out[i // 8, i % 8] = %x[i // 8, i % 8]
          }
        }
    """)


def test_simplified_forms_are_kept_per_scope() -> None:
    """`simplify_expr` keeps its results in the `Bounds` scope: asking again in the same scope
    is a hit (the same object back), an inner scope starts empty (its ranges differ)."""
    from torchburn.ir import expr as ex
    from torchburn.passes.loop.bounds import Bounds, Interval
    from torchburn.passes.loop.simplify import simplify_expr

    i = parse_expr("i")
    outer = Bounds()
    e = parse_expr("(i + 0) % 4")
    first = simplify_expr(e, outer)
    assert parse_expr("i + 0") in outer.simplified
    assert simplify_expr(e, outer) is first
    inner = outer.bind("i", Interval.const(0, 3))
    assert inner.simplified == {}
    assert simplify_expr(e, inner) == i  # the inner scope knows 0 <= i < 4: not the outer's answer
    assert simplify_expr(e, outer) is first


def test_signed_zeros_are_different_constants() -> None:
    """-0.0 and 0.0 are not equal IR (a memo keyed on expressions must not swap them)."""
    from torchburn.ir import expr as ex
    from torchburn.passes.loop.bounds import Bounds
    from torchburn.passes.loop.simplify import simplify_expr

    f32 = ScalarType(dt.f32)
    neg, pos = ex.Const(-0.0, f32), ex.Const(0.0, f32)
    assert neg != pos and neg == ex.Const(-0.0, f32)
    scope = Bounds()
    assert simplify_expr(pos, scope) == pos
    out = simplify_expr(neg, scope)
    assert out == neg and str(out.value) == "-0.0"


@pytest.mark.parametrize("value, dtype, expected", [(5, dt.i32, -5), (-2**31, dt.i32, -2**31), (-2**63, dt.i64, -2**63)])
def test_negating_an_integer_constant_folds_and_wraps(value: int, dtype: dt.DType, expected: int) -> None:
    """`neg(c)` of an integer folds to `-c` wrapped to the type (two's complement: -INT_MIN is
    INT_MIN), as the scalar semantics and the generated code compute it."""
    from torchburn.ir import expr as ex
    from torchburn.passes.loop.simplify import double_negation
    folded = double_negation(ex.Call("neg", (Const(value, ScalarType(dtype)),), ScalarType(dtype)), Bounds({}))
    assert isinstance(folded, Const) and folded.value == expected


@pytest.mark.parametrize("before, after", [
    # 16 lanes of a 128-wide row read through a flattened view: one row, contiguous
    ("ramp(r * 64 + 16, 1, 16) // broadcast(128, 16)", "broadcast((r * 64 + 16) // 128, 16)"),
    ("ramp(r * 64 + 16, 1, 16) % broadcast(128, 16)", "ramp((r * 64 + 16) % 128, 1, 16)"),
    ("ramp(r * 32, 2, 16) % broadcast(64, 16)", "ramp(r * 32 % 64, 2, 16)"),
    ("ramp(r * 48, 1, 8) // broadcast(40, 8)", "broadcast(r * 48 // 40, 8)"),  # r * 48 % 40 is a multiple of 8
    # lanes that may straddle a multiple of the divisor stay as they are
    ("ramp(r * 8, 1, 16) // broadcast(128, 16)", "ramp(r * 8, 1, 16) // broadcast(128, 16)"),
    ("ramp(r * 48, 1, 16) // broadcast(40, 16)", "ramp(r * 48, 1, 16) // broadcast(40, 16)"),
    ("ramp(r * 64 + 1, 1, 16) % broadcast(128, 16)", "ramp(r * 64 + 1, 1, 16) % broadcast(128, 16)"),
    # index (i64) arithmetic only: a narrower integer wraps
    ("ramp(cast<i32>(r) * 16:i32, 1:i32, 4) // broadcast(32:i32, 4)",
     "ramp(cast<i32>(r) * 16:i32, 1:i32, 4) // broadcast(32:i32, 4)"),
])
def test_ramp_division_in_closed_form(before: str, after: str) -> None:
    assert simp(before) == after


@pytest.mark.parametrize("g, stride, lanes, c", [(16, 1, 16, 128), (48, 1, 8, 40), (32, 2, 16, 64), (6, 1, 2, 4),
                                                  (12, 2, 3, 18)])
def test_ramp_division_rule_matches_lane_by_lane(g: int, stride: int, lanes: int, c: int) -> None:
    """Where the rule fires, every lane's floor quotient and remainder (negative bases too)
    equal the closed form's."""
    for op, symbol in (("floordiv", "//"), ("mod", "%")):
        out = simplify_expr(parse_expr(f"ramp(r * {g}, {stride}, {lanes}) {symbol} broadcast({c}, {lanes})"))
        assert print_expr(out).startswith("broadcast" if op == "floordiv" else "ramp(")
        for r in range(-40, 41):
            x = r * g
            want = [(x + i * stride) // c if op == "floordiv" else (x + i * stride) % c for i in range(lanes)]
            assert _lanes(simplify_expr(substitute(out, {"r": Const(r)}))) == want, (op, r)


def _lanes(e: ex.Expr) -> list[int]:
    """The lanes of a constant vector in closed form."""
    if isinstance(e, ex.Broadcast) and isinstance(e.value, Const):
        return [int(e.value.value)] * e.type.lanes
    assert isinstance(e, ex.Ramp) and isinstance(e.base, Const) and isinstance(e.stride, Const), e
    return [int(e.base.value) + i * int(e.stride.value) for i in range(e.type.lanes)]
