"""Index maps of view ops: given an index into a view's result, the index into its operand.

Views never copy: loads through them use these maps. Every map returns indices that are in
bounds whenever the result index is.
"""
from __future__ import annotations

from typing import Optional, Sequence

from ...ir import expr as ex
from ...ir.expr import Const, Expr
from ...ir.printer import print_expr
from ...ir.tensor import Op

Index = tuple[Expr, ...]


def permute_index(op: Op, idx: Index) -> Index:
    dims = op.attrs["dims"]
    src: list[Expr] = [Const(0)] * len(dims)
    for i, d in enumerate(dims):
        src[d] = idx[i]
    return tuple(src)


def expand_index(op: Op, idx: Index) -> Index:
    src_shape = op.operands[0].shape
    out_shape = op.result.shape
    offset = len(out_shape) - len(src_shape)
    return tuple(Const(0) if (d == Const(1) and out_shape[j + offset] != Const(1)) else idx[j + offset]
                 for j, d in enumerate(src_shape))


def slice_index(op: Op, idx: Index) -> Index:
    dim = op.attrs["dim"]
    out = list(idx)
    out[dim] = ex.add(ex.mul(idx[dim], ex.as_expr(op.attrs["step"])), ex.as_expr(op.attrs["start"]))
    return tuple(out)


def _factors(e: Expr) -> Optional[tuple[int, tuple[str, ...]]]:
    """A size as (constant, sorted factors): a product of constants and factors, each factor a
    symbol or any other expression taken whole (`s1 // 4`, by its text), so that two sizes with
    the same constant and factors are equal. None for a non-integer constant."""
    if isinstance(e, Const):
        return (int(e.value), ()) if isinstance(e.value, int) else None
    if isinstance(e, ex.Binary) and e.op == "mul":
        a, b = _factors(e.a), _factors(e.b)
        if a is None or b is None:
            return None
        return a[0] * b[0], tuple(sorted(a[1] + b[1]))
    return 1, (e.name if isinstance(e, ex.Var) else print_expr(e),)


def _product(dims: Sequence[Expr]) -> Optional[tuple[int, tuple[str, ...]]]:
    c, syms = 1, ()
    for d in dims:
        f = _factors(d)
        if f is None:
            return None
        c, syms = c * f[0], tuple(sorted(syms + f[1]))
    return c, syms


def _divides(a: tuple[int, tuple[str, ...]], b: tuple[int, tuple[str, ...]]) -> bool:
    """Whether product `a` divides product `b` (so `a` is the smaller group)."""
    if a[0] == 0 or b[0] % a[0] != 0:
        return False
    rest = list(b[1])
    for s in a[1]:
        if s not in rest:
            return False
        rest.remove(s)
    return True


def _linear(idx: Sequence[Expr], shape: Sequence[Expr]) -> Expr:
    lin: Expr = Const(0)
    for i, d in zip(idx, shape):
        lin = ex.add(ex.mul(lin, d), i)
    return lin


def _delinearize(lin: Expr, shape: Sequence[Expr]) -> list[Expr]:
    out: list[Expr] = []
    for k in range(len(shape) - 1, -1, -1):
        if k == 0:
            out.append(lin)
        else:
            out.append(ex.mod(lin, shape[k]))
            lin = ex.floordiv(lin, shape[k])
    return list(reversed(out))


def reshape_index(op: Op, idx: Index) -> Index:
    """Map through a row-major reshape, dimension group by dimension group, so that common
    reshapes (splitting or merging dims) need no division on untouched dims."""
    return regroup_index(idx, op.result.shape, op.operands[0].shape)


def regroup_rows(lead: Sequence[Expr], src: Sequence[Expr], dst: Sequence[Expr]) -> tuple[Expr, ...]:
    """The index over the leading dims `dst` of the element at `lead` over the leading dims
    `src` (row-major order kept): flatten, then split by `dst`. An index that needs no
    regrouping (`src == dst`) is returned as it is."""
    if tuple(src) == tuple(dst):
        return tuple(lead)
    flat: Expr = Const(0)
    for i, d in zip(lead, src):
        flat = ex.add(ex.mul(flat, d), i)
    out: list[Expr] = []
    for pos in range(len(dst)):
        inner: Expr = Const(1)
        for d in dst[pos + 1:]:
            inner = ex.mul(inner, d)
        x = ex.floordiv(flat, inner)
        out.append(x if pos == 0 else ex.mod(x, dst[pos]))
    return tuple(out)


def regroup_index(idx: Index, shape: Sequence[Expr], to: Sequence[Expr]) -> Index:
    """The index over `to` of the element at `idx` over `shape` (the same elements in
    row-major order), dimension group by dimension group (`reshape_index`)."""
    src = list(to)
    dst = list(shape)
    out: list[Expr] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        if i < len(src) and src[i] == Const(1):
            out.append(Const(0))
            i += 1
            continue
        if j < len(dst) and dst[j] == Const(1):
            j += 1
            continue
        if i >= len(src) or j >= len(dst):
            break
        gi, gj = [src[i]], [dst[j]]
        pi, pj = _product(gi), _product(gj)
        ok = True
        while pi != pj or pi is None:  # (two unknown products are not equal ones)
            if pi is None or pj is None:
                ok = False
                break
            if _divides(pi, pj) and i + len(gi) < len(src):
                gi.append(src[i + len(gi)])
            elif _divides(pj, pi) and j + len(gj) < len(dst):
                gj.append(dst[j + len(gj)])
            else:
                ok = False
                break
            pi, pj = _product(gi), _product(gj)
        if not ok:
            # Fall back to one linear index over everything that remains.
            lin = _linear(idx[j:], dst[j:])
            rest = [d for d in src[i:]]
            return tuple(out + _delinearize(lin, rest))
        lin = _linear(idx[j:j + len(gj)], gj)
        out.extend(_delinearize(lin, gi))
        i += len(gi)
        j += len(gj)
    while len(out) < len(src):
        out.append(Const(0))
    return tuple(out)


VIEW_INDEX = {
    "permute": permute_index,
    "expand": expand_index,
    "slice": slice_index,
    "reshape": reshape_index,
}
