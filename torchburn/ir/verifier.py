"""Checks that IR is well formed, so that a broken pass fails at the pass, not in codegen.

`verify(ir)` accepts a `Graph`, `Kernel` or `Program` and raises `VerificationError` naming
the first problem found (which graph, kernel, op or statement, and what is wrong).

Graph: SSA (every value defined once, before use), known ops, result types equal to
`ops.infer_types`, outputs defined.

Kernel: buffers of loads and stores are parameters or allocations in scope, with as many
indices as dimensions; variables are bound (symbols, loop variables, lets) before use and
never rebound while in scope; every node's type is the one the builders give it (operands of
binary ops agree, select conditions are bool with the operands' lanes, stores write the
buffer's dtype with the index's lanes); loop bounds and variables are i64; `vectorized` and
`unrolled` loops have constant extents (a vector width and an unroll factor are static) and
nothing parallel or vectorized runs inside a vectorized loop.

Program: unique buffer and kernel names, calls name existing kernels with arguments matching
the parameters in count, dtype and rank, every symbol a kernel or buffer uses is a program
symbol, `return` names input or output buffers (one returned viewed in another shape,
`return %out0 as [...]`, is contiguous and holds as many elements), and the workspace is planned for every
temporary or for none: passes before memory planning produce temporaries without offsets, so
only `verify(p, planned=True)` (what codegen needs) demands offsets; a partial plan is always an error.
"""
from __future__ import annotations

import math

from typing import Callable, Iterable, Optional, Union

from . import dtypes as dt
from . import expr as ex
from . import loop as lp
from .ops import OPS, infer_types
from .printer import Printer, print_expr
from .tensor import Graph, Op, Value


class VerificationError(ValueError):
    """IR that breaks an invariant. `where` locates it (the graph, kernel or program, and the
    op or statement when there is one), `message` says what is wrong; `str()` gives both."""

    def __init__(self, where: str, message: str) -> None:
        self.where = where
        self.message = message
        super().__init__(f"{where}: {message}")

    def __reduce__(self) -> tuple[object, ...]:  # picklable despite the custom signature
        return (VerificationError, (self.where, self.message))


#: The index type is i64: a size, stride or element count must stay below 2**63.
INDEX_LIMIT = 2 ** 63


def _size_problem(dims: tuple[ex.Expr, ...], what: str) -> Optional[str]:
    """Why constant sizes `dims` cannot be a shape (negative, or past the index type)."""
    count = 1
    for k, d in enumerate(dims):
        if isinstance(d, ex.Const) and isinstance(d.value, int):
            if d.value < 0:
                return f"{what} has a negative size {d.value} in dim {k}"
            if d.value >= INDEX_LIMIT:
                return f"{what} has size {d.value} in dim {k}, past the index type (2**63)"
            count *= d.value
    if count >= INDEX_LIMIT:
        return f"{what} has {count} elements, past the index type (2**63)"
    return None


def _stride_problem(strides: tuple[ex.Expr, ...], what: str) -> Optional[str]:
    for k, d in enumerate(strides):
        if isinstance(d, ex.Const) and isinstance(d.value, int) and abs(d.value) >= INDEX_LIMIT:
            return f"{what} has stride {d.value} in dim {k}, past the index type (2**63)"
    return None


#: Vector reductions the codegen implements.
VECTOR_REDUCE_OPS = frozenset({"add", "mul", "min", "max", "and", "or"})
_PREDICATES = frozenset({"isnan", "isinf", "isfinite", "signbit"})
_RESERVED_CALLS = frozenset({"cast", "bitcast", "select", "ramp", "broadcast"}) | ex.NAMED_BINARY_OPS
_BITWISE = frozenset({"and", "or", "xor"})
_SHIFTS = frozenset({"shl", "shr"})


