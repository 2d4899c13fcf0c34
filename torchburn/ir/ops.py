"""Definitions of the tensor-level ops: what operands and attributes each takes, its result
types, and its documentation (which `docs/ir.md` is generated from).

Ops are deliberately explicit: elementwise ops take operands of one shape and one dtype (the
importer inserts `expand` and `cast`), so every pass and every backend sees a small,
regular op set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import dtypes as dt
from .expr import (COMPARISONS, INFIX_OPS, NAMED_BINARY_OPS, UNARY_FUNCS, Const, Expr, as_expr,
                   floordiv, mul, sub)
from .tensor import TensorType

InferFn = Callable[[list[TensorType], dict[str, Any]], list[TensorType]]


class OpError(ValueError):
    """An op's operands or attributes are invalid; the message names the op and the problem."""


@dataclass(frozen=True)
class OpDef:
    """One tensor op: its category (`elementwise`, `view`, `reduction`, `contraction`,
    `factory`, `data`), its type rule, and a doc with an IR example."""

    name: str
    category: str
    infer: InferFn
    doc: str
    #: number of operands, or -1 for variadic
    arity: int


OPS: dict[str, OpDef] = {}


def define(name: str, category: str, arity: int, doc: str) -> Callable[[InferFn], InferFn]:
    def deco(fn: InferFn) -> InferFn:
        OPS[name] = OpDef(name, category, fn, doc.strip(), arity)
        return fn
    return deco


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise OpError(f"unknown op {name!r}") from None


