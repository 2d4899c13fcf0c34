"""Hypothesis strategies for well-formed IR at both levels, and consistent renaming.

Every generated IR is meant to pass the verifier and to round-trip through the printer and
parser, so nodes are built with exactly the types the parser infers (never through the
folding helpers, which would hide unfolded forms such as `1 + 2`). Names are fresh per kernel,
program or graph, so no variable is ever rebound.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Optional

from hypothesis import strategies as st

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir import ops
from torchburn.ir.tensor import Graph, Op, TensorType, Value
from torchburn.ir.transform import ExprMutator

LANES = (2, 4, 8)
FLOATS = (dt.f16, dt.bf16, dt.f32, dt.f64)
INTS = (dt.i8, dt.i16, dt.i32, dt.i64, dt.u8)
VALUE_DTYPES = FLOATS + INTS + (dt.bool_,)
BITCAST_PARTNERS = {dt.f32: dt.i32, dt.i32: dt.f32, dt.f64: dt.i64, dt.i64: dt.f64,
                    dt.f16: dt.i16, dt.bf16: dt.i16, dt.i16: dt.f16, dt.i8: dt.u8, dt.u8: dt.i8}
FLOAT_BINARY = ("add", "sub", "mul", "div", "min", "max", "pow", "atan2", "fmod", "copysign", "hypot")
INT_BINARY = ("add", "sub", "mul", "div", "floordiv", "mod", "min", "max", "and", "or", "xor", "shl", "shr")
BOOL_BINARY = ("and", "or", "xor", "eq", "ne")
COMPARISONS = tuple(sorted(ex.COMPARISONS))
FLOAT_UNARY = ("exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "neg", "abs", "floor", "erf", "sin")
INT_UNARY = ("neg", "abs", "sign")
PREDICATES = ("isnan", "isinf", "isfinite", "signbit")


class Names:
    """Fresh names (`t0`, `i1`, ...) for one generated IR object."""

    def __init__(self) -> None:
        self._count = itertools.count()

    def fresh(self, prefix: str) -> str:
        return f"{prefix}{next(self._count)}"


@dataclass
class Env:
    """What generated code may reference: bound variables and visible buffers."""

    names: Names
    vars: dict[str, ex.ScalarType] = field(default_factory=dict)
    buffers: dict[str, lp.Buffer] = field(default_factory=dict)

    def child(self) -> "Env":
        return Env(self.names, dict(self.vars), dict(self.buffers))


# --------------------------------------------------------------------------------------------
# Expressions

def _const(draw: Any, dtype: dt.DType) -> ex.Const:
    if dtype.is_bool:
        v: Any = draw(st.booleans())
    elif dtype.is_float:
        v = draw(st.floats(allow_nan=True, allow_infinity=True))
    elif dtype == dt.u8:
        v = draw(st.integers(0, 255))
    elif dtype == dt.index:
        v = draw(st.integers(-4, 64) | st.integers(-(2 ** 63), 2 ** 63 - 1))
    else:
        v = draw(st.integers(-(2 ** (dtype.bits - 1)), 2 ** (dtype.bits - 1) - 1))
    return ex.Const(v, ex.ScalarType(dtype))


def _binary(op: str, a: ex.Expr, b: ex.Expr) -> ex.Binary:
    t = ex.ScalarType(dt.bool_, a.lanes) if op in ex.COMPARISONS else a.type
    return ex.Binary(op, a, b, t)


def gen_expr(draw: Any, t: ex.ScalarType, env: Env, depth: int) -> ex.Expr:
    """An expression of exactly type `t` over `env`; `depth` bounds the nesting."""
    d = t.dtype
    vector = t.lanes > 1
    choices = ["const"]
    if any(vt == t for vt in env.vars.values()):
        choices += ["var", "var"]
    if vector and not d.is_bool:
        choices.append("ramp")
    if depth > 0:
        if any(b.dtype == d and (b.ndim >= 1 or not vector) for b in env.buffers.values()):
            choices += ["load", "load"]
        choices += ["binary", "binary", "select", "cast"]
        if d.is_bool:
            choices += ["compare", "compare", "pred"]
        else:
            choices += ["unary", "named"]
        if d in BITCAST_PARTNERS:
            choices.append("bitcast")
        if d.is_float:
            choices.append("fma")
        if vector:
            choices.append("broadcast")
        else:
            choices.append("vreduce")
    kind = draw(st.sampled_from(choices))
    sub = depth - 1

    if kind == "const":
        c = _const(draw, d)
        return c if not vector else ex.Broadcast(c, t)
    if kind == "var":
        name = draw(st.sampled_from(sorted(n for n, vt in env.vars.items() if vt == t)))
        return ex.Var(name, t)
    if kind == "ramp":
        base = gen_expr(draw, ex.ScalarType(d), env, max(sub, 0))
        stride = gen_expr(draw, ex.ScalarType(d), env, max(sub, 0))
        return ex.Ramp(base, stride, t)
    if kind == "load":
        bufs = sorted((b for b in env.buffers.values() if b.dtype == d and (b.ndim >= 1 or not vector)),
                      key=lambda b: b.name)
        b = draw(st.sampled_from(bufs))
        return ex.Load(b.name, gen_index(draw, b, t.lanes, env, sub), t)
    if kind == "binary":
        ops_ = BOOL_BINARY if d.is_bool else FLOAT_BINARY if d.is_float else INT_BINARY
        op = draw(st.sampled_from(ops_))
        return _binary(op, gen_expr(draw, t, env, sub), gen_expr(draw, t, env, sub))
    if kind == "compare":
        od = draw(st.sampled_from(VALUE_DTYPES))
        ot = ex.ScalarType(od, t.lanes)
        op = draw(st.sampled_from(COMPARISONS))
        return _binary(op, gen_expr(draw, ot, env, sub), gen_expr(draw, ot, env, sub))
    if kind == "pred":
        if draw(st.booleans()):
            return ex.Call("not", (gen_expr(draw, t, env, sub),), t)
        ft = ex.ScalarType(draw(st.sampled_from(FLOATS)), t.lanes)
        return ex.Call(draw(st.sampled_from(PREDICATES)), (gen_expr(draw, ft, env, sub),), t)
    if kind == "unary":
        name = draw(st.sampled_from(FLOAT_UNARY if d.is_float else INT_UNARY))
        return ex.Call(name, (gen_expr(draw, t, env, sub),), t)
    if kind == "named":
        op = draw(st.sampled_from(("min", "max", "pow")))
        return ex.Binary(op, gen_expr(draw, t, env, sub), gen_expr(draw, t, env, sub), t)
    if kind == "fma":
        return ex.Call("fma", tuple(gen_expr(draw, t, env, sub) for _ in range(3)), t)
    if kind == "select":
        cond = gen_expr(draw, ex.ScalarType(dt.bool_, t.lanes), env, sub)
        return ex.Select(cond, gen_expr(draw, t, env, sub), gen_expr(draw, t, env, sub), t)
    if kind == "cast":
        src = draw(st.sampled_from([x for x in VALUE_DTYPES if x != d]))
        return ex.Cast(gen_expr(draw, ex.ScalarType(src, t.lanes), env, sub), t)
    if kind == "bitcast":
        src = BITCAST_PARTNERS[d]
        return ex.Bitcast(gen_expr(draw, ex.ScalarType(src, t.lanes), env, sub), t)
    if kind == "broadcast":
        return ex.Broadcast(gen_expr(draw, ex.ScalarType(d), env, sub), t)
    if kind == "vreduce":
        lanes = draw(st.sampled_from(LANES))
        ops_ = ["add", "mul", "min", "max"] + (["and", "or"] if d.is_int else [])
        if d.is_bool:
            ops_ = ["and", "or"]
        return ex.VectorReduce(draw(st.sampled_from(ops_)), gen_expr(draw, ex.ScalarType(d, lanes), env, sub), t)
    raise AssertionError(kind)


def gen_index(draw: Any, b: lp.Buffer, lanes: int, env: Env, depth: int) -> tuple[ex.Expr, ...]:
    """Indices into `b`; with `lanes > 1` at least one dimension is a vector of that width."""
    vector_dims: set[int] = set()
    if lanes > 1:
        vector_dims = set(draw(st.lists(st.integers(0, b.ndim - 1), min_size=1, max_size=b.ndim)))
    return tuple(_in_extent(gen_expr(draw, ex.ScalarType(dt.index, lanes if i in vector_dims else 1), env,
                                     max(depth, 0)), b.shape[i])
                 for i in range(b.ndim))


def _in_extent(i: ex.Expr, size: ex.Expr) -> ex.Expr:
    """An index the verifier cannot prove out of range: random index arithmetic modulo a
    constant size (the verifier rejects accesses its loop ranges prove past the extent)."""
    if not isinstance(size, ex.Const):
        return i
    if isinstance(i, ex.Const) and 0 <= i.value < size.value:
        return i
    n = size if i.lanes == 1 else ex.Broadcast(size, i.type)
    return _binary("mod", i, n)


def _scalar_type(draw: Any) -> ex.ScalarType:
    return ex.ScalarType(draw(st.sampled_from(VALUE_DTYPES)), draw(st.sampled_from((1, 1) + LANES)))


def _shape_dim(draw: Any, symbols: list[str]) -> ex.Expr:
    options: list[ex.Expr] = [ex.Const(draw(st.integers(1, 16)))]
    for s in symbols:
        options += [ex.Var(s), _binary("mul", ex.Var(s), ex.Const(draw(st.integers(2, 8))))]
    return draw(st.sampled_from(options))


def gen_buffer(draw: Any, name: str, symbols: list[str], scope: str = "global",
               dtype: Optional[dt.DType] = None, ndim: Optional[int] = None) -> lp.Buffer:
    dtype = dtype or draw(st.sampled_from(VALUE_DTYPES))
    ndim = draw(st.integers(0, 3)) if ndim is None else ndim
    shape = tuple(_shape_dim(draw, symbols) for _ in range(ndim))
    if draw(st.booleans()):
        strides = lp.contiguous_strides(shape)
    else:  # column-major-ish or padded: any symbolic strides are legal
        strides = tuple(_shape_dim(draw, symbols) for _ in range(ndim))
    return lp.Buffer(name, dtype, shape, strides, scope)


@st.composite
def expressions(draw: Any, max_depth: int = 3) -> tuple[ex.Expr, Env]:
    """An expression and the environment (variable types, buffers) it was built over."""
    env = Env(Names())
    for s in ("s0", "s1"):
        env.vars[s] = ex.INDEX
    for _ in range(draw(st.integers(0, 3))):
        env.vars[env.names.fresh("t")] = _scalar_type(draw)
    for _ in range(draw(st.integers(0, 3))):
        b = gen_buffer(draw, env.names.fresh("b"), ["s0", "s1"])
        env.buffers[b.name] = b
    e = gen_expr(draw, _scalar_type(draw), env, draw(st.integers(0, max_depth)))
    return e, env


# --------------------------------------------------------------------------------------------
# Kernels and programs

def gen_block(draw: Any, env: Env, depth: int, in_vector: bool) -> lp.Stmt:
    env = env.child()
    stmts = [gen_stmt(draw, env, depth, in_vector) for _ in range(draw(st.integers(0, 3)))]
    return lp.block(*stmts)


def gen_stmt(draw: Any, env: Env, depth: int, in_vector: bool) -> lp.Stmt:
    """One statement; `let` and `alloc` extend `env` for the statements after it."""
    choices = ["let", "alloc"]
    if env.buffers:
        choices += ["store", "store", "store"]
    if depth > 0:
        choices += ["for", "for", "if"]
    kind = draw(st.sampled_from(choices))
    if kind == "let":
        t = _scalar_type(draw)
        value = gen_expr(draw, t, env, 2)
        var = ex.Var(env.names.fresh("t"), t)
        env.vars[var.name] = t
        return lp.Let(var, value)
    if kind == "alloc":
        index_vars = [n for n, t in env.vars.items() if t == ex.INDEX]
        b = gen_buffer(draw, env.names.fresh("a"), index_vars, scope="local")
        env.buffers[b.name] = b
        return lp.Alloc(b)
    if kind == "store":
        b = env.buffers[draw(st.sampled_from(sorted(env.buffers)))]
        lanes = draw(st.sampled_from((1,) + LANES)) if b.ndim else 1
        index = gen_index(draw, b, lanes, env, 1)
        return lp.Store(b.name, index, gen_expr(draw, ex.ScalarType(b.dtype, lanes), env, 2))
    if kind == "for":
        kinds = ["serial", "unrolled"] if in_vector else list(lp.LOOP_KINDS)
        loop_kind = draw(st.sampled_from(kinds))
        if loop_kind in ("vectorized", "unrolled"):
            extent: ex.Expr = ex.Const(draw(st.sampled_from((1, 4, 8, 16))))
        else:
            extent = gen_expr(draw, ex.INDEX, env, 1)
        start = ex.Const(0) if draw(st.booleans()) else gen_expr(draw, ex.INDEX, env, 1)
        annotations = draw(st.sampled_from([(), (("origin", "aten.add.Tensor"),), (("hint", "tile"),)]))
        var = ex.Var(env.names.fresh("i"))
        inner = env.child()
        inner.vars[var.name] = ex.INDEX
        body = gen_block(draw, inner, depth - 1, in_vector or loop_kind == "vectorized")
        return lp.For(var, start, extent, loop_kind, body, annotations)
    if kind == "if":
        cond = gen_expr(draw, ex.BOOL, env, 2)
        then = gen_block(draw, env, depth - 1, in_vector)
        orelse = gen_block(draw, env, depth - 1, in_vector) if draw(st.booleans()) else None
        return lp.If(cond, then, orelse)
    raise AssertionError(kind)


def gen_kernel(draw: Any, name: str, symbols: list[str], max_depth: int = 3) -> lp.Kernel:
    names = Names()
    env = Env(names)
    syms = draw(st.lists(st.sampled_from(symbols), unique=True)) if symbols else []
    for s in syms:
        env.vars[s] = ex.INDEX
    params = []
    for _ in range(draw(st.integers(1, 3))):
        b = gen_buffer(draw, names.fresh("p"), syms)
        params.append(b)
        env.buffers[b.name] = b
    body = gen_block(draw, env, max_depth, in_vector=False)
    attrs = draw(st.sampled_from([(), (("origin", "aten.mm"),), (("origin", "x"), ("note", "fused"))]))
    return lp.Kernel(name, tuple(params), tuple(ex.Var(s) for s in syms), body, attrs)


@st.composite
def kernels(draw: Any, max_depth: int = 3) -> lp.Kernel:
    """A kernel with nested loops of every kind, lets, allocs, stores, ifs and vectors."""
    return gen_kernel(draw, "k", ["s0", "s1", "s2"], max_depth)


@st.composite
def programs(draw: Any) -> lp.Program:
    """A program whose calls match its kernels' parameters, with planned temporaries."""
    symbols = draw(st.lists(st.sampled_from(["s0", "s1"]), unique=True))
    ks = [gen_kernel(draw, f"k{i}", symbols, max_depth=2) for i in range(draw(st.integers(1, 3)))]
    names = Names()
    pool: list[tuple[str, lp.Buffer]] = []  # (role, buffer)
    for k in ks:
        for p in k.params:
            role = draw(st.sampled_from(["input", "output", "temp"]))
            pool.append((role, gen_buffer(draw, names.fresh("b"), symbols, dtype=p.dtype, ndim=p.ndim)))
    calls = []
    for k in draw(st.permutations(ks)):
        args = []
        for p in k.params:
            fits = [b.name for _, b in pool if b.dtype == p.dtype and b.ndim == p.ndim]
            args.append(draw(st.sampled_from(fits)))
        calls.append(lp.KernelCall(k.name, tuple(args)))
    temps = tuple(b for role, b in pool if role == "temp")
    offsets = []
    for i, t in enumerate(temps):
        off: ex.Expr = ex.Const(64 * i)
        if symbols and draw(st.booleans()):
            off = _binary("mul", ex.Var(symbols[0]), ex.Const(64 * i))
        offsets.append((t.name, off))
    workspace: ex.Expr = ex.Const(0)
    if temps:
        workspace = ex.Const(draw(st.integers(0, 1 << 20)))
        if symbols and draw(st.booleans()):
            workspace = _binary("add", _binary("mul", ex.Var(symbols[-1]), ex.Const(256)), workspace)
    return lp.Program("main", tuple(b for r, b in pool if r == "input"), tuple(b for r, b in pool if r == "output"),
                      temps, tuple(ex.Var(s) for s in symbols), tuple(calls), tuple(ks), tuple(offsets), workspace)


