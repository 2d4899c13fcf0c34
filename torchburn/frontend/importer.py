"""Import an FX graph of ATen ops into the tensor-level IR.

Placeholders become graph inputs: tensors with their (possibly symbolic) shapes and, when not
contiguous, their strides; SymInt placeholders become symbol inputs. Each call node goes
through its registered lowering. Shapes come from the nodes' fake-tensor metadata, so the IR
sees exactly what Dynamo guarded on.

A lowering may write a symbolic size in another form than torch does (`repeat` of `[s0, ...]`
by 4 gives `s0 * 4`, torch's metadata says `4*s0`), and ops that need equal sizes (a batched
matmul's batch dims, broadcasting) compare sizes as written. So a node's result whose shape
provably equals its metadata's in another form is reshaped to the metadata's (a view, free):
every value between nodes carries torch's canonical sizes.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx

from ..ir import expr as ex
from ..ir.expr import Const, Expr, Var
from ..ir.loop import contiguous_strides
from ..ir.tensor import Graph, TensorType, Value
from . import lowerings  # noqa: F401  (registers lowerings)
from .builder import Builder
from .dtypes import to_ir
from .inplace_writes import is_marked
from .meta_keys import CONSTANT_META
from .registry import Unsupported, get_lowering
from .symbols import same_size, shape_to_exprs, size_to_expr


def _input_strides(meta: torch.Tensor, shape: tuple[Expr, ...]) -> Optional[tuple[Expr, ...]]:
    """None when the tensor is row-major contiguous (ignoring size-1 dims), else its strides."""
    strides = shape_to_exprs(meta.stride())
    expected = contiguous_strides(shape)
    if all(s == e or d == Const(1) for s, e, d in zip(strides, expected, shape)):
        return None
    return strides


def import_graph(gm: torch.fx.GraphModule, name: str = "main") -> Graph:
    """Lower every node of `gm` (all must have lowerings) into a new tensor-IR graph."""
    graph = Graph(name, [])
    builder = Builder(graph)
    env: dict[torch.fx.Node, Any] = {}
    bound = _bound_symbols(gm)
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("val")
            if isinstance(val, torch.SymInt):
                e = size_to_expr(val)
                if not isinstance(e, Var):
                    if all(v.name in bound for v in ex.walk(e) if isinstance(v, Var)):
                        # A derived size such as `s0 * 2` passed as an argument: it is an
                        # expression over symbols bound elsewhere, so no input needs it.
                        env[node] = e
                        graph.inputs.append(Var(f"_unused_{node.name}"))
                        continue
                    # An expression over a symbol no tensor shape carries (`k + 1` of a Python
                    # int Dynamo made dynamic): the argument's value is a symbol of its own.
                    e = Var(f"arg_{node.name}")
                env[node] = e
                graph.inputs.append(e)
            elif isinstance(val, torch.Tensor):
                shape = shape_to_exprs(val.shape)
                v = Value(node.name, TensorType(to_ir(val.dtype), shape), _input_strides(val, shape),
                          constant=bool(node.meta.get(CONSTANT_META)))
                env[node] = v
                graph.inputs.append(v)
            elif isinstance(val, (int, float, bool)):
                env[node] = val
                graph.inputs.append(Var(f"_const_{node.name}"))
            else:
                raise Unsupported(f"input {node.name} of type {type(val).__name__}")
        elif node.op == "call_function":
            lw = get_lowering(node.target)
            if lw is None:
                raise Unsupported(f"no lowering for {node.target}")
            builder.node = node
            args = torch.fx.node.map_arg(node.args, lambda n: env[n])
            kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
            result = lw.fn(builder, *args, **kwargs)
            _check_result(node, result)
            if is_marked(node):
                _mark_inplace(result, env.get(node.args[0]))
            env[node] = _canonical_shape(builder, node, result)
        elif node.op == "output":
            outs = node.args[0]
            outs = outs if isinstance(outs, (list, tuple)) else [outs]
            for o in outs:
                v = env[o] if isinstance(o, torch.fx.Node) else o
                if not isinstance(v, Value):
                    raise Unsupported(f"graph output {o} is not a tensor")
                graph.outputs.append(v)
        else:
            raise Unsupported(f"FX node kind {node.op}")
    graph.remove_dead_ops()
    graph.rename_canonically()
    _rename_symbols(graph)
    return graph


def _mark_inplace(result: Any, x: Any) -> None:
    """The IR op of a marked write-back (`inplace_writes.py`) stores in place, when it lowered
    to one `index_put`/`scatter` of the input itself (`lower-to-loops` checks the rest)."""
    op = result.producer if isinstance(result, Value) else None
    if op is not None and op.name in ("index_put", "scatter") and isinstance(x, Value) and op.operands[0] is x:
        op.attrs["inplace"] = True


def _bound_symbols(gm: torch.fx.GraphModule) -> set[str]:
    """Names of the symbols the inputs bind: plain symbolic-int arguments and the symbols in
    tensor inputs' sizes and strides (the launcher reads them from the arguments)."""
    names: set[str] = set()
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        val = node.meta.get("val")
        exprs: list[Expr] = []
        if isinstance(val, torch.SymInt):
            e = size_to_expr(val)
            exprs = [e] if isinstance(e, Var) else []
        elif isinstance(val, torch.Tensor):
            exprs = [*shape_to_exprs(val.shape), *shape_to_exprs(val.stride())]
        names.update(v.name for e in exprs for v in ex.walk(e) if isinstance(v, Var))
    return names


def _rename_symbols(graph: Graph) -> None:
    """Name symbols s0, s1, ... by first appearance among the inputs, so graphs that differ
    only in Dynamo's symbol numbering are the same IR (and share compiled code)."""
    order: list[str] = []
    for v in graph.inputs:
        exprs = [v] if isinstance(v, Var) else [*v.shape, *v.layout()]
        for e in exprs:
            for node in ex.walk(e):
                if isinstance(node, Var) and node.name not in order and not node.name.startswith("_"):
                    order.append(node.name)
    mapping: dict[str, Expr] = {name: Var(f"s{i}") for i, name in enumerate(order)}
    # Avoid capture: go through temporary names when a new name is an old one.
    temp = {name: Var(f"__tmp_{i}") for i, name in enumerate(order)}
    graph.substitute_symbols(temp)
    graph.substitute_symbols({f"__tmp_{i}": mapping[name] for i, name in enumerate(order)})


def _canonical_shape(builder: Builder, node: torch.fx.Node, result: Any) -> Any:
    """`result` with its metadata's shape where that is its own written otherwise (module
    docstring); unchanged when the forms differ and equality cannot be shown."""
    meta = node.meta.get("val")
    if not isinstance(meta, torch.Tensor) or not isinstance(result, Value):
        return result
    want = shape_to_exprs(meta.shape)
    if result.shape == want or not all(same_size(e, s) for e, s in zip(result.shape, meta.shape)):
        return result
    return builder.reshape(result, want)


def _check_result(node: torch.fx.Node, result: Any) -> None:
    """A lowering must produce the dtype and rank the node's metadata promises."""
    meta = node.meta.get("val")
    if isinstance(meta, torch.Tensor):
        if not isinstance(result, Value):
            raise Unsupported(f"lowering of {node.target} returned {type(result).__name__}")
        if result.dtype != to_ir(meta.dtype) or result.type.rank != meta.dim():
            raise Unsupported(
                f"lowering of {node.target} produced {result.dtype}{list(map(str, result.shape))}, "
                f"expected {meta.dtype}{list(meta.shape)}")
