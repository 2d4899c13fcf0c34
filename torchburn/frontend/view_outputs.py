"""Strided views among a graph's outputs are made by PyTorch, not by a compiled subgraph.

A compiled subgraph writes each of its results into a new contiguous tensor. When a graph
output is a view with other strides (`permute(weight)` or the heads of `qkv.view(...)
.transpose(1, 2)` that AOTAutograd saves for the backward), the copy has other strides than
the ones AOTAutograd recorded, and the backward graph, compiled for the recorded strides, then
finds its inputs changed and runs in PyTorch (the launcher's slow path) on every step.

So before partitioning, each such output gets its own copy of the view chain, applied in
PyTorch to the chain's base (a graph input or a compiled result, which the subgraph then
returns): a view is free, and its strides are exactly the recorded ones. The chain's original
nodes stay where they were, for the compiled ops that read them.

    permute = aten.permute.default(primals_1, [1, 0])       # read by addmm, and an output
    addmm = aten.addmm.default(primals_2, primals_3, permute)
    return (addmm, permute)

becomes

    permute = aten.permute.default(primals_1, [1, 0])
    addmm = aten.addmm.default(primals_2, primals_3, permute)
    permute_out = aten.permute.default(primals_1, [1, 0])   # marked: stays in PyTorch
    return (addmm, permute_out)

It runs before the FX-graph cache key is taken, so the cached plan names the nodes it made.
"""
from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

#: The meta key marking a node made here (the partitioner leaves it to PyTorch, not as a fallback).
MARK = "torchburn_output_view"

#: Ops whose result is a view of their first argument.
VIEW_OPS = frozenset({"aten.view", "aten._unsafe_view", "aten.permute", "aten.t", "aten.expand",
                      "aten.squeeze", "aten.unsqueeze", "aten.slice", "aten.select", "aten.alias",
                      "aten.transpose", "aten.as_strided", "aten.diagonal", "aten.unfold",
                      # several views, picked by `getitem` (`chunk` reaches us as `split`)
                      "aten.split", "aten.split_with_sizes", "aten.unbind"})


def _is_view(node: Any) -> bool:
    """A view op, or the `getitem` picking one view of a multi-view op (`split`)."""
    if isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target is operator.getitem:
        return _is_view_op(node.args[0])
    return _is_view_op(node)


def _is_view_op(node: Any) -> bool:
    return (isinstance(node, torch.fx.Node) and node.op == "call_function"
            and str(getattr(node.target, "_overloadpacket", "")) in VIEW_OPS
            and bool(node.args) and isinstance(node.args[0], torch.fx.Node))


def _contiguous_strides(shape: tuple[int, ...]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(int(size), 1)
    return strides[::-1]


def _strided(node: torch.fx.Node) -> bool:
    """Whether the node's recorded result is not laid out as a new contiguous tensor would be
    (a stride of a size-1 dimension is never read, so it does not count)."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor) or val.layout != torch.strided:
        return False
    if any(isinstance(s, torch.SymInt) for s in (*val.shape, *val.stride())):
        # symbolic sizes: leave the node as it is (`int()` of a SymInt would specialise it, a
        # guard that recompiles the graph for every new size)
        return False
    shape, strides = tuple(int(s) for s in val.shape), tuple(int(s) for s in val.stride())
    return any(size != 1 and st != want for size, st, want in zip(shape, strides, _contiguous_strides(shape)))


def views_to_pytorch(gm: torch.fx.GraphModule) -> int:
    """Give every strided view among `gm`'s outputs its own chain made in PyTorch (in place);
    returns how many outputs were rewritten."""
    output = next(n for n in reversed(gm.graph.nodes) if n.op == "output")
    made: dict[torch.fx.Node, torch.fx.Node] = {}
    graph = gm.graph

    def copy_chain(node: torch.fx.Node) -> torch.fx.Node:
        if not _is_view(node):
            return node
        if node not in made:
            base = copy_chain(node.args[0])  # type: ignore[arg-type]
            with graph.inserting_before(output):
                clone = graph.call_function(node.target, (base, *node.args[1:]), dict(node.kwargs))
            clone.meta = dict(node.meta)
            clone.meta[MARK] = True
            made[node] = clone
        return made[node]

    rewritten = 0

    def visit(arg: Any) -> Any:
        nonlocal rewritten
        if isinstance(arg, torch.fx.Node) and _is_view(arg) and _strided(arg):
            rewritten += 1
            return copy_chain(arg)
        return arg

    output.args = torch.fx.node.map_aggregate(output.args, visit)
    if rewritten:
        graph.lint()
        gm.recompile()
    return rewritten