# --------------------------------------------------------------------------------------------
# Tensor graphs

def _attr_values() -> st.SearchStrategy[Any]:
    exprs = st.sampled_from([ex.Var("s0"), _binary("mul", ex.Var("s0"), ex.Const(2)),
                             _binary("sub", ex.Const(-3), ex.Var("s1")), ex.Const(5), ex.Const(-5),
                             ex.Const(3, ex.ScalarType(dt.i32)), ex.Const(True, ex.BOOL),
                             ex.Const(float("nan"), ex.ScalarType(dt.f32)),
                             ex.Binary("min", ex.Var("s0"), ex.Const(8), ex.INDEX)])
    leaves = (st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
              | st.sampled_from(VALUE_DTYPES) | exprs)
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=3).map(tuple), max_leaves=6)


@st.composite
def graphs(draw: Any) -> Graph:
    """A graph built with `Graph.add_op` from the ops in `ops.OPS`, with symbolic dims."""
    symbols = draw(st.lists(st.sampled_from(["s0", "s1"]), unique=True))
    dtypes = (dt.f32, dt.f16, dt.i32, dt.i64, dt.bool_)
    inputs: list[Any] = []
    for i in range(draw(st.integers(1, 3))):
        shape = tuple(_shape_dim(draw, symbols) for _ in range(draw(st.integers(1, 3))))
        strides = draw(st.sampled_from([None, lp.contiguous_strides(shape)]))
        inputs.append(Value(f"x{i}", TensorType(draw(st.sampled_from(dtypes)), shape), strides))
    pool: list[Value] = list(inputs)
    if symbols and draw(st.booleans()):
        inputs += [ex.Var(s) for s in symbols]
    g = Graph(draw(st.sampled_from(["main", "forward"])), inputs)

    def add(name: str, operands: list[Value], attrs: Optional[dict[str, Any]] = None) -> Value:
        attrs = dict(attrs or {})
        if draw(st.integers(0, 4)) == 0:
            attrs["note"] = draw(_attr_values())
        loc = draw(st.none() | st.text(max_size=12))
        op = g.add_op(name, operands, attrs, loc=loc)
        pool.extend(op.results)
        return op.results[0]

    def dims_attr(shape: tuple[ex.Expr, ...]) -> list[Any]:
        # Constant dims as ints (as the importer writes them), the rest as expressions.
        return [int(d.value) if isinstance(d, ex.Const) and draw(st.booleans()) else d for d in shape]

    for _ in range(draw(st.integers(1, 8))):
        v = draw(st.sampled_from(pool))
        r = v.type.rank
        kind = draw(st.sampled_from(["unary", "binary", "where", "cast", "permute", "expand", "reshape",
                                     "slice", "reduce", "arg", "matmul", "full", "iota", "concat"]))
        if kind == "unary":
            add(draw(st.sampled_from(sorted(ex.UNARY_FUNCS))), [v])
        elif kind == "binary":
            other = draw(st.sampled_from([w for w in pool if w.type == v.type]))
            add(draw(st.sampled_from(sorted(ex.BINARY_OPS))), [v, other])
        elif kind == "where":
            add("where", [add("lt", [v, v]), v, v])
        elif kind == "cast":
            add("cast", [v], {"dtype": draw(st.sampled_from(VALUE_DTYPES))})
        elif kind == "permute":
            add("permute", [v], {"dims": draw(st.permutations(range(r)))})
        elif kind == "expand":
            shape = [_shape_dim(draw, symbols)] + [ex.Const(5) if d == ex.Const(1) else d for d in v.shape]
            add("expand", [v], {"shape": dims_attr(tuple(shape))})
        elif kind == "reshape":
            add("reshape", [v], {"shape": dims_attr((ex.Const(1), ops.numel(v.shape)))})
        elif kind == "slice" and r >= 1:
            dim = draw(st.integers(0, r - 1))
            start = draw(st.integers(0, 2))
            if isinstance(v.shape[dim], ex.Const):  # no slice past the end (a negative size)
                start = min(start, int(v.shape[dim].value))
            add("slice", [v], {"dim": dim, "start": start, "end": dims_attr(v.shape)[dim],
                               "step": draw(st.integers(1, 2))})
        elif kind == "reduce" and r >= 1:
            dims = draw(st.lists(st.integers(-r, r - 1), min_size=1, max_size=r, unique_by=lambda d: d % r))
            add(draw(st.sampled_from(ops.REDUCTIONS)), [v], {"dims": dims, "keepdim": draw(st.booleans())})
        elif kind == "arg" and r >= 1:
            add(draw(st.sampled_from(["argmax", "argmin"])), [v],
                {"dim": draw(st.integers(0, r - 1)), "keepdim": draw(st.booleans())})
        elif kind == "matmul" and r >= 2:
            n = _shape_dim(draw, symbols)
            rhs = add("full", [], {"shape": dims_attr((*v.shape[:-2], v.shape[-1], n)), "value": 1.0,
                                   "dtype": v.dtype})
            add("matmul", [v, rhs])
        elif kind == "full":
            shape = tuple(_shape_dim(draw, symbols) for _ in range(draw(st.integers(0, 3))))
            add("full", [], {"shape": dims_attr(shape), "value": draw(st.floats() | st.integers()),
                             "dtype": draw(st.sampled_from(VALUE_DTYPES))})
        elif kind == "iota":
            add("iota", [], {"shape": dims_attr((_shape_dim(draw, symbols),)), "dim": 0,
                             "start": draw(st.integers(-5, 5)), "step": draw(st.integers(1, 3)), "dtype": dt.i64})
        elif kind == "concat" and r >= 1:
            add("concat", [v] * draw(st.integers(1, 3)), {"dim": draw(st.integers(0, r - 1))})
    g.outputs = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=3))
    return g


