"""Per-function emission state: the builder, the names in scope, and stack allocations.

A `Scope` maps IR names to LLVM values: variables (loop indices, `let`s, symbols) to SSA
values, buffers to their base pointers. `let` binds for the rest of its block, so loops and
branches emit their bodies in a child scope; a child copies its parent's dictionaries, which
is cheap at kernel sizes and keeps scoping obviously right.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import llvmlite.ir as ir

from ...ir.loop import Buffer
from ..errors import CodegenError
from .context import ModuleContext
from .types import PTR


@dataclass(frozen=True)
class BufferRef:
    """A buffer visible in a function: its IR description and its base pointer."""

    buffer: Buffer
    ptr: ir.Value
    #: No other pointer in the function reaches this memory while it is written (LLVM noalias).
    noalias: bool = False
    #: The function never writes through this pointer.
    readonly: bool = False


@dataclass
class Scope:
    """Names visible at one point of a function."""

    vars: dict[str, ir.Value] = field(default_factory=dict)
    buffers: dict[str, BufferRef] = field(default_factory=dict)

    def child(self) -> "Scope":
        return Scope(dict(self.vars), dict(self.buffers))

    def var(self, name: str) -> ir.Value:
        try:
            return self.vars[name]
        except KeyError:
            raise CodegenError(f"variable {name!r} is not bound here (not a symbol, loop index "
                               f"or let in scope)") from None

    def buffer(self, name: str) -> BufferRef:
        try:
            return self.buffers[name]
        except KeyError:
            raise CodegenError(f"buffer %{name} is not a parameter or allocation in scope") from None


class FunctionState:
    """The function being emitted and how to emit into it."""

    def __init__(self, ctx: ModuleContext, fn: ir.Function, *, in_parallel: bool = False,
                 contract: bool = False, prefetch: Optional[dict[str, int]] = None) -> None:
        self.ctx = ctx
        self.fn = fn
        #: Buffer -> bytes ahead: its vector loads also prefetch that far ahead (kernel attr
        #: `prefetch`, `memory.prefetch_ahead`).
        self.prefetch: dict[str, int] = dict(prefetch or {})
        #: The entry block holds only the function's stack allocations; `finish` ends it with a
        #: branch to `start`, where code begins. (Inserting allocas in front of code already in
        #: a block would shift llvmlite's insertion point.)
        self.entry = fn.append_basic_block("entry")
        self._allocas = ir.IRBuilder(self.entry)
        self.start = fn.append_basic_block("start")
        self.builder = ir.IRBuilder(self.start)
        #: True inside an outlined parallel body: nested parallel loops then run serially.
        self.in_parallel = in_parallel
        #: Allow `contract` (fused multiply-add) on float add/sub/mul (kernel attr `fastmath`).
        self.contract = contract
        #: Value numbering of binary operations (`ExprEmitter._binary`): (block, op, operand
        #: types, operands) -> (left operand, right operand, result) already emitted in `block`.
        self.binaries: dict[tuple[object, ...], tuple[ir.Value, ir.Value, ir.Value]] = {}
        #: The same for broadcasts of a scalar (`ExprEmitter.splat`): (block, scalar's id,
        #: lanes) -> (scalar, vector).
        self.splats: dict[tuple[object, int, int], tuple[ir.Value, ir.Value]] = {}

    @property
    def fastmath(self) -> tuple[str, ...]:
        return ("contract",) if self.contract else ()

    def alloca(self, typ: ir.Type, name: str = "", count: Optional[int] = None) -> ir.Value:
        """Stack memory allocated once in the entry block, whatever block is current; an
        alloca inside a loop would grow the stack on every iteration."""
        size = None if count is None else ir.Constant(ir.IntType(64), count)
        slot = self._allocas.alloca(typ, size=size, name=name)
        slot.type = PTR  # llvmlite types allocas as typed pointers (`float*`); LLVM 22 wants `ptr`
        return slot

    def finish(self) -> None:
        """Terminate the current block with `ret void` and the entry block with its branch."""
        self.builder.ret_void()
        self._allocas.branch(self.start)
