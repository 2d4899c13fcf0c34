"""The builder lowerings use to emit tensor IR: type promotion, broadcasting, scalars, and
half-precision compute (f16/bf16 are computed in f32 and stored in their own type)."""
from __future__ import annotations

import functools
import os
import re
from typing import Any, Optional, Sequence, Union

import torch
import torch.fx
from torch._prims_common import ELEMENTWISE_TYPE_PROMOTION_KIND, elementwise_dtypes

from ..ir import dtypes as dt
from ..ir import expr as ex
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr
from ..ir.tensor import Graph, TensorType, Value
from .dtypes import to_ir, to_torch
from .registry import Unsupported

Operand = Union[Value, Expr, int, float, bool]
PROMOTE = ELEMENTWISE_TYPE_PROMOTION_KIND


_PACKAGE = os.path.dirname(os.path.dirname(os.path.realpath(__file__))) + os.sep


@functools.lru_cache(maxsize=4096)
def _in_torchburn(path: str) -> bool:
    """Whether a stack frame's file is part of the torchburn package (kept per path: resolving
    links asks the file system, and every op of a 30-layer graph asks again)."""
    return os.path.realpath(path).startswith(_PACKAGE)


#: (promotion kind, each operand's kind) -> (compute dtype, result dtype) (`Builder.promote`).
_PROMOTIONS: dict[tuple[Any, ...], tuple[DType, DType]] = {}


def _promotion_kind(x: Operand) -> tuple[Any, ...]:
    """What torch's type promotion sees of an operand (`Builder._promotion_proxy`)."""
    if isinstance(x, Value):
        return ("tensor", x.dtype.name, x.type.rank == 0)
    if isinstance(x, Expr):
        return ("int",) if x.dtype.is_int else ("float",)
    return ("scalar", type(x).__name__)