def verify(ir: Union[Graph, lp.Kernel, lp.Program], planned: bool = False) -> None:
    """Raise `VerificationError` unless `ir` is well formed. `planned` (programs only) also
    demands a workspace offset for every temporary, as codegen does."""
    if isinstance(ir, Graph):
        verify_graph(ir)
    elif isinstance(ir, lp.Kernel):
        verify_kernel(ir)
    elif isinstance(ir, lp.Program):
        verify_program(ir, planned)
    else:
        raise TypeError(f"cannot verify {type(ir).__name__}")


# --------------------------------------------------------------------------------------------
# Tensor level

def _op_text(op: Op) -> str:
    try:
        return Printer().op(op)
    except Exception:  # an op too broken to print still gets named
        return f"{op.name}(...)"


def verify_graph(g: Graph) -> None:
    where = f"graph @{g.name}"
    names: set[str] = set()  # `%name`s of values, `name`s of symbols: two namespaces, as printed
    defined: set[int] = set()

    def define(name: str, obj: object, what: str) -> None:
        spelled = name if what == "symbol" else "%" + name
        if id(obj) in defined:
            raise VerificationError(where, f"{what} {spelled} (one object) is defined twice")
        if spelled in names:
            raise VerificationError(where, f"{what} {spelled} is defined twice")
        names.add(spelled)
        defined.add(id(obj))

    for v in g.inputs:
        if isinstance(v, Value):
            if v.strides is not None and len(v.strides) != v.type.rank:
                raise VerificationError(where, f"input %{v.name} has {v.type.rank} dims but "
                                        f"{len(v.strides)} strides")
            problem = _size_problem(v.type.shape, f"input %{v.name}")
            if problem is not None:
                raise VerificationError(where, problem)
            define(v.name, v, "input")
        elif isinstance(v, ex.Var):
            if v.type != ex.INDEX:
                raise VerificationError(where, f"symbol {v.name} must be i64, not {v.type}")
            define(v.name, v, "symbol")
        else:
            raise VerificationError(where, f"input {v!r} is neither a Value nor a symbol Var")

    for op in g.ops:
        at = f"{where}: op `{_op_text(op)}`"
        if op.name not in OPS:
            raise VerificationError(at, f"unknown op {op.name!r}")
        for v in op.operands:
            if id(v) not in defined:
                raise VerificationError(at, f"operand %{v.name} is not defined before use")
        try:
            expected = infer_types(op.name, [v.type for v in op.operands], op.attrs)
        except (ValueError, KeyError, TypeError, IndexError) as e:
            detail = f"missing attribute {e}" if isinstance(e, KeyError) else str(e)
            raise VerificationError(at, f"{detail}") from None
        for r in op.results:
            problem = _size_problem(r.type.shape, f"result %{r.name}")
            if problem is not None:
                raise VerificationError(at, problem)
        actual = [r.type for r in op.results]
        if actual != expected:
            p = Printer()
            raise VerificationError(
                at, f"result types {', '.join(p.tensor_type(t) for t in actual) or 'none'} but "
                f"the op gives {', '.join(p.tensor_type(t) for t in expected) or 'none'}")
        for r in op.results:
            define(r.name, r, "value")

    for v in g.outputs:
        if id(v) not in defined:
            raise VerificationError(where, f"output %{v.name} is not defined")


# --------------------------------------------------------------------------------------------
# Loop level

def _short(e: ex.Expr, limit: int = 200) -> str:
    """`e` as text for a message, cut short when long (an expression can be thousands deep)."""
    text = print_expr(e)
    return text if len(text) <= limit else text[:limit] + "..."


class _Scope:
    """What is visible at one point of a kernel: variables with their types, and buffers."""

    def __init__(self, parent: Optional["_Scope"] = None) -> None:
        self.parent = parent
        self.vars: dict[str, ex.ScalarType] = {}
        self.buffers: dict[str, lp.Buffer] = {}

    def var(self, name: str) -> Optional[ex.ScalarType]:
        s: Optional[_Scope] = self
        while s is not None:
            if name in s.vars:
                return s.vars[name]
            s = s.parent
        return None

    def buffer(self, name: str) -> Optional[lp.Buffer]:
        s: Optional[_Scope] = self
        while s is not None:
            if name in s.buffers:
                return s.buffers[name]
            s = s.parent
        return None


