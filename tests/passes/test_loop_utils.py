"""Shared helpers of the loop passes: polynomial form, affine coefficients, names, loops."""
from __future__ import annotations

from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.expr import Const, Var
from torchburn.ir.parser import parse_expr, parse_stmt
from torchburn.ir.printer import print_expr, print_stmt
from torchburn.passes.loop.loop_utils import (
    NameSupply,
    Poly,
    affine_coefficient,
    flat_address,
    freshen,
    make_loop,
    vector_binary,
)


def p(text: str) -> Poly:
    return Poly.of(parse_expr(text))


def test_poly_equality_is_structural_arithmetic() -> None:
    assert p("i0 * 4 + (i1 + 1) * 4 - 4") == p("(i0 + i1) * 4")
    assert p("s0 * i0 + i0 * s0") == p("2 * i0 * s0")
    assert p("(a + b) * (a - b)") == p("a * a - b * b")
    assert p("i0 - i0").is_const and p("i0 - i0").const_value == 0


def test_poly_keeps_opaque_atoms() -> None:
    q = p("(i // 4) * 4 + i % 4 + 1")
    assert q.const_value == 1
    assert {print_expr(a) for a in q.atoms()} == {"i // 4", "i % 4"}


def test_to_expr_reads_naturally() -> None:
    assert print_expr(p("1 + i1 + i0 * 4").to_expr()) == "i0 * 4 + i1 + 1"
    assert print_expr(p("s0 - 1 - i0").to_expr()) == "s0 - i0 - 1"
    assert print_expr(p("3 - i0").to_expr()) == "3 - i0"
    assert print_expr(p("0 - i0").to_expr()) == "i0 * -1"


def test_affine_coefficient() -> None:
    e = parse_expr("i0 * s1 * 4 + i1 * 4 + i2")
    assert print_expr(affine_coefficient(e, "i0")) == "s1 * 4"
    assert print_expr(affine_coefficient(e, "i2")) == "1"
    assert print_expr(affine_coefficient(e, "j")) == "0"
    assert affine_coefficient(parse_expr("i * i"), "i") is None
    assert affine_coefficient(parse_expr("i // 4"), "i") is None


def test_flat_address() -> None:
    index = (Var("i0"), Var("i1"))
    assert print_expr(flat_address(index, (Var("s1"), Const(1)))) == "i0 * s1 + i1"


def test_vector_binary_keeps_closed_forms() -> None:
    ramp = ex.Ramp(Var("b"), Const(1), ex.ScalarType(ex.dt.index, 8))
    assert print_expr(vector_binary("add", ramp, Var("x"))) == "ramp(b + x, 1, 8)"
    assert print_expr(vector_binary("mul", ramp, Const(4))) == "ramp(b * 4, 4, 8)"
    assert print_expr(vector_binary("sub", Const(0), ramp)) == "ramp(0 - b, -1, 8)"
    two = ex.Broadcast(Const(2), ramp.type)
    assert print_expr(vector_binary("add", two, Var("x"))) == "broadcast(2 + x, 8)"
    assert print_expr(vector_binary("lt", ramp, Var("n"))) == "ramp(b, 1, 8) < broadcast(n, 8)"


def test_name_supply_and_freshen() -> None:
    names = NameSupply({"t", "t_1", "i"})
    assert names.fresh("t") == "t_2"
    assert names.fresh("u") == "u"
    body = parse_stmt("let t = i * 2\nalloc %tmp: f32[1] strides [1] local\n%tmp[0] = cast<f32>(t)")
    copy = freshen(body, names)
    assert print_stmt(copy).splitlines() == [
        "let t_3 = i * 2", "alloc %tmp: f32[1] strides [1] local", "%tmp[0] = cast<f32>(t_3)"]


def test_make_loop_folds_trivial_trip_counts() -> None:
    body = parse_stmt("%out[i] = 1.0:f32")
    assert make_loop(Var("i"), Const(0), Const(0), "serial", body) == lp.Block(())
    assert print_stmt(make_loop(Var("i"), Const(3), Const(1), "serial", body)).strip() == "%out[3] = 1.0:f32"
    assert isinstance(make_loop(Var("i"), Const(0), Var("n"), "serial", body), lp.For)
