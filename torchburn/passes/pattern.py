"""The public rewrite API: patterns, a rewriter, and a greedy driver that runs them to a fixed
point. Built-in passes (`canonicalize`) use exactly this API; so can yours.

Tensor level. A `RewritePattern` matches one op (`op_name`, or None for any op) and rewrites it
through the `Rewriter`, returning True when it changed something:

    class MulByOne(RewritePattern):
        "mul(x, 1) -> x"
        op_name = "mul"

        def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
            x, one = op.operands
            if constant_value(one) != 1:
                return False
            rewriter.replace_op(op, [x])
            return True

Before:

    graph @main(%x: f32[4]) {
      %0 = full() {shape = [4], value = 1.0, dtype = f32} : f32[4]
      %1 = mul(%x, %0) : f32[4]
      return %1
    }

After `apply_patterns_greedily(graph, [MulByOne(), DeadOp()])`:

    graph @main(%x: f32[4]) {
      return %x
    }

Loop level. An `ExprPattern` rewrites one expression node (`node_type`, or None for any) and
returns the replacement, or None when it does not match:

    class MulByOneExpr(ExprPattern):
        node_type = Binary

        def match_and_rewrite(self, e: Expr) -> Optional[Expr]:
            if e.op == "mul" and isinstance(e.b, Const) and e.b.value == 1:
                return e.a
            return None

`apply_patterns_greedily(program, [MulByOneExpr()])` rewrites every expression of every kernel
bottom-up, again to a fixed point.

The driver stops with a `PatternError` naming the patterns still firing when the IR has not
settled after `max_iterations` sweeps (two patterns undoing each other, or a pattern that
reports a change it did not make).

A pass made of patterns subclasses `PatternPass` and lists them:

    @register_pass
    @dataclass(frozen=True)
    class MyCleanup(PatternPass):
        "My clean-up rewrites."
        name: ClassVar[str] = "my-cleanup"

        def patterns(self) -> list[Pattern]:
            return [MulByOne(), DeadOp()]
"""
from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import Any, ClassVar, Optional, Sequence, Union

from ..ir import expr as ex
from ..ir import loop as lp
from ..ir.tensor import AttrValue, Graph, Op, TensorType, Value
from ..ir.transform import StmtMutator
from .base import Pass, PassError, source_digest

#: Attributes a 1:1 replacement inherits from the op it replaces (see `Rewriter.replace_op_with`):
#: the fusion decisions, so that patterns also work after `fuse`.
INHERITED_ATTRS: tuple[str, ...] = ("kernel", "fused_into")


class PatternError(PassError):
    """The greedy driver did not settle, or a pattern broke the rewrite protocol."""


# ---- tensor level ---------------------------------------------------------------------------------

class RewritePattern:
    """Matches one tensor op and rewrites it through the `Rewriter`.

    Set `op_name` to the op this pattern matches (`"mul"`) or to a tuple of names
    (`("mul", "div")`), or leave it None to see every op.
    `match_and_rewrite` returns True when it changed the graph, False (having changed nothing)
    when the op does not match.
    """

    op_name: ClassVar[Union[str, tuple[str, ...], None]] = None

    def match_and_rewrite(self, op: Op, rewriter: "Rewriter") -> bool:  # pragma: no cover
        raise NotImplementedError(f"{type(self).__name__} does not implement match_and_rewrite")

    def __repr__(self) -> str:
        return type(self).__name__


