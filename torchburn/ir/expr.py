"""Scalar and vector expressions: the values inside loop nests, and symbolic dimensions.

One small set of immutable node types serves three uses: index arithmetic in loops, the
symbolic sizes and strides of tensors (`s0 * 512`), and the arithmetic a kernel computes.
Nodes are frozen dataclasses, so equality and hashing are structural.

Text form (see `printer.py`): `a + b`, `a // b`, `min(a, b)`, `exp(x)`, `cast<f16>(x)`,
`select(c, a, b)`, `%buf[i, j]`, `ramp(i, 1, 16)`, `broadcast(x, 16)`, `1.5:f32`.

The constructor helpers at the bottom (`add`, `mul`, ...) fold constants and identities, so
shapes such as `s0 * 1 + 0` stay readable as `s0`.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, fields
from typing import Any, Iterator, Union

from . import dtypes as dt
from . import semantics as sem
from .dtypes import DType
from .opnames import (  # noqa: F401  (re-exported: `ex.BINARY_OPS` is the usual spelling)
    BINARY_OPS,
    CHECKED_INDEX,
    COMPARISONS,
    DOT4_CALLS,
    DOT4_I8I8,
    DOT4_U8I8,
    INFIX_OPS,
    NAMED_BINARY_OPS,
    PREDICATES,
    TILE_DOT_CALLS,
    TILE_DOT_I8I8,
    TILE_DOT_U8I8,
    TILE_ROWS,
    UNARY_FUNCS,
)


@dataclass(frozen=True)
class ScalarType:
    """The type of an expression: an element dtype and a vector width (`lanes`, 1 for scalars)."""

    dtype: DType
    lanes: int = 1

    def with_lanes(self, lanes: int) -> "ScalarType":
        return ScalarType(self.dtype, lanes)

    def __str__(self) -> str:
        return str(self.dtype) if self.lanes == 1 else f"{self.dtype}x{self.lanes}"


INDEX = ScalarType(dt.index)
BOOL = ScalarType(dt.bool_)


class Expr:
    """Base of all expression nodes. Every node has a `type`."""

    type: ScalarType

    def children(self) -> tuple["Expr", ...]:
        return ()

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def lanes(self) -> int:
        return self.type.lanes

    # Operator sugar for building index arithmetic in Python.
    def __add__(self, other: "ExprLike") -> "Expr":
        return add(self, other)

    def __radd__(self, other: "ExprLike") -> "Expr":
        return add(other, self)

    def __sub__(self, other: "ExprLike") -> "Expr":
        return sub(self, other)

    def __rsub__(self, other: "ExprLike") -> "Expr":
        return sub(other, self)

    def __mul__(self, other: "ExprLike") -> "Expr":
        return mul(self, other)

    def __rmul__(self, other: "ExprLike") -> "Expr":
        return mul(other, self)

    def __floordiv__(self, other: "ExprLike") -> "Expr":
        return floordiv(self, other)

    def __mod__(self, other: "ExprLike") -> "Expr":
        return mod(self, other)


ExprLike = Union[Expr, int]


@dataclass(frozen=True)
class Const(Expr):
    """A literal. Text: `3` (i64), `3:i32`, `1.5:f32`, `true`, `inf:f32`, `nan:f64`.

    An integer is kept in its dtype's range, wrapped as the IR's integers wrap
    (`Const(200, i8)` is `-56:i8`, `semantics.wrap_int`), so equal values are equal nodes."""

    value: Union[int, float, bool]
    type: ScalarType = INDEX

    def __post_init__(self) -> None:
        d = self.type.dtype
        if d.is_float:
            object.__setattr__(self, "value", float(self.value))
        elif d.is_bool:
            object.__setattr__(self, "value", bool(self.value))
        else:
            object.__setattr__(self, "value", sem.wrap_int(int(self.value), d))

    def __eq__(self, other: object) -> bool:
        # NaN constants compare equal to each other so that IR equality is reflexive; the two
        # zeros of a float type are not equal.
        if not isinstance(other, Const) or other.type != self.type:
            return False
        if isinstance(self.value, float):
            if math.isnan(self.value):
                return isinstance(other.value, float) and math.isnan(other.value)
            if self.value == 0.0:  # -0.0 and 0.0 are different constants (1 / x, min, max, printing)
                return other.value == 0.0 and math.copysign(1.0, self.value) == math.copysign(1.0, other.value)
        return self.value == other.value

    def __hash__(self) -> int:
        v = "nan" if isinstance(self.value, float) and math.isnan(self.value) else self.value
        return hash((Const, v, self.type))


@dataclass(frozen=True)
class Var(Expr):
    """A named scalar: a loop index, a `let` binding or a symbolic dimension. Text: `i0`, `s0`."""

    name: str
    type: ScalarType = INDEX


@dataclass(frozen=True)
class Binary(Expr):
    """A two-operand operation on operands of one type; comparisons give bool.

    `floordiv` and `mod` round toward negative infinity (Python semantics); `div` on integers
    truncates (C semantics) and is only produced by code that knows operands are positive.
    Integers wrap per dtype; every op's exact meaning is `semantics.py`'s.
    """

    op: str
    a: Expr
    b: Expr
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)


@dataclass(frozen=True)
class Call(Expr):
    """A named pure function: unary math (`exp(x)`), `fma(a, b, c)`. Text: `name(args...)`.

    Arguments share one type, which is the result's, with one exception: `dot4_u8i8_acc(acc,
    a, b)` takes `acc: i32 x L`, `a: u8 x 4L`, `b: i8 x 4L` and gives `i32 x L`, lane `i` being
    `acc[i] + sum(i32(a[4i + j]) * i32(b[4i + j]) for j in 0..3)` (wrapping i32 sums; the
    products cannot overflow). It is the byte dot product of quantized kernels: one
    `vpdpbusd` on CPUs with AVX512-VNNI, `pmaddubsw` + `pmaddwd` on other x86 CPUs when `a`
    is known below 128 (codegen/llvm/dot.py), a widening multiply and pairwise adds elsewhere.
    The `qlinear` kernel with int8 activations replaces the f32 lane-wise products

        let %wv = fma(cast<f32>(%q[n, ramp(c, 1, 16)] & broadcast(15, 16)), %dv, %mv)
        %acc[ramp(0, 1, 16)] = fma(%wv, %x[i, ramp(k, 1, 16)], %acc[ramp(0, 1, 16)])

    by integer dot products on x quantized to i8 (scales applied once per group):

        let %lo = %q[n, ramp(c, 1, 32)] & broadcast(15, 32)
        %iacc[ramp(0, 1, 8)] = dot4_u8i8_acc(%iacc[ramp(0, 1, 8)], %lo, %xq[i, ramp(k, 1, 32)])

    `dot4_i8i8_acc(acc, a, b)` is the same with `a: i8 x 4L` (signed bytes by signed bytes:
    an int8 weight by int8 activations); without VNNI it is `pabsb`, `psignb`, `pmaddubsw`,
    `pmaddwd` when one operand is known above -128 (`|a| * sign(b, a)`: no pair sum saturates).

    `tile_dot_u8i8(acc, a, b)` is a 16 x 16 byte matrix product: `acc: i32 x 256` (row-major
    16 x 16), `a: u8 x 16K` (16 rows of K bytes, row-major; K a multiple of 4, at most 64),
    `b: i8 x 16K` (K / 4 rows of 64 bytes: the four bytes of k = 4q .. 4q + 3 of column j at
    `64 q + 4 j`, AMX's "VNNI" layout) give `i32 x 256`:

        result[16 i + j] = acc[16 i + j] + sum(a[K i + k] * b[64 (k // 4) + 4 j + k % 4] for k < K)

    (exact products, wrapping i32 sums). With AMX-INT8 it is one `tdpbusd` on tiles loaded
    from the operands' memory (`codegen/llvm/tiles.py`); elsewhere sixteen rows of K / 4
    `dot4_u8i8_acc`. `tile_dot_i8i8` takes `a: i8 x 16K` (`tdpbssd`). The many-row `qlinear`
    kernel's tile form (`passes/quant/qlinear_tiles.py`) multiplies a group of 16 weight rows
    by 16 rows of quantized x with it:

        let %c = tile_dot_u8i8(broadcast(0, 256), %wt[ramp(0, 1, 512)], %xv[g, ramp(0, 1, 512)])
    """

    name: str
    args: tuple[Expr, ...]
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True)
class Cast(Expr):
    """Value conversion to another dtype (float->int truncates). Text: `cast<f16>(x)`."""

    value: Expr
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return (self.value,)


@dataclass(frozen=True)
class Bitcast(Expr):
    """Reinterpret the bits as another dtype of the same width. Text: `bitcast<i32>(x)`.

    The lane count may change when the total width does not (`lanes * bits` equal): the
    bytes in memory order, lane 0 lowest, as on every target we emit for (little-endian).
    Text: `bitcast<u8, 64>(%panel[k, ramp(c, 1, 16)])` reads sixteen i32 lanes as 64 bytes:

        let %w = bitcast<u8, 64>(%panel[k, ramp(0, 1, 16)])          u8 x 64
        let %xb = bitcast<i8, 64>(broadcast(%xq4[r, k], 16))          four bytes of x, 16 times
        %acc[ramp(0, 1, 16)] = dot4_u8i8_acc(%acc[ramp(0, 1, 16)], %w, %xb)
    """

    value: Expr
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return (self.value,)


@dataclass(frozen=True)
class Select(Expr):
    """`cond ? a : b`, lane-wise for vectors; both sides are evaluated. Text: `select(c, a, b)`."""

    cond: Expr
    a: Expr
    b: Expr
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.a, self.b)


@dataclass(frozen=True)
class Load(Expr):
    """Read `buffer[index...]`; the buffer's strides turn the index into an address.

    A vector load has a vector index (for example a `ramp`) in some dimension. Text: `%x[i, j]`.
    """

    buffer: str
    index: tuple[Expr, ...]
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return self.index


@dataclass(frozen=True)
class Ramp(Expr):
    """The vector `base, base+stride, ..., base+(lanes-1)*stride`. Text: `ramp(i, 1, 16)`."""

    base: Expr
    stride: Expr
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return (self.base, self.stride)


@dataclass(frozen=True)
class Broadcast(Expr):
    """A scalar repeated in every lane. Text: `broadcast(x, 16)`."""

    value: Expr
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return (self.value,)


@dataclass(frozen=True)
class VectorReduce(Expr):
    """Combine the lanes of a vector into a scalar (`add`, `mul`, `min`, `max`, `and`, `or`).

    Float `add` and `mul` combine the lanes as a halving tree when their count is a power of
    two (lane i with lane i + n/2, then the same on the first half, down to one lane), the
    order LLVM's reassociable `llvm.vector.reduce` takes on every SIMD target: a vectorized
    reduction has already reassociated the sum, and the tree is what the hardware does fast.
    Other lane counts, and the other ops, fold from the first lane to the last.

    Text: `vreduce_add(v)`.
    """

    op: str
    value: Expr
    type: ScalarType

    def children(self) -> tuple[Expr, ...]:
        return (self.value,)


#: The field-wise hash `dataclass` generated for each node class (see `_remember_hash`).
_FIELD_HASH: dict[type, object] = {}
_FIELDS: dict[type, tuple[str, ...]] = {}


def _hash_subtree(root: "Expr") -> None:
    """Remember the hash of every node under `root`, children first, with an explicit stack:
    the field-wise hash of a node then finds its children's hashes remembered, so hashing a
    tree 20,000 deep never recurses."""
    stack: list[tuple[Expr, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if "_hash" in node.__dict__:
            continue
        if children_done:
            object.__setattr__(node, "_hash", _FIELD_HASH[type(node)](node))  # type: ignore[operator]
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in node.children() if type(k) in _FIELD_HASH)


def _remember_hash(cls: type) -> None:
    """Give `cls` a hash computed once per node: a frozen dataclass hashes all of its fields
    on every call, so hashing a tree costs its size, and passes that keep expressions in
    dicts (memo tables, CSE) would pay that at every level of every tree."""
    _FIELD_HASH[cls] = cls.__hash__

    def __hash__(self: Expr) -> int:
        try:
            return self.__dict__["_hash"]  # type: ignore[no-any-return]
        except KeyError:
            _hash_subtree(self)
            return self.__dict__["_hash"]  # type: ignore[no-any-return]

    cls.__hash__ = __hash__  # type: ignore[method-assign]


def _fields_equal(x: object, y: object, pending: list[tuple["Expr", "Expr"]]) -> bool:
    """Compare one field of two nodes; expression operands are queued on `pending`."""
    if isinstance(x, Expr) and isinstance(y, Expr):
        pending.append((x, y))
        return True
    if isinstance(x, tuple) and isinstance(y, tuple):
        return len(x) == len(y) and all(_fields_equal(a, b, pending) for a, b in zip(x, y))
    return bool(x == y)


def _structural_eq(self: "Expr", other: object) -> bool:
    """Field-wise equality, as `dataclass` defines it, walked with an explicit stack (the
    generated `__eq__` recurses once per level of the tree)."""
    if other.__class__ is not self.__class__:
        return NotImplemented  # type: ignore[return-value]
    pending: list[tuple[Expr, Expr]] = [(self, other)]  # type: ignore[list-item]
    while pending:
        a, b = pending.pop()
        if a is b:
            continue
        cls = a.__class__
        if cls is not b.__class__:
            return False
        names = _FIELDS.get(cls)
        if names is None:  # a leaf with its own equality (Const)
            if not a == b:
                return False
            continue
        ha, hb = a.__dict__.get("_hash"), b.__dict__.get("_hash")
        if ha is not None and hb is not None and ha != hb:
            return False
        for name in names:
            if not _fields_equal(getattr(a, name), getattr(b, name), pending):
                return False
    return True


for _cls in (Var, Binary, Call, Cast, Bitcast, Select, Load, Ramp, Broadcast, VectorReduce):
    _remember_hash(_cls)
    _FIELDS[_cls] = tuple(f.name for f in fields(_cls))
    _cls.__eq__ = _structural_eq  # type: ignore[method-assign,assignment]
del _cls  # not part of the module's surface (tools/gen_ir_docs.py documents what it finds)


# --------------------------------------------------------------------------------------------
# Construction helpers with constant folding (index arithmetic stays readable).

def as_expr(x: Union[Expr, int, float, bool], dtype: DType = dt.index) -> Expr:
    """Wrap a Python number as a constant of `dtype`; pass expressions through."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool) and dtype == dt.index:
        return Const(x, BOOL)
    return Const(x, ScalarType(dtype))


def const(value: Union[int, float, bool], dtype: DType, lanes: int = 1) -> Expr:
    c = Const(value, ScalarType(dtype))
    return c if lanes == 1 else Broadcast(c, ScalarType(dtype, lanes))


def _int_const(e: Expr) -> int | None:
    if isinstance(e, Const) and e.type.dtype.is_int and e.type.lanes == 1:
        return int(e.value)
    return None


#: The integer ops `binary` folds when both operands are constants (the index arithmetic of
#: shapes); the values are `semantics.evaluate`'s (wrapping per dtype, floor rounding).
FOLDED_INT_OPS: frozenset[str] = sem.FOLD_INT_OPS


def _fold_int(op: str, a: int, b: int, dtype: DType) -> int | None:
    """`a op b` on integers of `dtype`, or None where it does not fold (division by zero)."""
    if op not in FOLDED_INT_OPS:
        return None
    try:
        return sem.fold_int(op, dtype, a, b)
    except sem.DivisionByZero:
        return None


def binary(op: str, a: ExprLike, b: ExprLike) -> Expr:
    """Build `a op b`, folding integer constants (`semantics.evaluate`: `100:i8 + 100:i8` is
    `-56:i8`) and the identities x+0, x*1, x*0, x//1, x%1, (x+y)-x."""
    a, b = as_expr(a), as_expr(b)
    if op not in BINARY_OPS:
        raise ValueError(f"unknown binary op {op!r}")
    ta = a.type if a.type.lanes >= b.type.lanes else b.type
    ca, cb = _int_const(a), _int_const(b)
    if ca is not None and cb is not None and a.type == b.type:
        folded = _fold_int(op, ca, cb, ta.dtype)
        if folded is not None:
            return Const(folded, ta)
    if ta.dtype.is_int and ta == b.type:
        if op == "add":
            if ca == 0:
                return b
            if cb == 0:
                return a
        elif op == "sub" and cb == 0:
            return a
        elif op == "sub" and isinstance(a, Binary) and a.op == "add" and a.type == ta:
            # (x + y) - x: a slice's length after a segment of symbolic length
            if a.a == b:
                return a.b
            if a.b == b:
                return a.a
        elif op == "mul":
            if ca == 1:
                return b
            if cb == 1:
                return a
            if ca == 0 or cb == 0:
                return Const(0, ta)
        elif op == "floordiv" and cb == 1:
            return a
        elif op == "mod" and cb == 1:
            return Const(0, ta)
    rtype = ScalarType(dt.bool_, ta.lanes) if op in COMPARISONS else ta
    return Binary(op, a, b, rtype)


def add(a: ExprLike, b: ExprLike) -> Expr:
    return binary("add", a, b)


def sub(a: ExprLike, b: ExprLike) -> Expr:
    return binary("sub", a, b)


def mul(a: ExprLike, b: ExprLike) -> Expr:
    return binary("mul", a, b)


def floordiv(a: ExprLike, b: ExprLike) -> Expr:
    return binary("floordiv", a, b)


def mod(a: ExprLike, b: ExprLike) -> Expr:
    return binary("mod", a, b)


def minimum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("min", a, b)


def maximum(a: ExprLike, b: ExprLike) -> Expr:
    return binary("max", a, b)


def checked_index(i: ExprLike, n: ExprLike) -> Expr:
    """`checked_index(i, n)`: the index `i` where `0 <= i < n`, else 0 and a fault (an index
    read from a tensor that eager would refuse; `opnames.CHECKED_INDEX`):

        let t = checked_index(%idx[j], 50257)      ; 50257 -> 0 and a fault; the launcher
                                                   ; runs the call in PyTorch, which raises
    """
    a, b = as_expr(i), as_expr(n)
    return Call(CHECKED_INDEX, (a, b), a.type)


def call(name: str, *args: Expr, type: ScalarType | None = None) -> Expr:
    """Build a function call; unary math keeps its argument's type, predicates give bool."""
    if type is None:
        t = args[0].type
        type = ScalarType(dt.bool_, t.lanes) if name in PREDICATES else t
    return Call(name, tuple(args), type)


def cast(value: Expr, dtype: DType) -> Expr:
    """Convert `value` to `dtype`; a no-op cast disappears and constants fold
    (`semantics.cast_value`), except float -> integer, whose out-of-range values targets
    disagree on."""
    if value.type.dtype == dtype:
        return value
    target = ScalarType(dtype, value.type.lanes)
    if isinstance(value, Const) and value.type.lanes == 1:
        if not (value.type.dtype.is_float and dtype.is_int):
            return Const(sem.cast_value(value.value, value.type.dtype, dtype), target)
    return Cast(value, target)


def select(cond: Expr, a: Expr, b: Expr) -> Expr:
    if isinstance(cond, Const):
        return a if cond.value else b
    return Select(cond, a, b, a.type)


def walk(e: Expr) -> Iterator[Expr]:
    """Every node of an expression tree, parents before children."""
    stack = [e]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(reversed(node.children()))


def postorder(e: Expr) -> Iterator[Expr]:
    """Every node of an expression tree, children (left to right) before their parent: the
    order a recursive evaluator meets them, without the recursion (trees can be deep)."""
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        node, children_done = stack.pop()
        if children_done:
            yield node
            continue
        stack.append((node, True))
        stack.extend((k, False) for k in reversed(node.children()))


def free_vars(e: Expr) -> set[str]:
    """Names of the variables an expression reads (a fresh set the caller may change)."""
    return set(_free_names(e))


_NO_NAMES: frozenset[str] = frozenset()


def _free_names(e: Expr) -> frozenset[str]:
    """`free_vars`, remembered on each node: passes ask it of the same subtrees again and
    again, and expressions are immutable. Post-order without recursion (trees can be deep)."""
    done = e.__dict__.get("_free")
    if done is not None:
        return done  # type: ignore[no-any-return]
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        node, children_done = stack.pop()
        if "_free" in node.__dict__:
            continue
        kids = node.children()
        if kids and not children_done:
            stack.append((node, True))
            stack.extend((k, False) for k in kids)
            continue
        if isinstance(node, Var):
            names = frozenset((node.name,))
        else:
            names = _NO_NAMES.union(*(k.__dict__["_free"] for k in kids)) if kids else _NO_NAMES
        object.__setattr__(node, "_free", names)
    return e.__dict__["_free"]  # type: ignore[no-any-return]


def substitute(e: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace variables by expressions (capture cannot happen: expressions bind nothing).
    Unchanged subtrees are returned as they are (shared), as `transform.ExprMutator` does;
    post-order without recursion (trees can be deep)."""
    done: dict[int, Expr] = {}
    for node in postorder(e):
        if id(node) in done:
            continue
        if isinstance(node, Var):
            done[id(node)] = mapping.get(node.name, node)
            continue
        changes: dict[str, Any] = {}
        for f in dataclasses.fields(node):  # type: ignore[arg-type]
            v = getattr(node, f.name)
            if isinstance(v, Expr):
                nv = done[id(v)]
                if nv is not v:
                    changes[f.name] = nv
            elif isinstance(v, tuple) and v and isinstance(v[0], Expr):
                nt = tuple(done[id(x)] for x in v)
                if any(a is not b for a, b in zip(nt, v)):
                    changes[f.name] = nt
        done[id(node)] = dataclasses.replace(node, **changes) if changes else node  # type: ignore[type-var]
    return done[id(e)]


def evaluate_index(e: Expr, env: dict[str, int]) -> int:
    """Evaluate an integer index expression (shape arithmetic) given symbol values, with the
    IR's semantics (`semantics.evaluate`); division by zero raises `semantics.DivisionByZero`."""
    if isinstance(e, Const):
        return int(e.value) if e.dtype.is_bool else sem.wrap_int(int(e.value), e.dtype)
    if isinstance(e, Var):
        try:
            return env[e.name]
        except KeyError:
            raise KeyError(f"symbol {e.name!r} has no value") from None
    if isinstance(e, Binary):
        if not e.a.dtype.is_int:
            raise ValueError(f"not an integer index op: {e.op} on {e.a.type}")
        a, b = evaluate_index(e.a, env), evaluate_index(e.b, env)
        return int(sem.evaluate(e.op, e.a.dtype, a, b))
    if isinstance(e, Cast):
        v = evaluate_index(e.value, env)
        if e.dtype.is_int or e.dtype.is_bool:
            return int(sem.cast_value(v, e.value.dtype, e.dtype))
        return v
    raise ValueError(f"not an index expression: {type(e).__name__}")
