"""The structural key of a kernel root: roots with equal keys lower to one kernel.

`lower-to-loops` builds a kernel from a root op and the producers inlined into it (the ops
whose results have no buffer), reading the buffers at the region's edge and writing the
root's buffer. A transformer's 30 layers give 30 roots per layer kernel that differ only in
names; lowering each and merging them afterwards (`dedup-kernels`) lowers the same kernel 30
times. With this key the lowering builds the first and calls it with the others' buffers.

The key is the BLAKE3 of the region printed canonically (value names by first appearance;
locations, `origin` and fusion bookkeeping (`kernel`, `fused_into`) left out; program symbols
keep their names, since kernels take them by name), preceded by each edge buffer's dtype,
shape and strides and whether it is a graph input, and followed by the root's output buffer
(a lowering reads nothing beyond its region's edge: `matmul.epilogue_views` once asked
whether a product lay upstream of an edge buffer, and took a view of that buffer for a view
of its own product). Everything the lowering reads is in the key, so two
roots with one key get the same kernel up to the names of their buffers; the edge buffers,
listed in the key's order with the output last, say which buffer each parameter is bound to.

    %4 = mul(%x, %w0) {fused_into = [3]}          %9 = mul(%y, %w1) {fused_into = [7]}
    %5 = exp(%4) {kernel = 3}                     %10 = exp(%9) {kernel = 7}

both key as

    edge %v0: f32[8, 16] strides [16, 1] temp
    edge %v1: f32[16] strides [1] input
    %v2 = mul(%v0, %v1) : f32[8, 16]
    %v3 = exp(%v2) : f32[8, 16]
    out %v3: f32[8, 16] strides [16, 1]

with edges (x, w0, tmp3) and (y, w1, tmp7).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from blake3 import blake3

from ...ir import loop as lp
from ...ir.printer import Printer
from ...ir.tensor import Op, Value

#: Op attributes that record fusion decisions by kernel number: they differ between copies
#: and no lowering reads them.
FUSION_ATTRS = frozenset({"kernel", "fused_into"})
@dataclass(frozen=True)
class RootKey:
    """A root's key and the buffer names bound to its kernel (edges in order, output last)."""

    key: str
    buffers: tuple[str, ...]


@dataclass(frozen=True)
class _BareOp:
    """An op as the key prints it: no location, no fusion attributes."""

    name: str
    operands: list[Value]
    attrs: Mapping[str, Any]
    results: list[Value]
    loc: Optional[str] = None


class _KeyPrinter(Printer):
    """Canonical value names, symbols by their own names (a kernel binds them by name)."""

    def __init__(self) -> None:
        super().__init__(canonical=True)

    def var_name(self, name: str) -> str:
        return name


def root_key(root: Op, buffers: Mapping[Value, lp.Buffer]) -> Optional[RootKey]:
    """The key of `root`'s kernel (see the module docstring); None for a root of several
    results (lowered on its own)."""
    if len(root.results) != 1 or root.result not in buffers:
        return None
    edges: list[Value] = []
    seen_edges: set[int] = set()
    ops: list[Op] = []
    visited: set[int] = set()
    stack: list[tuple[Op, bool]] = [(root, False)]
    while stack:  # post-order over the inlined region; edges in order of first reading
        op, expanded = stack.pop()
        if expanded:
            ops.append(op)
            continue
        if id(op) in visited:
            continue
        visited.add(id(op))
        stack.append((op, True))
        for v in op.operands:
            if (v in buffers or v.producer is None) and id(v) not in seen_edges:
                seen_edges.add(id(v))
                edges.append(v)
        stack.extend((v.producer, False) for v in reversed(op.operands)
                     if v not in buffers and v.producer is not None and id(v.producer) not in visited)
    if any(v not in buffers for v in edges):
        return None  # an operand without a buffer and without a producer: not ours to key
    p = _KeyPrinter()
    lines = []
    for v in edges:
        kind = "input" if v.producer is None else "temp"
        lines.append(f"edge {_buffer_text(p, v, buffers[v])} {kind}")
    for op in ops:
        attrs = {k: a for k, a in op.attrs.items() if k not in FUSION_ATTRS}
        lines.append(p.op(_BareOp(op.name, op.operands, attrs, op.results)))
    out = buffers[root.result]
    lines.append(f"out {_buffer_text(p, root.result, out)}")
    key = blake3("\n".join(lines).encode("utf-8")).hexdigest()
    return RootKey(key, tuple(buffers[v].name for v in edges) + (out.name,))


def _buffer_text(p: Printer, v: Value, b: lp.Buffer) -> str:
    return f"{p.value_name(v.name)}: {b.dtype}{p.dims(b.shape)} strides {p.dims(b.strides)}"
