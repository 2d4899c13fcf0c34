"""Expression emission: one IR expression tree -> LLVM SSA values in the current block.

`ExprEmitter.emit` dispatches on the node class through a table; operators and functions are
themselves tables (`binary.py`, `mathfuncs.py`, `reduce.py`, `casts.py`). Every node's result
is checked against the LLVM type its IR type maps to, so a type error in the IR surfaces here
with the node's name rather than as an LLVM verifier message later.

An emitter lives for one statement: within it, a node object reached twice (shared subtrees)
is emitted once. Expressions have no side effects and emit no control flow, so this reuse is
always valid; across statements a store could change what a load reads, so the memo is not
kept. Binary operations are also numbered by value across statements (`_binary`): an
operation on the same LLVM operands emitted earlier in the same basic block (the index
arithmetic every statement of an unrolled body repeats) is reused, since a value defined
earlier in a block dominates the rest of it and arithmetic reads no memory; so is the
broadcast of a scalar to a vector (`splat`). LLVM's EarlyCSE would merge them anyway; not
emitting them saves codegen's and LLVM's time.
"""
from __future__ import annotations

from typing import Any, Callable

import llvmlite.ir as ir

from ...ir import expr as ex
from ...ir.expr import ScalarType
from ..errors import CodegenError
from . import memory
from .binary import emit_binary
from .dot import emit_dot4, emit_dot4_i8i8, emit_dot4_pair
from .casts import emit_bitcast, emit_cast
from .halfconv import select_bits
from .function import FunctionState, Scope
from .mathfuncs import emit_call
from .opcontext import OpContext
from .reduce import emit_reduce
from .tiles import emit_tile_dot
from .types import I32, I64, const, lanes_of, reg_type


