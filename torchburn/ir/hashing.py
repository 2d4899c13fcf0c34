"""Structural hashes of IR: the keys of the compile cache.

The hash is BLAKE3 of the canonical print (`printer.py`, `canonical=True`): names are replaced
by ones derived from their first appearance and provenance (locations, `origin` annotations)
is dropped. So two IRs that differ only in names or provenance hash alike, while any change to
structure, shapes, dtypes, attributes, ops or loop kinds changes the text and thus the hash.
Hashing the text rather than walking the nodes keeps one definition of "what matters": the
printer's.
"""
from __future__ import annotations

from typing import Union

from blake3 import blake3

from . import expr as ex
from . import loop as lp
from .printer import Printer, print_ir
from .tensor import Graph

Hashable = Union[Graph, lp.Kernel, lp.Program, ex.Expr]


def canonical_text(ir: Hashable) -> str:
    """The text the structural hash is computed from."""
    if isinstance(ir, ex.Expr):
        return "expr " + Printer(canonical=True).expr(ir)
    return print_ir(ir, canonical=True)


def structural_hash(ir: Hashable) -> str:
    """Hex BLAKE3 of the canonical print: blind to names and provenance, sensitive to all else."""
    return blake3(canonical_text(ir).encode("utf-8")).hexdigest()


def hash_key(*parts: str) -> str:
    """Hex BLAKE3 of several strings; each is length-prefixed so that ("ab", "c") and
    ("a", "bc") give different keys."""
    h = blake3()
    for part in parts:
        data = part.encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()
