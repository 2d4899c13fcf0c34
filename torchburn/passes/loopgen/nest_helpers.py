"""Small statement helpers the hand-written kernel builders (GEMM, convolution, its weight
gradient) share: fresh names, index lets, local buffers and counted loops, all emitted
into the builder's `KernelBuilder` (`self.kb`)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...ir import dtypes as dt
from ...ir import loop as lp
from ...ir.expr import Const, Expr, Var

if TYPE_CHECKING:
    from .kernel_builder import KernelBuilder


class NestHelpers:
    """Mixin: needs `self.kb` (the kernel builder) and, for `local`, `self.acc_t`."""

    kb: "KernelBuilder"
    acc_t: dt.DType

    def var(self, prefix: str) -> Var:
        return Var(self.kb.fresh(prefix))

    def let(self, e: Expr, prefix: str) -> Expr:
        """Bind an index expression to a name (constants and variables stay as they are)."""
        if isinstance(e, (Const, Var)):
            return e
        v = Var(self.kb.fresh(prefix), e.type)
        self.kb.emit(lp.Let(v, e))
        return v

    def local(self, prefix: str, shape: tuple[int, ...], dtype: Optional[dt.DType] = None) -> lp.Buffer:
        """A kernel-local array (allocated where the builder is emitting)."""
        dims = tuple(Const(d) for d in shape)
        buf = lp.Buffer(self.kb.fresh(prefix), dtype or self.acc_t, dims, lp.contiguous_strides(dims), "local")
        self.kb.emit(lp.Alloc(buf))
        return buf

    @staticmethod
    def loop(var: Var, extent: Expr, body: lp.Stmt, kind: str = "serial",
             annotations: tuple[tuple[str, str], ...] = ()) -> lp.Stmt:
        return lp.For(var, Const(0), extent, kind, body, annotations)