#: An index as `c0 + sum(coef * var)`: the constant and the coefficients by variable name.
Linear = tuple[int, dict[str, int]]


def _linear(e: ex.Expr, forms: dict[str, Linear]) -> Optional[Linear]:
    """`e` as a linear form over the variables in `forms`, or None (anything else)."""
    done: dict[int, Optional[Linear]] = {}
    for node in ex.postorder(e):
        form: Optional[Linear] = None
        if isinstance(node, ex.Const) and isinstance(node.value, int) and not isinstance(node.value, bool):
            form = (node.value, {})
        elif isinstance(node, ex.Var):
            form = forms.get(node.name)
        elif isinstance(node, ex.Binary) and node.op in ("add", "sub", "mul") and node.type == ex.INDEX:
            a, b = done[id(node.a)], done[id(node.b)]
            if a is not None and b is not None:
                if node.op == "mul":
                    if not a[1] or not b[1]:
                        k, other = (a[0], b) if not a[1] else (b[0], a)
                        form = (k * other[0], {n: k * c for n, c in other[1].items()})
                else:
                    sign = 1 if node.op == "add" else -1
                    coefs = dict(a[1])
                    for n, c in b[1].items():
                        coefs[n] = coefs.get(n, 0) + sign * c
                    form = (a[0] + sign * b[0], coefs)
        done[id(node)] = form
    return done[id(e)]