class Rewriter:
    """Edits a graph on behalf of patterns, keeping a map of each value's users up to date.

    Every change goes through a method here so the driver knows the graph changed and which
    values are still read; patterns never edit `graph.ops` directly.
    """

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        #: Number of edits made through this rewriter (the driver watches it).
        self.edits = 0
        self._users: dict[Value, list[Op]] = {}
        self._outputs: Counter[Value] = Counter(graph.outputs)
        self._erased: set[Op] = set()
        numbers = [int(v.name) for v in graph.inputs if v.name.isdigit()]
        numbers += [int(r.name) for op in graph.ops for r in op.results if r.name.isdigit()]
        self._next_name = max(numbers, default=-1) + 1
        for op in graph.ops:
            for v in op.operands:
                self._users.setdefault(v, []).append(op)

    # ---- queries ------------------------------------------------------------------------------
    def users(self, v: Value) -> list[Op]:
        """The ops that read `v` (one entry per op, even if it reads `v` twice)."""
        seen: list[Op] = []
        for op in self._users.get(v, []):
            if op not in seen:
                seen.append(op)
        return seen

    def has_uses(self, v: Value) -> bool:
        """Whether an op reads `v` or the graph returns it."""
        return bool(self._users.get(v)) or self._outputs[v] > 0

    def is_returned(self, v: Value) -> bool:
        """Whether the graph returns `v` (a value other code reads, whatever its op users)."""
        return self._outputs[v] > 0

    def is_dead(self, op: Op) -> bool:
        """Whether nothing reads any result of `op`."""
        return not any(self.has_uses(r) for r in op.results)

    def is_erased(self, op: Op) -> bool:
        return op in self._erased

    # ---- creating ops -------------------------------------------------------------------------
    def insert_op_before(self, anchor: Op, name: str, operands: Sequence[Value],
                         attrs: Optional[dict[str, AttrValue]] = None,
                         result_types: Optional[list[TensorType]] = None,
                         loc: Optional[str] = None) -> Op:
        """Create op `name` right before `anchor`; result types are inferred unless given,
        the location defaults to the anchor's, and results are named with the next number
        above every numeric name in the graph."""
        index = self.graph.ops.index(anchor)
        op = self.graph.add_op(name, operands, attrs, result_types,
                               loc=anchor.loc if loc is None else loc, index=index)
        for r in op.results:  # deterministic names (`%9`), so printed IR is stable
            r.name = str(self._next_name)
            self._next_name += 1
        for v in op.operands:
            self._users.setdefault(v, []).append(op)
        self.edits += 1
        return op

    # ---- replacing and erasing ------------------------------------------------------------------
    def replace_all_uses(self, old: Value, new: Value) -> None:
        """Make every reader of `old` (ops and graph outputs) read `new` instead."""
        if old is new:
            return
        if old.type != new.type:
            raise PatternError(f"cannot replace %{old.name}: {_type_text(old.type)} by "
                               f"%{new.name}: {_type_text(new.type)} (types differ)")
        readers = self._users.pop(old, [])
        for op in readers:
            op.operands = [new if v is old else v for v in op.operands]
        self._users.setdefault(new, []).extend(readers)
        if self._outputs[old]:
            self.graph.outputs = [new if v is old else v for v in self.graph.outputs]
            self._outputs[new] += self._outputs.pop(old)
        self.edits += 1

    def replace_op(self, op: Op, new_values: Union[Value, Sequence[Value]]) -> None:
        """Replace each result of `op` by the value at the same position, then erase `op`."""
        values = [new_values] if isinstance(new_values, Value) else list(new_values)
        if len(values) != len(op.results):
            raise PatternError(f"replace_op: {op.name} has {len(op.results)} result(s), "
                               f"got {len(values)} replacement(s)")
        for old, new in zip(op.results, values):
            self.replace_all_uses(old, new)
        self.erase_op(op)

    def replace_op_with(self, op: Op, name: str, operands: Sequence[Value],
                        attrs: Optional[dict[str, AttrValue]] = None) -> Op:
        """Replace `op` by a new op `name(operands) {attrs}` created in its place. The new op
        keeps `op`'s location and fusion decisions (`INHERITED_ATTRS`)."""
        merged = {k: op.attrs[k] for k in INHERITED_ATTRS if k in op.attrs}
        merged.update(attrs or {})
        new = self.insert_op_before(op, name, operands, merged)
        self.replace_op(op, new.results)
        return new

    def erase_op(self, op: Op) -> None:
        """Remove `op`; its results must be unused."""
        if op in self._erased:
            raise PatternError(f"op {op.name} (%{op.results[0].name if op.results else '?'}) erased twice")
        for r in op.results:
            if self.has_uses(r):
                raise PatternError(f"cannot erase {op.name}: its result %{r.name} is still used")
        self.graph.ops.remove(op)
        for v in op.operands:
            readers = self._users.get(v)
            if readers is not None and op in readers:
                readers.remove(op)
        self._erased.add(op)
        self.edits += 1

    def set_attr(self, op: Op, key: str, value: AttrValue) -> None:
        """Set an attribute of `op` in place (the op's result types must stay valid)."""
        from ..ir.tensor import normalize_attr

        op.attrs[key] = normalize_attr(value)
        self.edits += 1


def _type_text(t: TensorType) -> str:
    from ..ir.printer import Printer

    return Printer().tensor_type(t)


# ---- helpers for matching -------------------------------------------------------------------------

#: View ops through which a constant stays a constant (every element equal).
_SPLAT_VIEWS = frozenset({"reshape", "expand", "permute", "slice"})


