"""The reference interpreter: a loop-IR `Program` run on NumPy arrays.

Each kernel is translated once into nested Python closures (one per statement and
expression node), which then run with a `State`: variable values, buffers, and the active
lanes. A loop whose iterations are independent (`lanes.laneable`) runs all its iterations
at once: its variable becomes an `np.arange` laid along a lane axis of its own, and every
value computed inside is an array broadcast over the active lane axes (values that do not
depend on a lane stay scalars). Other loops run one iteration at a time, in lock step over
the lanes already active. An `if` whose condition differs between lanes runs both branches
under a mask (stores and loads touch only the lanes whose condition holds); a loop whose
bounds differ between lanes runs to the largest bound under a mask.

IR vectors (`ramp`, `broadcast`, vector loads and stores) are one more axis, the last. Local
buffers allocated inside lanes get one private copy per lane. Every access is bounds-checked:
an index outside a buffer raises `ExecutionError` instead of reading other memory.

The meaning of every scalar op is `torchburn.ir.semantics` (through `ops.py`).
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import numpy as np

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Expr
from . import ops
from .lanes import accumulator_updates, fold_operand, laneable
from .values import constant, load_values, storage_dtype, store_values, value_dtype


class ExecutionError(RuntimeError):
    """The program cannot run as written (an access outside a buffer, a missing symbol)."""


def span_elements(shape: Sequence[int], strides: Sequence[int]) -> int:
    """Elements from a buffer's first element to its last one, inclusive (0 when empty)."""
    if any(n <= 0 for n in shape):
        return 0
    return 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides))


def overlaps_itself(shape: Sequence[int], strides: Sequence[int]) -> bool:
    """Whether two different indices of the buffer may address one element."""
    dims = sorted((abs(s), n) for n, s in zip(shape, strides) if n > 1)
    reach = 1
    for stride, n in dims:
        if stride < reach:
            return True
        reach = stride * n
    return False


class Storage:
    """A buffer's memory: `data` is flat (`span` elements), or for a local allocated inside
    lanes, one flat copy per lane (`data.shape == lane_shape + (span,)`)."""

    __slots__ = ("name", "dtype", "data", "shape", "strides", "span", "lane_keys", "vector_keys")

    def __init__(self, name: str, dtype: dt.DType, data: np.ndarray, shape: tuple[int, ...],
                 strides: tuple[int, ...]) -> None:
        self.name, self.dtype, self.data, self.shape, self.strides = name, dtype, data, shape, strides
        self.span = data.shape[-1]
        lane_shape = data.shape[:-1]
        self.lane_keys: tuple[Any, ...] = ()
        self.vector_keys: tuple[Any, ...] = ()
        if lane_shape:
            keys = []
            for a, n in enumerate(lane_shape):
                keys.append(np.arange(n).reshape([n if b == a else 1 for b in range(len(lane_shape))]) if n > 1 else 0)
            self.lane_keys = tuple(keys)
            self.vector_keys = tuple(k[..., None] if isinstance(k, np.ndarray) else k for k in keys)

    def key(self, offset: Any, vector: bool) -> Any:
        if not self.lane_keys:
            return offset
        if np.ndim(offset) == 0 or (vector and np.ndim(offset) == 1):
            return (Ellipsis, offset)  # the same element(s) in every lane's copy: basic indexing
        return (*(self.vector_keys if vector else self.lane_keys), offset)


class State:
    """What a kernel's closures read and write while it runs."""

    __slots__ = ("vars", "bufs", "mask", "lane_shape", "depth", "lane_ok")

    def __init__(self, axes: int) -> None:
        self.vars: dict[str, Any] = {}
        self.bufs: dict[str, Storage] = {}
        self.mask: Any = None
        self.lane_shape: list[int] = [1] * axes
        self.depth = 0
        self.lane_ok = True


ExprFn = Callable[[State], Any]
StmtFn = Callable[[State], None]


def _lanes_of(mask: Any, vector: bool) -> Any:
    if mask is None or not vector or np.ndim(mask) == 0:
        return mask
    return mask[..., None]


# ---- expressions --------------------------------------------------------------------------------