class _KernelVerifier:
    def __init__(self, k: lp.Kernel) -> None:
        self.k = k
        self.where = f"kernel @{k.name}"
        #: Loop variables with constant ranges (and i64 lets linear in them) as linear forms;
        #: their ranges, by loop variable.
        self.forms: dict[str, Linear] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        #: How many enclosing statements may skip an access (an `if`, an empty loop): inside
        #: them the loop ranges do not prove an access is made.
        self.uncertain = 0

    def fail(self, message: str, stmt: Optional[lp.Stmt] = None) -> VerificationError:
        at = ""
        if stmt is not None:
            lines = Printer().stmt(stmt, 0) if not isinstance(stmt, lp.Block) else []
            head = lines[0].strip() if lines else ""
            at = f": in `{head}`" if head else ""
        return VerificationError(f"{self.where}{at}", message)

    # ---- binding -------------------------------------------------------------------------
    def bind(self, scope: _Scope, var: ex.Var, stmt: Optional[lp.Stmt]) -> None:
        if scope.var(var.name) is not None:
            raise self.fail(f"variable {var.name} is bound again while already in scope", stmt)
        scope.vars[var.name] = var.type

    def declare(self, scope: _Scope, b: lp.Buffer, stmt: Optional[lp.Stmt]) -> None:
        if scope.buffer(b.name) is not None:
            raise self.fail(f"buffer %{b.name} is declared again while already in scope", stmt)
        for e in (*b.shape, *b.strides):
            self.index_expr(e, scope, stmt, f"shape or stride of %{b.name}")
        problem = _size_problem(b.shape, f"buffer %{b.name}") or _stride_problem(b.strides, f"buffer %{b.name}")
        if problem is not None:
            raise self.fail(problem, stmt)
        scope.buffers[b.name] = b

    # ---- the kernel --------------------------------------------------------------------------
    def run(self) -> None:
        top = _Scope()
        for s in self.k.symbols:
            if s.type != ex.INDEX:
                raise self.fail(f"symbol {s.name} must be i64, not {s.type}")
            self.bind(top, s, None)
        for b in self.k.params:
            self.declare(top, b, None)
        self.stmt(self.k.body, _Scope(top), in_vector=False)

    def stmt(self, s: lp.Stmt, scope: _Scope, in_vector: bool) -> None:
        if isinstance(s, lp.Block):
            for x in s.stmts:
                self.stmt(x, scope, in_vector)
        elif isinstance(s, lp.Store):
            b = self.buffer(s.buffer, scope, s)
            lanes = self.index(b, s.index, scope, s)
            self.expr(s.value, scope, s)
            if s.value.dtype != b.dtype:
                raise self.fail(f"stores {s.value.type} into %{b.name} of dtype {b.dtype}", s)
            if s.value.lanes != lanes:
                raise self.fail(f"stores a value of {s.value.lanes} lanes at an index of {lanes} lanes", s)
        elif isinstance(s, lp.Let):
            self.expr(s.value, scope, s)
            if s.var.type != s.value.type:
                raise self.fail(f"let {s.var.name} has type {s.var.type} but its value is {s.value.type}", s)
            self.bind(scope, s.var, s)
            form = _linear(s.value, self.forms) if s.value.type == ex.INDEX else None
            if form is None:
                self.forms.pop(s.var.name, None)
            else:
                self.forms[s.var.name] = form
        elif isinstance(s, lp.Alloc):
            if s.buffer.scope != "local":
                raise self.fail(f"alloc %{s.buffer.name} must have local scope", s)
            self.declare(scope, s.buffer, s)
        elif isinstance(s, lp.For):
            self.for_stmt(s, scope, in_vector)
        elif isinstance(s, lp.If):
            self.expr(s.cond, scope, s)
            if s.cond.type != ex.BOOL:
                raise self.fail(f"if condition must be a scalar bool, not {s.cond.type}", s)
            self.uncertain += 1
            self.stmt(s.then, _Scope(scope), in_vector)
            if s.orelse is not None:
                self.stmt(s.orelse, _Scope(scope), in_vector)
            self.uncertain -= 1
        else:
            raise self.fail(f"unknown statement {type(s).__name__}")

    def for_stmt(self, s: lp.For, scope: _Scope, in_vector: bool) -> None:
        if s.kind not in lp.LOOP_KINDS:
            raise self.fail(f"unknown loop kind {s.kind!r}", s)
        for what, e in (("start", s.start), ("extent", s.extent)):
            self.expr(e, scope, s)
            if e.type != ex.INDEX:
                raise self.fail(f"loop {what} must be i64, not {e.type}", s)
        if s.var.type != ex.INDEX:
            raise self.fail(f"loop variable {s.var.name} must be i64, not {s.var.type}", s)
        if in_vector and s.kind in ("parallel", "vectorized"):
            raise self.fail(f"{s.kind} loop inside a vectorized loop", s)
        if s.kind in ("vectorized", "unrolled") and not isinstance(s.extent, ex.Const):
            raise self.fail(f"{s.kind} loop needs a constant extent, not {print_expr(s.extent)}", s)
        inner = _Scope(scope)
        self.bind(inner, s.var, s)
        name = s.var.name
        known = isinstance(s.start, ex.Const) and isinstance(s.extent, ex.Const)
        empty = known and int(s.extent.value) <= 0
        if known and not empty:
            first = int(s.start.value)
            self.forms[name] = (0, {name: 1})
            self.ranges[name] = (first, first + int(s.extent.value) - 1)
        self.uncertain += empty
        try:
            self.stmt(s.body, _Scope(inner), in_vector or s.kind == "vectorized")
        finally:
            self.uncertain -= empty
            self.forms.pop(name, None)
            self.ranges.pop(name, None)

    def check_extent(self, b: lp.Buffer, dim: int, i: ex.Expr, stmt: Optional[lp.Stmt]) -> None:
        """Fail when the loop ranges prove that index `i` of dim `dim` leaves `b` (constant
        loop bounds, an index linear in the loop variables, a constant size)."""
        size = b.shape[dim]
        if self.uncertain or not isinstance(size, ex.Const):
            return
        spread = (0, 0)
        if isinstance(i, ex.Ramp) and isinstance(i.stride, ex.Const):
            step = int(i.stride.value) * (i.lanes - 1)
            spread, i = (min(0, step), max(0, step)), i.base
        elif isinstance(i, ex.Broadcast):
            i = i.value
        form = _linear(i, self.forms)
        if form is None or any(n not in self.ranges for n in form[1]):
            return
        lo = hi = form[0]
        for n, c in form[1].items():
            a, z = self.ranges[n]
            lo += min(c * a, c * z)
            hi += max(c * a, c * z)
        lo, hi = lo + spread[0], hi + spread[1]
        if lo < 0 or hi >= int(size.value):
            raise self.fail(f"index {_short(i)} of %{b.name} (dim {dim}) runs over {lo}..{hi}, "
                            f"past the extent {size.value} of the buffer", stmt)

    # ---- buffers and indices -----------------------------------------------------------------
    def buffer(self, name: str, scope: _Scope, stmt: Optional[lp.Stmt]) -> lp.Buffer:
        b = scope.buffer(name)
        if b is None:
            raise self.fail(f"%{name} is neither a parameter nor an allocation in scope", stmt)
        return b

    def index(self, b: lp.Buffer, index: tuple[ex.Expr, ...], scope: _Scope, stmt: Optional[lp.Stmt],
              visit: bool = True) -> int:
        """Check an index into `b`; returns its lanes (1, or the lanes of its vector parts)."""
        if len(index) != b.ndim:
            raise self.fail(f"%{b.name} has {b.ndim} dims but is indexed with {len(index)}", stmt)
        lanes = 1
        for dim, i in enumerate(index):
            if visit:
                self.expr(i, scope, stmt)
            if not i.dtype.is_int:
                raise self.fail(f"index {_short(i)} of %{b.name} is {i.type}, not an integer", stmt)
            self.check_extent(b, dim, i, stmt)
            if i.lanes != 1:
                if lanes not in (1, i.lanes):
                    raise self.fail(f"index of %{b.name} mixes vectors of {lanes} and {i.lanes} lanes", stmt)
                lanes = i.lanes
        return lanes

    def index_expr(self, e: ex.Expr, scope: _Scope, stmt: Optional[lp.Stmt], what: str) -> None:
        self.expr(e, scope, stmt)
        if e.type.lanes != 1 or not e.dtype.is_int:
            raise self.fail(f"{what} must be a scalar integer, not {e.type}", stmt)

    # ---- expressions -----------------------------------------------------------------------
    def expr(self, e: ex.Expr, scope: _Scope, stmt: Optional[lp.Stmt]) -> None:
        """Check every node of `e`, operands before the node (post-order without recursion:
        expressions can be thousands deep)."""
        for node in ex.postorder(e):
            expected = self.expected_type(node, scope, stmt)
            if node.type != expected:
                raise self.fail(f"{_short(node)} has type {node.type} but should have {expected}", stmt)

    def expected_type(self, e: ex.Expr, scope: _Scope, stmt: Optional[lp.Stmt]) -> ex.ScalarType:
        """The type the builders give `e`, after checking its operands fit together."""
        def bad(message: str) -> VerificationError:
            return self.fail(f"{_short(e)}: {message}", stmt)

        if isinstance(e, ex.Const):
            if e.lanes != 1:
                raise bad("vector constants are written broadcast(c, lanes)")
            return e.type
        if isinstance(e, ex.Var):
            t = scope.var(e.name)
            if t is None:
                raise self.fail(f"variable {e.name} is not bound here", stmt)
            return t
        if isinstance(e, ex.Binary):
            if e.op not in ex.BINARY_OPS:
                raise bad(f"unknown binary op {e.op!r}")
            if e.a.type != e.b.type:
                raise bad(f"operands of {e.op} differ in type: {e.a.type} vs {e.b.type}")
            if e.op in _BITWISE and not (e.a.dtype.is_int or e.a.dtype.is_bool):
                raise bad(f"{e.op} needs integer or bool operands, not {e.a.type}")
            if e.op in _SHIFTS and not e.a.dtype.is_int:
                raise bad(f"{e.op} needs integer operands, not {e.a.type}")
            return ex.ScalarType(dt.bool_, e.a.lanes) if e.op in ex.COMPARISONS else e.a.type
        if isinstance(e, ex.Call):
            if e.name in _RESERVED_CALLS or e.name.startswith("vreduce_"):
                raise bad(f"{e.name} must be its own node, not a Call")
            if not e.args:
                raise bad("a call needs at least one argument")
            if e.name in ex.DOT4_CALLS:
                return self.dot4_type(e, bad)
            if e.name in ex.TILE_DOT_CALLS:
                return self.tile_dot_type(e, bad)
            if e.name in ex.UNARY_FUNCS and len(e.args) != 1:
                raise bad(f"{e.name} takes one argument, got {len(e.args)}")
            if any(a.type != e.args[0].type for a in e.args):
                raise bad("arguments differ in type")
            t = e.args[0].type
            return ex.ScalarType(dt.bool_, t.lanes) if e.name in _PREDICATES else t
        if isinstance(e, ex.Cast):
            return ex.ScalarType(e.type.dtype, e.value.lanes)
        if isinstance(e, ex.Bitcast):
            if e.type.lanes != e.value.lanes:
                if e.type.lanes * e.type.dtype.bits != e.value.lanes * e.value.dtype.bits:
                    raise bad(f"bitcast from {e.value.type} to {e.type} changes the total width")
                if e.type.dtype.is_bool or e.value.dtype.is_bool:
                    raise bad(f"bitcast from {e.value.type} to {e.type}: bools cannot change lanes")
                return e.type
            if e.type.dtype.bits != e.value.dtype.bits:
                raise bad(f"bitcast between {e.value.dtype} and {e.type.dtype} of different widths")
            return ex.ScalarType(e.type.dtype, e.value.lanes)
        if isinstance(e, ex.Select):
            if e.cond.dtype != dt.bool_:
                raise bad(f"select condition must be bool, not {e.cond.type}")
            if e.a.type != e.b.type:
                raise bad(f"select operands differ in type: {e.a.type} vs {e.b.type}")
            if e.cond.lanes != e.a.lanes:
                raise bad(f"select condition has {e.cond.lanes} lanes but operands {e.a.lanes}")
            return e.a.type
        if isinstance(e, ex.Load):
            b = scope.buffer(e.buffer)
            if b is None:
                raise bad(f"%{e.buffer} is neither a parameter nor an allocation in scope")
            # The index expressions were visited as children already.
            lanes = self.index(b, e.index, scope, stmt, visit=False)
            return ex.ScalarType(b.dtype, lanes)
        if isinstance(e, ex.Ramp):
            if e.base.lanes != 1 or e.base.type != e.stride.type:
                raise bad(f"ramp base and stride must be scalars of one type, not {e.base.type} and {e.stride.type}")
            if e.lanes < 2:
                raise bad("a ramp needs at least 2 lanes")
            return ex.ScalarType(e.base.dtype, e.lanes)
        if isinstance(e, ex.Broadcast):
            if e.value.lanes != 1:
                raise bad(f"broadcast of a vector ({e.value.type})")
            if e.lanes < 1:
                raise bad("a broadcast needs at least 1 lane")
            return ex.ScalarType(e.value.dtype, e.lanes)
        if isinstance(e, ex.VectorReduce):
            if e.op not in VECTOR_REDUCE_OPS:
                raise bad(f"unknown vector reduction {e.op!r}")
            if e.value.lanes < 2:
                raise bad("vector reduction of a scalar")
            return ex.ScalarType(e.value.dtype)
        raise bad(f"unknown expression node {type(e).__name__}")

    @staticmethod
    def dot4_type(e: ex.Call, bad: Callable[[str], VerificationError]) -> ex.ScalarType:
        """`dot4_u8i8_acc(acc: i32 x L, a: u8 x 4L, b: i8 x 4L)` (`dot4_i8i8_acc`: `a: i8 x 4L`)
        gives `i32 x L` (see `Call`)."""
        if len(e.args) != 3:
            raise bad(f"{e.name} takes 3 arguments, got {len(e.args)}")
        acc, a, b = (arg.type for arg in e.args)
        a_dtype = dt.u8 if e.name == ex.DOT4_U8I8 else dt.i8
        if acc.dtype != dt.i32 or a.dtype != a_dtype or b.dtype != dt.i8 or a.lanes != 4 * acc.lanes \
                or b.lanes != a.lanes:
            raise bad(f"{e.name} needs i32 x L, {a_dtype} x 4L and i8 x 4L, not {acc}, {a} and {b}")
        return acc

    @staticmethod
    def tile_dot_type(e: ex.Call, bad: Callable[[str], VerificationError]) -> ex.ScalarType:
        """`tile_dot_u8i8(acc: i32 x 256, a: u8 x 16K, b: i8 x 16K)` (`tile_dot_i8i8`: `a: i8 x
        16K`), K a multiple of 4 up to 64, gives `i32 x 256` (see `Call`)."""
        if len(e.args) != 3:
            raise bad(f"{e.name} takes 3 arguments, got {len(e.args)}")
        acc, a, b = (arg.type for arg in e.args)
        a_dtype = dt.u8 if e.name == ex.TILE_DOT_U8I8 else dt.i8
        rows = ex.TILE_ROWS
        k = a.lanes // rows
        if acc.dtype != dt.i32 or acc.lanes != rows * rows or a.dtype != a_dtype or b.dtype != dt.i8 \
                or a.lanes != rows * k or b.lanes != a.lanes or k % 4 or not 4 <= k <= 64:
            raise bad(f"{e.name} needs i32 x {rows * rows}, {a_dtype} x {rows}K and i8 x {rows}K "
                      f"(K a multiple of 4 up to 64), not {acc}, {a} and {b}")
        return acc


