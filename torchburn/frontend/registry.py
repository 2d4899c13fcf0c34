"""The lowering registry: which ATen ops the compiler handles, and how.

    @lowering(aten.exp.default)
    def exp(b: Builder, x: Value) -> Value:
        return b.unary("exp", x)

`supports` predicates refine a registration for node-specific limits (an argument the
lowering does not handle). Coverage is read from this table, so what the docs list is what
the code does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch
import torch.fx

SupportsFn = Callable[[torch.fx.Node], Optional[str]]


class Unsupported(Exception):
    """Raised by a lowering (or found by a `supports` check): this node cannot be compiled.

    The message is the reason `explain()` reports; the node runs in PyTorch instead.
    """


@dataclass(frozen=True)
class Lowering:
    op: Any
    fn: Callable[..., Any]
    supports: Optional[SupportsFn]


LOWERINGS: dict[Any, Lowering] = {}


def lowering(*ops: Any, supports: Optional[SupportsFn] = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register `fn` as the lowering of each op (an `OpOverload`, or an `OpOverloadPacket`
    meaning all of its overloads)."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        for op in ops:
            if isinstance(op, torch._ops.OpOverloadPacket):
                targets = [t for t in (getattr(op, o) for o in op.overloads()) if _is_functional(t)]
            else:
                targets = [op]
            for t in targets:
                LOWERINGS[t] = Lowering(t, fn, supports)
        return fn

    return deco


def _is_functional(op: Any) -> bool:
    """Out= and in-place overloads never appear in AOTAutograd's functional graphs."""
    schema = op._schema
    return not schema.is_mutable and "out" not in schema.overload_name


def get_lowering(target: Any) -> Optional[Lowering]:
    return LOWERINGS.get(target)


def lowered_ops() -> list[Any]:
    """Every op with a lowering, sorted by name."""
    return sorted(LOWERINGS, key=str)
