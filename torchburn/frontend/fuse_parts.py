"""Fuse partitions into `fused_N` submodules, each given the size symbols its code needs.

torch.fx's `fuse_by_partitions` gives a submodule the values its nodes read. The sizes in its
nodes' metadata may name a symbol none of those values carries as a plain size: after a
stride-4 convolution a subgraph sees sizes `s0 // 4` and `s0 // 8`, never `s0` itself, and
its compiled launcher cannot recover `s0` from `s0 // 4`. Such a symbol is passed to the
submodule as one more input, taken in the parent graph from a SymInt input that is the
symbol, or else as `sym_size` of an input tensor that has it as a size.
"""
from __future__ import annotations

from typing import Any, Optional

import sympy
import torch
import torch.fx
from torch.fx.passes.utils.fuser_utils import fuse_by_partitions


def fuse_parts(gm: torch.fx.GraphModule, parts: list[Any]) -> torch.fx.GraphModule:
    """`fuse_by_partitions(gm, parts, prefix="fused_")`, then each submodule given the symbols
    it lacks (module docstring)."""
    if not parts:
        return gm
    module = fuse_by_partitions(gm, parts, prefix="fused_")
    sources = _ParentSymbols(module.graph)
    changed = False
    for call in list(module.graph.nodes):
        if call.op != "call_module" or not str(call.target).startswith("fused_"):
            continue
        sub: torch.fx.GraphModule = getattr(module, call.target)
        extra = [(sym, node) for sym in sorted(_missing(sub.graph), key=str)
                 if (node := sources.node_for(sym)) is not None]
        if not extra:
            continue
        last = [n for n in sub.graph.nodes if n.op == "placeholder"][-1]
        for sym, node in extra:  # after the last input: the call passes them last
            with sub.graph.inserting_after(last):
                last = sub.graph.placeholder(f"symbol_{sym}")
            last.meta["val"] = node.meta["val"]
        call.args = (*call.args, *(node for _, node in extra))
        sub.recompile()
        changed = True
    if changed:
        module.recompile()
    return module


def _plain(val: Any) -> set[sympy.Symbol]:
    """The symbols `val` (a SymInt or a tensor's sizes and strides) holds as whole sizes."""
    ints = [val] if isinstance(val, torch.SymInt) else [*val.shape, *val.stride()] \
        if isinstance(val, torch.Tensor) else []
    return {s.node.expr for s in ints if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol)}


def _named(val: Any) -> set[sympy.Symbol]:
    """Every symbol `val`'s sizes (or its own value, for a SymInt) mention."""
    if isinstance(val, (list, tuple)):
        return set().union(*(_named(v) for v in val)) if val else set()
    ints = [val] if isinstance(val, torch.SymInt) else [*val.shape, *val.stride()] \
        if isinstance(val, torch.Tensor) else []
    out: set[sympy.Symbol] = set()
    for s in ints:
        if isinstance(s, torch.SymInt):
            out |= s.node.expr.free_symbols
    return out


def _missing(graph: torch.fx.Graph) -> set[sympy.Symbol]:
    """Symbols the graph's metadata mentions that no input holds as a whole size."""
    plain: set[sympy.Symbol] = set()
    named: set[sympy.Symbol] = set()
    for n in graph.nodes:
        val = n.meta.get("val")
        if n.op == "placeholder":
            plain |= _plain(val)
        named |= _named(val)
    return named - plain


class _ParentSymbols:
    """Where the parent graph has each symbol: a SymInt input, or a size of an input tensor
    (read with a `sym_size` node made on first use)."""

    def __init__(self, graph: torch.fx.Graph) -> None:
        self.graph = graph
        self.nodes: dict[sympy.Symbol, torch.fx.Node] = {}
        self.sizes: dict[sympy.Symbol, tuple[torch.fx.Node, int]] = {}
        for n in graph.nodes:
            if n.op != "placeholder":
                continue
            val = n.meta.get("val")
            if isinstance(val, torch.SymInt) and isinstance(val.node.expr, sympy.Symbol):
                self.nodes.setdefault(val.node.expr, n)
            elif isinstance(val, torch.Tensor):
                for d, s in enumerate(val.shape):
                    if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
                        self.sizes.setdefault(s.node.expr, (n, d))

    def node_for(self, sym: sympy.Symbol) -> Optional[torch.fx.Node]:
        if sym not in self.nodes and sym in self.sizes:
            tensor, d = self.sizes[sym]
            last = [n for n in self.graph.nodes if n.op == "placeholder"][-1]
            with self.graph.inserting_after(last):
                node = self.graph.call_function(torch.ops.aten.sym_size.int, (tensor, d))
            node.meta["val"] = tensor.meta["val"].shape[d]
            self.nodes[sym] = node
        return self.nodes.get(sym)
