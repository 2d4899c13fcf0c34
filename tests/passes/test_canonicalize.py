"""`canonicalize`: read IR text, run the pass, compare with the expected IR text."""
from __future__ import annotations

import textwrap

import pytest

from torchburn.ir import dtypes as dt
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_graph
from torchburn.ir.verifier import verify
from torchburn.passes.base import get_pass, parse_pipeline
from torchburn.passes.tensor.canonicalize import Canonicalize, exact_conversion
from torchburn.passes.pipeline import DEFAULT_TENSOR, Pipeline


def canon(text: str, **options: object) -> str:
    g = parse_graph(textwrap.dedent(text))
    verify(g)
    out = Canonicalize(**options).run(g)  # type: ignore[arg-type]
    verify(out)
    return print_graph(out).strip()


def check(before: str, after: str, **options: object) -> None:
    got = canon(before, **options)
    want = textwrap.dedent(after).strip()
    assert got == want, f"IR differs.\n--- got ---\n{got}\n--- expected ---\n{want}"


def test_registered_and_in_the_default_pipeline_before_fuse() -> None:
    assert parse_pipeline("canonicalize") == [Canonicalize()]
    assert DEFAULT_TENSOR.index("canonicalize") < DEFAULT_TENSOR.index("fuse")
    names = [p.name for p in Pipeline.default().tensor]
    assert names.index("canonicalize") < names.index("fuse")


def test_module_docstring_example() -> None:
    check("""
        graph @main(%x: f32[4, 8]) {
          %0 = full() {shape = [], value = 1.0, dtype = f32} : f32[]
          %1 = reshape(%0) {shape = [1, 1]} : f32[1, 1]
          %2 = expand(%1) {shape = [4, 8]} : f32[4, 8]
          %3 = mul(%x, %2) : f32[4, 8]
          %4 = permute(%3) {dims = [1, 0]} : f32[8, 4]
          %5 = permute(%4) {dims = [1, 0]} : f32[4, 8]
          %6 = cast(%5) {dtype = f64} : f64[4, 8]
          %7 = cast(%6) {dtype = f32} : f32[4, 8]
          return %7
        }
    """, """
        graph @main(%x: f32[4, 8]) {
          return %x
        }
    """)


def test_identity_cast_and_dead_ops() -> None:
    check("""
        graph @main(%x: f32[4]) {
          %0 = cast(%x) {dtype = f32} : f32[4]
          %1 = exp(%x) : f32[4]
          %2 = neg(%0) : f32[4]
          return %2
        }
    """, """
        graph @main(%x: f32[4]) {
          %2 = neg(%x) : f32[4]
          return %2
        }
    """)


def test_cast_of_cast_folds_only_exact_round_trips() -> None:
    check("""
        graph @main(%x: f32[4], %y: f32[4]) {
          %0 = cast(%x) {dtype = f64} : f64[4]
          %1 = cast(%0) {dtype = f32} : f32[4]
          %2 = cast(%y) {dtype = f16} : f16[4]
          %3 = cast(%2) {dtype = f32} : f32[4]
          %4 = add(%1, %3) : f32[4]
          return %4
        }
    """, """
        graph @main(%x: f32[4], %y: f32[4]) {
          %2 = cast(%y) {dtype = f16} : f16[4]
          %3 = cast(%2) {dtype = f32} : f32[4]
          %4 = add(%x, %3) : f32[4]
          return %4
        }
    """)


def test_cast_of_exact_cast_becomes_one_cast() -> None:
    check("""
        graph @main(%x: i8[4]) {
          %0 = cast(%x) {dtype = i32} : i32[4]
          %1 = cast(%0) {dtype = f16} : f16[4]
          return %1
        }
    """, """
        graph @main(%x: i8[4]) {
          %2 = cast(%x) {dtype = f16} : f16[4]
          return %2
        }
    """)


@pytest.mark.parametrize("src,dst,exact", [
    (dt.f16, dt.f32, True), (dt.bf16, dt.f32, True), (dt.f32, dt.f64, True), (dt.f32, dt.f16, False),
    (dt.f16, dt.bf16, False), (dt.bf16, dt.f16, False), (dt.i8, dt.i32, True), (dt.i32, dt.i8, False),
    (dt.u8, dt.i16, True), (dt.u8, dt.i8, False), (dt.i8, dt.u8, False), (dt.i32, dt.f32, False),
    (dt.i32, dt.f64, True), (dt.i16, dt.f32, True), (dt.u8, dt.bf16, True), (dt.bool_, dt.f16, True),
    (dt.f32, dt.bool_, False), (dt.f32, dt.i64, False),
])
def test_exact_conversion(src: dt.DType, dst: dt.DType, exact: bool) -> None:
    assert exact_conversion(src, dst) is exact


