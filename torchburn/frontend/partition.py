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
from torch.fx.node import _get_qualified_name
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner, Partition
from torch.fx.passes.operator_support import OperatorSupport

from . import lowerings  # noqa: F401  (registers lowerings)
from .dtypes import is_supported
from .fuse_parts import fuse_parts
from .registry import get_lowering
from .symfloat_args import is_symfloat_wrap
from .view_outputs import MARK as OUTPUT_VIEW

#: Ops that are deliberately left to PyTorch, with the reason. This is the one list: the
#: OpInfo test expects exactly these (and tensors of dtypes or layouts the compiler never takes,
#: see `is_deliberate`) to fall back, and checks that the results still equal eager's.
NOT_COMPILED: dict[str, str] = {
    # Output shape depends on the values.
    **dict.fromkeys(("aten.nonzero", "aten.masked_select", "aten.unique", "aten._unique", "aten._unique2",
                     "aten.unique_dim", "aten.unique_consecutive", "aten.repeat_interleave",
                     "aten.bincount"),
                    "output shape depends on the data"),
    # Per-element loops whose trip count is read from the data (a recurrence to degree n, a
    # series summed until it converges): an elementwise kernel has no such loop.
    **dict.fromkeys(("aten.polygamma", "aten.special_zeta", "aten.igamma", "aten.igammac",
                     "aten.special_chebyshev_polynomial_t", "aten.special_chebyshev_polynomial_u",
                     "aten.special_chebyshev_polynomial_v", "aten.special_chebyshev_polynomial_w",
                     "aten.special_shifted_chebyshev_polynomial_t",
                     "aten.special_shifted_chebyshev_polynomial_u",
                     "aten.special_shifted_chebyshev_polynomial_v",
                     "aten.special_shifted_chebyshev_polynomial_w",
                     "aten.special_hermite_polynomial_h", "aten.special_hermite_polynomial_he",
                     "aten.special_laguerre_polynomial_l", "aten.special_legendre_polynomial_p"),
                    "a per-element loop whose trip count depends on the data"),
    "aten._local_scalar_dense": "reads a tensor value into Python",
    "aten.equal": "returns a Python bool",
    # Random numbers: PyTorch's generator draws them, so seeded runs match eager.
    **dict.fromkeys(("aten.native_dropout", "aten.rand", "aten.randn", "aten.randint", "aten.rand_like",
                     "aten.randn_like", "aten.randint_like", "aten.randperm", "aten.bernoulli",
                     "aten.normal", "aten.normal_functional", "aten.uniform", "aten.exponential",
                     "aten.geometric", "aten.log_normal", "aten.cauchy", "aten.random", "aten.multinomial",
                     "aten.poisson", "aten.binomial", "aten._standard_gamma", "aten._sample_dirichlet",
                     "aten.rrelu_with_noise", "aten.rrelu_with_noise_functional", "aten._fused_dropout"),
                    "random numbers are drawn by PyTorch"),
    # Pooling regions placed by random samples PyTorch draws (`aten.rand` above) right before.
    **dict.fromkeys(("aten.fractional_max_pool2d", "aten.fractional_max_pool3d"),
                    "its pooling regions come from random samples PyTorch draws"),
    # Factorizations and solvers: PyTorch calls LAPACK.
    **dict.fromkeys(("aten._linalg_svd", "aten._linalg_eigh", "aten.linalg_eig", "aten._linalg_eigvals",
                     "aten.linalg_eigvals", "aten.linalg_qr", "aten.geqrf", "aten.ormqr",
                     "aten.linalg_householder_product", "aten.linalg_cholesky_ex", "aten.cholesky",
                     "aten.cholesky_inverse", "aten.cholesky_solve", "aten.linalg_lu", "aten.linalg_lu_factor_ex",
                     "aten.linalg_lu_solve", "aten.lu_unpack", "aten._lu_with_info", "aten.lu_solve",
                     "aten.linalg_ldl_factor_ex", "aten.linalg_ldl_solve", "aten.linalg_inv_ex",
                     "aten._linalg_solve_ex", "aten.linalg_solve_triangular", "aten.triangular_solve",
                     "aten._linalg_det", "aten._linalg_slogdet", "aten.linalg_matrix_exp",
                     "aten.linalg_lstsq", "aten.linalg_pinv", "aten._linalg_check_errors"),
                    "a LAPACK factorization or solver"),
    "with_effects": "an op with side effects (LAPACK's error checks) that must run in order",
    # Complex numbers and FFTs (complex results).
    **dict.fromkeys(("aten._fft_r2c", "aten._fft_c2c", "aten._fft_c2r", "aten.view_as_complex",
                     "aten.view_as_real", "aten.complex", "aten.polar", "aten._conj", "aten._conj_physical"),
                    "complex numbers are not compiled"),
}


