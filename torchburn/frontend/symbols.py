"""Symbolic sizes: turn torch's SymInts (sympy expressions) into IR index expressions."""
from __future__ import annotations

from typing import Any, Optional, Union

import sympy
import torch

from ..ir import expr as ex
from ..ir.expr import Expr


class UnsupportedSymbolic(ValueError):
    """A symbolic size uses an operation the IR's index arithmetic cannot express."""


def sympy_to_expr(e: Any) -> Expr:
    """Convert a sympy expression over size symbols into an IR index expression."""
    if isinstance(e, (int, sympy.Integer)):
        return ex.Const(int(e))
    if isinstance(e, sympy.Symbol):
        return ex.Var(str(e))
    if isinstance(e, sympy.Add):
        acc: Expr = ex.Const(0)
        for a in e.args:
            acc = ex.add(acc, sympy_to_expr(a))
        return acc
    if isinstance(e, sympy.Mul):
        acc = ex.Const(1)
        for a in e.args:
            acc = ex.mul(acc, sympy_to_expr(a))
        return acc
    name = type(e).__name__
    if name == "FloorDiv":
        return ex.floordiv(sympy_to_expr(e.args[0]), sympy_to_expr(e.args[1]))
    if name in ("ModularIndexing",):
        base, div, mod = (sympy_to_expr(a) for a in e.args)
        return ex.mod(ex.floordiv(base, div), mod)
    if name in ("Mod", "PythonMod"):
        return ex.mod(sympy_to_expr(e.args[0]), sympy_to_expr(e.args[1]))
    if name in ("Max",):
        acc = sympy_to_expr(e.args[0])
        for a in e.args[1:]:
            acc = ex.maximum(acc, sympy_to_expr(a))
        return acc
    if name in ("Min",):
        acc = sympy_to_expr(e.args[0])
        for a in e.args[1:]:
            acc = ex.minimum(acc, sympy_to_expr(a))
        return acc
    if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) > 0:
        base = sympy_to_expr(e.base)
        acc = base
        for _ in range(int(e.exp) - 1):
            acc = ex.mul(acc, base)
        return acc
    raise UnsupportedSymbolic(f"symbolic size {e} ({name}) cannot be expressed in index arithmetic")


def expr_to_sympy(e: Expr) -> Optional[sympy.Expr]:
    """An IR index expression of sums, differences and products of sizes as sympy, or None for
    anything else (divisions, minima)."""
    if isinstance(e, ex.Const) and isinstance(e.value, int):
        return sympy.Integer(e.value)
    if isinstance(e, ex.Var):
        return sympy.Symbol(e.name, integer=True, positive=True)
    if isinstance(e, ex.Binary) and e.op in ("add", "sub", "mul"):
        a, b = expr_to_sympy(e.a), expr_to_sympy(e.b)
        if a is None or b is None:
            return None
        return a + b if e.op == "add" else a - b if e.op == "sub" else a * b
    return None


def same_size(e: Expr, s: Union[int, torch.SymInt]) -> bool:
    """Whether the IR expression `e` provably equals the size `s` (a polynomial identity in the
    size symbols): `s0 * 4` is `4*s0`, as torch writes it."""
    if e == size_to_expr(s):
        return True
    mine = expr_to_sympy(e)
    if mine is None:
        return False
    theirs = s.node.expr if isinstance(s, torch.SymInt) else sympy.Integer(int(s))
    names = {str(v): sympy.Symbol(str(v), integer=True, positive=True) for v in theirs.free_symbols}
    return sympy.expand(mine - theirs.subs(names)) == 0


def size_to_expr(s: Union[int, torch.SymInt]) -> Expr:
    """An int or SymInt size as an IR expression."""
    if isinstance(s, torch.SymInt):
        node = s.node
        if hasattr(node, "maybe_as_int") and node.maybe_as_int() is not None:
            return ex.Const(int(node.maybe_as_int()))
        return sympy_to_expr(node.expr)
    return ex.Const(int(s))


def shape_to_exprs(shape: Any) -> tuple[Expr, ...]:
    return tuple(size_to_expr(s) for s in shape)
