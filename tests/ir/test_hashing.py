"""Tests for torchburn/ir/hashing.py: blind to names and provenance, sensitive to structure."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import blake3
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.hashing import canonical_text, hash_key, structural_hash
from torchburn.ir.parser import parse_graph, parse_kernel, parse_program
from torchburn.ir.printer import print_ir
from torchburn.ir.tensor import Graph, TensorType

from .strategies import graphs, kernels, programs, rename_graph, rename_kernel, rename_program, renamings

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def test_hash_is_hex_blake3_of_the_canonical_print() -> None:
    g = parse_graph("graph @g(%x: f32[4]) {\n  %y = exp(%x) : f32[4]\n  return %y\n}\n")
    h = structural_hash(g)
    assert len(h) == 64 and int(h, 16) >= 0
    assert h == blake3.blake3(print_ir(g, canonical=True).encode()).hexdigest()
    assert structural_hash(ex.Var("a") + 1) == structural_hash(ex.Var("b") + 1)
    assert canonical_text(ex.Var("a") + 1) == "expr x0 + 1"


# ---- renaming does not change the hash ---------------------------------------------------------

@SETTINGS
@given(kernels(), renamings())
def test_kernel_hash_ignores_names(k: lp.Kernel, rename: Callable[[str], str]) -> None:
    renamed = rename_kernel(k, rename)
    assert print_ir(renamed) != print_ir(k)
    assert structural_hash(renamed) == structural_hash(k)


@SETTINGS
@given(programs(), renamings())
def test_program_hash_ignores_names(p: lp.Program, rename: Callable[[str], str]) -> None:
    renamed = rename_program(p, rename)
    assert print_ir(renamed) != print_ir(p)
    assert structural_hash(renamed) == structural_hash(p)


@SETTINGS
@given(graphs(), renamings())
def test_graph_hash_ignores_names(g: Graph, rename: Callable[[str], str]) -> None:
    renamed = rename_graph(g, rename)
    assert print_ir(renamed) != print_ir(g)
    assert structural_hash(renamed) == structural_hash(g)
    # The round trip keeps the hash too.
    assert structural_hash(parse_graph(print_ir(g))) == structural_hash(g)


def test_hash_ignores_provenance() -> None:
    text = "graph @g(%x: f32[4]) {\n  %y = exp(%x) {origin = \"aten.exp\"} : f32[4] loc(\"m.py:1\")\n  return %y\n}\n"
    bare = "graph @g(%x: f32[4]) {\n  %y = exp(%x) : f32[4]\n  return %y\n}\n"
    assert structural_hash(parse_graph(text)) == structural_hash(parse_graph(bare))
    k = "kernel @k(%x: f32[4]) attrs {origin = \"a\"} {\n  for i in 0..4 attrs {origin = \"b\"} {\n  }\n}\n"
    k2 = "kernel @k(%x: f32[4]) {\n  for i in 0..4 {\n  }\n}\n"
    assert structural_hash(parse_kernel(k)) == structural_hash(parse_kernel(k2))


# ---- any structural change does ------------------------------------------------------------------

GRAPH = """graph @g(%x: f32[s0, 4], s0) {
  %a = exp(%x) : f32[s0, 4]
  %b = reduce_sum(%a) {dims = [1], keepdim = false} : f32[s0]
  return %b
}
"""
KERNEL = """kernel @k(%x: f32[s0, 8] strides [8, 1], %y: f32[s0, 8] strides [8, 1]) symbols(s0) {
  parallel for i in 0..s0 {
    for j in 0..8 {
      %y[i, j] = exp(%x[i, j])
    }
  }
}
"""
PROGRAM = """program @main(%x: f32[s0, 8] strides [8, 1]) -> (%y: f32[s0, 8] strides [8, 1]) symbols(s0) {
  call @k(%x, %y)
}
""" + KERNEL


def test_graph_hash_sensitivity() -> None:
    base = structural_hash(parse_graph(GRAPH))
    for old, new in [("%x: f32[s0, 4]", "%x: f32[s0, 5]"),          # shape
                     ("f32", "f16"),                                 # dtype
                     ("dims = [1]", "dims = [0]"),                   # attribute
                     ("keepdim = false", "keepdim = true"),
                     ("exp(%x)", "log(%x)"),                         # op
                     ("return %b", "return %a"),                     # outputs
                     ("s0) {", "s0, s1) {")]:                        # inputs
        assert old in GRAPH
        assert structural_hash(parse_graph(GRAPH.replace(old, new))) != base, (old, new)


def test_kernel_and_program_hash_sensitivity() -> None:
    for text, parse in ((KERNEL, parse_kernel), (PROGRAM, parse_program)):
        base = structural_hash(parse(text))  # type: ignore[operator]
        for old, new in [("parallel for", "for"),                       # loop kind
                         ("for j in 0..8", "vectorized for j in 0..8"),
                         ("0..8", "0..16"),                             # extent
                         ("%x: f32[s0, 8]", "%x: f32[s0, 9]"),          # shape
                         ("strides [8, 1], %y", "strides [1, s0], %y"),  # strides
                         ("%x: f32", "%x: f64"),                        # dtype
                         ("exp(", "log("),                              # computation
                         ("%y[i, j]", "%y[j, i]")]:                     # index order
            assert old in text
            assert structural_hash(parse(text.replace(old, new))) != base, (old, new)  # type: ignore[operator]


def _first_loop(s: lp.Stmt) -> lp.For | None:
    for node in lp.walk_stmts(s):
        if isinstance(node, lp.For):
            return node
    return None


def _replace_stmt(s: lp.Stmt, old: lp.Stmt, new: lp.Stmt) -> lp.Stmt:
    if s is old:
        return new
    if isinstance(s, lp.Block):
        return lp.Block(tuple(_replace_stmt(x, old, new) for x in s.stmts))
    if isinstance(s, lp.For):
        return replace(s, body=_replace_stmt(s.body, old, new))
    if isinstance(s, lp.If):
        orelse = None if s.orelse is None else _replace_stmt(s.orelse, old, new)
        return lp.If(s.cond, _replace_stmt(s.then, old, new), orelse)
    return s


@SETTINGS
@given(kernels(), st.sampled_from(lp.LOOP_KINDS), st.sampled_from([dt.f32, dt.i8, dt.bool_]))
def test_kernel_hash_sees_loop_kinds_and_dtypes(k: lp.Kernel, kind: str, dtype: dt.DType) -> None:
    base = structural_hash(k)
    loop = _first_loop(k.body)
    if loop is not None and loop.kind != kind:
        changed = replace(k, body=_replace_stmt(k.body, loop, replace(loop, kind=kind)))
        assert structural_hash(changed) != base
    p = k.params[0]
    assume(p.dtype != dtype)
    assert structural_hash(replace(k, params=(replace(p, dtype=dtype), *k.params[1:]))) != base


@SETTINGS
@given(graphs(), st.integers(1, 7))
def test_graph_hash_sees_input_shapes(g: Graph, extra: int) -> None:
    base = structural_hash(g)
    x = g.tensor_inputs()[0]
    x.type = TensorType(x.type.dtype, (*x.type.shape, ex.Const(extra)))
    assert structural_hash(g) != base


# ---- hash_key ------------------------------------------------------------------------------------

def test_hash_key() -> None:
    assert hash_key("a", "b") == hash_key("a", "b")
    assert hash_key("ab", "c") != hash_key("a", "bc")
    assert hash_key("a", "") != hash_key("a")
    assert hash_key() != hash_key("")
    assert len(hash_key("x")) == 64
