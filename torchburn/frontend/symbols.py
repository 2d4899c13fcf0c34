"""Symbolic sizes: turn torch's SymInts (sympy expressions) into IR index expressions."""
from __future__ import annotations

from typing import Any, Callable, Optional, Union

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


def expr_to_sympy(e: Expr, symbols: dict[str, sympy.Symbol],
                  known: Callable[[Any], bool] = lambda fact: False) -> Optional[sympy.Expr]:
    """An IR index expression as sympy over `symbols` (torch's own, by name), or None where it
    uses a name or an operation sympy is not given here. A minimum or maximum whose order
    `known` establishes (`known(a <= b)`) is resolved to that operand: a slice's clamped bounds
    become plain sums where torch guarded on them fitting."""
    if isinstance(e, ex.Const) and isinstance(e.value, int):
        return sympy.Integer(e.value)
    if isinstance(e, ex.Var):
        return symbols.get(e.name)
    if isinstance(e, ex.Binary) and e.op in _SYMPY_BINARY:
        a, b = expr_to_sympy(e.a, symbols, known), expr_to_sympy(e.b, symbols, known)
        if a is None or b is None:
            return None
        if e.op in ("min", "max"):
            if known(sympy.Le(a, b)):
                return a if e.op == "min" else b
            if known(sympy.Le(b, a)):
                return b if e.op == "min" else a
        return _SYMPY_BINARY[e.op](a, b)
    return None


def _floordiv(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    from torch.utils._sympy.functions import FloorDiv

    return FloorDiv(a, b)


def _mod(a: sympy.Expr, b: sympy.Expr) -> sympy.Expr:
    from torch.utils._sympy.functions import PythonMod

    return PythonMod(a, b)


_SYMPY_BINARY: dict[str, Callable[[sympy.Expr, sympy.Expr], sympy.Expr]] = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b,
    "min": sympy.Min, "max": sympy.Max, "floordiv": _floordiv, "mod": _mod,
}


def same_size(e: Expr, s: Union[int, torch.SymInt]) -> bool:
    """Whether the IR expression `e` provably equals the size `s`, as torch's shape environment
    decides from what it knows (each size's range: dynamic sizes are at least 2; the guards the
    compiled graph runs under) without adding a guard: `s0 * 4` is `4*s0`, and a slice's clamped
    length `min(s0 + 1, s1) - 1` is `s0` once torch guarded on `s0 + 1 <= s1`."""
    if e == size_to_expr(s):
        return True
    if not isinstance(s, torch.SymInt):
        return False
    env = s.node.shape_env
    axioms = env.get_axioms()

    def known(fact: Any) -> bool:
        try:
            return env._maybe_evaluate_static(fact, axioms=axioms) is sympy.true
        except Exception:  # noqa: BLE001 - what torch cannot reason about is not known
            return False

    symbols = {str(v): v for v in env.backed_var_to_val}
    mine = expr_to_sympy(e, symbols, known)
    return mine is not None and known(sympy.Eq(mine, s.node.expr))


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