# --------------------------------------------------------------------------------------------
# Consistent renaming (for hash stability)

class _RenameExpr(ExprMutator):
    def __init__(self, rename: Callable[[str], str]) -> None:
        self.rename = rename

    def visit_Var(self, e: ex.Var) -> ex.Expr:
        return ex.Var(self.rename(e.name), e.type)

    def visit_Load(self, e: ex.Load) -> ex.Expr:
        return ex.Load(self.rename(e.buffer), tuple(self.visit(i) for i in e.index), e.type)


def _rename_buffer(b: lp.Buffer, r: _RenameExpr) -> lp.Buffer:
    return replace(b, name=r.rename(b.name), shape=tuple(r.visit(d) for d in b.shape),
                   strides=tuple(r.visit(d) for d in b.strides))


def _rename_stmt(s: lp.Stmt, r: _RenameExpr) -> lp.Stmt:
    if isinstance(s, lp.Block):
        return lp.Block(tuple(_rename_stmt(x, r) for x in s.stmts))
    if isinstance(s, lp.Store):
        return lp.Store(r.rename(s.buffer), tuple(r.visit(i) for i in s.index), r.visit(s.value))
    if isinstance(s, lp.Let):
        return lp.Let(ex.Var(r.rename(s.var.name), s.var.type), r.visit(s.value))
    if isinstance(s, lp.Alloc):
        return lp.Alloc(_rename_buffer(s.buffer, r))
    if isinstance(s, lp.For):
        return replace(s, var=ex.Var(r.rename(s.var.name), s.var.type), start=r.visit(s.start),
                       extent=r.visit(s.extent), body=_rename_stmt(s.body, r))
    if isinstance(s, lp.If):
        return lp.If(r.visit(s.cond), _rename_stmt(s.then, r),
                     None if s.orelse is None else _rename_stmt(s.orelse, r))
    raise TypeError(type(s).__name__)


