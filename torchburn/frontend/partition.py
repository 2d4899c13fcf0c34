"""Split an ATen FX graph into compiled subgraphs and nodes that stay in PyTorch.

A node is compilable when it has a lowering, its `supports` check passes, and all tensors it
touches are CPU tensors of supported dtypes. Maximal groups of compilable nodes become
subgraphs (PyTorch's capability-based partitioner does the grouping, keeping the graph
acyclic); everything else runs as it would in eager mode.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch
import torch.fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupport

from . import lowerings  # noqa: F401  (registers lowerings)
from .dtypes import is_supported
from .registry import get_lowering

#: Ops that are deliberately left to PyTorch, with the reason (data-dependent shapes, RNG...).
NOT_COMPILED: dict[str, str] = {
    "aten.nonzero": "output shape depends on the data",
    "aten.masked_select": "output shape depends on the data",
    "aten.unique": "output shape depends on the data",
    "aten._local_scalar_dense": "reads a tensor value into Python",
    "aten.native_dropout": "random numbers are drawn by PyTorch",
    "aten.rand": "random numbers are drawn by PyTorch",
    "aten.randn": "random numbers are drawn by PyTorch",
    "aten.bernoulli": "random numbers are drawn by PyTorch",
}


def _tensor_problem(val: Any, what: str) -> Optional[str]:
    if isinstance(val, torch.Tensor):
        if val.device.type != "cpu":
            return f"{what} is on {val.device}"
        if not is_supported(val.dtype):
            return f"{what} has unsupported dtype {val.dtype}"
        if val.layout != torch.strided:
            return f"{what} has layout {val.layout}"
        return None
    if isinstance(val, (list, tuple)):
        for v in val:
            p = _tensor_problem(v, what)
            if p:
                return p
        return None
    if isinstance(val, (torch.SymInt, int, float, bool, type(None))):
        return None
    return f"{what} is a {type(val).__name__}"


def unsupported_reason(node: torch.fx.Node) -> Optional[str]:
    """Why `node` cannot be compiled, or None when it can."""
    if node.op != "call_function":
        return f"node kind {node.op}"
    name = str(node.target).rsplit(".", 1)[0] if "." in str(node.target) else str(node.target)
    packet = getattr(node.target, "_overloadpacket", None)
    if packet is not None and str(packet) in NOT_COMPILED:
        return NOT_COMPILED[str(packet)]
    lw = get_lowering(node.target)
    if lw is None:
        return f"no lowering for {node.target}"
    out = node.meta.get("val")
    if not isinstance(out, torch.Tensor) and not _is_tensor_tuple(out):
        return f"result of {name} is not a tensor or a tuple of tensors"
    problem = _tensor_problem(out, "result")
    if problem:
        return problem
    for arg in node.all_input_nodes:
        problem = _tensor_problem(arg.meta.get("val"), f"input {arg.name}")
        if problem:
            return problem
    if lw.supports is not None:
        return lw.supports(node)
    return None


def _is_tensor_tuple(val: Any) -> bool:
    """Results of multi-result ops (max pooling, sort, var_mean...): their lowerings return a
    tuple of values, and `getitem` nodes pick them out."""
    return (isinstance(val, (tuple, list)) and any(isinstance(v, torch.Tensor) for v in val)
            and all(v is None or isinstance(v, torch.Tensor) for v in val))


class _Support(OperatorSupport):
    def __init__(self, reasons: dict[torch.fx.Node, str]) -> None:
        super().__init__()
        self.reasons = reasons

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        reason = unsupported_reason(node)
        if reason is not None:
            self.reasons[node] = reason
            return False
        return True


@dataclass
class PartitionResult:
    module: torch.fx.GraphModule
    #: Names of the submodules holding compilable subgraphs.
    subgraphs: list[str]
    #: Nodes left to PyTorch: (op name, reason).
    fallbacks: list[tuple[str, str]] = field(default_factory=list)


VIEW_ONLY = {"aten.view", "aten._unsafe_view", "aten.permute", "aten.t", "aten.expand",
             "aten.squeeze", "aten.unsqueeze", "aten.slice", "aten.select", "aten.alias",
             "aten.transpose", "aten.reshape", "aten.detach"}


def partition(gm: torch.fx.GraphModule) -> PartitionResult:
    """Group compilable nodes into submodules `fused_N` of `gm` (modified in place)."""
    reasons: dict[torch.fx.Node, str] = {}
    partitioner = CapabilityBasedPartitioner(gm, _Support(reasons), allows_single_node_partition=True)
    parts = partitioner.propose_partitions()
    # A subgraph of views only would turn free views into copies: leave those to PyTorch.
    parts = [p for p in parts if any(str(getattr(n.target, "_overloadpacket", n.target)) not in VIEW_ONLY
                                     for n in p.nodes)]
    fallbacks = [(str(n.target), r) for n, r in reasons.items()
                 if n.op == "call_function" and not _is_python_scalar_op(n)]
    module = partitioner.fuse_partitions(parts) if parts else gm
    names = [n.target for n in module.graph.nodes if n.op == "call_module" and str(n.target).startswith("fused_")]
    return PartitionResult(module, names, fallbacks)


def _is_python_scalar_op(node: torch.fx.Node) -> bool:
    """Size arithmetic on SymInts (sym_size, operator.mul...) is bookkeeping, not a fallback."""
    val = node.meta.get("val")
    return not isinstance(val, torch.Tensor) and not (isinstance(val, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in val))
