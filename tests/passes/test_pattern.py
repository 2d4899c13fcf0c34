"""The public rewrite API: patterns on tensor ops and loop expressions, the rewriter, the
greedy driver (fixed point, non-termination), and passes made of patterns."""
from __future__ import annotations

import textwrap
from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence

import pytest

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir.parser import parse_graph, parse_program
from torchburn.ir.printer import print_graph, print_program
from torchburn.ir.tensor import Op
from torchburn.ir.verifier import verify
from torchburn.passes.base import PassManager, VerifyAfterEach, parse_pipeline, register_pass, PASSES
from torchburn.passes.pattern import (DeadOp, ExprPattern, Pattern, PatternError, PatternPass,
                                      RewritePattern, Rewriter, apply_patterns_greedily,
                                      constant_value, is_constant)


def graph(text: str):  # type: ignore[no-untyped-def]
    g = parse_graph(textwrap.dedent(text))
    verify(g)
    return g


def same(got: str, want: str) -> None:
    assert got.strip() == textwrap.dedent(want).strip(), f"--- got ---\n{got}"


class PowTwoToMul(RewritePattern):
    """pow(x, 2) -> mul(x, x)"""

    op_name = "pow"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        x, exponent = op.operands
        if not is_constant(exponent, 2):
            return False
        rewriter.replace_op_with(op, "mul", [x, x])
        return True


POW = """
    graph @main(%x: f32[4, 8]) {
      %0 = full() {shape = [], value = 2.0, dtype = f32} : f32[] loc("aten.pow.Tensor_Scalar @ m.py:3")
      %1 = reshape(%0) {shape = [1, 1]} : f32[1, 1] loc("aten.pow.Tensor_Scalar @ m.py:3")
      %2 = expand(%1) {shape = [4, 8]} : f32[4, 8] loc("aten.pow.Tensor_Scalar @ m.py:3")
      %3 = pow(%x, %2) : f32[4, 8] loc("aten.pow.Tensor_Scalar @ m.py:3")
      return %3
    }
"""


def test_replace_op_with_and_dead_op() -> None:
    g = graph(POW)
    apply_patterns_greedily(g, [PowTwoToMul(), DeadOp()])
    verify(g)
    same(print_graph(g), """
        graph @main(%x: f32[4, 8]) {
          %4 = mul(%x, %x) : f32[4, 8] loc("aten.pow.Tensor_Scalar @ m.py:3")
          return %4
        }
    """)


def test_without_dead_op_the_constant_stays() -> None:
    g = graph(POW)
    apply_patterns_greedily(g, [PowTwoToMul()])
    assert [op.name for op in g.ops] == ["full", "reshape", "expand", "mul"]


def test_constant_value_sees_through_views() -> None:
    g = graph(POW)
    assert constant_value(g.ops[2].result) == 2.0
    assert constant_value(g.ops[3].result) is None
    assert constant_value(g.inputs[0]) is None  # type: ignore[arg-type]
    assert is_constant(g.ops[1].result, 2) and not is_constant(g.ops[1].result, 3)


def test_rewriter_queries_and_insert_before() -> None:
    g = graph("""
        graph @main(%x: f32[4]) {
          %0 = exp(%x) : f32[4]
          %1 = add(%0, %0) : f32[4]
          return %1
        }
    """)
    rw = Rewriter(g)
    exp_op, add_op = g.ops
    assert rw.users(exp_op.result) == [add_op]
    assert rw.has_uses(add_op.result) and not rw.is_dead(exp_op)
    neg = rw.insert_op_before(exp_op, "neg", [g.inputs[0]])  # type: ignore[list-item]
    assert neg.result.type == exp_op.result.type and neg.loc is None
    rw.replace_all_uses(exp_op.result, neg.result)
    assert rw.is_dead(exp_op)
    rw.erase_op(exp_op)
    verify(g)
    same(print_graph(g), """
        graph @main(%x: f32[4]) {
          %2 = neg(%x) : f32[4]
          %1 = add(%2, %2) : f32[4]
          return %1
        }
    """)
    with pytest.raises(PatternError, match="still used"):
        rw.erase_op(neg)
    with pytest.raises(PatternError, match="types differ"):
        bad = rw.insert_op_before(add_op, "cast", [neg.result], {"dtype": dt.f64})
        rw.replace_all_uses(neg.result, bad.result)


def test_replace_op_checks_result_count() -> None:
    g = graph(POW)
    with pytest.raises(PatternError, match="1 result"):
        Rewriter(g).replace_op(g.ops[3], [])


class Flip(RewritePattern):
    """add(a, b) -> add(b, a): never settles."""

    op_name = "add"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        a, b = op.operands
        rewriter.replace_op_with(op, "add", [b, a])
        return True


def test_non_termination_is_reported() -> None:
    g = graph("""
        graph @main(%x: f32[4], %y: f32[4]) {
          %0 = add(%x, %y) : f32[4]
          return %0
        }
    """)
    with pytest.raises(PatternError, match=r"fixed point after 5 iterations.*Flip \(1x\)"):
        apply_patterns_greedily(g, [Flip()], max_iterations=5)


class Liar(RewritePattern):
    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        return True