def rename_kernel(k: lp.Kernel, rename: Callable[[str], str]) -> lp.Kernel:
    """The same kernel with every name (kernel, buffers, variables) passed through `rename`."""
    r = _RenameExpr(rename)
    return lp.Kernel(rename(k.name), tuple(_rename_buffer(b, r) for b in k.params),
                     tuple(ex.Var(rename(v.name), v.type) for v in k.symbols), _rename_stmt(k.body, r), k.attrs)


def rename_program(p: lp.Program, rename: Callable[[str], str]) -> lp.Program:
    r = _RenameExpr(rename)
    bufs = lambda bs: tuple(_rename_buffer(b, r) for b in bs)  # noqa: E731
    return lp.Program(
        rename(p.name), bufs(p.inputs), bufs(p.outputs), bufs(p.temps),
        tuple(ex.Var(rename(v.name), v.type) for v in p.symbols),
        tuple(lp.KernelCall(rename(c.kernel), tuple(rename(a) for a in c.args)) for c in p.calls),
        tuple(rename_kernel(k, rename) for k in p.kernels),
        tuple((rename(n), r.visit(off)) for n, off in p.temp_offsets), r.visit(p.workspace_bytes))


def rename_graph(g: Graph, rename: Callable[[str], str]) -> Graph:
    """The same graph with values, symbols and the graph's name passed through `rename`."""
    r = _RenameExpr(rename)

    def ttype(t: TensorType) -> TensorType:
        return TensorType(t.dtype, tuple(r.visit(d) for d in t.shape))

    def attr(v: Any) -> Any:
        if isinstance(v, ex.Expr):
            return r.visit(v)
        if isinstance(v, (list, tuple)):
            return type(v)(attr(x) for x in v)
        return v

    new: dict[int, Value] = {}
    inputs: list[Any] = []
    for v in g.inputs:
        if isinstance(v, ex.Var):
            inputs.append(ex.Var(rename(v.name), v.type))
        else:
            nv = Value(rename(v.name), ttype(v.type),
                       None if v.strides is None else tuple(r.visit(d) for d in v.strides))
            new[id(v)] = nv
            inputs.append(nv)
    out = Graph(rename(g.name), inputs)
    for op in g.ops:
        nop = Op(op.name, [new[id(o)] for o in op.operands], {k: attr(v) for k, v in op.attrs.items()}, [], op.loc)
        for res in op.results:
            nv = Value(rename(res.name), ttype(res.type), producer=nop)
            new[id(res)] = nv
            nop.results.append(nv)
        out.ops.append(nop)
    out.outputs = [new[id(v)] for v in g.outputs]
    return out


@st.composite
def renamings(draw: Any) -> Callable[[str], str]:
    """An injective renaming: each name gets a fresh `n<k>` in an arbitrary order."""
    salt = draw(st.integers(0, 10 ** 6))
    table: dict[str, str] = {}

    def rename(name: str) -> str:
        if name not in table:
            table[name] = f"n{salt}_{len(table)}"
        return table[name]

    return rename