def verify_kernel(k: lp.Kernel) -> None:
    depth = lp.nesting_depth(k.body)
    if depth > lp.MAX_NESTING:
        raise VerificationError(f"kernel @{k.name}", f"statements nest {depth} deep, more than the "
                                f"{lp.MAX_NESTING} the compiler supports (loop.MAX_NESTING)")
    _KernelVerifier(k).run()


# --------------------------------------------------------------------------------------------
# Program

def _unique(names: Iterable[str], where: str, what: str) -> None:
    seen: set[str] = set()
    for n in names:
        if n in seen:
            raise VerificationError(where, f"{what} {n} is declared twice")
        seen.add(n)


def _check_result_view(b: lp.Buffer, shape: tuple[ex.Expr, ...], symbols: set[str], where: str) -> None:
    """A result returned viewed in `shape` (`Program.result_views`): its buffer is contiguous
    and holds as many elements as `shape` (compared where the sizes are constants, else at two
    sets of symbol values: equal products of sizes agree at both)."""
    if tuple(b.strides) != lp.contiguous_strides(tuple(b.shape)):
        raise VerificationError(where, f"result %{b.name} is returned as a view but is not contiguous")
    for base in (3, 7):
        env = {n: base + 2 * i for i, n in enumerate(sorted(symbols))}
        have = math.prod(ex.evaluate_index(d, env) for d in b.shape)
        want = math.prod(ex.evaluate_index(d, env) for d in shape)
        if have != want:
            raise VerificationError(where, f"result %{b.name} holds {have} elements but its view "
                                    f"[{', '.join(map(str, shape))}] {want}" + (" (at symbols " + str(env) + ")"
                                                                               if env else ""))


