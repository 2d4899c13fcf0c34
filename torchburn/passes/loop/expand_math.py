"""`expand-math`: replace f32 transcendental calls by polynomial code built from IR arithmetic.

`exp`, `expm1`, `log`, `log1p`, `tanh`, `sigmoid` and `erf` calls on f32 (vectors, and scalars unless
`scalar=false`) become the implementations of `mathlib.py`, so vector code stays vector code
instead of calling libm lane by lane, and scalar tails compute bit-identical results to the
vector body. Values the expansion reuses are bound by `let`s placed right before the
statement (store, let or if) that holds the call; nested calls expand inside out.

Before:

    for i in 0..s0 {
      %out[i] = exp(%x[i])
    }

After (`mathlib.exp_f32`; let names are the function's name and the step's):

    for i in 0..s0 {
      let exp_x = %x[i]
      let exp_xh = select(exp_x > 89.0:f32, 89.0:f32, exp_x)
      let exp_xc = select(exp_xh < -104.0:f32, -104.0:f32, exp_xh)
      let exp_t = fma(exp_xc, 1.4426950216293335:f32, 12582912.0:f32)
      let exp_nf = exp_t - 12582912.0:f32
      let exp_n = bitcast<i32>(exp_t) - 1262485504:i32
      let exp_r = fma(exp_nf, 0.00021219444170128554:f32, fma(exp_nf, -0.693359375:f32, exp_xc))
      let exp_u = fma(exp_r * exp_r, fma(fma(fma(fma(fma(0.00019845923816319555:f32, exp_r, 0.0013941213255748153:f32), exp_r, 0.008333390578627586:f32), exp_r, 0.04166635498404503:f32), exp_r, 0.1666666567325592:f32), exp_r, 0.5:f32), exp_r)
      let exp_n1 = exp_n >> 1:i32
      %out[i] = (1.0:f32 + exp_u) * bitcast<f32>(exp_n1 + 127:i32 << 23:i32) * bitcast<f32>(exp_n - exp_n1 + 127:i32 << 23:i32)
    }

A vector call expands the same way, with `broadcast(c, lanes)` constants.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.transform import ExprMutator
from ..base import LoopPass, register_pass
from .loop_utils import NameSupply, map_kernels
from .mathlib import F32_FUNCTIONS, LetSink


class _Expand(ExprMutator):
    """Expands the calls of one expression, collecting the lets in `sink`."""

    def __init__(self, sink: LetSink, scalar: bool) -> None:
        self.sink = sink
        self.scalar = scalar

    def visit_Call(self, node: ex.Call) -> ex.Expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        builder = F32_FUNCTIONS.get(node.name)
        if builder is None or node.type.dtype != dt.f32 or len(node.args) != 1:
            return node
        if node.type.lanes == 1 and not self.scalar:
            return node
        self.sink.prefix = node.name
        return builder(node.args[0], self.sink)


def _has_math(e: ex.Expr) -> bool:
    return any(isinstance(x, ex.Call) and x.name in F32_FUNCTIONS and x.type.dtype == dt.f32
               for x in ex.walk(e))


class _Rewriter:
    def __init__(self, names: NameSupply, scalar: bool) -> None:
        self.names = names
        self.scalar = scalar

    def expr(self, e: ex.Expr) -> tuple[list[lp.Let], ex.Expr]:
        if not _has_math(e):
            return [], e
        sink = LetSink(self.names)
        out = _Expand(sink, self.scalar).visit(e)
        return sink.lets, out

    def stmt(self, s: lp.Stmt) -> lp.Stmt:
        if isinstance(s, lp.Block):
            new = tuple(self.stmt(x) for x in s.stmts)
            return s if all(a is b for a, b in zip(new, s.stmts)) else lp.block(*new)
        if isinstance(s, lp.Store):
            lets, value = self.expr(s.value)
            return s if not lets else lp.block(*lets, lp.Store(s.buffer, s.index, value))
        if isinstance(s, lp.Let):
            lets, value = self.expr(s.value)
            return s if not lets else lp.block(*lets, lp.Let(s.var, value))
        if isinstance(s, lp.For):
            body = self.stmt(s.body)
            return s if body is s.body else replace(s, body=body)
        if isinstance(s, lp.If):
            lets, cond = self.expr(s.cond)
            then = self.stmt(s.then)
            orelse = None if s.orelse is None else self.stmt(s.orelse)
            if not lets and then is s.then and orelse is s.orelse:
                return s
            return lp.block(*lets, lp.If(cond, then, orelse))
        return s


def expand_math_kernel(kernel: lp.Kernel, scalar: bool = True) -> lp.Kernel:
    """Expand the f32 math calls of one kernel."""
    body = _Rewriter(NameSupply.for_kernel(kernel), scalar).stmt(kernel.body)
    return kernel if body is kernel.body else replace(kernel, body=body)


@register_pass
@dataclass(frozen=True)
class ExpandMath(LoopPass):
    """Replace f32 `exp`, `expm1`, `log`, `log1p`, `tanh`, `sigmoid`, `erf` calls by polynomial IR.

    Before:

        %out[i] = exp(%x[i])

    After:

        let exp_x = %x[i]
        let exp_xh = select(exp_x > 89.0:f32, 89.0:f32, exp_x)
        let exp_xc = select(exp_xh < -104.0:f32, -104.0:f32, exp_xh)
        let exp_t = fma(exp_xc, 1.4426950216293335:f32, 12582912.0:f32)
        ... (reduction by ln2, degree-5 polynomial; see the module docstring)
        %out[i] = (1.0:f32 + exp_u) * bitcast<f32>(exp_n1 + 127:i32 << 23:i32) * bitcast<f32>(exp_n - exp_n1 + 127:i32 << 23:i32)
    """

    name = "expand-math"
    per_kernel = True
    #: Also expand scalar calls (so scalar tails match the vector body bit for bit).
    scalar: bool = True

    def run(self, program: lp.Program) -> lp.Program:
        return map_kernels(program, lambda k: expand_math_kernel(k, self.scalar))