class ExprEmitter:
    """Emits expressions of one statement into `fs`'s current block, names from `scope`."""

    def __init__(self, fs: FunctionState, scope: Scope) -> None:
        self.fs = fs
        self.scope = scope
        self.b = fs.builder
        self._memo: dict[int, tuple[ex.Expr, ir.Value]] = {}

    def emit(self, e: ex.Expr) -> ir.Value:
        hit = self._memo.get(id(e))
        if hit is not None and hit[0] is e:
            return hit[1]
        if isinstance(e, _ARITHMETIC) and e.children():
            self._emit_operands_first(e)
        return self._emit_node(e)

    def _emit_operands_first(self, e: ex.Expr) -> None:
        """Emit the arithmetic below `e` deepest first with an explicit stack, so that each
        handler's own `emit` of its operands is a memo hit: a fused chain of thousands of ops
        is one deep expression, too deep for recursion. Loads and ramps are left to their
        handlers (memory.py decides how to emit an index), which recurse only into indices."""
        stack: list[tuple[ex.Expr, bool]] = [(k, False) for k in reversed(_operands(e))]
        while stack:
            node, children_done = stack.pop()
            hit = self._memo.get(id(node))
            if hit is not None and hit[0] is node:
                continue
            if children_done or not isinstance(node, _ARITHMETIC) or not node.children():
                self._emit_node(node)
                continue
            stack.append((node, True))
            stack.extend((k, False) for k in reversed(_operands(node)))

    def _emit_node(self, e: ex.Expr) -> ir.Value:
        handler = _HANDLERS.get(type(e))
        if handler is None:
            raise CodegenError(f"cannot generate code for expression {type(e).__name__}")
        value = handler(self, e)
        expected = reg_type(e.type)
        if value.type != expected:
            raise CodegenError(f"{type(e).__name__} of IR type {e.type} produced LLVM {value.type}, "
                               f"expected {expected}")
        self._memo[id(e)] = (e, value)
        return value

    # ---- helpers shared with memory.py and stmt.py ------------------------------------------
    def index_value(self, e: ex.Expr) -> ir.Value:
        """An integer expression widened to i64 (vectors stay vectors)."""
        v = self.emit(e)
        if not (e.dtype.is_int or e.dtype.is_bool):
            raise CodegenError(f"index expression of type {e.type}")
        if e.dtype.bits == 64:
            return v
        target = I64 if e.lanes == 1 else ir.VectorType(I64, e.lanes)
        return self.b.sext(v, target) if e.dtype.kind == "i" else self.b.zext(v, target)

    def splat(self, v: ir.Value, lanes: int) -> ir.Value:
        """A scalar repeated in `lanes` lanes."""
        if lanes_of(v.type) == lanes:
            return v
        if isinstance(v.type, ir.VectorType):
            raise CodegenError(f"cannot broadcast a {v.type} to {lanes} lanes")
        key = (self.b.block, id(v), lanes)
        hit = self.fs.splats.get(key)
        if hit is not None and hit[0] is v:  # broadcast earlier in this block (see `_binary`)
            return hit[1]
        vt = ir.VectorType(v.type, lanes)
        if isinstance(v, ir.Constant) and isinstance(v.constant, (int, float)):
            return ir.Constant(vt, [v.constant] * lanes)
        one = self.b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(I32, 0))
        mask = ir.Constant(ir.VectorType(I32, lanes), [0] * lanes)
        vector = self.b.shuffle_vector(one, ir.Constant(vt, ir.Undefined), mask)
        self.fs.splats[key] = (v, vector)
        return vector

    def op_context(self, st: ScalarType) -> OpContext:
        return OpContext(self.b, self.fs.ctx, st.dtype, reg_type(st), self.fs.fastmath)

    # ---- node kinds ----------------------------------------------------------------------------
    def _const(self, e: ex.Const) -> ir.Value:
        return const(e.type, e.value)

    def _var(self, e: ex.Var) -> ir.Value:
        v = self.scope.var(e.name)
        if v.type != reg_type(e.type):
            raise CodegenError(f"variable {e.name} is used as {e.type} but bound to an LLVM {v.type}")
        return v

    def _binary(self, e: ex.Binary) -> ir.Value:
        if e.a.dtype != e.b.dtype:
            raise CodegenError(f"binary {e.op} on different dtypes {e.a.type} and {e.b.type}")
        lanes = max(e.a.lanes, e.b.lanes)
        va, vb = self.emit(e.a), self.emit(e.b)
        # Constants by value (llvmlite makes a new object per use), other operands by identity;
        # the entry keeps its operands alive, so an `id` is never reused while it is there.
        ka = e.a if isinstance(e.a, ex.Const) else va
        kb = e.b if isinstance(e.b, ex.Const) else vb
        key = (self.b.block, e.op, e.a.type, e.b.type, _key_of(ka), _key_of(kb))
        hit = self.fs.binaries.get(key)
        if hit is not None and _same(hit[0], ka) and _same(hit[1], kb):
            return hit[2]
        a, b = self.splat(va, lanes), self.splat(vb, lanes)
        value = emit_binary(self.op_context(e.a.type.with_lanes(lanes)), e.op, a, b)
        self.fs.binaries[(self.b.block, *key[1:])] = (ka, kb, value)
        return value

    def _call(self, e: ex.Call) -> ir.Value:
        if not e.args:
            raise CodegenError(f"call {e.name}() has no arguments")
        special = _CALL_NODES.get(e.name)
        if special is not None:
            return special(self, e)
        dtype = e.args[0].dtype
        for a in e.args:
            if a.dtype != dtype:
                raise CodegenError(f"call {e.name} mixes argument dtypes {dtype} and {a.dtype}")
        lanes = max(a.lanes for a in e.args)
        args = [self.splat(self.emit(a), lanes) for a in e.args]
        return emit_call(self.op_context(ScalarType(dtype, lanes)), e.name, args)

    def _dot4(self, e: ex.Call) -> ir.Value:
        """Operands of three types, see `dot.py`."""
        if len(e.args) != 3:
            raise CodegenError(f"{ex.DOT4_U8I8} takes 3 arguments, got {len(e.args)}")
        inner = e.args[0]
        if isinstance(inner, ex.Call) and inner.name == ex.DOT4_U8I8 and len(inner.args) == 3:
            acc, a1, b1 = (self.emit(arg) for arg in inner.args)
            a2, b2 = self.emit(e.args[1]), self.emit(e.args[2])
            fused = emit_dot4_pair(self.b, self.fs.ctx, acc, (a1, b1), (a2, b2))
            if fused is not None:
                return fused
            return emit_dot4(self.b, self.fs.ctx, emit_dot4(self.b, self.fs.ctx, acc, a1, b1), a2, b2)
        acc, a, b = (self.emit(arg) for arg in e.args)
        return emit_dot4(self.b, self.fs.ctx, acc, a, b)

    def _dot4_i8i8(self, e: ex.Call) -> ir.Value:
        """Signed bytes by signed bytes, see `dot.py`."""
        if len(e.args) != 3:
            raise CodegenError(f"{ex.DOT4_I8I8} takes 3 arguments, got {len(e.args)}")
        acc, a, b = (self.emit(arg) for arg in e.args)
        return emit_dot4_i8i8(self.b, self.fs.ctx, acc, a, b)

    def _tile_dot(self, e: ex.Call) -> ir.Value:
        """A 16 x 16 byte tile product, see `tiles.py` (a zero accumulator is a `tilezero`)."""
        if len(e.args) != 3:
            raise CodegenError(f"{e.name} takes 3 arguments, got {len(e.args)}")
        first = e.args[0]
        zero = (isinstance(first, ex.Broadcast) and isinstance(first.value, ex.Const) and first.value.value == 0) \
            or (isinstance(first, ex.Const) and first.value == 0)
        acc, a, w = (self.emit(arg) for arg in e.args)
        return emit_tile_dot(self.b, self.fs.ctx, e.name, acc, a, w, zero)

    def _cast(self, e: ex.Cast) -> ir.Value:
        return emit_cast(self.b, self.emit(e.value), e.value.type, e.type)

    def _bitcast(self, e: ex.Bitcast) -> ir.Value:
        return emit_bitcast(self.b, self.emit(e.value), e.value.type, e.type)

    def _select(self, e: ex.Select) -> ir.Value:
        if not e.cond.dtype.is_bool:
            raise CodegenError(f"select condition has type {e.cond.type}, expected bool")
        lanes = e.type.lanes
        cond = self.emit(e.cond)
        if e.cond.lanes not in (1, lanes):
            raise CodegenError(f"select condition has {e.cond.lanes} lanes, values {lanes}")
        a, b = self.splat(self.emit(e.a), lanes), self.splat(self.emit(e.b), lanes)
        return select_bits(self.b, cond, a, b)

    def _load(self, e: ex.Load) -> ir.Value:
        return memory.emit_load(self, e)

    def _ramp(self, e: ex.Ramp) -> ir.Value:
        lanes = e.type.lanes
        base = self.splat(self.emit(e.base), lanes)
        stride = self.splat(self.emit(e.stride), lanes)
        cx = self.op_context(e.type)
        iota = ir.Constant(cx.type, [float(i) if e.dtype.is_float else i for i in range(lanes)])
        return emit_binary(cx, "add", base, emit_binary(cx, "mul", stride, iota))

    def _broadcast(self, e: ex.Broadcast) -> ir.Value:
        return self.splat(self.emit(e.value), e.type.lanes)

    def _vreduce(self, e: ex.VectorReduce) -> ir.Value:
        if e.type.lanes != 1:
            raise CodegenError(f"vreduce_{e.op} must produce a scalar, not {e.type}")
        return emit_reduce(self.op_context(e.value.type), e.op, self.emit(e.value))