class Sneaky(RewritePattern):
    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        rewriter.set_attr(op, "note", 1)
        return False


def test_protocol_errors() -> None:
    with pytest.raises(PatternError, match="returned True on exp but changed nothing"):
        apply_patterns_greedily(graph("graph @m(%x: f32[2]) {\n %0 = exp(%x) : f32[2]\n return %0\n}"), [Liar()])
    with pytest.raises(PatternError, match="returned False"):
        apply_patterns_greedily(graph("graph @m(%x: f32[2]) {\n %0 = exp(%x) : f32[2]\n return %0\n}"), [Sneaky()])


def test_patterns_must_fit_the_level() -> None:
    g = graph(POW)
    with pytest.raises(PatternError, match="RewritePatterns"):
        apply_patterns_greedily(g, [FoldMulOne()])  # type: ignore[list-item]


# ---- loop level ----------------------------------------------------------------------------------

class FoldMulOne(ExprPattern):
    """x * 1.0 -> x"""

    node_type = ex.Binary

    def match_and_rewrite(self, e: ex.Expr) -> Optional[ex.Expr]:
        assert isinstance(e, ex.Binary)
        if e.op == "mul" and isinstance(e.b, ex.Const) and e.b.value == 1:
            return e.a
        return None


class SquareToMul(ExprPattern):
    """pow(x, 2.0) -> x * x"""

    node_type = ex.Binary

    def match_and_rewrite(self, e: ex.Expr) -> Optional[ex.Expr]:
        assert isinstance(e, ex.Binary)
        if e.op == "pow" and isinstance(e.b, ex.Const) and e.b.value == 2:
            return ex.Binary("mul", e.a, e.a, e.type)
        return None


PROGRAM = """
    program @p(%x: f32[4] strides [1]) -> (%out: f32[4] strides [1]) {
      call @k0(%x, %out)
    }
    kernel @k0(%x: f32[4] strides [1], %out: f32[4] strides [1]) {
      for i0 in 0..4 {
        %out[i0] = pow(%x[i0] * 1.0:f32, 2.0:f32) * 1.0:f32
      }
    }
"""


def test_expr_patterns_on_a_program() -> None:
    p = parse_program(textwrap.dedent(PROGRAM))
    out = apply_patterns_greedily(p, [FoldMulOne(), SquareToMul()])
    verify(out)
    same(print_program(out), """
        program @p(%x: f32[4] strides [1]) -> (%out: f32[4] strides [1]) {
          call @k0(%x, %out)
        }
        kernel @k0(%x: f32[4] strides [1], %out: f32[4] strides [1]) {
          for i0 in 0..4 {
            %out[i0] = %x[i0] * %x[i0]
          }
        }
    """)
    assert apply_patterns_greedily(out, [FoldMulOne()]) is out  # nothing to do: same object


class WrongType(ExprPattern):
    def match_and_rewrite(self, e: ex.Expr) -> Optional[ex.Expr]:
        if isinstance(e, ex.Load):
            return ex.Cast(e, ex.ScalarType(dt.f64))
        return None


class Grow(ExprPattern):
    """x -> x + 0.0 on every load: never settles."""

    node_type = ex.Load

    def match_and_rewrite(self, e: ex.Expr) -> Optional[ex.Expr]:
        return ex.Binary("add", e, ex.Const(0.0, e.type), e.type)


def test_expr_pattern_errors() -> None:
    p = parse_program(textwrap.dedent(PROGRAM))
    with pytest.raises(PatternError, match="changed the type"):
        apply_patterns_greedily(p, [WrongType()])
    with pytest.raises(PatternError, match="Grow"):
        apply_patterns_greedily(p, [Grow()], max_iterations=4)


# ---- passes made of patterns -----------------------------------------------------------------------

@dataclass(frozen=True)
class PowPass(PatternPass):
    """pow(x, 2) -> mul(x, x), with dead constants removed."""

    name: ClassVar[str] = "test-pow-to-mul"

    def patterns(self) -> Sequence[Pattern]:
        return [PowTwoToMul(), DeadOp()]


def test_pattern_pass_registers_runs_and_hashes_its_patterns() -> None:
    register_pass(PowPass)
    try:
        (p,) = parse_pipeline("test-pow-to-mul")
        g = PassManager([p], [VerifyAfterEach()]).run(graph(POW))
        assert [op.name for op in g.ops] == ["mul"]  # type: ignore[union-attr]
        uuid = p.uuid()
        assert "PowTwoToMul=" in uuid and "DeadOp" not in uuid  # torchburn's own are versioned
    finally:
        PASSES.pop("test-pow-to-mul", None)


@dataclass(frozen=True)
class LoopPowPass(PatternPass):
    name: ClassVar[str] = "test-loop-square"
    level: ClassVar[str] = "loop"

    def patterns(self) -> Sequence[Pattern]:
        return [SquareToMul(), FoldMulOne()]


def test_loop_pattern_pass() -> None:
    out = PassManager([LoopPowPass()], [VerifyAfterEach()]).run(parse_program(textwrap.dedent(PROGRAM)))
    assert "pow" not in print_program(out)  # type: ignore[arg-type]
