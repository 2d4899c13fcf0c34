"""Statement emission: stores, lets, local allocations, blocks, branches and loops.

Loops are canonical: a header with an i64 phi, `i < start + extent` (signed) and a latch that
adds 1 with `nsw`, which is what LLVM's loop passes (SCEV, the vectorizer) recognise.
`unrolled` loops with a constant trip count get `llvm.loop.unroll.full` metadata (LLVM warns
when it cannot fully unroll a loop of unknown trip count, so those stay plain). `parallel`
loops are outlined and run through OpenMP (`parallel.py`), except inside another parallel
loop, where they run serially. `vectorized` loops are requests the vectorize pass must carry
out before codegen.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import llvmlite.ir as ir

from ...ir import expr as ex
from ...ir import loop as lp
from ..errors import CodegenError
from . import memory
from .expr import ExprEmitter
from .function import BufferRef, FunctionState, Scope
from .parallel import emit_parallel_loop
from .types import I1, storage_type

#: Unrolling fully beyond this many iterations is left to LLVM's own heuristics.
MAX_FULL_UNROLL = 1024


class StmtEmitter:
    """Emits statements into one function."""

    def __init__(self, fs: FunctionState) -> None:
        self.fs = fs

    @property
    def b(self) -> ir.IRBuilder:
        return self.fs.builder

    def emit(self, s: lp.Stmt, scope: Scope) -> None:
        handler = _HANDLERS.get(type(s))
        if handler is None:
            raise CodegenError(f"cannot generate code for statement {type(s).__name__}")
        handler(self, s, scope)

    def exprs(self, scope: Scope) -> ExprEmitter:
        return ExprEmitter(self.fs, scope)

    # ---- statements ------------------------------------------------------------------------------
    def _block(self, s: lp.Block, scope: Scope) -> None:
        for child in s.stmts:
            self.emit(child, scope)

    def _store(self, s: lp.Store, scope: Scope) -> None:
        memory.emit_store(self.exprs(scope), s.buffer, s.index, s.value)

    def _let(self, s: lp.Let, scope: Scope) -> None:
        if s.var.type != s.value.type:
            raise CodegenError(f"let {s.var.name}: variable is {s.var.type}, value is {s.value.type}")
        scope.vars[s.var.name] = self.exprs(scope).emit(s.value)

    def _alloc(self, s: lp.Alloc, scope: Scope) -> None:
        buf = s.buffer
        size = constant_extent(buf)
        ptr = self.fs.alloca(storage_type(buf.dtype), name=buf.name, count=max(size, 1))
        ptr.align = buf.dtype.itemsize
        scope.buffers[buf.name] = BufferRef(buf, ptr)

    def _if(self, s: lp.If, scope: Scope) -> None:
        cond = self.exprs(scope).emit(s.cond)
        if cond.type != I1:
            raise CodegenError(f"if condition must be a scalar bool, got {s.cond.type}")
        if s.orelse is None:
            with self.b.if_then(cond):
                self.emit(s.then, scope.child())
            return
        with self.b.if_else(cond) as (then, orelse):
            with then:
                self.emit(s.then, scope.child())
            with orelse:
                self.emit(s.orelse, scope.child())

    def _for(self, s: lp.For, scope: Scope) -> None:
        _LOOP_KINDS[s.kind](self, s, scope)

    # ---- loops -----------------------------------------------------------------------------------
    def bounds(self, s: lp.For, scope: Scope) -> tuple[ir.Value, ir.Value]:
        """The loop's start and end (start + extent) as values of the loop variable's type."""
        if not s.var.dtype.is_int or s.var.lanes != 1:
            raise CodegenError(f"loop variable {s.var.name} has type {s.var.type}, expected an integer")
        for part in (s.start, s.extent):
            if part.type != s.var.type:
                raise CodegenError(f"loop {s.var.name}: bound {part.type} differs from the variable's {s.var.type}")
        em = self.exprs(scope)
        start = em.emit(s.start)
        return start, self.b.add(start, em.emit(s.extent))

    def counted_loop(self, var: ex.Var, begin: ir.Value, end: ir.Value, body: lp.Stmt, scope: Scope,
                     metadata: Optional[ir.MDValue] = None) -> None:
        """`for var in begin..end` with `body` emitted in a child scope."""
        b = self.b
        pre = b.block
        header = b.append_basic_block(f"{var.name}.header")
        loop_body = b.append_basic_block(f"{var.name}.body")
        exit_ = b.append_basic_block(f"{var.name}.exit")
        b.branch(header)
        b.position_at_end(header)
        i = b.phi(begin.type, name=var.name)
        i.add_incoming(begin, pre)
        b.cbranch(b.icmp_signed("<", i, end), loop_body, exit_)
        b.position_at_end(loop_body)
        inner = scope.child()
        inner.vars[var.name] = i
        self.emit(body, inner)
        nxt = b.add(i, ir.Constant(begin.type, 1), flags=("nsw",))
        latch = b.branch(header)
        if metadata is not None:
            latch.set_metadata("llvm.loop", metadata)
        i.add_incoming(nxt, b.block)
        b.position_at_end(exit_)

    def _serial(self, s: lp.For, scope: Scope) -> None:
        begin, end = self.bounds(s, scope)
        self.counted_loop(s.var, begin, end, s.body, scope)

    def _unrolled(self, s: lp.For, scope: Scope) -> None:
        begin, end = self.bounds(s, scope)
        md = None
        if isinstance(s.extent, ex.Const) and 0 < int(s.extent.value) <= MAX_FULL_UNROLL:
            md = self.fs.ctx.loop_metadata("llvm.loop.unroll.full")
        self.counted_loop(s.var, begin, end, s.body, scope, md)

    def _vectorized(self, s: lp.For, scope: Scope) -> None:
        raise CodegenError(f"loop {s.var.name} is marked vectorized; run the vectorize pass "
                           f"before codegen (it turns such loops into vector expressions)")

    def _parallel(self, s: lp.For, scope: Scope) -> None:
        if self.fs.in_parallel:
            self._serial(s, scope)
            return
        emit_parallel_loop(self, s, scope)


def constant_extent(buf: lp.Buffer) -> int:
    """Elements a local buffer spans (`1 + sum((shape - 1) * stride)`); all must be constants."""
    span = 1
    for d, st in zip(buf.shape, buf.strides):
        if not (isinstance(d, ex.Const) and isinstance(st, ex.Const)):
            raise CodegenError(f"local buffer %{buf.name} needs constant shape and strides, got "
                               f"shape {buf.shape} strides {buf.strides}")
        if int(st.value) < 0:
            raise CodegenError(f"local buffer %{buf.name} has a negative stride")
        if int(d.value) == 0:
            return 0
        span += (int(d.value) - 1) * int(st.value)
    return span


_HANDLERS: dict[type, Callable[[StmtEmitter, Any, Scope], None]] = {
    lp.Block: StmtEmitter._block,
    lp.Store: StmtEmitter._store,
    lp.Let: StmtEmitter._let,
    lp.Alloc: StmtEmitter._alloc,
    lp.If: StmtEmitter._if,
    lp.For: StmtEmitter._for,
}

_LOOP_KINDS: dict[str, Callable[[StmtEmitter, lp.For, Scope], None]] = {
    "serial": StmtEmitter._serial,
    "unrolled": StmtEmitter._unrolled,
    "vectorized": StmtEmitter._vectorized,
    "parallel": StmtEmitter._parallel,
}
