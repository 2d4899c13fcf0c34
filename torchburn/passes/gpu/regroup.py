"""Row-regrouped indices: where a matrix product's epilogue stores through a reshape.

A linear layer on `[batch, seq, features]` is a product of `[batch * seq, K] x [K, N]` whose
result is reshaped to `[batch, seq, N]` before the bias, the activation or the residual add
(`fuse` lets one such reshape, which keeps the last dim and only regroups the rows, sit inside
a product's epilogue). The GPU product nest (`lower-to-loops-gpu`) keeps its loops over the
product's shape and stores element `(i, j)` at the reshaped result's index of the same
element:

    %out[i floordiv 128, i mod 128, j] = ...          (product rows 512 -> [4, 128])

`loopgen.views.regroup_rows` builds that index; `regrouped_loops` recognizes it, so that `gpu-map` sees the
store still writes one distinct element per iteration of the loops (the index is a mixed-radix
split of the row's flat position, injective whatever the sizes).
"""
from __future__ import annotations

from typing import Sequence

from ...ir import loop as lp
from ...ir.expr import Expr, Var
from ..loopgen.views import regroup_rows


def regrouped_loops(index: tuple[Expr, ...], loops: Sequence[lp.For], shape: Sequence[Expr]) -> int:
    """How many leading `loops` a store at `index` into a buffer of `shape` names through a
    row regroup (`regroup_rows` of the loops before the one the last index is, that loop's
    variable last): distinct iterations of those loops store distinct elements. 0 when the
    index is not of that form."""
    if len(index) != len(shape) or not index or not isinstance(index[-1], Var):
        return 0
    for m, f in enumerate(loops):
        if f.var == index[-1]:
            if m == 0:
                return 0
            lead = regroup_rows(tuple(x.var for x in loops[:m]), tuple(x.extent for x in loops[:m]), shape[:-1])
            return m + 1 if lead == tuple(index[:-1]) else 0
    return 0