#: Namespaces of torch.distributed's collectives (functional collectives and their waits, as
#: Dynamo, DTensor, FSDP2 and compiled autograd put them in graphs; c10d's own ops): each runs
#: in PyTorch, on the process group, at its place in the graph; the compute around it is compiled.
COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "_c10d_functional_autograd", "c10d", "_dtensor")
COLLECTIVE_REASON = "a collective: it runs in PyTorch on the process group (torch.distributed), at its place in the graph"


def is_collective(target: str) -> bool:
    """Whether `target` (such as `_c10d_functional.all_reduce.default`) is a torch.distributed op."""
    return target.split(".", 1)[0] in COLLECTIVE_NAMESPACES


def is_deliberate(target: str, reason: str) -> bool:
    """Whether a node left to PyTorch (`target` such as `aten.nonzero.default`, with the
    reason the partitioner gave) stays there by design: its op is in NOT_COMPILED, or it
    touches a tensor the compiler never takes (complex, float8 or quantized dtypes, sparse), or
    it is a collective (COLLECTIVE_NAMESPACES)."""
    packet = target.rsplit(".", 1)[0]
    return (target in NOT_COMPILED or packet in NOT_COMPILED or is_collective(target)
            or " has unsupported dtype " in reason or " has layout " in reason)


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
    if is_collective(str(node.target)):
        return COLLECTIVE_REASON
    lw = get_lowering(node.target)
    if lw is None:
        # A result of a dtype the compiler never takes (uint64, complex) says more than that.
        return _tensor_problem(node.meta.get("val"), "result") or f"no lowering for {node.target}"
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
    def __init__(self, reasons: dict[torch.fx.Node, str], library: Optional[dict[torch.fx.Node, str]] = None) -> None:
        super().__init__()
        self.reasons = reasons
        self.library = library or {}

    def is_node_supported(self, submodules: Any, node: torch.fx.Node) -> bool:
        if node.meta.get(OUTPUT_VIEW):  # a free view in PyTorch by design (view_outputs.py)
            return False
        if node in self.library:  # the tuner chose a library call (backend/library_calls.py)
            return False
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
    #: The partitions as fused, each as (node name, node order) pairs: replaying them on the
    #: same graph (`fx_cache.py`) gives the same submodules without asking the lowerings again.
    plan: list[list[tuple[str, Optional[int]]]] = field(default_factory=list)
    #: Nodes kept as library calls by the tuner's choice: (op name, why). Not fallbacks: each
    #: could be compiled, and was measured slower than the library.
    library_calls: list[tuple[str, str]] = field(default_factory=list)


VIEW_ONLY = {"aten.view", "aten._unsafe_view", "aten.permute", "aten.t", "aten.expand",
             "aten.squeeze", "aten.unsqueeze", "aten.slice", "aten.select", "aten.alias",
             "aten.transpose", "aten.reshape", "aten.detach"}


def partition(gm: torch.fx.GraphModule, library: Optional[dict[torch.fx.Node, str]] = None) -> PartitionResult:
    """Group compilable nodes into submodules `fused_N` of `gm` (modified in place). The nodes
    of `library` (node -> why) stay library calls between the subgraphs."""
    reasons: dict[torch.fx.Node, str] = {}
    library = library or {}
    support = _Support(reasons, library)
    parts = convex_partition(gm, support)
    if parts is None and library:  # library calls cut the graph: one subgraph per layer between them
        parts = layered_partition(gm, support)
    if parts is None:  # torch's partitioner (quadratic in the graph: seconds for 30 layers)
        reasons.clear()
        parts = CapabilityBasedPartitioner(gm, support, allows_single_node_partition=True).propose_partitions()
    # A subgraph of views only would turn free views into copies: leave those to PyTorch.
    parts = [p for p in parts if any(str(getattr(n.target, "_overloadpacket", n.target)) not in VIEW_ONLY
                                     for n in p.nodes)]
    fallbacks = [(str(n.target), r) for n, r in reasons.items()
                 if n.op == "call_function" and not _is_python_scalar_op(n) and not _is_input_writeback(n)
                 and not is_symfloat_wrap(n)]
    plan = [[(n.name, order) for n, order in p.nodes.items()] for p in parts]
    module = fuse_parts(gm, [p.nodes for p in parts])
    names = [n.target for n in module.graph.nodes if n.op == "call_module" and str(n.target).startswith("fused_")]
    calls = [(str(n.target), why) for n, why in library.items()]
    return PartitionResult(module, names, fallbacks, plan, calls)


