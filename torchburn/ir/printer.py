"""Text form of both IR levels. `parser.py` reads it back: `parse(print(ir)) == ir`.

With `canonical=True` every name is replaced by one derived from its first appearance and
provenance (locations, `origin` annotations) is left out: two IRs that differ only in names
print identically, which is what the structural hash is computed from.
"""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, Optional, Protocol, Sequence, Union

from . import expr as ex
from . import loop as lp
from .dtypes import DType
from .tensor_type import TensorType


class ValueLike(Protocol):
    """A tensor value as the printer reads it (`tensor.Value`)."""

    @property
    def name(self) -> str: ...

    @property
    def type(self) -> TensorType: ...

    @property
    def strides(self) -> Optional[tuple[ex.Expr, ...]]: ...


class OpLike(Protocol):
    """An op as the printer reads it (`tensor.Op`)."""

    @property
    def name(self) -> str: ...

    @property
    def operands(self) -> Sequence[ValueLike]: ...

    @property
    def results(self) -> Sequence[ValueLike]: ...

    @property
    def attrs(self) -> Mapping[str, Any]: ...

    @property
    def loc(self) -> Optional[str]: ...


class GraphLike(Protocol):
    """A tensor graph as the printer reads it (`tensor.Graph`, which prints itself through
    this module: the printer needs only the graph's shape, so the two files do not import
    each other)."""

    @property
    def name(self) -> str: ...

    @property
    def inputs(self) -> Sequence[Union[ValueLike, ex.Var]]: ...

    @property
    def ops(self) -> Sequence[OpLike]: ...

    @property
    def outputs(self) -> Sequence[ValueLike]: ...

#: Annotation and attribute keys that record where IR came from, not what it computes.
PROVENANCE_KEYS = frozenset({"origin", "source"})

# Precedence of infix operators (higher binds tighter).
PRECEDENCE: dict[str, int] = {
    "or": 1, "xor": 2, "and": 3,
    "eq": 4, "ne": 4, "lt": 4, "le": 4, "gt": 4, "ge": 4,
    "shl": 5, "shr": 5,
    "add": 6, "sub": 6,
    "mul": 7, "div": 7, "floordiv": 7, "mod": 7,
}
ATOM = 10


