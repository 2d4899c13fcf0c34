"""Expressions 20,000 deep through every IR tool: the printer, parser, verifier, structural
hash, equality and the walks (`walk`, `postorder`, `free_vars`, `substitute`, `ExprMutator`).

Each tool walks with an explicit stack; Python's recursion limit (1,000 frames) stays as it
is, so a recursive walk anywhere fails these tests with `RecursionError`.
"""
from __future__ import annotations

import sys

import pytest

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.hashing import structural_hash
from torchburn.ir.parser import parse_expr, parse_kernel
from torchburn.ir.printer import print_expr, print_kernel
from torchburn.ir.transform import ExprMutator
from torchburn.ir.verifier import VerificationError, verify

DEPTH = 20_000
F32 = ex.ScalarType(dt.f32)
BUFFERS = {"x": dt.f32}


def x_at(i: str) -> ex.Load:
    return ex.Load("x", (ex.Var(i),), F32)


def right_nested(depth: int, leaf: ex.Expr) -> ex.Expr:
    """`l + (l * (l - (...)))`: each level needs parentheses, so parsing nests as deep."""
    e = leaf
    ops = ("add", "mul", "sub")
    for k in range(depth):
        e = ex.Binary(ops[k % 3], leaf, e, F32)
    return e


def nested_calls(depth: int, leaf: ex.Expr) -> ex.Expr:
    """`exp(cast<f32>(max(select(c, ..., l), l)))`-like nesting of every call-shaped node."""
    e = leaf
    for k in range(depth):
        kind = k % 4
        if kind == 0:
            e = ex.Call("exp", (e,), F32)
        elif kind == 1:
            e = ex.Cast(ex.Cast(e, ex.ScalarType(dt.f64)), F32)
        elif kind == 2:
            e = ex.Binary("max", e, leaf, F32)
        else:
            e = ex.Select(ex.Binary("lt", leaf, leaf, ex.BOOL), e, leaf, F32)
    return e


def left_chain(depth: int, leaf: ex.Expr) -> ex.Expr:
    e = leaf
    for _ in range(depth):
        e = ex.Binary("add", e, leaf, F32)
    return e


SHAPES = {"right_nested": right_nested, "nested_calls": nested_calls, "left_chain": left_chain}


def test_recursion_limit_is_untouched() -> None:
    assert sys.getrecursionlimit() < DEPTH // 4


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_print_parse_round_trip(shape: str) -> None:
    e = SHAPES[shape](DEPTH, x_at("i"))
    text = print_expr(e)
    back = parse_expr(text, buffers=BUFFERS)
    assert back == e
    assert back is not e
    assert print_expr(back) == text


def test_equality_and_hash_of_separately_built_trees() -> None:
    a = right_nested(DEPTH, x_at("i"))
    b = right_nested(DEPTH, x_at("i"))
    c = right_nested(DEPTH, x_at("j"))  # differs only at the leaves, 20,000 levels down
    assert a == b and hash(a) == hash(b)
    assert a != c
    assert len({a, b, c}) == 2


def test_walks() -> None:
    e = nested_calls(DEPTH, x_at("i"))
    nodes = list(ex.walk(e))
    assert nodes[0] is e
    post = list(ex.postorder(e))
    assert post[-1] is e and len(post) == len(nodes)
    assert ex.free_vars(e) == {"i"}
    swapped = ex.substitute(e, {"i": ex.Var("j")})
    assert ex.free_vars(swapped) == {"j"}
    assert swapped == nested_calls(DEPTH, x_at("j"))


def test_mutator_rebuilds_only_what_changes() -> None:
    class Doubler(ExprMutator):
        def visit_Call(self, node: ex.Call) -> ex.Expr:  # not recursive: exp's operand is kept
            return node

    leaf = x_at("i")
    e = left_chain(DEPTH, leaf)
    assert Doubler().visit(e) is e

    class LeafSwap(ExprMutator):
        def visit_Load(self, node: ex.Load) -> ex.Expr:
            return x_at("k")

    out = LeafSwap().visit(e)
    assert out == left_chain(DEPTH, x_at("k"))


def deep_kernel(e: ex.Expr) -> lp.Kernel:
    shape = (ex.Const(8),)
    params = (lp.Buffer("x", dt.f32, shape, (ex.Const(1),)), lp.Buffer("out", dt.f32, shape, (ex.Const(1),)))
    body = lp.For(ex.Var("i"), ex.Const(0), ex.Const(8), "serial", lp.Store("out", (ex.Var("i"),), e))
    return lp.Kernel("deep", params, (), body)


def test_kernel_verify_print_parse_hash() -> None:
    k = deep_kernel(right_nested(DEPTH, x_at("i")))
    verify(k)
    text = print_kernel(k)
    back = parse_kernel(text)
    assert back == k
    verify(back)
    renamed = deep_kernel(right_nested(DEPTH, x_at("i")))
    assert structural_hash(renamed) == structural_hash(k)


def test_verifier_finds_a_type_error_deep_down() -> None:
    bad_leaf = ex.Binary("add", x_at("i"), ex.Const(1, ex.ScalarType(dt.f64)), F32)
    k = deep_kernel(right_nested(DEPTH, bad_leaf))
    with pytest.raises(VerificationError, match="operands of add differ in type"):
        verify(k)
