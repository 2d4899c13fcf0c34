"""The tensor-level IR: a graph of ops on typed tensors, in SSA form.

Values are typed (`f32[s0, 1024]`); dimensions are index expressions, so symbolic sizes are
first class. Ops are generic (a name, operands, attributes, results), checked against the
definitions in `ops.py`. Graphs are mutable: passes edit them in place, as in MLIR. An input
marked `const` is one the caller keeps unchanged between calls unless the tensor, its memory or
its version changes (a parameter in inference: `Value.constant`).

Text form:

    graph @main(%x: f32[s0, 512], %w: f32[1024, 512] const) {
      %0 = permute(%w) {dims = [1, 0]} : f32[512, 1024]
      %1 = matmul(%x, %0) : f32[s0, 1024]
      return %1
    }
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Optional, Union

from .dtypes import DType
from .expr import Const, Expr, Var
from .loop import contiguous_strides
from .ops import infer_types
from .printer import print_graph
from .tensor_type import TensorType

__all__ = ["AttrValue", "Graph", "Op", "TensorType", "Value", "normalize_attr"]


_value_ids = itertools.count()


def normalize_attr(v: Any) -> Any:
    """Store attributes in one canonical form: integer constants as ints, lists as tuples."""
    if isinstance(v, Const) and v.type.dtype.name == "i64" and v.type.lanes == 1:
        return int(v.value)
    if isinstance(v, (list, tuple)):
        return tuple(normalize_attr(x) for x in v)
    return v


@dataclass(eq=False)
class Value:
    """An SSA tensor value: a graph input or an op result. Identity is the object."""

    name: str
    type: TensorType
    #: Strides of a graph input in memory; None means row-major contiguous.
    strides: Optional[tuple[Expr, ...]] = None
    producer: Optional["Op"] = field(default=None, repr=False)
    #: A graph input the caller keeps unchanged from call to call unless the tensor itself, its
    #: memory or its version counter changes (a module's parameter or buffer in inference),
    #: printed `%w: f32[64, 64, 3] const`. What a kernel computes from such inputs alone may be
    #: kept across calls (`keep-constant-prep`).
    constant: bool = False

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def shape(self) -> tuple[Expr, ...]:
        return self.type.shape

    def layout(self) -> tuple[Expr, ...]:
        """The strides of this value in memory (contiguous unless the input says otherwise)."""
        return self.strides if self.strides is not None else contiguous_strides(self.shape)

    def __repr__(self) -> str:
        return f"%{self.name}"


AttrValue = Any  # int | float | bool | str | DType | Expr | None | tuple[AttrValue, ...]


@dataclass(eq=False)
class Op:
    """An operation: `results = name(operands) {attrs}`; `loc` records its origin."""

    name: str
    operands: list[Value]
    attrs: dict[str, AttrValue]
    results: list[Value]
    loc: Optional[str] = None

    @property
    def result(self) -> Value:
        if len(self.results) != 1:
            raise ValueError(f"op {self.name} has {len(self.results)} results")
        return self.results[0]

    def __repr__(self) -> str:
        return f"<Op {self.name} {self.operands} -> {self.results}>"


@dataclass(eq=False)
class Graph:
    """A function over tensors. `inputs` holds tensor values and scalar symbols (i64 `Var`s)
    in the order the caller passes them; `outputs` are returned in order.
    """

    name: str
    inputs: list[Union[Value, Var]]
    ops: list[Op] = field(default_factory=list)
    outputs: list[Value] = field(default_factory=list)

    # ---- construction -----------------------------------------------------------------
    def fresh_name(self) -> str:
        used = self._used_names()
        for i in itertools.count(len(self.ops)):
            if str(i) not in used:
                return str(i)
        raise AssertionError("unreachable")

    def _used_names(self) -> set[str]:
        names = {v.name for v in self.inputs}
        names.update(r.name for op in self.ops for r in op.results)
        return names

    def add_op(
        self,
        name: str,
        operands: Iterable[Value],
        attrs: Optional[dict[str, AttrValue]] = None,
        result_types: Optional[list[TensorType]] = None,
        loc: Optional[str] = None,
        index: Optional[int] = None,
    ) -> Op:
        """Append (or insert at `index`) an op; result types are inferred when not given."""
        operands = list(operands)
        attrs = {k: normalize_attr(v) for k, v in (attrs or {}).items()}
        if result_types is None:
            result_types = infer_types(name, [v.type for v in operands], attrs)
        op = Op(name, operands, attrs, [], loc)
        # `v<n>` from a process-wide counter, skipping names the graph already has (a parsed
        # graph may name its own values `%v0`): two values of one name print ambiguously.
        taken: Optional[set[str]] = self.__dict__.get("_v_names")
        if taken is None:
            taken = {n for n in self._used_names() if n.startswith("v")}
            self.__dict__["_v_names"] = taken
        while True:
            base = next(_value_ids)
            names = [f"v{base}_{i}" for i in range(len(result_types))] if len(result_types) > 1 else [f"v{base}"]
            if not taken.intersection(names):
                break
        taken.update(names)
        op.results = [Value(n, t, producer=op) for n, t in zip(names, result_types)]
        if index is None:
            self.ops.append(op)
        else:
            self.ops.insert(index, op)
        return op

    # ---- queries and edits ---------------------------------------------------------------
    def tensor_inputs(self) -> list[Value]:
        return [v for v in self.inputs if isinstance(v, Value)]

    def symbol_inputs(self) -> list[Var]:
        return [v for v in self.inputs if isinstance(v, Var)]

    def users(self) -> dict[Value, list[Op]]:
        """Map each value to the ops that read it (in graph order)."""
        result: dict[Value, list[Op]] = {}
        for op in self.ops:
            for v in op.operands:
                result.setdefault(v, []).append(op)
        return result

    def replace_all_uses(self, old: Value, new: Value) -> None:
        for op in self.ops:
            op.operands = [new if v is old else v for v in op.operands]
        self.outputs = [new if v is old else v for v in self.outputs]

    def remove_dead_ops(self) -> int:
        """Drop ops whose results nobody reads; returns how many were removed."""
        live = set(self.outputs)
        kept: list[Op] = []
        for op in reversed(self.ops):
            if any(r in live for r in op.results):
                kept.append(op)
                live.update(op.operands)
        removed = len(self.ops) - len(kept)
        self.ops = list(reversed(kept))
        return removed

    def walk(self) -> Iterator[Op]:
        return iter(list(self.ops))

    def rename_canonically(self) -> None:
        """Name results `0, 1, 2...` in order (inputs keep their names). Printing uses this."""
        taken = {v.name for v in self.inputs}
        counter = itertools.count()
        for op in self.ops:
            for r in op.results:
                name = str(next(counter))
                while name in taken:
                    name = str(next(counter))
                r.name = name

    def substitute_symbols(self, mapping: dict[str, Expr]) -> None:
        """Rename or replace symbolic dimensions everywhere: types, strides, attributes, inputs."""
        from .expr import substitute

        def sub(e: Any) -> Any:
            if isinstance(e, Expr):
                return substitute(e, mapping)
            if isinstance(e, tuple):
                return tuple(sub(x) for x in e)
            return e

        def retype(v: Value) -> None:
            v.type = TensorType(v.type.dtype, sub(v.type.shape))
            if v.strides is not None:
                v.strides = sub(v.strides)

        self.inputs = [sub(v) if isinstance(v, Var) else v for v in self.inputs]
        for v in self.tensor_inputs():
            retype(v)
        for op in self.ops:
            op.attrs = {k: normalize_attr(sub(a)) for k, a in op.attrs.items()}
            for r in op.results:
                retype(r)

    def __eq__(self, other: object) -> bool:
        """Structural equality: same ops, attributes, types, locations and value names."""
        if not isinstance(other, Graph):
            return NotImplemented
        return print_graph(self) == print_graph(other)

    __hash__ = None  # type: ignore[assignment]

    def __str__(self) -> str:
        return print_graph(self)