def format_float(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def _precedence(e: ex.Expr) -> int:
    """How tightly the printed form of `e` binds: an infix operator's precedence, else atom."""
    if isinstance(e, ex.Binary) and e.op in ex.INFIX_OPS:
        return PRECEDENCE[e.op]
    return ATOM


def _joined(items: "tuple[ex.Expr, ...]") -> list[Union[str, tuple[ex.Expr, int]]]:
    """Operands separated by `, `, each printed without parentheses."""
    pieces: list[Union[str, tuple[ex.Expr, int]]] = []
    for k, x in enumerate(items):
        if k:
            pieces.append(", ")
        pieces.append((x, 0))
    return pieces


class Printer:
    """Prints IR; `canonical` renames everything by order of appearance."""

    def __init__(self, canonical: bool = False) -> None:
        self.canonical = canonical
        self._values: dict[str, str] = {}
        self._vars: dict[str, str] = {}
        self._funcs: dict[str, str] = {}

    # ---- names -------------------------------------------------------------------------------
    def value_name(self, name: str) -> str:
        if not self.canonical:
            return "%" + name
        return "%" + self._values.setdefault(name, f"v{len(self._values)}")

    def var_name(self, name: str) -> str:
        if not self.canonical:
            return name
        return self._vars.setdefault(name, f"x{len(self._vars)}")

    def func_name(self, name: str) -> str:
        if not self.canonical:
            return "@" + name
        return "@" + self._funcs.setdefault(name, f"f{len(self._funcs)}")

    # ---- expressions ---------------------------------------------------------------------------
    def expr(self, e: ex.Expr, parent_prec: int = 0) -> str:
        """`e` as text, in parentheses when it binds no tighter than `parent_prec`.

        Written with an explicit stack of pending pieces (text, or a node with the precedence
        of its context) instead of recursion, so expressions of any depth print; pieces are
        produced left to right, so canonical names are handed out in order of appearance."""
        out: list[str] = []
        stack: list[Union[str, tuple[ex.Expr, int]]] = [(e, parent_prec)]
        var, const = ex.Var, ex.Const
        while stack:
            item = stack.pop()
            if type(item) is str:
                out.append(item)
                continue
            node, context = item  # type: ignore[misc]
            kind = type(node)
            if kind is var:  # the leaves, most of the nodes, without building pieces
                out.append(self.var_name(node.name))  # type: ignore[attr-defined]
                continue
            if kind is const:
                out.append(self.const(node))  # type: ignore[arg-type]
                continue
            if context >= 1 and _precedence(node) <= context:
                stack.append(")")
                stack.append((node, -1))
                stack.append("(")
                continue
            pieces = self._pieces(node)
            stack.extend(reversed(pieces))
        return "".join(out)

    def _pieces(self, e: ex.Expr) -> list[Union[str, tuple[ex.Expr, int]]]:
        """The text of one node as literal pieces and operands with their context precedence."""
        if isinstance(e, ex.Const):
            return [self.const(e)]
        if isinstance(e, ex.Var):
            return [self.var_name(e.name)]
        if isinstance(e, ex.Binary):
            if e.op in ex.INFIX_OPS:
                p = PRECEDENCE[e.op]
                # Left-associative: the right operand needs parentheses at equal precedence.
                return [(e.a, p - 1), f" {ex.INFIX_OPS[e.op]} ", (e.b, p)]
            return [f"{e.op}(", (e.a, 0), ", ", (e.b, 0), ")"]
        if isinstance(e, ex.Call):
            return [f"{e.name}(", *_joined(e.args), ")"]
        if isinstance(e, ex.Cast):
            return [f"cast<{e.type.dtype}>(", (e.value, 0), ")"]
        if isinstance(e, ex.Bitcast):
            lanes = f", {e.type.lanes}" if e.type.lanes != e.value.lanes else ""
            return [f"bitcast<{e.type.dtype}{lanes}>(", (e.value, 0), ")"]
        if isinstance(e, ex.Select):
            return ["select(", *_joined((e.cond, e.a, e.b)), ")"]
        if isinstance(e, ex.Load):
            return [f"{self.value_name(e.buffer)}[", *_joined(e.index), "]"]
        if isinstance(e, ex.Ramp):
            return ["ramp(", (e.base, 0), ", ", (e.stride, 0), f", {e.type.lanes})"]
        if isinstance(e, ex.Broadcast):
            return ["broadcast(", (e.value, 0), f", {e.type.lanes})"]
        if isinstance(e, ex.VectorReduce):
            return [f"vreduce_{e.op}(", (e.value, 0), ")"]
        raise TypeError(f"cannot print expression {type(e).__name__}")

    def const(self, c: ex.Const) -> str:
        d = c.type.dtype
        if d.is_bool:
            return "true" if c.value else "false"
        if d.is_float:
            return f"{format_float(c.value)}:{d}"  # type: ignore[arg-type]
        if d.name == "i64":
            return str(c.value)
        return f"{c.value}:{d}"

    def dims(self, dims: tuple[ex.Expr, ...]) -> str:
        return "[" + ", ".join(self.expr(d) for d in dims) + "]"

    # ---- attributes --------------------------------------------------------------------------
    def attr(self, v: Any) -> str:
        if v is None:
            return "none"
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, int):
            return str(v)
        if isinstance(v, float):
            return format_float(v)
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, DType):
            return str(v)
        if isinstance(v, ex.Expr):
            return self.expr(v) if isinstance(v, (ex.Var, ex.Binary)) else "(" + self.expr(v) + ")"
        if isinstance(v, (tuple, list)):
            return "[" + ", ".join(self.attr(x) for x in v) + "]"
        raise TypeError(f"cannot print attribute value {v!r}")

    def attr_dict(self, attrs: Union[dict[str, Any], tuple[tuple[str, Any], ...]]) -> str:
        items = list(attrs.items()) if isinstance(attrs, dict) else list(attrs)
        if self.canonical:
            items = [(k, v) for k, v in items if k not in PROVENANCE_KEYS]
        if not items:
            return ""
        return "{" + ", ".join(f"{k} = {self.attr(v)}" for k, v in items) + "}"

    # ---- tensor level ----------------------------------------------------------------------------
    def tensor_type(self, t: TensorType) -> str:
        return f"{t.dtype}{self.dims(t.shape)}"

    def graph(self, g: GraphLike) -> str:
        params = []
        for v in g.inputs:
            if isinstance(v, ex.Var):
                params.append(self.var_name(v.name))
            else:
                s = f"{self.value_name(v.name)}: {self.tensor_type(v.type)}"
                if v.strides is not None:
                    s += f" strides {self.dims(v.strides)}"
                if getattr(v, "constant", False):
                    s += " const"
                params.append(s)
        lines = [f"graph {self.func_name(g.name)}({', '.join(params)}) {{"]
        for op in g.ops:
            lines.append("  " + self.op(op))
        lines.append("  return " + ", ".join(self.value_name(v.name) for v in g.outputs))
        lines.append("}")
        return "\n".join(lines) + "\n"

    def op(self, op: OpLike) -> str:
        results = ", ".join(self.value_name(r.name) for r in op.results)
        operands = ", ".join(self.value_name(v.name) for v in op.operands)
        text = f"{results} = {op.name}({operands})"
        attrs = self.attr_dict(op.attrs)
        if attrs:
            text += " " + attrs
        text += " : " + ", ".join(self.tensor_type(r.type) for r in op.results)
        if op.loc is not None and not self.canonical:
            text += f" loc({json.dumps(op.loc)})"
        return text

    # ---- loop level ------------------------------------------------------------------------------
    def buffer(self, b: lp.Buffer) -> str:
        text = f"{self.value_name(b.name)}: {b.dtype}{self.dims(b.shape)} strides {self.dims(b.strides)}"
        return text + (" local" if b.scope == "local" else "")

    def stmt(self, s: lp.Stmt, indent: int) -> list[str]:
        pad = "  " * indent
        if isinstance(s, lp.Block):
            return [line for x in s.stmts for line in self.stmt(x, indent)]
        if isinstance(s, lp.Store):
            idx = ", ".join(self.expr(i) for i in s.index)
            return [f"{pad}{self.value_name(s.buffer)}[{idx}] = {self.expr(s.value)}"]
        if isinstance(s, lp.Let):
            return [f"{pad}let {self.var_name(s.var.name)} = {self.expr(s.value)}"]
        if isinstance(s, lp.Alloc):
            return [f"{pad}alloc {self.buffer(s.buffer)}"]
        if isinstance(s, lp.For):
            kind = "" if s.kind == "serial" else s.kind + " "
            start = "" if s.start == ex.Const(0) else f"{self.expr(s.start)}..+"
            if start:
                rng = f"{self.expr(s.start)}..+{self.expr(s.extent)}"
            else:
                rng = f"0..{self.expr(s.extent)}"
            head = f"{pad}{kind}for {self.var_name(s.var.name)} in {rng}"
            attrs = self.attr_dict(s.annotations)
            if attrs:
                head += " attrs " + attrs
            return [head + " {", *self.stmt(s.body, indent + 1), pad + "}"]
        if isinstance(s, lp.If):
            lines = [f"{pad}if {self.expr(s.cond)} {{", *self.stmt(s.then, indent + 1)]
            if s.orelse is not None:
                lines += [pad + "} else {", *self.stmt(s.orelse, indent + 1)]
            return lines + [pad + "}"]
        raise TypeError(f"cannot print statement {type(s).__name__}")

    def kernel(self, k: lp.Kernel) -> str:
        params = ", ".join(self.buffer(b) for b in k.params)
        head = f"kernel {self.func_name(k.name)}({params})"
        if k.symbols:
            head += " symbols(" + ", ".join(self.var_name(v.name) for v in k.symbols) + ")"
        attrs = self.attr_dict(k.attrs)
        if attrs:
            head += " attrs " + attrs
        return "\n".join([head + " {", *self.stmt(k.body, 1), "}"]) + "\n"

    def program(self, p: lp.Program) -> str:
        ins = ", ".join(self.buffer(b) for b in p.inputs)
        outs = ", ".join(self.buffer(b) for b in p.outputs)
        head = f"program {self.func_name(p.name)}({ins}) -> ({outs})"
        if p.symbols:
            head += " symbols(" + ", ".join(self.var_name(v.name) for v in p.symbols) + ")"
        lines = [head + " {"]
        offsets = dict(p.temp_offsets)
        for t in p.temps:
            line = f"  temp {self.buffer(t)}"
            if t.name in offsets:
                line += f" offset {self.expr(offsets[t.name])}"
            lines.append(line)
        if p.temps:
            lines.append(f"  workspace {self.expr(p.workspace_bytes)}")
        if p.constant_inputs:
            lines.append("  constant " + ", ".join(self.value_name(n) for n in p.constant_inputs))
        if p.kept:
            lines.append("  kept " + ", ".join(self.value_name(n) for n in p.kept) + " from "
                         + ", ".join(self.value_name(n) for n in p.kept_from))
        for c in p.calls:
            args = []
            for i, a in enumerate(c.args):
                off = c.offset(i)
                args.append(self.value_name(a) + ("" if off is None else f" offset {self.expr(off)}"))
            lines.append(f"  call {self.func_name(c.kernel)}({', '.join(args)})")
        if p.results:
            returned = []
            for k, r in enumerate(p.results):
                view = p.result_view(k)
                returned.append(self.value_name(r) + ("" if view is None else
                                                      " as [" + ", ".join(self.expr(d) for d in view) + "]"))
            lines.append("  return " + ", ".join(returned))
        lines.append("}")
        text = "\n".join(lines) + "\n"
        return text + "".join(self.kernel(k) for k in p.kernels)


def print_expr(e: ex.Expr) -> str:
    return Printer().expr(e)


def print_stmt(s: lp.Stmt) -> str:
    return "\n".join(Printer().stmt(s, 0)) + "\n"


def print_graph(g: GraphLike, canonical: bool = False) -> str:
    return Printer(canonical).graph(g)


def print_kernel(k: lp.Kernel, canonical: bool = False) -> str:
    return Printer(canonical).kernel(k)


def print_program(p: lp.Program, canonical: bool = False) -> str:
    return Printer(canonical).program(p)


def print_ir(ir: Union[GraphLike, lp.Kernel, lp.Program], canonical: bool = False) -> str:
    """Print any top-level IR object (a loop program or kernel, else a tensor graph)."""
    if isinstance(ir, lp.Kernel):
        return print_kernel(ir, canonical)
    if isinstance(ir, lp.Program):
        return print_program(ir, canonical)
    if all(hasattr(ir, a) for a in ("inputs", "ops", "outputs")):
        return print_graph(ir, canonical)
    raise TypeError(f"cannot print {type(ir).__name__}")