def convex_partition(gm: torch.fx.GraphModule, support: OperatorSupport) -> Optional[list[Partition]]:
    """The partition torch's `CapabilityBasedPartitioner` proposes, in linear time, when it is
    all the supported nodes: no unsupported node lies between two supported ones (its greedy,
    horizontally fusing merge then joins every supported node into one partition), and no
    node's getitem users differ from it in support (they would be moved to its partition).
    None otherwise (the caller asks torch's partitioner). Nodes are asked in torch's order
    (last first) and keep its node orders (position from the end)."""
    nodes = list(gm.graph.nodes)
    submodules = dict(gm.named_modules())
    supported = {n: support.is_node_supported(submodules, n) for n in reversed(nodes)}
    upstream: dict[torch.fx.Node, bool] = {}
    for n in nodes:
        upstream[n] = any(supported[i] or upstream[i] for i in n.all_input_nodes)
    downstream: dict[torch.fx.Node, bool] = {}
    for n in reversed(nodes):
        downstream[n] = any(supported[u] or downstream[u] for u in n.users)
    for n in nodes:
        if not supported[n] and upstream[n] and downstream[n]:
            return None
        if n.users and all(u.op == "call_function" and _get_qualified_name(u.target) == "_operator.getitem"
                           for u in n.users) and any(supported[u] != supported[n] for u in n.users):
            return None
    chosen = [n for n in nodes if supported[n]]
    if not chosen:
        return []
    position = {n: i for i, n in enumerate(reversed(nodes))}
    return [Partition(id=0, nodes=chosen, node_orders=[position[n] for n in chosen])]


def layered_partition(gm: torch.fx.GraphModule, support: OperatorSupport) -> Optional[list[Partition]]:
    """A partition in linear time for graphs cut by nodes that stay in PyTorch (library calls
    between convolutions): each node's layer is the most nodes left to PyTorch on any path
    from the graph's inputs to it, and the supported nodes of one layer form one subgraph.

    Layers never decrease along an edge and grow past a node left to PyTorch, so a path
    between two nodes of one layer passes only supported nodes of that layer: each subgraph
    is convex, and the subgraphs, ordered by layer, form no cycle. None when a node's getitem
    users differ from it in support (the caller asks torch's partitioner).

        x -> conv(aten) -> bn -> relu -> conv(aten) -> add(x)
        layers: bn, relu: 1; add: 2 (x's own layer 0 holds nothing to compile)
    """
    nodes = list(gm.graph.nodes)
    submodules = dict(gm.named_modules())
    supported = {n: support.is_node_supported(submodules, n) for n in reversed(nodes)}
    layer: dict[torch.fx.Node, int] = {}
    for n in nodes:
        layer[n] = max((layer[i] + (0 if supported[i] or i.op in ("placeholder", "get_attr") else 1) for i in n.all_input_nodes),
                       default=0)
        if n.users and all(u.op == "call_function" and _get_qualified_name(u.target) == "_operator.getitem"
                           for u in n.users) and any(supported[u] != supported[n] for u in n.users):
            return None
    position = {n: i for i, n in enumerate(reversed(nodes))}
    groups: dict[int, list[torch.fx.Node]] = {}
    for n in nodes:
        if supported[n]:
            groups.setdefault(layer[n], []).append(n)
    return [Partition(id=i, nodes=members, node_orders=[position[n] for n in members])
            for i, (_, members) in enumerate(sorted(groups.items()))]


def _is_input_writeback(node: torch.fx.Node) -> bool:
    """AOTAutograd's write-back of a mutated graph input (batch norm's running statistics):
    `copy_(input, new_value)` with the new value computed in the graph. It copies a result
    into the caller's tensor, as AOTAutograd's own epilogue would; it computes nothing, so it
    is not a fallback. An in-place op on an input (`x.mul_(2)`) returns the write-back too."""
    return (node.target is torch.ops.aten.copy_.default
            and all(u.op == "output" for u in node.users)
            and isinstance(node.args[0], torch.fx.Node) and node.args[0].op == "placeholder")


def _is_python_scalar_op(node: torch.fx.Node) -> bool:
    """Size arithmetic on SymInts (sym_size, operator.mul...) is bookkeeping, not a fallback."""
    val = node.meta.get("val")
    return not isinstance(val, torch.Tensor) and not (isinstance(val, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in val))