def test_add_zero_int_and_mul_one_through_views() -> None:
    check("""
        graph @main(%x: i32[2, 3]) {
          %0 = full() {shape = [], value = 0, dtype = i32} : i32[]
          %1 = reshape(%0) {shape = [1, 1]} : i32[1, 1]
          %2 = expand(%1) {shape = [2, 3]} : i32[2, 3]
          %3 = add(%2, %x) : i32[2, 3]
          %4 = full() {shape = [2, 3], value = 1, dtype = i32} : i32[2, 3]
          %5 = mul(%3, %4) : i32[2, 3]
          %6 = sub(%5, %2) : i32[2, 3]
          %7 = div(%6, %4) : i32[2, 3]
          return %7
        }
    """, """
        graph @main(%x: i32[2, 3]) {
          return %x
        }
    """)


FLOAT_ZERO = """
    graph @main(%x: f32[4]) {
      %0 = full() {shape = [4], value = 0.0, dtype = f32} : f32[4]
      %1 = add(%x, %0) : f32[4]
      %2 = sub(%1, %0) : f32[4]
      return %2
    }
"""


def test_float_add_zero_keeps_signed_zeros_by_default() -> None:
    check(FLOAT_ZERO, """
        graph @main(%x: f32[4]) {
          %0 = full() {shape = [4], value = 0.0, dtype = f32} : f32[4]
          %1 = add(%x, %0) : f32[4]
          return %1
        }
    """)
    check(FLOAT_ZERO, """
        graph @main(%x: f32[4]) {
          return %x
        }
    """, ignore_signed_zeros=True)
    assert get_pass("canonicalize")(ignore_signed_zeros=True).spelling() == "canonicalize{ignore_signed_zeros=true}"


def test_float_add_negative_zero_always_folds() -> None:
    check("""
        graph @main(%x: f32[4]) {
          %0 = full() {shape = [4], value = -0.0, dtype = f32} : f32[4]
          %1 = add(%0, %x) : f32[4]
          return %1
        }
    """, """
        graph @main(%x: f32[4]) {
          return %x
        }
    """)


def test_double_permute() -> None:
    check("""
        graph @main(%x: f32[2, 3, 4]) {
          %0 = permute(%x) {dims = [1, 2, 0]} : f32[3, 4, 2]
          %1 = permute(%0) {dims = [0, 2, 1]} : f32[3, 2, 4]
          %2 = permute(%x) {dims = [1, 2, 0]} : f32[3, 4, 2]
          %3 = permute(%2) {dims = [2, 0, 1]} : f32[2, 3, 4]
          %4 = permute(%3) {dims = [0, 1, 2]} : f32[2, 3, 4]
          return %1, %4
        }
    """, """
        graph @main(%x: f32[2, 3, 4]) {
          %5 = permute(%x) {dims = [1, 0, 2]} : f32[3, 2, 4]
          return %5, %x
        }
    """)


def test_reshape_and_expand_chains() -> None:
    g = parse_graph(textwrap.dedent("""
        graph @main(%x: f32[3, 4], %b: f32[1, 1]) {
          %0 = reshape(%x) {shape = [2, 6]} : f32[2, 6]
          %1 = reshape(%0) {shape = [12]} : f32[12]
          %2 = reshape(%1) {shape = [3, 4]} : f32[3, 4]
          %3 = expand(%b) {shape = [1, 4]} : f32[1, 4]
          %4 = expand(%3) {shape = [3, 4]} : f32[3, 4]
          %5 = expand(%4) {shape = [3, 4]} : f32[3, 4]
          %6 = add(%2, %5) : f32[3, 4]
          %7 = reshape(%6) {shape = [2, 6]} : f32[2, 6]
          %8 = reshape(%7) {shape = [12]} : f32[12]
          return %8
        }
    """))
    out = Canonicalize().run(g)
    verify(out)
    out.rename_canonically()
    assert print_graph(out).strip() == textwrap.dedent("""
        graph @main(%x: f32[3, 4], %b: f32[1, 1]) {
          %0 = expand(%b) {shape = [3, 4]} : f32[3, 4]
          %1 = add(%x, %0) : f32[3, 4]
          %2 = reshape(%1) {shape = [12]} : f32[12]
          return %2
        }
    """).strip()


def test_locations_survive_rewrites() -> None:
    g = parse_graph(textwrap.dedent("""
        graph @main(%x: f32[3, 4]) {
          %0 = reshape(%x) {shape = [2, 6]} : f32[2, 6] loc("aten.view.default @ m.py:3")
          %1 = reshape(%0) {shape = [12]} : f32[12] loc("aten.view.default @ m.py:4")
          return %1
        }
    """))
    out = Canonicalize().run(g)
    assert [op.loc for op in out.ops] == ["aten.view.default @ m.py:4"]


def test_nothing_to_do_leaves_the_graph_alone() -> None:
    text = """
        graph @main(%x: f32[s0, 4]) {
          %0 = exp(%x) : f32[s0, 4]
          %1 = reduce_sum(%0) {dims = [1], keepdim = false} : f32[s0]
          return %1
        }
    """
    check(text, text)
