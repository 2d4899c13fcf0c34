"""When four consecutive values of a loop variable read one aligned `vec4`.

A load `buf[i0, .., in]` read for `v = v0 .. v0+3` (`v0` a multiple of 4) is one `vec4` load
when the four elements are consecutive in the innermost dimension and the first is 16-byte
aligned: the innermost index is `v`, `v mod c`, or either plus terms that are multiples of 4
(`h * 64 + c + 128`: a head and a q/k/v slice of a fused projection), every other index that
reads `v` is `v floordiv c` (`c` a multiple of 4: a head split off a channel dimension), and
the buffer's outer strides are multiples of 4 (checked by the callers with the buffer).
"""
from __future__ import annotations

from typing import Optional

from ...ir import expr as ex
from ...ir.expr import Const, Expr, Var


def _terms(e: Expr) -> list[Expr]:
    if isinstance(e, ex.Binary) and e.op == "add":
        return _terms(e.a) + _terms(e.b)
    return [e]


def _multiple_of_4(e: Expr) -> bool:
    """`e` is a multiple of 4 for every value of its variables."""
    if isinstance(e, Const):
        return isinstance(e.value, int) and e.value % 4 == 0
    if isinstance(e, ex.Binary) and e.op == "mul":
        return _multiple_of_4(e.a) or _multiple_of_4(e.b)
    if isinstance(e, ex.Binary) and e.op == "add":
        return _multiple_of_4(e.a) and _multiple_of_4(e.b)
    return False


def _aligned_plus(e: Expr, v: Var) -> bool:
    """`e` is `v` plus terms that are multiples of 4 (`v` itself once, with coefficient 1)."""
    terms = _terms(e)
    with_v = [t for t in terms if v.name in ex.free_vars(t)]
    return len(with_v) == 1 and with_v[0] == v and all(_multiple_of_4(t) for t in terms if t is not with_v[0])


def runs_of_four(index: tuple[Expr, ...], v: Var) -> bool:
    """Whether `v = v0 .. v0+3` (`v0` a multiple of 4) reads four consecutive elements of the
    innermost dimension starting at a multiple of 4 (module docstring). The argument of a
    `mod` / `floordiv` by `c` may itself be `v` plus multiples of 4 (`(ks * 384 + k) mod 64`, a
    part of a split reduction): four values from a multiple of 4 never cross a multiple of `c`."""
    if not index:
        return False
    terms = _terms(index[-1])
    with_v = [t for t in terms if v.name in ex.free_vars(t)]
    if len(with_v) != 1 or not all(_multiple_of_4(t) for t in terms if t is not with_v[0]):
        return False
    core = with_v[0]
    arg: Optional[Expr] = None
    if core != v:
        if not (isinstance(core, ex.Binary) and core.op == "mod" and isinstance(core.b, Const)
                and _aligned_plus(core.a, v)):
            return False
        arg = core.a
        if int(core.b.value) % 4 or int(core.b.value) <= 0:
            return False
    for i in index[:-1]:
        if v.name not in ex.free_vars(i):
            continue
        if arg is None or not (isinstance(i, ex.Binary) and i.op == "floordiv" and i.a == arg
                               and i.b == core.b):  # type: ignore[union-attr]
            return False
    return True
