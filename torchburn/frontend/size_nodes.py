"""Sizes read from intermediate tensors, read from the graph's inputs instead.

With dynamic shapes an ATen graph reads sizes with `sym_size(t, d)` (or `sym_numel(t)`) nodes, often of a tensor
the graph computed (`view(conv_out, [b, c, h * w])` reads `h` and `w` from `conv_out`). Such a
size node is not compilable (it is Python arithmetic) and depends on a compilable node while
a compilable node depends on it: the partitioner must then cut the graph around it, and each
cut is a subgraph boundary (ConvNeXt under dynamic=True was cut into five subgraphs). Every
size is an expression in the symbols of the graph's inputs (`s0 // 4`), so such a node is
rebuilt from the inputs (their `sym_size`, SymInt inputs, and `operator` arithmetic) and no
longer depends on the tensor.
"""
from __future__ import annotations

import operator
from typing import Any, Callable, Optional

import sympy
import torch
import torch.fx

aten = torch.ops.aten
#: Reads of a tensor's size: one dim (`sym_size`), or all of them multiplied (`sym_numel`: batch
#: norm's count of elements per channel in training, `x.numel()`).
SIZE_READS = (aten.sym_size.int, aten.sym_numel.default)


def sizes_from_inputs(gm: torch.fx.GraphModule) -> None:
    """Rebuild each `sym_size` or `sym_numel` of a computed tensor from the graph's inputs (module docstring),
    where its expression uses sums, products, integer powers and floor divisions only."""
    sizes = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in SIZE_READS
             and isinstance(n.args[0], torch.fx.Node) and n.args[0].op != "placeholder"
             and isinstance(n.meta.get("val"), torch.SymInt)]
    if not sizes:
        return
    builder = _FromInputs(gm.graph)
    for node in sizes:
        with gm.graph.inserting_before(node):
            new = builder.build(node.meta["val"].node.expr)
        if isinstance(new, torch.fx.Node):
            node.replace_all_uses_with(new)
            gm.graph.erase_node(node)
    gm.recompile()


class _FromInputs:
    """Emits FX nodes computing a sympy size expression from the graph's inputs."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.symbols: dict[sympy.Symbol, Callable[[], torch.fx.Node]] = {}
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        for n in placeholders:
            val = n.meta.get("val")
            if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
                self.symbols.setdefault(val.node.expr, lambda n=n: n)
            elif isinstance(val, torch.Tensor):
                for d, s in enumerate(val.shape):
                    if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                        self.symbols.setdefault(s.node.expr, lambda n=n, d=d: self._size_of(n, d))
        self.made: dict[sympy.Symbol, torch.fx.Node] = {}

    def _size_of(self, tensor: torch.fx.Node, d: int) -> torch.fx.Node:
        node = self.graph.call_function(aten.sym_size.int, (tensor, d))
        node.meta["val"] = tensor.meta["val"].shape[d]
        return node

    def build(self, e: sympy.Expr) -> Optional[Any]:
        """A node (or int) computing `e`, or None when `e` uses something else."""
        if e.free_symbols - set(self.symbols):
            return None
        return self._emit(e)

    def _emit(self, e: sympy.Expr) -> Optional[Any]:
        if isinstance(e, sympy.Integer):
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e not in self.made:
                self.made[e] = self.symbols[e]()
            return self.made[e]
        name = type(e).__name__
        if isinstance(e, (sympy.Add, sympy.Mul)):
            op = operator.add if isinstance(e, sympy.Add) else operator.mul
            return self._fold(op, list(e.args))
        if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) > 0:
            return self._fold(operator.mul, [e.base] * int(e.exp))
        if name == "FloorDiv":
            return self._fold(operator.floordiv, list(e.args))
        return None

    def _fold(self, op: Callable[[Any, Any], Any], args: list[sympy.Expr]) -> Optional[Any]:
        acc = self._emit(args[0])
        for a in args[1:]:
            b = self._emit(a)
            if acc is None or b is None:
                return None
            acc = self._apply(op, acc, b)
        return acc

    def _apply(self, op: Callable[[Any, Any], Any], a: Any, b: Any) -> Any:
        if not isinstance(a, torch.fx.Node) and not isinstance(b, torch.fx.Node):
            return op(a, b)
        node = self.graph.call_function(op, (a, b))
        node.meta["val"] = op(a.meta["val"] if isinstance(a, torch.fx.Node) else a,
                              b.meta["val"] if isinstance(b, torch.fx.Node) else b)
        return node