class KernelCode:
    """One kernel translated to closures (see the module docstring)."""

    def __init__(self, kernel: lp.Kernel) -> None:
        self.kernel = kernel
        self.axes = _lane_depth(kernel.body)
        self.written = {s.buffer for s in lp.walk_stmts(kernel.body) if isinstance(s, lp.Store)}
        self.body = self.stmt(kernel.body, 0)

    # expressions
    def expr(self, e: Expr) -> ExprFn:
        method = getattr(self, f"_e_{type(e).__name__}", None)
        if method is None:
            raise ExecutionError(f"the reference engine cannot evaluate {type(e).__name__} nodes")
        return method(e)  # type: ignore[no-any-return]

    def _e_Const(self, e: ex.Const) -> ExprFn:
        v = constant(e.value, e.dtype)
        return lambda s: v

    def _e_Var(self, e: ex.Var) -> ExprFn:
        name = e.name

        def var(s: State) -> Any:
            try:
                return s.vars[name]
            except KeyError:
                raise ExecutionError(f"kernel @{self.kernel.name}: {name} has no value") from None

        return var

    def _e_Binary(self, e: ex.Binary) -> ExprFn:
        fa, fb, op, d = self.expr(e.a), self.expr(e.b), e.op, e.a.dtype
        return lambda s: ops.binary(op, d, fa(s), fb(s))

    def _e_Call(self, e: ex.Call) -> ExprFn:
        fns, name, d = [self.expr(a) for a in e.args], e.name, e.args[0].dtype
        return lambda s: ops.call(name, d, [f(s) for f in fns])

    def _e_Cast(self, e: ex.Cast) -> ExprFn:
        f, src, dst = self.expr(e.value), e.value.dtype, e.dtype
        return lambda s: ops.cast(f(s), src, dst)

    def _e_Bitcast(self, e: ex.Bitcast) -> ExprFn:
        f, src, dst = self.expr(e.value), e.value.dtype, e.dtype
        if e.value.lanes != e.type.lanes:
            lanes_in, lanes_out = e.value.lanes, e.type.lanes
            return lambda s: ops.bitcast_lanes(f(s), src, lanes_in, dst, lanes_out)
        return lambda s: ops.bitcast(f(s), src, dst)

    def _e_Select(self, e: ex.Select) -> ExprFn:
        fc, fa, fb, d = self.expr(e.cond), self.expr(e.a), self.expr(e.b), e.dtype
        return lambda s: ops.select(d, fc(s), fa(s), fb(s))

    def _e_Ramp(self, e: ex.Ramp) -> ExprFn:
        fb, fs, d = self.expr(e.base), self.expr(e.stride), e.base.dtype
        steps = constant(0, d) + np.arange(e.lanes).astype(value_dtype(d))

        def ramp(s: State) -> Any:
            base, stride = np.asarray(fb(s)), np.asarray(fs(s))
            return ops.binary("add", d, base[..., None], ops.binary("mul", d, stride[..., None], steps))

        return ramp

    def _e_Broadcast(self, e: ex.Broadcast) -> ExprFn:
        f, lanes = self.expr(e.value), e.lanes

        def broadcast(s: State) -> Any:
            v = np.asarray(f(s))
            return np.repeat(v[..., None], lanes, axis=-1)

        return broadcast

    def _e_VectorReduce(self, e: ex.VectorReduce) -> ExprFn:
        f, op, d = self.expr(e.value), e.op, e.dtype
        return lambda s: ops.vector_reduce(op, d, f(s))

    def _e_Load(self, e: ex.Load) -> ExprFn:
        offset = self._offset(e.buffer, e.index, e.lanes > 1)
        name, vector, d = e.buffer, e.lanes > 1, e.dtype

        def load(s: State) -> Any:
            buf = s.bufs[name]
            off = offset(s, buf)
            mask = _lanes_of(s.mask, vector)
            if mask is not None and np.ndim(mask) > 0:
                if buf.span == 0:
                    return np.zeros(np.broadcast_shapes(np.shape(off), np.shape(mask)), value_dtype(d))
                off = np.where(mask, off, 0)
            _check_bounds(buf, off, "load from")
            return load_values(buf.data[buf.key(off, vector)], d)

        return load

    def _offset(self, name: str, index: tuple[Expr, ...], vector: bool) -> Callable[[State, Storage], Any]:
        fns = [(self.expr(i), vector and i.lanes == 1) for i in index]

        def offset(s: State, buf: Storage) -> Any:
            off: Any = 0
            try:
                for (f, widen), stride in zip(fns, buf.strides):
                    v = f(s)
                    if widen and np.ndim(v) > 0:
                        v = v[..., None]
                    off = off + v * stride
            except OverflowError:
                raise ExecutionError(f"an index of %{name} is far outside the buffer") from None
            return off

        return offset

    # statements
    def stmt(self, st: lp.Stmt, depth: int) -> StmtFn:
        method = getattr(self, f"_s_{type(st).__name__}", None)
        if method is None:
            raise ExecutionError(f"the reference engine cannot run {type(st).__name__} statements")
        return method(st, depth)  # type: ignore[no-any-return]

    def _s_Block(self, st: lp.Block, depth: int) -> StmtFn:
        fns = [self.stmt(x, depth) for x in st.stmts]

        def block(s: State) -> None:
            for f in fns:
                f(s)

        return block

    def _s_Let(self, st: lp.Let, depth: int) -> StmtFn:
        f, name = self.expr(st.value), st.var.name

        def let(s: State) -> None:
            s.vars[name] = f(s)

        return let

    def _s_Alloc(self, st: lp.Alloc, depth: int) -> StmtFn:
        b = st.buffer
        dims = [self.expr(x) for x in (*b.shape, *b.strides)]
        sdt = storage_dtype(b.dtype)

        def alloc(s: State) -> None:
            # in lanes (a loop run as one vector of its iterations) an extent may vary by lane:
            # each lane's storage is as large as the largest, and a lane reads only its own part
            vals = [int(np.max(f(s))) for f in dims]
            shape, strides = tuple(vals[:b.ndim]), tuple(vals[b.ndim:])
            lane_shape = tuple(s.lane_shape) if s.depth else ()
            data = np.zeros(lane_shape + (span_elements(shape, strides),), sdt)
            s.bufs[b.name] = Storage(b.name, b.dtype, data, shape, strides)

        return alloc

    def _s_Store(self, st: lp.Store, depth: int) -> StmtFn:
        write, fv = self._writer(st), self.expr(st.value)
        return lambda s: write(s, fv(s))

    def _writer(self, st: lp.Store) -> Callable[[State, Any], None]:
        """`write(state, value)`: store `value` at the store's index (masked lanes left alone)."""
        vector = st.value.lanes > 1
        offset = self._offset(st.buffer, st.index, vector)
        name, d = st.buffer, st.value.dtype

        def store(s: State, value: Any) -> None:
            buf = s.bufs[name]
            val = store_values(value, d)
            off = offset(s, buf)
            mask = _lanes_of(s.mask, vector)
            key = buf.key(off, vector)
            if mask is not None and np.ndim(mask) > 0 and not mask.all():
                if isinstance(key, tuple) and key[0] is Ellipsis:
                    key = (*(buf.vector_keys if vector else buf.lane_keys), key[1])
                keys = key if isinstance(key, tuple) else (key,)
                parts = np.broadcast_arrays(*keys, val, mask)
                live = parts[-1]
                picked = [p[live] for p in parts[:-2]]
                off, val = picked[-1], parts[-2][live]
                key = tuple(picked) if isinstance(key, tuple) else off
            _check_bounds(buf, off, "store to")
            buf.data[key] = val

        return store

    def _s_If(self, st: lp.If, depth: int) -> StmtFn:
        fc = self.expr(st.cond)
        then = self.stmt(st.then, depth)
        orelse = self.stmt(st.orelse, depth) if st.orelse is not None else None

        def if_(s: State) -> None:
            c = fc(s)
            if np.ndim(c) == 0:
                if c:
                    then(s)
                elif orelse is not None:
                    orelse(s)
                return
            outer = s.mask
            taken = c if outer is None else c & outer
            if taken.any():
                s.mask = taken
                then(s)
            if orelse is not None:
                other = ~c if outer is None else ~c & outer
                if other.any():
                    s.mask = other
                    orelse(s)
            s.mask = outer

        return if_

    def _s_For(self, st: lp.For, depth: int) -> StmtFn:
        fstart, fextent, name = self.expr(st.start), self.expr(st.extent), st.var.name
        in_lanes = laneable(st) and depth < self.axes
        updates = None if in_lanes or depth >= self.axes else accumulator_updates(st)
        body = self.stmt(st.body, depth + 1 if in_lanes else depth)

        def serial(s: State, start: Any, extent: Any) -> None:
            if np.ndim(start) == 0 and np.ndim(extent) == 0:
                for k in range(int(start), int(start) + int(extent)):
                    s.vars[name] = k
                    body(s)
                return
            end = start + extent
            outer = s.mask
            for k in range(int(np.min(start)), int(np.max(end))):
                live = (start <= k) & (k < end)
                if outer is not None:
                    live = live & outer
                if live.any():
                    s.mask = live
                    s.vars[name] = k
                    body(s)
            s.mask = outer

        if updates is not None:
            return self._reduction(st, updates, depth, serial)
        if not in_lanes:
            return lambda s: serial(s, fstart(s), fextent(s))
        axis = depth

        def lanes(s: State) -> None:
            start, extent = fstart(s), fextent(s)
            if not s.lane_ok or (np.ndim(extent) == 0 and int(extent) <= 1):
                serial(s, start, extent)
                return
            uniform = np.ndim(start) == 0 and np.ndim(extent) == 0
            lo = int(np.min(start))
            n = int(np.max(start + extent)) - lo
            if n <= 0:
                return
            shape = [1] * self.axes
            shape[axis] = n
            v = (np.arange(n, dtype=np.int64) + lo).reshape(shape)
            outer = s.mask
            if not uniform:
                live = (v >= start) & (v < start + extent)
                s.mask = live if outer is None else live & outer
            saved_depth = s.depth
            s.lane_shape[axis], s.depth = n, axis + 1
            s.vars[name] = v
            body(s)
            s.lane_shape[axis], s.depth, s.mask = 1, saved_depth, outer

        return lanes


    def _reduction(self, st: lp.For, updates: tuple[lp.Store, ...], depth: int,
                   serial: Callable[[State, Any, Any], None]) -> StmtFn:
        """A loop of accumulator updates (`lanes.accumulator_updates`): its `let`s and update
        operands evaluated for a block of iterations at once on lane axis `depth`, then folded
        into each accumulator one iteration after the other, with the op's semantics."""
        fstart, fextent, name, axis = self.expr(st.start), self.expr(st.extent), st.var.name, depth
        stmts = st.body.stmts if isinstance(st.body, lp.Block) else (st.body,)
        lets = [self.stmt(x, depth + 1) for x in stmts if isinstance(x, lp.Let)]
        folds = []
        for u in updates:
            op, operand, left = fold_operand(u)  # type: ignore[misc]
            current = self.expr(ex.Load(u.buffer, u.index, u.value.type))
            folds.append((op, u.value.dtype, left, current, self.expr(operand), self._writer(u)))

        def reduction(s: State) -> None:
            start, extent = fstart(s), fextent(s)
            if not s.lane_ok or np.ndim(start) or np.ndim(extent) or int(extent) <= 1:
                serial(s, start, extent)
                return
            lo, n = int(start), int(extent)
            lanes = int(np.prod(s.lane_shape))
            step = max(1, min(n, REDUCTION_BLOCK // max(lanes, 1)))
            accs = [f[3](s) for f in folds]
            shapes = [np.shape(a) for a in accs]
            saved = s.depth
            for k0 in range(lo, lo + n, step):
                m = min(step, lo + n - k0)
                shape = [1] * self.axes
                shape[axis] = m
                s.lane_shape[axis], s.depth = m, axis + 1
                s.vars[name] = (np.arange(m, dtype=np.int64) + k0).reshape(shape)
                for let in lets:
                    let(s)
                operands = [f[4](s) for f in folds]
                s.lane_shape[axis], s.depth = 1, saved
                for j, ((op, d, left, *_), e) in enumerate(zip(folds, operands)):
                    spread = np.ndim(e) >= self.axes and np.shape(e)[axis] > 1
                    acc = accs[j]
                    lead = (slice(None),) * axis
                    for k in range(m):
                        x = e[lead + (slice(k, k + 1),)] if spread else e  # keeps the axis (size 1)
                        acc = ops.binary(op, d, acc, x) if left else ops.binary(op, d, x, acc)
                    accs[j] = acc
            s.vars.pop(name, None)
            for (_, _, _, _, _, write), acc, shape in zip(folds, accs, shapes):
                if np.ndim(acc) != len(shape) and np.size(acc) == int(np.prod(shape)):
                    acc = np.reshape(acc, shape)  # a lane-uniform accumulator stays its own shape
                write(s, acc)

        return reduction


#: Elements (lanes times iterations) a reduction loop evaluates at once, at most.
REDUCTION_BLOCK = 1 << 21


def _lane_depth(s: lp.Stmt) -> int:
    """How many lane axes the kernel needs: the deepest nesting of laneable loops."""
    if isinstance(s, lp.For):
        inner = _lane_depth(s.body)
        return inner + 1 if laneable(s) or accumulator_updates(s) is not None else inner
    return max((_lane_depth(c) for c in s.children()), default=0)


def _check_bounds(buf: Storage, off: Any, what: str) -> None:
    arr = np.asarray(off)
    if arr.size == 0:
        return
    lo, hi = int(arr.min()), int(arr.max())
    if lo < 0 or hi >= buf.span:
        bad = lo if lo < 0 else hi
        raise ExecutionError(f"{what} %{buf.name}: element {bad} is outside the buffer "
                             f"({buf.span} elements, shape {list(buf.shape)}, strides {list(buf.strides)})")


# ---- programs ---------------------------------------------------------------------------------

class ProgramCode:
    """A program translated once; `run` executes it on memory the caller provides."""

    def __init__(self, program: lp.Program) -> None:
        self.program = program
        self.kernels = {k.name: KernelCode(k) for k in program.kernels}

    def buffer_layout(self, b: lp.Buffer, env: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
        return (tuple(ex.evaluate_index(d, env) for d in b.shape), tuple(ex.evaluate_index(d, env) for d in b.strides))

    def run(self, memory: dict[str, np.ndarray], env: dict[str, int]) -> None:
        """Run every call in order. `memory` maps each program buffer (inputs, outputs and
        temporaries) to a flat array of its storage dtype covering its span; `env` gives
        every program symbol."""
        p = self.program
        for call in p.calls:
            code = self.kernels[call.kernel]
            k = code.kernel
            if len(call.args) != len(k.params):
                raise ExecutionError(f"call @{k.name} passes {len(call.args)} buffers to {len(k.params)} parameters")
            if any(off is not None for off in call.offsets):
                raise ExecutionError(f"call @{k.name} passes a view at an offset, which the reference "
                                     "engine does not run (its lowering, lower-to-loops-gpu, makes none)")
            state = State(code.axes)
            kenv: dict[str, int] = {}
            for sym in k.symbols:
                if sym.name not in env:
                    raise ExecutionError(f"kernel @{k.name} needs symbol {sym.name}, which the program does not bind")
                kenv[sym.name] = env[sym.name]
                state.vars[sym.name] = int(env[sym.name])
            for param, arg in zip(k.params, call.args):
                if arg not in memory:
                    raise ExecutionError(f"call @{k.name}: %{arg} is not a buffer of program @{p.name}")
                shape, strides = self.buffer_layout(param, kenv)
                state.bufs[param.name] = Storage(param.name, param.dtype, memory[arg], shape, strides)
                if param.name in code.written and overlaps_itself(shape, strides):
                    state.lane_ok = False
            if len(set(call.args)) != len(call.args):
                state.lane_ok = False  # one buffer bound to two parameters: keep the sequential order
            with np.errstate(all="ignore"):
                code.body(state)


_CACHE: dict[int, tuple[lp.Program, ProgramCode]] = {}


def program_code(program: lp.Program) -> ProgramCode:
    """The translated program (kept while the program object lives in the small cache)."""
    hit = _CACHE.get(id(program))
    if hit is not None and hit[0] is program:
        return hit[1]
    code = ProgramCode(program)
    if len(_CACHE) > 64:
        _CACHE.clear()
    _CACHE[id(program)] = (program, code)
    return code

