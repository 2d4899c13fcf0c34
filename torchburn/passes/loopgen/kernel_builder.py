"""Build the loop nest of one kernel from its root op and the ops fused into it.

Every element is computed as a chain of `let`s (one per op, so values used twice are computed
once), views become index arithmetic, and loads go to the buffers of materialized values.
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.ops import get_op
from ...ir.tensor import Op, Value
from . import scalar_ops
from .row_cache import cached_operand, row_index
from .views import VIEW_INDEX

Index = tuple[Expr, ...]

#: Identity element and combining function of each reduction.
REDUCE_INIT: dict[str, Callable[[dt.DType], Expr]] = {
    "reduce_sum": lambda d: Const(0, ScalarType(d)),
    "reduce_prod": lambda d: Const(1, ScalarType(d)),
    "reduce_max": lambda d: Const(float("-inf"), ScalarType(d)) if d.is_float else Const(_int_min(d), ScalarType(d)),
    "reduce_min": lambda d: Const(float("inf"), ScalarType(d)) if d.is_float else Const(_int_max(d), ScalarType(d)),
    "reduce_any": lambda d: Const(False, ScalarType(d)),
    "reduce_all": lambda d: Const(True, ScalarType(d)),
}
REDUCE_COMBINE = {"reduce_sum": "add", "reduce_prod": "mul", "reduce_max": "max",
                  "reduce_min": "min", "reduce_any": "or", "reduce_all": "and"}


def _int_min(d: dt.DType) -> int:
    if d.is_bool:
        return 0
    return 0 if d.kind == "u" else -(1 << (d.bits - 1))


def _int_max(d: dt.DType) -> int:
    if d.is_bool:
        return 1
    return (1 << d.bits) - 1 if d.kind == "u" else (1 << (d.bits - 1)) - 1


#: Rules computing one element of an op's result: `rule(builder, op, index) -> Expr`. A rule
#: may emit statements first (loops, allocations) through the builder. Op families living in
#: other modules register theirs with `@element_rule("name")`.
ElementRule = Callable[["KernelBuilder", Op, Index], Expr]
ELEMENT_RULES: dict[str, ElementRule] = {}


def element_rule(*names: str) -> Callable[[ElementRule], ElementRule]:
    def deco(fn: ElementRule) -> ElementRule:
        for n in names:
            ELEMENT_RULES[n] = fn
        return fn
    return deco


#: Rules building the whole body of a kernel whose root op is not computed element by element
#: (ops of category `ordered`: scatters copy and then update through indices, scans carry a
#: value along a dim, sorts write each element at its rank): `rule(builder, op, out) -> Stmt`,
#: storing the op's result into the buffer `out`. Registered with `@root_rule("name")`.
RootRule = Callable[["KernelBuilder", Op, lp.Buffer], lp.Stmt]
ROOT_RULES: dict[str, RootRule] = {}
#: Ops of a category that is otherwise inlined whose only loop form is their root rule
#: (`root_rule(..., only=True)`): `fuse` makes each a kernel's root.
ROOT_ONLY: set[str] = set()


def root_rule(*names: str, only: bool = False) -> Callable[[RootRule], RootRule]:
    def deco(fn: RootRule) -> RootRule:
        for n in names:
            ROOT_RULES[n] = fn
            if only:
                ROOT_ONLY.add(n)
        return fn
    return deco


class LoweringError(ValueError):
    """The loop lowering has no rule for an op (a missing `element_rule`)."""


class KernelBuilder:
    """Lowers one kernel. `buffers` maps every materialized value to its buffer."""

    def __init__(self, name: str, buffers: dict[Value, lp.Buffer]) -> None:
        self.name = name
        self.buffers = buffers
        self._names = itertools.count()
        self._scopes: list[dict[tuple[int, Index], Expr]] = [{}]
        self._stmts: list[list[lp.Stmt]] = [[]]
        #: The loop variables each scope binds (None: unknown, nothing moves out past it).
        self._bound: list[Optional[frozenset[str]]] = [None]
        #: Lowest scope a value may be hoisted to (None: no hoisting; see `row_root`).
        self._hoist_base: Optional[int] = None
        #: The scope each `let` was emitted in, and the reciprocals made by `_divide`.
        self._let_level: dict[str, int] = {}
        self._recips: dict[str, Var] = {}
        #: In a row kernel, the value kept in the output row (`row_cache.py`): the value, the
        #: reduction whose loop stores it, the output and the element index; and whether the
        #: store has been emitted (from then on the element loop loads the value back).
        self._row_cache: Optional[tuple[Value, Op, lp.Buffer, Index]] = None
        self._row_cache_stored = False
        self.used_buffers: dict[str, lp.Buffer] = {}
        self.origins: list[str] = []
        #: Kernel attributes besides `origin` (a GEMM records its blocking as `gemm`).
        self.attrs: dict[str, str] = {}
        #: Workspace buffers the kernel asked for with `scratch` (the program adds them to its
        #: temporaries, so memory planning places them like any other).
        self.scratch_buffers: list[lp.Buffer] = []
        #: Loop over a concat computed here one operand at a time (`concat_parts`); GPUs keep
        #: one nest (each nest would be a dispatch of its own).
        self.split_concats = True

    # ---- naming, scopes ------------------------------------------------------------------------------
    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self._names)}"

    def emit(self, s: lp.Stmt) -> None:
        self._stmts[-1].append(s)

    def bind(self, e: Expr, prefix: str = "t") -> Expr:
        """Name `e` with a let unless it is trivial."""
        if isinstance(e, (Const, Var)):
            return e
        v = Var(self.fresh(prefix), e.type)
        self.emit(lp.Let(v, e))
        self._let_level[v.name] = len(self._stmts) - 1
        return v

    def bind_invariant(self, e: Expr, prefix: str = "t") -> Expr:
        """`bind`, but (with hoisting on: row kernels) in the outermost scope where every name
        `e` reads is bound, once per scope: the check of a row's gathered index runs once per
        row, not once per element of the row.

            for i0 in 0..8 {                           for i0 in 0..8 {
              let x1 = %ids[i0]                          let x1 = %ids[i0]
              for i2 in 0..64 {                 ->       let t3 = checked_index(x1, 320)
                let t3 = checked_index(x1, 320)          for i2 in 0..64 { .. %w[t3, i2] .. }
                .. %w[t3, i2] ..
        """
        if isinstance(e, (Const, Var)):
            return e
        if self._hoist_base is None:
            return self.bind(e, prefix)
        used = ex.free_vars(e)
        level = len(self._scopes) - 1
        floor = max([self._hoist_base] + [self._let_level[n] for n in used if n in self._let_level])
        while level > floor:
            bound = self._bound[level]
            if bound is None or bound & used:
                break
            level -= 1
        key = ("invariant", e)
        hit = self._scopes[level].get(key)  # type: ignore[call-overload]
        if hit is not None:
            return hit  # type: ignore[no-any-return]
        v = Var(self.fresh(prefix), e.type)
        self._stmts[level].append(lp.Let(v, e))
        self._let_level[v.name] = level
        self._scopes[level][key] = v  # type: ignore[index]
        return v

    def _divide(self, a: Expr, b: Expr) -> Expr:
        """`a / b`; in a row kernel, a float divisor computed outside the current loop (a
        softmax's row sum) becomes one reciprocal there and a multiplication per element, as
        ATen's own softmax and norms do (a division costs several multiplications)."""
        top = len(self._stmts) - 1
        level = self._let_level.get(b.name, top) if isinstance(b, Var) else top
        if self._hoist_base is None or level >= top or not isinstance(b.type, ScalarType) \
                or not b.type.dtype.is_float or b.type != a.type:
            return self.bind(scalar_ops.binary("div", a, b))
        recip = self._recips.get(b.name)
        if recip is None:
            recip = Var(self.fresh("t"), b.type)
            self._stmts[level].append(lp.Let(recip, ex.Binary("div", Const(1.0, b.type), b, b.type)))
            self._let_level[recip.name] = level
            self._recips[b.name] = recip
        return self.bind(scalar_ops.binary("mul", a, recip))

    def push(self, binds: Optional[tuple[Var, ...]] = None) -> None:
        """Open a scope; `binds` are the loop variables it introduces, when known."""
        self._scopes.append({})
        self._stmts.append([])
        self._bound.append(None if binds is None else frozenset(v.name for v in binds))

    def pop(self) -> lp.Stmt:
        """Close the innermost scope and return its statements. The three stacks shrink
        together even when the scope emitted nothing (a probe of a constant operand): a
        statement list left behind would make later scopes emit into the wrong loop."""
        self._scopes.pop()
        self._bound.pop()
        stmts = self._stmts.pop()
        return lp.block(*stmts) if stmts else lp.Block(())

    def _home(self, idx: Index) -> int:
        """The outermost scope where an element at `idx` can be computed: below it, no scope
        binds a variable of `idx` (in a row kernel, a row's reduction lands before the loop over
        the row's elements). The innermost scope unless hoisting is on.

        An index may name `let`s as well as loop variables (a gather's clamped index
        `let t18 = min(max(t17, 0), 1)`); the element cannot move above the scope such a let
        is emitted in, or its load would read a name not bound there."""
        level = len(self._scopes) - 1
        if self._hoist_base is None:
            return level
        used: set[str] = set()
        for e in idx:
            used |= ex.free_vars(e)
        floor = max([self._hoist_base] + [self._let_level[n] for n in used if n in self._let_level])
        while level > floor:
            bound = self._bound[level]
            if bound is None or bound & used:
                break
            level -= 1
        return level

    def _memo_get(self, key: tuple[int, Index], cap: Optional[int] = None) -> Optional[Expr]:
        """The memoized element, looked up from scope `cap` (default: the innermost) outwards."""
        scopes = self._scopes if cap is None else self._scopes[:cap + 1]
        for scope in reversed(scopes):
            if key in scope:
                return scope[key]
        return None

    def pending(self) -> tuple[lp.Stmt, ...]:
        """The statements emitted into the current scope so far."""
        return tuple(self._stmts[-1])

    def define(self, v: Value, idx: Index, e: Expr) -> None:
        """Make `v[idx]` read as `e` in the current scope (a GEMM's accumulator, for the
        epilogue ops computed from it)."""
        self._scopes[-1][(id(v), idx)] = e

    def compute(self, op: Op, idx: Index) -> Expr:
        """The element `idx` of `op`'s result, computed here even if it has a buffer."""
        if op.loc and op.loc not in self.origins:
            self.origins.append(op.loc)
        return self._compute(op, idx)

    def scratch(self, dtype: dt.DType, shape: tuple[Expr, ...]) -> lp.Buffer:
        """A contiguous workspace buffer private to this kernel (a sort's second array):
        local buffers must have constant sizes, and a row may be long."""
        buf = lp.Buffer(f"{self.name}_ws{len(self.scratch_buffers)}", dtype, shape,
                        lp.contiguous_strides(shape))
        self.scratch_buffers.append(buf)
        self.used_buffers[buf.name] = buf
        return buf

    def loops(self, extents: tuple[Expr, ...], prefix: str) -> tuple[Var, ...]:
        return tuple(Var(self.fresh(prefix)) for _ in extents)

    @staticmethod
    def nest(vars_: tuple[Var, ...], extents: tuple[Expr, ...], body: lp.Stmt,
             annotations: tuple[tuple[str, str], ...] = ()) -> lp.Stmt:
        for k in range(len(vars_) - 1, -1, -1):
            body = lp.For(vars_[k], Const(0), extents[k], "serial", body, annotations if k == 0 else ())
        return body

    # ---- element expressions -------------------------------------------------------------------------
    def load(self, v: Value, idx: Index) -> Expr:
        buf = self.buffers[v]
        self.used_buffers[buf.name] = buf
        return self.bind(ex.Load(buf.name, idx, ScalarType(buf.dtype)), "x")

    def value_at(self, v: Value, idx: Index) -> Expr:
        """The element `v[idx]`, computing inlined producers as needed."""
        hit = self._memo_get((id(v), idx))
        if hit is not None:
            return hit
        self._precompute(v, idx)
        return self._value_at(v, idx, None)

    def _inline_operands(self, v: Value, idx: Index) -> Optional[list[tuple[Value, Index]]]:
        """The operand elements `_compute` would ask for first, when `v[idx]` is computed by an
        elementwise op or a view inlined here; None for everything else (loads, rules)."""
        op = v.producer
        if op is None or v in self.buffers or self._reads_row_cache(v, idx) or op.name in ELEMENT_RULES:
            return None
        view = VIEW_INDEX.get(op.name)
        if view is not None:
            return [(op.operands[0], view(op, idx))]
        if get_op(op.name).category == "elementwise":
            return [(u, idx) for u in op.operands]
        return None

    def _precompute(self, v: Value, idx: Index) -> None:
        """Compute the elementwise producers below `v[idx]` deepest first, with an explicit
        stack, so that the recursion of `_compute` -> `value_at` finds each operand computed
        already: a chain of thousands of fused ops would otherwise exceed Python's recursion
        limit. The order of the emitted lets is the one the recursion gives, and each element
        lands in the scope the recursion would choose (never deeper than its consumer's)."""
        top = self._home(idx)
        stack: list[tuple[Value, Index, int, bool]] = [(v, idx, top, False)]
        while stack:
            u, uidx, cap, expanded = stack.pop()
            if expanded:
                if u is not v:
                    self._value_at(u, uidx, cap)
                continue
            if self._memo_get((id(u), uidx), cap) is not None:
                continue
            kids = self._inline_operands(u, uidx)
            if kids is None:
                if u is not v:
                    self._value_at(u, uidx, cap)
                continue
            stack.append((u, uidx, cap, True))
            for w, widx in reversed(kids):
                stack.append((w, widx, min(self._home(widx), cap), False))

    def _value_at(self, v: Value, idx: Index, cap: Optional[int]) -> Expr:
        """`value_at` computed in scope `min(home, cap)`; `cap` is the scope of the consumer
        that asks (the recursion computes an operand while the consumer's inner scopes are
        closed, see below)."""
        key = (id(v), idx)
        hit = self._memo_get(key, cap)
        if hit is not None:
            return hit
        level = self._home(idx)
        if cap is not None:
            level = min(level, cap)
        inner = (self._scopes[level + 1:], self._stmts[level + 1:], self._bound[level + 1:])
        # Compute in scope `level`: close the inner scopes for a while (their statements so far
        # stay theirs), so what is emitted lands before the inner loops.
        del self._scopes[level + 1:], self._stmts[level + 1:], self._bound[level + 1:]
        try:
            op = v.producer
            if v in self.buffers or op is None:
                e = self.load(v, idx)
            elif self._reads_row_cache(v, idx):
                out = self._row_cache[2]  # type: ignore[index]
                e = self.bind(ex.Load(out.name, idx, ScalarType(out.dtype)), "c")
            else:
                if op.loc and op.loc not in self.origins:
                    self.origins.append(op.loc)
                e = self._compute(op, idx)
        finally:
            self._scopes += inner[0]
            self._stmts += inner[1]
            self._bound += inner[2]
        self._scopes[level][key] = e
        return e

    def _compute(self, op: Op, idx: Index) -> Expr:
        name = op.name
        rule = ELEMENT_RULES.get(name)
        if rule is not None:
            return rule(self, op, idx)
        view = VIEW_INDEX.get(name)
        if view is not None:
            return self.value_at(op.operands[0], view(op, idx))
        category = get_op(name).category
        if category == "elementwise":
            args = [self.value_at(v, idx) for v in op.operands]
            if name == "cast":
                return self.bind(ex.cast(args[0], op.attrs["dtype"]))
            if name == "where":
                return self.bind(scalar_ops.where(*args))
            if name == "div":
                return self._divide(args[0], args[1])
            if name in ex.BINARY_OPS:
                return self.bind(scalar_ops.binary(name, args[0], args[1]))
            return self.bind(scalar_ops.unary(name, args[0]))
        if name == "full":
            return scalar_ops.constant(op.attrs["value"], op.attrs["dtype"])
        if name == "iota":
            d = op.attrs["dtype"]
            pos = idx[op.attrs["dim"]]
            start, step = op.attrs["start"], op.attrs["step"]
            if d.is_float or isinstance(start, float) or isinstance(step, float):
                val = ex.Binary("add", ex.Binary("mul", ex.cast(pos, dt.f64), ex.Const(step, ScalarType(dt.f64)), ScalarType(dt.f64)),
                                ex.Const(start, ScalarType(dt.f64)), ScalarType(dt.f64))
                return self.bind(ex.cast(val, d))
            return self.bind(ex.cast(ex.add(ex.mul(pos, ex.as_expr(step)), ex.as_expr(start)), d))
        if name == "concat":
            return self._concat(op, idx)
        if category == "reduction":
            return self._reduction(op, idx)
        raise LoweringError(f"lower-to-loops: no loop form for op {name!r} inlined in a kernel")

    def concat_parts(self, v: Value) -> Optional[list[tuple[Value, int, Expr]]]:
        """(operand, dim, offset) of each operand when `v` is a concat computed in this kernel
        (not stored) and `split_concats` is on, else None. A nest over `v` is then better one
        nest per operand (`indexing_rules.split_nest`): an element of the concat computed by
        `_concat` is a chain of selects that loads every operand (60 loads per element for
        a decode step's 60 new key/value rows stacked)."""
        op = v.producer
        if not self.split_concats or op is None or op.name != "concat" or v in self.buffers:
            return None
        dim = op.attrs["dim"] % max(len(v.shape), 1)
        parts = []
        off: Expr = Const(0)
        for operand in op.operands:
            parts.append((operand, dim, off))
            off = ex.add(off, operand.shape[dim])
        return parts

    def stack_parts(self, v: Value) -> Optional[list[Value]]:
        """The operands of a stack computed in this kernel (not stored), `split_concats` on:
        `v` a reshape to ``[N, a, *rest]`` of a concat along dim 0 of N operands ``[a, *rest]``
        (what `torch.stack` decomposes to), so `v[i, ...]` is operand ``i``'s element; else
        None. A decode step's new keys and values of every layer are stacked so, then written
        into the KV cache in place: looped over `v` itself, each element was a chain of N
        selects loading every operand (`_concat`)."""
        op = v.producer
        if not self.split_concats or op is None or op.name != "reshape" or v in self.buffers:
            return None
        cat = op.operands[0]
        inner = cat.producer
        if inner is None or inner.name != "concat" or cat in self.buffers:
            return None
        if inner.attrs["dim"] % max(len(cat.shape), 1) != 0:
            return None
        parts = list(inner.operands)
        first = tuple(parts[0].shape)
        if len(first) < 1 or any(tuple(u.shape) != first for u in parts):
            return None
        if tuple(v.shape) != (Const(len(parts)),) + first:
            return None
        return parts

    def _concat(self, op: Op, idx: Index) -> Expr:
        """Select among the operands; each operand's index is clamped into its own bounds so
        no load ever leaves its buffer (a select evaluates both sides)."""
        dim = op.attrs["dim"]
        pos = idx[dim]
        offsets: list[Expr] = []
        off: Expr = Const(0)
        for v in op.operands:
            offsets.append(off)
            off = ex.add(off, v.shape[dim])
        result: Optional[Expr] = None
        for v, start in reversed(list(zip(op.operands, offsets))):
            local = ex.sub(pos, start)
            clamped = ex.minimum(ex.maximum(local, Const(0)), ex.sub(v.shape[dim], Const(1)))
            sub_idx = tuple(clamped if k == dim else i for k, i in enumerate(idx))
            val = self.value_at(v, sub_idx)
            if result is None:
                result = val
            else:
                cond = self.bind(ex.binary("lt", pos, ex.add(start, v.shape[dim])))
                result = self.bind(ex.select(cond, val, result))
        assert result is not None
        return result

    # ---- reductions ------------------------------------------------------------------------------------
    def _reduced_index(self, op: Op, out_idx: Index, red_vars: tuple[Var, ...]) -> Index:
        """The operand index for an output index and the reduction loop variables."""
        src_rank = op.operands[0].type.rank
        dims = tuple(op.attrs["dims"]) if "dims" in op.attrs else (op.attrs["dim"],)
        keep = bool(op.attrs.get("keepdim", False))
        it_out = iter(out_idx)
        it_red = iter(red_vars)
        src: list[Expr] = []
        for d in range(src_rank):
            if d in dims:
                src.append(next(it_red))
                if keep:
                    next(it_out)
            else:
                src.append(next(it_out))
        return tuple(src)

    def _reduction(self, op: Op, out_idx: Index) -> Expr:
        """Emit the accumulation loops for one output element; return the result."""
        src = op.operands[0]
        dims = tuple(op.attrs["dims"]) if "dims" in op.attrs else (op.attrs["dim"],)
        extents = tuple(src.shape[d] for d in dims)
        red_vars = self.loops(extents, "r")
        if op.name in ("argmax", "argmin"):
            return self._arg_reduction(op, out_idx, red_vars, extents)
        acc_t = op.result.dtype
        acc = lp.Buffer(self.fresh("acc"), acc_t, (Const(1),), (Const(1),), "local")
        self.emit(lp.Alloc(acc))
        self.emit(lp.Store(acc.name, (Const(0),), REDUCE_INIT[op.name](acc_t)))
        self.push(red_vars)
        val = self.value_at(src, self._reduced_index(op, out_idx, red_vars))
        cur = ex.Load(acc.name, (Const(0),), ScalarType(acc_t))
        self.emit(lp.Store(acc.name, (Const(0),), scalar_ops.binary(REDUCE_COMBINE[op.name], cur, val)))
        self._store_row_cache(op, red_vars, out_idx, val)
        body = self.pop()
        self.emit(self.nest(red_vars, extents, body))
        return self.bind(ex.Load(acc.name, (Const(0),), ScalarType(acc_t)))

    def _store_row_cache(self, op: Op, red_vars: tuple[Var, ...], out_idx: Index, val: Expr) -> None:
        """In the loop of the reduction chosen by `row_cache.cached_operand`, store its operand
        into the output row (the loop visits every element of the row, in the row's order)."""
        if self._row_cache is None or self._row_cache_stored or op is not self._row_cache[1]:
            return
        _, _, out, elem = self._row_cache
        src_idx = self._reduced_index(op, out_idx, red_vars)
        if src_idx != elem[:len(elem) - len(red_vars)] + red_vars:
            return
        self.used_buffers[out.name] = out
        self.emit(lp.Store(out.name, src_idx, val))
        self._row_cache_stored = True

    def _reads_row_cache(self, v: Value, idx: Index) -> bool:
        """Whether `v[idx]` is loaded from the output row: the stored value, at the element
        loop's own index (elsewhere the row may already hold final results)."""
        return self._row_cache_stored and self._row_cache is not None \
            and v is self._row_cache[0] and idx == self._row_cache[3]

    def _arg_reduction(self, op: Op, out_idx: Index, red_vars: tuple[Var, ...], extents: tuple[Expr, ...]) -> Expr:
        src = op.operands[0]
        vt = src.dtype
        best = lp.Buffer(self.fresh("acc"), vt, (Const(1),), (Const(1),), "local")
        where = lp.Buffer(self.fresh("acc"), dt.i64, (Const(1),), (Const(1),), "local")
        self.emit(lp.Alloc(best))
        self.emit(lp.Alloc(where))
        is_max = op.name == "argmax"
        init = REDUCE_INIT["reduce_max" if is_max else "reduce_min"](vt)
        self.emit(lp.Store(best.name, (Const(0),), init))
        self.emit(lp.Store(where.name, (Const(0),), Const(-1)))
        self.push(red_vars)
        val = self.value_at(src, self._reduced_index(op, out_idx, red_vars))
        cur = self.bind(ex.Load(best.name, (Const(0),), ScalarType(vt)))
        better = scalar_ops.binary("gt" if is_max else "lt", val, cur)
        if vt.is_float:
            # NaN wins (torch treats NaN as the extreme) and the first NaN is kept.
            val_nan = ex.call("isnan", val)
            cur_nan = ex.call("isnan", cur)
            better = ex.Binary("or", ex.Binary("and", better, ex.call("not", cur_nan), ex.BOOL),
                               ex.Binary("and", val_nan, ex.call("not", cur_nan), ex.BOOL), ex.BOOL)
        # The first element always wins (covers all -inf/+inf rows).
        first = ex.binary("eq", ex.Load(where.name, (Const(0),), ex.INDEX), Const(-1))
        take = self.bind(ex.Binary("or", better, first, ex.BOOL))
        flat: Expr = Const(0)
        for v, n in zip(red_vars, extents):
            flat = ex.add(ex.mul(flat, n), v)
        self.emit(lp.Store(best.name, (Const(0),), ex.select(take, val, cur)))
        self.emit(lp.Store(where.name, (Const(0),), ex.select(take, flat, ex.Load(where.name, (Const(0),), ex.INDEX))))
        body = self.pop()
        self.emit(self.nest(red_vars, extents, body))
        result = ex.Load(where.name, (Const(0),), ex.INDEX)
        # An empty reduction leaves -1; torch raises there, so keep 0 as a defined value.
        return self.bind(ex.maximum(result, Const(0)))

    # ---- kernel roots ------------------------------------------------------------------------------------
    def element_root(self, op: Op, out: lp.Buffer) -> lp.Stmt:
        """Loops over the result; each element computed in place (elementwise ops, views,
        factories, and reductions, whose accumulation loops sit inside)."""
        shape = op.result.shape
        vars_ = self.loops(shape, "i")
        if op.loc and op.loc not in self.origins:
            self.origins.append(op.loc)
        if self._holds_reduction(op):
            return self.row_root(op, out, vars_)
        self.push()
        val = self._compute(op, vars_)
        self.used_buffers[out.name] = out
        self.emit(lp.Store(out.name, vars_, val))
        body = self.pop()
        return self.nest(vars_, shape, body, self._origin_annotation())

    def _holds_reduction(self, op: Op) -> bool:
        """Whether a reduction is computed inside this elementwise kernel (a row kernel, see
        `passes/tensor/row_fusion.py`)."""
        if get_op(op.name).category == "reduction":
            return False
        stack, seen = list(op.operands), set()
        while stack:
            v = stack.pop()
            p = v.producer
            if v in self.buffers or p is None or id(p) in seen:
                continue
            seen.add(id(p))
            if get_op(p.name).category == "reduction":
                return True
            stack.extend(p.operands)
        return False

    def row_root(self, op: Op, out: lp.Buffer, vars_: tuple[Var, ...]) -> lp.Stmt:
        """The loops of an elementwise kernel that holds reductions: one scope per loop, and each
        value computed in the outermost scope its index allows, so a row's reductions and
        statistics run once per row, before the loop over the row's elements:

            for i0 in 0..8 {
              alloc %acc2: f32[1] strides [1] local
              %acc2[0] = -inf:f32
              for r1 in 0..16 { let x3 = %x[i0, r1]; %acc2[0] = max(%acc2[0], x3) }
              let t4 = %acc2[0]
              ...                                   (the sum's loop, the same way)
              for i5 in 0..16 { ... %out0[i0, i5] = t9 }
            }
        """
        shape = op.result.shape
        base = len(self._scopes)
        self.push(())
        for v in vars_:
            self.push((v,))
        self._hoist_base = base
        cache = cached_operand(op, out, self.buffers)
        try:
            if cache is not None:
                # the reduction (and what it needs) first, so its loop stores the operand
                # before the element loop reads it
                self._row_cache = (cache[0], cache[1], out, vars_)
                self.value_at(cache[1].result, row_index(cache[1], vars_))
            val = self._compute(op, vars_)
        finally:
            self._hoist_base = None
            self._row_cache, self._row_cache_stored = None, False
        self.used_buffers[out.name] = out
        self.emit(lp.Store(out.name, vars_, val))
        for k in range(len(vars_) - 1, -1, -1):
            body = self.pop()
            ann = self._origin_annotation() if k == 0 else ()
            self.emit(lp.For(vars_[k], Const(0), shape[k], "serial", body, ann))
        return self.pop()

    def _origin_annotation(self) -> tuple[tuple[str, str], ...]:
        return (("origin", "; ".join(self.origins)),) if self.origins else ()