class Builder:
    """Emits ops into `graph` on behalf of the FX node being lowered (`node`)."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.node: Optional[torch.fx.Node] = None
        self._loc: tuple[Optional[torch.fx.Node], Optional[str]] = (None, None)

    # ---- basics ---------------------------------------------------------------------------------
    @property
    def loc(self) -> Optional[str]:
        """Where the node came from: `aten.op @ file:line` when Dynamo recorded the user's
        source line, else `aten.op @ module.path (Class)` from the module stack (a model made
        only of torch.nn modules has no user line in the traced frames), else `aten.op`."""
        if self.node is None:
            return None
        if self._loc[0] is self.node:  # a lowering emits several ops for one node
            return self._loc[1]
        loc = self._node_loc()
        self._loc = (self.node, loc)
        return loc

    def _node_loc(self) -> str:
        assert self.node is not None
        target = str(self.node.target)
        trace = self.node.meta.get("stack_trace")
        if trace:
            lines = [ln.strip() for ln in trace.strip().splitlines() if ln.strip().startswith("File ")]
            frames = [ln.replace("File ", "").split(", in ")[0].replace('"', "").replace(", line ", ":") for ln in lines]
            # the user's line, not torchburn's own (a QuantizedLinear's forward calls our op)
            users = [f for f in frames if not _in_torchburn(f.rsplit(":", 1)[0])]
            if users:
                return f"{target} @ {users[-1]}"
        stack = self.node.meta.get("nn_module_stack") or self.node.meta.get("fwd_nn_module_stack")
        if stack:
            path, cls = list(stack.values())[-1]
            path = re.sub(r"^L\['[^']*'\]\.?", "", str(path))
            return f"{target} @ {path or 'self'} ({getattr(cls, '__name__', cls)})"
        return target

    def op(self, name: str, *operands: Value, **attrs: Any) -> Value:
        return self.graph.add_op(name, operands, attrs, loc=self.loc).result

    def out_meta(self, i: Optional[int] = None) -> Any:
        assert self.node is not None
        val = self.node.meta["val"]
        return val if i is None else val[i]

    @property
    def out_dtype(self) -> DType:
        meta = self.out_meta()
        if isinstance(meta, (tuple, list)):
            meta = meta[0]
        return to_ir(meta.dtype)

    # ---- scalars and promotion --------------------------------------------------------------------
    @staticmethod
    def _promotion_proxy(x: Operand) -> Any:
        if isinstance(x, Value):
            return torch.empty([1] * x.type.rank, dtype=to_torch(x.dtype), device="meta")
        if isinstance(x, Expr):
            return 1 if x.dtype.is_int else 1.0
        return x

    def promote(self, *args: Operand, kind: PROMOTE = PROMOTE.DEFAULT) -> tuple[DType, DType]:
        """(compute dtype, result dtype) for an elementwise op, by torch's own rules (asked once
        per kind of operands: a tensor by dtype and whether it is 0-dim, a scalar by type)."""
        key = (kind, *(_promotion_kind(a) for a in args))
        hit = _PROMOTIONS.get(key)
        if hit is None:
            proxies = [self._promotion_proxy(a) for a in args]
            comp, res = elementwise_dtypes(*proxies, type_promotion_kind=kind)
            hit = _PROMOTIONS[key] = (to_ir(comp), to_ir(res))
        return hit

    def full(self, value: Union[int, float, bool, Expr], shape: Sequence[Expr], dtype: DType) -> Value:
        if isinstance(value, float) and dtype.is_int:
            raise Unsupported(f"float constant {value} for an integer tensor")
        return self.op("full", shape=tuple(shape), value=value, dtype=dtype)

    def as_tensor(self, x: Operand, dtype: DType) -> Value:
        """A tensor operand of `dtype`: values are cast, Python scalars become rank-0 `full`s."""
        if isinstance(x, Value):
            return self.cast(x, dtype)
        if isinstance(x, bool) and not dtype.is_bool:
            x = int(x)
        if isinstance(x, float) and dtype.is_int:
            x = int(x)
        return self.full(x, (), dtype)

    def cast(self, v: Value, dtype: DType) -> Value:
        if v.dtype == dtype:
            return v
        return self.op("cast", v, dtype=dtype)

    # ---- shapes ---------------------------------------------------------------------------------
    def broadcast_shapes(self, *shapes: tuple[Expr, ...]) -> tuple[Expr, ...]:
        rank = max((len(s) for s in shapes), default=0)
        out: list[Expr] = []
        for i in range(rank):
            dim: Optional[Expr] = None
            for s in shapes:
                j = i - (rank - len(s))
                if j < 0:
                    continue
                d = s[j]
                if d == Const(1):
                    dim = dim or d
                elif dim is None or dim == Const(1):
                    dim = d
                elif dim != d:
                    # Equal at run time by the graph's guards if symbolic; prefer the symbol.
                    if isinstance(dim, Const) and isinstance(d, Const):
                        raise Unsupported(f"shapes {shapes} do not broadcast")
            out.append(dim if dim is not None else Const(1))
        return tuple(out)

    def expand(self, v: Value, shape: Sequence[Expr]) -> Value:
        shape = tuple(shape)
        if v.shape == shape:
            return v
        if v.type.rank < len(shape):
            v = self.op("reshape", v, shape=(Const(1),) * (len(shape) - v.type.rank) + v.shape)
            if v.shape == shape:
                return v
        return self.op("expand", v, shape=shape)

    def broadcast(self, *vals: Value) -> list[Value]:
        """`vals` expanded to their common shape. A symbolic size written otherwise than the
        common one (`(s0 * s0) // s0` against `s0`: torch's metadata does not always simplify)
        is the same size at run time by the graph's guards (see `broadcast_shapes`): that
        operand is first reshaped to the common form, a view, so that `expand` only grows
        dims of size 1."""
        shape = self.broadcast_shapes(*(v.shape for v in vals))
        out = []
        for v in vals:
            lead = len(shape) - v.type.rank
            aligned = tuple(d if d == Const(1) or d == shape[lead + j] else shape[lead + j]
                            for j, d in enumerate(v.shape))
            out.append(self.expand(self.reshape(v, aligned), shape))
        return out

    def reshape(self, v: Value, shape: Sequence[Expr]) -> Value:
        shape = tuple(ex.as_expr(d) for d in shape)
        return v if v.shape == shape else self.op("reshape", v, shape=shape)

    # ---- elementwise helpers -------------------------------------------------------------------------
    def elementwise(self, name: str, *args: Operand, kind: PROMOTE = PROMOTE.DEFAULT,
                    compute: Optional[DType] = None) -> Value:
        """Promote, broadcast, compute `name` in the compute dtype, cast to the result dtype."""
        comp, res = self.promote(*args, kind=kind)
        if compute is not None:
            comp = compute
        tensors = self.broadcast(*(self.as_tensor(a, comp) for a in args))
        out = self.op(name, *tensors)
        if out.dtype.is_bool:
            return out
        return self.cast(out, res)

    def unary(self, name: str, x: Operand, kind: PROMOTE = PROMOTE.DEFAULT) -> Value:
        return self.elementwise(name, x, kind=kind)

    def compute_dtype(self, v: Value) -> DType:
        return dt.compute_dtype(v.dtype)

    def to_compute(self, v: Value) -> Value:
        return self.cast(v, self.compute_dtype(v))

    def scalar_like(self, value: Union[int, float, bool, Expr], like: Value) -> Value:
        """A constant broadcast to `like`'s shape and dtype."""
        return self.expand(self.full(value, (), like.dtype), like.shape)


def normalize_dim(dim: int, rank: int) -> int:
    r = max(rank, 1)
    if not -r <= dim < r:
        raise Unsupported(f"dimension {dim} out of range for rank {rank}")
    return dim % r


def numel(shape: Sequence[Expr]) -> Expr:
    n: Expr = Const(1)
    for d in shape:
        n = ex.mul(n, d)
    return n


def tensor_type(meta: Any) -> TensorType:
    from .symbols import shape_to_exprs

    return TensorType(to_ir(meta.dtype), shape_to_exprs(meta.shape))