def constant_value(v: Value) -> Optional[Union[int, float, bool]]:
    """The value of every element of `v` when `v` is a `full` seen through views (the frontend
    writes `x * 2` as `mul(%x, expand(reshape(full(2))))`), else None."""
    op = v.producer
    while op is not None and op.name in _SPLAT_VIEWS:
        op = op.operands[0].producer
    if op is None or op.name != "full":
        return None
    value = op.attrs.get("value")
    if isinstance(value, (bool, int, float)):
        return value
    return None


def is_constant(v: Value, value: Union[int, float, bool]) -> bool:
    """Whether every element of `v` is `value` (compared as numbers; `-0.0 == 0.0`)."""
    c = constant_value(v)
    if c is None or isinstance(c, float) and math.isnan(c):
        return False
    return c == value


def producer(v: Value, name: Optional[str] = None) -> Optional[Op]:
    """The op defining `v` (None for graph inputs), if it is named `name` (when given)."""
    op = v.producer
    if op is None or (name is not None and op.name != name):
        return None
    return op


# ---- loop level -----------------------------------------------------------------------------------

class ExprPattern:
    """Rewrites one loop-level expression node: return its replacement or None.

    `node_type` restricts the pattern to one node class (`Binary`, `Call`, `Cast`...); None
    sees every node. Children are already rewritten when a node is visited (bottom-up). The
    replacement must have the same type (dtype and lanes) as the node it replaces.
    """

    node_type: ClassVar[Optional[type]] = None

    def match_and_rewrite(self, e: ex.Expr) -> Optional[ex.Expr]:  # pragma: no cover
        raise NotImplementedError(f"{type(self).__name__} does not implement match_and_rewrite")

    def __repr__(self) -> str:
        return type(self).__name__


class _ExprRewriter(StmtMutator):
    """Applies expression patterns bottom-up; counts which pattern fired how often."""

    def __init__(self, patterns: Sequence[ExprPattern], per_node_limit: int) -> None:
        self.patterns = patterns
        self.per_node_limit = per_node_limit
        self.fired: Counter[str] = Counter()

    def leave(self, e: ex.Expr) -> ex.Expr:
        for _ in range(self.per_node_limit):
            new = self._rewrite_once(e)
            if new is None:
                return e
            e = new
        raise PatternError(f"expression patterns keep rewriting {_expr_text(e)}; still firing: "
                           f"{_fired_text(self.fired)}")

    def _rewrite_once(self, e: ex.Expr) -> Optional[ex.Expr]:
        for p in self.patterns:
            if p.node_type is not None and not isinstance(e, p.node_type):
                continue
            new = p.match_and_rewrite(e)
            if new is None or new == e:
                continue
            if new.type != e.type:
                raise PatternError(f"pattern {p!r} changed the type of {_expr_text(e)} from "
                                   f"{e.type} to {new.type}")
            self.fired[repr(p)] += 1
            return new
        return None


def _expr_text(e: ex.Expr) -> str:
    from ..ir.printer import print_expr

    text = print_expr(e)
    return text if len(text) <= 80 else text[:77] + "..."


def _fired_text(fired: Counter[str]) -> str:
    return ", ".join(f"{name} ({n}x)" for name, n in fired.most_common()) or "none"


def _rewrite_kernel_exprs(k: lp.Kernel, rw: _ExprRewriter) -> lp.Kernel:
    return rw.visit_kernel(k)


# ---- the driver ---------------------------------------------------------------------------------

Pattern = Union[RewritePattern, ExprPattern]
IR = Union[Graph, lp.Program, lp.Kernel]

DEFAULT_MAX_ITERATIONS = 32


def apply_patterns_greedily(ir: IR, patterns: Sequence[Pattern],
                            max_iterations: int = DEFAULT_MAX_ITERATIONS) -> IR:
    """Apply `patterns` until none matches anywhere and return the rewritten IR.

    A `Graph` takes `RewritePattern`s and is edited in place (and returned); a `Program` or
    `Kernel` takes `ExprPattern`s and a new one is returned (loop IR is immutable). Raises
    `PatternError` when the IR still changes after `max_iterations` sweeps.
    """
    if max_iterations < 1:
        raise PatternError(f"max_iterations must be at least 1, got {max_iterations}")
    if isinstance(ir, Graph):
        wrong = [p for p in patterns if not isinstance(p, RewritePattern)]
        if wrong:
            raise PatternError(f"a tensor graph takes RewritePatterns, got {wrong}")
        _apply_to_graph(ir, patterns, max_iterations)  # type: ignore[arg-type]
        return ir
    if isinstance(ir, (lp.Program, lp.Kernel)):
        not_expr = [p for p in patterns if not isinstance(p, ExprPattern)]
        if not_expr:
            raise PatternError(f"loop IR takes ExprPatterns, got {not_expr}")
        return _apply_to_loops(ir, patterns, max_iterations)  # type: ignore[arg-type]
    raise PatternError(f"cannot apply patterns to {type(ir).__name__}")