def _operands(e: ex.Expr) -> tuple[ex.Expr, ...]:
    """What `e`'s handler emits first: its children, except that a `dot4_u8i8_acc` nested in
    another's accumulator is emitted by the outer one (`_dot4` may fuse the two)."""
    if isinstance(e, ex.Call) and e.name == ex.DOT4_U8I8 and e.args:
        inner = e.args[0]
        if isinstance(inner, ex.Call) and inner.name == ex.DOT4_U8I8:
            return (*inner.args, *e.args[1:])
    return e.children()


def _key_of(operand: object) -> object:
    """An IR constant is its own key (equal constants are equal nodes); an LLVM value is
    keyed by identity."""
    return operand if isinstance(operand, ex.Const) else id(operand)


def _same(kept: object, operand: object) -> bool:
    """Whether a remembered operand is `operand` (constants: the key compared them already)."""
    return kept is operand or isinstance(operand, ex.Const)


#: Calls whose operands are not of one type: emitted from the node, not through `CALLS`.
_CALL_NODES: dict[str, Callable[[ExprEmitter, ex.Call], ir.Value]] = {
    ex.DOT4_U8I8: ExprEmitter._dot4,
    ex.DOT4_I8I8: ExprEmitter._dot4_i8i8,
    ex.TILE_DOT_U8I8: ExprEmitter._tile_dot,
    ex.TILE_DOT_I8I8: ExprEmitter._tile_dot,
}
#: Nodes whose handlers emit each operand as a value (so emitting operands first is exact).
_ARITHMETIC = (ex.Binary, ex.Call, ex.Cast, ex.Bitcast, ex.Select, ex.Broadcast, ex.VectorReduce)

_HANDLERS: dict[type, Callable[[ExprEmitter, Any], ir.Value]] = {
    ex.Const: ExprEmitter._const,
    ex.Var: ExprEmitter._var,
    ex.Binary: ExprEmitter._binary,
    ex.Call: ExprEmitter._call,
    ex.Cast: ExprEmitter._cast,
    ex.Bitcast: ExprEmitter._bitcast,
    ex.Select: ExprEmitter._select,
    ex.Load: ExprEmitter._load,
    ex.Ramp: ExprEmitter._ramp,
    ex.Broadcast: ExprEmitter._broadcast,
    ex.VectorReduce: ExprEmitter._vreduce,
}