def verify_program(p: lp.Program, planned: bool = False) -> None:
    where = f"program @{p.name}"
    buffers = (*p.inputs, *p.outputs, *p.temps)
    _unique((f"%{b.name}" for b in buffers), where, "buffer")
    _unique((v.name for v in p.symbols), where, "symbol")
    _unique((f"@{k.name}" for k in p.kernels), where, "kernel")
    symbols = {v.name for v in p.symbols}
    for v in p.symbols:
        if v.type != ex.INDEX:
            raise VerificationError(where, f"symbol {v.name} must be i64, not {v.type}")

    def symbolic(e: ex.Expr, what: str) -> None:
        if e.type != ex.INDEX:
            raise VerificationError(where, f"{what} must be an i64 expression, not {e.type}")
        for n in ex.walk(e):
            if isinstance(n, ex.Var) and n.name not in symbols:
                raise VerificationError(where, f"{what} uses {n.name}, which is not a program symbol")
            if isinstance(n, ex.Load):
                raise VerificationError(where, f"{what} reads a buffer")

    for b in buffers:
        if b.scope != "global":
            raise VerificationError(where, f"buffer %{b.name} must have global scope")
        for d in (*b.shape, *b.strides):
            symbolic(d, f"shape or stride of %{b.name}")
        problem = _size_problem(b.shape, f"buffer %{b.name}") or _stride_problem(b.strides, f"buffer %{b.name}")
        if problem is not None:
            raise VerificationError(where, problem)

    returnable = {b.name for b in (*p.inputs, *p.outputs)}
    for r in p.results:
        if r not in returnable:
            raise VerificationError(where, f"returns %{r}, which is not an input or output buffer")
    _unique((f"result {k}" for k, _ in p.result_views), where, "view of")
    for k, shape in p.result_views:
        if not 0 <= k < len(p.results):
            raise VerificationError(where, f"a view of result {k}, but it returns {len(p.results)} values")
        for d in shape:
            symbolic(d, f"view shape of result {k}")
        _check_result_view(p.buffer(p.results[k]), shape, symbols, where)

    temp_names = {t.name for t in p.temps}
    _unique((f"%{n}" for n, _ in p.temp_offsets), where, "offset of")
    for name, off in p.temp_offsets:
        if name not in temp_names:
            raise VerificationError(where, f"offset given for %{name}, which is not a temporary")
        symbolic(off, f"offset of %{name}")
    offsets = dict(p.temp_offsets)
    if planned or offsets:
        for t in p.temps:
            if t.name not in offsets:
                raise VerificationError(where, f"temporary %{t.name} has no workspace offset")
    symbolic(p.workspace_bytes, "workspace size")
    input_names = {b.name for b in p.inputs}
    for name in p.constant_inputs:
        if name not in input_names:
            raise VerificationError(where, f"constant %{name} is not an input buffer")
    for name in p.kept:
        if name not in temp_names:
            raise VerificationError(where, f"kept %{name} is not a temporary")
        if offsets and not isinstance(offsets.get(name), ex.Const):
            raise VerificationError(where, f"kept %{name} needs a constant workspace offset")
    for name in p.kept_from:
        if name not in p.constant_inputs:
            raise VerificationError(where, f"kept temporaries are computed from %{name}, which is not a constant input")
    if p.kept and lp.REFRESH not in symbols:
        raise VerificationError(where, f"kept temporaries but no symbol {lp.REFRESH}")

    kernels = {k.name: k for k in p.kernels}
    for k in p.kernels:
        verify_kernel(k)
        for s in k.symbols:
            if s.name not in symbols:
                raise VerificationError(where, f"kernel @{k.name} uses symbol {s.name}, "
                                        "which is not a program symbol")

    by_name = {b.name: b for b in buffers}
    for c in p.calls:
        at = f"{where}: call @{c.kernel}"
        k = kernels.get(c.kernel)
        if k is None:
            raise VerificationError(at, f"no kernel @{c.kernel} in the program")
        if len(c.args) != len(k.params):
            raise VerificationError(at, f"{len(c.args)} arguments for {len(k.params)} parameters")
        if c.offsets and len(c.offsets) != len(c.args):
            raise VerificationError(at, f"{len(c.offsets)} offsets for {len(c.args)} arguments")
        for i, off in enumerate(c.offsets):
            if off is not None:
                symbolic(off, f"offset of argument {i}")
        for a, param in zip(c.args, k.params):
            b = by_name.get(a)
            if b is None:
                raise VerificationError(at, f"argument %{a} is not a buffer of the program")
            if b.dtype != param.dtype:
                raise VerificationError(at, f"argument %{a} is {b.dtype} but parameter "
                                        f"%{param.name} is {param.dtype}")
            if b.ndim != param.ndim:
                raise VerificationError(at, f"argument %{a} has rank {b.ndim} but parameter "
                                        f"%{param.name} has rank {param.ndim}")