def infer_types(name: str, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    """Result types of op `name` applied to operands of these types, or an `OpError`."""
    d = get_op(name)
    if d.arity >= 0 and len(operand_types) != d.arity:
        raise OpError(f"{name}: expected {d.arity} operands, got {len(operand_types)}")
    return d.infer(operand_types, attrs)


def _same_shape(name: str, types: list[TensorType]) -> None:
    first = types[0].shape
    for t in types[1:]:
        if t.shape != first:
            raise OpError(f"{name}: operand shapes differ: {list(map(str, first))} vs {list(map(str, t.shape))}")


def _same_dtype(name: str, types: list[TensorType]) -> None:
    first = types[0].dtype
    for t in types[1:]:
        if t.dtype != first:
            raise OpError(f"{name}: operand dtypes differ: {first} vs {t.dtype}")


def _norm_dims(name: str, dims: Any, rank: int) -> tuple[int, ...]:
    out = []
    for d in dims:
        if not -rank <= d < max(rank, 1):
            raise OpError(f"{name}: dim {d} out of range for rank {rank}")
        out.append(d % max(rank, 1))
    return tuple(sorted(set(out)))


# ---- elementwise ---------------------------------------------------------------------------

PREDICATES = frozenset({"isnan", "isinf", "isfinite", "signbit"})


def _unary(name: str) -> None:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        t = types[0]
        return [t.with_dtype(dt.bool_) if name in PREDICATES else t]
    OPS[name] = OpDef(name, "elementwise", infer,
                      f"Elementwise `{name}`.\n\n    %1 = {name}(%0) : f32[4]", 1)


def _binary(name: str) -> None:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        _same_shape(name, types)
        _same_dtype(name, types)
        t = types[0]
        return [t.with_dtype(dt.bool_) if name in COMPARISONS else t]
    spelled = INFIX_OPS.get(name, name)
    OPS[name] = OpDef(name, "elementwise", infer,
                      f"Elementwise `{spelled}` of two tensors of one shape and dtype.\n\n"
                      f"    %2 = {name}(%0, %1) : f32[4]", 2)


for _n in sorted(UNARY_FUNCS):
    _unary(_n)
for _n in sorted(set(INFIX_OPS) | NAMED_BINARY_OPS):
    _binary(_n)


@define("where", "elementwise", 3, """
Pick `a` where `cond` is true, else `b`; `cond` is bool, `a` and `b` share a dtype.

    %3 = where(%c, %a, %b) : f32[4]
""")
def _where(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    _same_shape("where", types)
    if types[0].dtype != dt.bool_:
        raise OpError("where: condition must be bool")
    _same_dtype("where", types[1:])
    return [types[1]]


@define("cast", "elementwise", 1, """
Convert elements to `dtype` (float to int truncates toward zero, to bool tests != 0).

    %1 = cast(%0) {dtype = f16} : f16[4]
""")
def _cast(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [types[0].with_dtype(attrs["dtype"])]


# ---- views -----------------------------------------------------------------------------------

@define("permute", "view", 1, """
Reorder dimensions: result dim i is operand dim `dims[i]`.

    %1 = permute(%0) {dims = [1, 0]} : f32[8, 4]    # %0: f32[4, 8]
""")
def _permute(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    t, dims = types[0], tuple(attrs["dims"])
    if sorted(dims) != list(range(t.rank)):
        raise OpError(f"permute: dims {list(dims)} is not a permutation of rank {t.rank}")
    return [TensorType(t.dtype, tuple(t.shape[d] for d in dims))]


@define("expand", "view", 1, """
Broadcast size-1 dimensions (and new leading ones) to `shape`.

    %1 = expand(%0) {shape = [3, 4]} : f32[3, 4]    # %0: f32[1, 4]
""")
def _expand(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    t, shape = types[0], tuple(as_expr(d) for d in attrs["shape"])
    if len(shape) < t.rank:
        raise OpError(f"expand: target rank {len(shape)} below operand rank {t.rank}")
    for src, dst in zip(reversed(t.shape), reversed(shape)):
        if src != dst and src != Const(1):
            raise OpError(f"expand: cannot expand dim of size {src} to {dst}")
    return [TensorType(t.dtype, shape)]


@define("reshape", "view", 1, """
Reinterpret the elements in row-major order with a new `shape` of the same element count.

    %1 = reshape(%0) {shape = [2, 6]} : f32[2, 6]   # %0: f32[3, 4]
""")
def _reshape(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [TensorType(types[0].dtype, tuple(as_expr(d) for d in attrs["shape"]))]


@define("slice", "view", 1, """
Take `start, start+step, ...` below `end` along `dim` (bounds already clamped).

    %1 = slice(%0) {dim = 1, start = 2, end = 8, step = 2} : f32[4, 3]   # %0: f32[4, 10]
""")
def _slice(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    t = types[0]
    dim = attrs["dim"]
    if not 0 <= dim < t.rank:
        raise OpError(f"slice: dim {dim} out of range for rank {t.rank}")
    start, end, step = as_expr(attrs["start"]), as_expr(attrs["end"]), as_expr(attrs["step"])
    length = floordiv(sub(end, start) + sub(step, 1), step)
    shape = list(t.shape)
    shape[dim] = length
    return [TensorType(t.dtype, tuple(shape))]


# ---- reductions ----------------------------------------------------------------------------

REDUCTIONS = ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "reduce_any", "reduce_all")


def _reduced_shape(name: str, t: TensorType, attrs: dict[str, Any]) -> tuple[Expr, ...]:
    dims = _norm_dims(name, attrs["dims"], t.rank)
    keep = bool(attrs.get("keepdim", False))
    out: list[Expr] = []
    for i, d in enumerate(t.shape):
        if i in dims:
            if keep:
                out.append(Const(1))
        else:
            out.append(d)
    return tuple(out)


def _reduction(name: str) -> None:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        t = types[0]
        dtype = dt.bool_ if name in ("reduce_any", "reduce_all") else t.dtype
        return [TensorType(dtype, _reduced_shape(name, t, attrs))]
    kind = name.split("_")[1]
    OPS[name] = OpDef(name, "reduction", infer,
                      f"Reduce with `{kind}` over `dims` (keepdim keeps them as size 1).\n\n"
                      f"    %1 = {name}(%0) {{dims = [1], keepdim = false}} : f32[4]   # %0: f32[4, 8]", 1)


for _n in REDUCTIONS:
    _reduction(_n)


def _arg_reduction(name: str) -> None:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        t = types[0]
        a = dict(attrs, dims=[attrs["dim"]])
        return [TensorType(dt.i64, _reduced_shape(name, t, a))]
    OPS[name] = OpDef(name, "reduction", infer,
                      f"Index (i64) of the first {name[3:]}imum along `dim`; NaN counts as the extreme.\n\n"
                      f"    %1 = {name}(%0) {{dim = 1, keepdim = false}} : i64[4]   # %0: f32[4, 8]", 1)


for _n in ("argmax", "argmin"):
    _arg_reduction(_n)


# ---- contraction -------------------------------------------------------------------------------

@define("matmul", "contraction", 2, """
Batched matrix product `[..., M, K] x [..., K, N] -> [..., M, N]`; batch dims are equal.
Accumulates in f32 for half-precision inputs.

    %2 = matmul(%0, %1) : f32[32, 1024]   # %0: f32[32, 512], %1: f32[512, 1024]
""")
def _matmul(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    a, b = types
    if a.rank < 2 or a.rank != b.rank:
        raise OpError(f"matmul: operands must have equal rank >= 2, got {a.rank} and {b.rank}")
    if a.shape[:-2] != b.shape[:-2]:
        raise OpError("matmul: batch dimensions differ")
    if a.shape[-1] != b.shape[-2]:
        raise OpError(f"matmul: inner dimensions differ: {a.shape[-1]} vs {b.shape[-2]}")
    _same_dtype("matmul", types)
    return [TensorType(a.dtype, (*a.shape[:-1], b.shape[-1]))]


# ---- factories and data movement ---------------------------------------------------------------

@define("full", "factory", 0, """
A tensor of `shape` filled with `value`.

    %0 = full() {shape = [2, 3], value = 0.0, dtype = f32} : f32[2, 3]
""")
def _full(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [TensorType.of(attrs["dtype"], attrs["shape"])]


@define("iota", "factory", 0, """
`start + i * step` along `dim` of a tensor of `shape` (arange when rank is 1).

    %0 = iota() {shape = [5], dim = 0, start = 0, step = 1, dtype = i64} : i64[5]
""")
def _iota(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [TensorType.of(attrs["dtype"], attrs["shape"])]


@define("concat", "data", -1, """
Join tensors along `dim`; other dimensions and dtypes are equal.

    %2 = concat(%0, %1) {dim = 0} : f32[5, 4]   # %0: f32[2, 4], %1: f32[3, 4]
""")
def _concat(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    if not types:
        raise OpError("concat: needs at least one operand")
    dim = attrs["dim"]
    _same_dtype("concat", types)
    base = types[0]
    total: Expr = Const(0)
    for t in types:
        if t.rank != base.rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, base.shape)) if i != dim):
            raise OpError("concat: operands differ outside the concatenated dim")
        total = total + t.shape[dim]
    shape = list(base.shape)
    shape[dim] = total
    return [TensorType(base.dtype, tuple(shape))]


def numel(shape: tuple[Expr, ...]) -> Expr:
    """The element count of a shape, as an index expression."""
    n: Expr = Const(1)
    for d in shape:
        n = mul(n, d)
    return n
