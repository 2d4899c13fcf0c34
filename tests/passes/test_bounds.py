"""Range analysis of index expressions."""
from __future__ import annotations

from torchburn.ir.expr import Const, Var
from torchburn.ir.parser import parse_expr
from torchburn.ir.printer import print_expr
from torchburn.passes.loop.bounds import Bounds, Interval


def nest() -> Bounds:
    """for i0 in 0..s0 { for i1 in 0..4 { for j in 1..+s1 { ..."""
    b = Bounds(["s0", "s1"])
    b = b.bind_loop(Var("i0"), Const(0), Var("s0"))
    b = b.bind_loop(Var("i1"), Const(0), Const(4))
    return b.bind_loop(Var("j"), Const(1), Var("s1"))


def rng(b: Bounds, text: str) -> tuple[str, str]:
    r = b.interval(parse_expr(text))
    return ("-inf" if r.lo is None else print_expr(r.lo.to_expr()),
            "inf" if r.hi is None else print_expr(r.hi.to_expr()))


def test_loop_ranges_are_symbolic() -> None:
    b = nest()
    assert rng(b, "i0") == ("0", "s0 - 1")
    assert rng(b, "j") == ("1", "s1")
    assert rng(b, "i0 * 4 + i1") == ("0", "s0 * 4 - 1")
    assert rng(b, "i1 - i1") == ("0", "0")  # normal form first: no spurious [-3, 3]
    assert rng(b, "3 - i1") == ("0", "3")


def test_opaque_operations() -> None:
    b = nest()
    assert rng(b, "i1 % 3") == ("0", "2")
    assert rng(b, "(i1 + 5) // 4") == ("1", "2")
    assert rng(b, "min(i1, 2)") == ("0", "2")
    assert rng(b, "max(i1, 2)") == ("2", "3")
    assert rng(b, "i0 % s1") == ("0", "s1 - 1")
    assert rng(b, "x & 15") == ("0", "15")
    assert rng(b, "cast<i64>(cast<u8>(x))") == ("0", "255")
    assert rng(b, "x") == ("-inf", "inf")


def test_min_and_max_of_incomparable_ends_keep_the_constant() -> None:
    """Either end bounds `min(32, s0 - i0)` from above; the constant one lets `tile`'s partial
    tiles be seen as at most 32 wide (whichever operand comes first)."""
    b = nest()
    assert rng(b, "min(32, s0 - i0)")[1] == "32"
    assert rng(b, "min(s0 - i0, 32)")[1] == "32"
    assert rng(b, "max(-5, i0 - s1)")[0] == "-5"
    assert rng(b, "max(i0 - s1, -5)")[0] == "-5"


def test_proofs() -> None:
    b = nest()
    assert b.prove_lt(parse_expr("i1"), Const(4))
    assert b.prove_lt(parse_expr("j - 1"), Var("s1"))
    assert b.prove_in(parse_expr("i0"), Const(0), Var("s0"))
    assert b.prove_nonneg(parse_expr("i0 * s1 + j"))
    assert not b.prove_lt(parse_expr("i0"), Var("s1"))   # unrelated symbols: unknown
    assert not b.prove_nonneg(parse_expr("i1 - 1"))


def test_interval_helpers() -> None:
    assert Interval.const(1, 3).scale(-2) == Interval.const(-6, -2)
    assert Interval.const(1, 3) + Interval.const(0, None) == Interval.const(1, None)