def _apply_to_graph(graph: Graph, patterns: Sequence[RewritePattern], max_iterations: int) -> None:
    by_name: dict[Optional[str], list[RewritePattern]] = {}
    for p in patterns:
        names = p.op_name if isinstance(p.op_name, tuple) else (p.op_name,)
        for name in names:
            by_name.setdefault(name, []).append(p)
    generic = by_name.get(None, [])
    fired: Counter[str] = Counter()
    for _ in range(max_iterations):
        fired = Counter()
        rewriter = Rewriter(graph)
        # Walk a snapshot from the last op up: users are visited before their producers, so
        # a producer left dead by a rewrite is seen (and can be erased) in the same sweep.
        for op in reversed(list(graph.ops)):
            if rewriter.is_erased(op):
                continue
            for p in (*by_name.get(op.name, ()), *generic):
                before = rewriter.edits
                changed = p.match_and_rewrite(op, rewriter)
                made_edits = rewriter.edits != before
                if changed and not made_edits:
                    raise PatternError(f"pattern {p!r} returned True on {op.name} but changed nothing "
                                       "(edit the graph through the Rewriter)")
                if made_edits and not changed:
                    raise PatternError(f"pattern {p!r} changed the graph at {op.name} but returned False")
                if changed:
                    fired[repr(p)] += 1
                    break
        if not fired:
            return
    raise PatternError(f"patterns did not reach a fixed point after {max_iterations} iterations; "
                       f"still firing in the last one: {_fired_text(fired)}")


def _apply_to_loops(ir: Union[lp.Program, lp.Kernel], patterns: Sequence[ExprPattern],
                    max_iterations: int) -> Union[lp.Program, lp.Kernel]:
    fired: Counter[str] = Counter()
    for _ in range(max_iterations):
        rw = _ExprRewriter(patterns, per_node_limit=max_iterations)
        if isinstance(ir, lp.Kernel):
            new: Union[lp.Program, lp.Kernel] = _rewrite_kernel_exprs(ir, rw)
        else:
            kernels = tuple(_rewrite_kernel_exprs(k, rw) for k in ir.kernels)
            new = ir if all(a is b for a, b in zip(kernels, ir.kernels)) else ir.with_kernels(kernels)
        fired = rw.fired
        if not fired or new == ir:
            return new
        ir = new
    raise PatternError(f"expression patterns did not reach a fixed point after {max_iterations} "
                       f"iterations; still firing in the last one: {_fired_text(fired)}")


# ---- passes made of patterns ----------------------------------------------------------------------

@dataclass(frozen=True)
class PatternPass(Pass):
    """A pass that is a list of patterns applied greedily to a fixed point.

    Subclasses implement `patterns()`; tensor-level passes list `RewritePattern`s, loop-level
    ones (`level = "loop"`) `ExprPattern`s. The patterns' source code joins the pass's `uuid()`
    (and thus the compile-cache key) for patterns defined outside torchburn.
    """

    #: Sweeps before the driver gives up (see `apply_patterns_greedily`).
    max_iterations: ClassVar[int] = DEFAULT_MAX_ITERATIONS

    def patterns(self) -> Sequence[Pattern]:  # pragma: no cover - abstract
        raise NotImplementedError(f"pass {self.name} does not implement patterns()")

    def run(self, ir: Any) -> Any:
        return apply_patterns_greedily(ir, self.patterns(), self.max_iterations)

    def uuid(self) -> str:
        parts = [super().uuid()]
        for p in self.patterns():
            cls = type(p)
            if not cls.__module__.startswith("torchburn."):
                parts.append(f"{cls.__qualname__}={source_digest(cls)}")
        return "|".join(parts)


class DeadOp(RewritePattern):
    """Erase an op nothing reads (every tensor op is free of side effects).

    Before:

        graph @main(%x: f32[4]) {
          %0 = exp(%x) : f32[4]
          %1 = neg(%x) : f32[4]
          return %1
        }

    After:

        graph @main(%x: f32[4]) {
          %1 = neg(%x) : f32[4]
          return %1
        }
    """

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        if not rewriter.is_dead(op):
            return False
        rewriter.erase_op(op)
        return True
