"""Fuzzing the IR parser and verifier: random and mutated text gives a located parse or
verification error, never another exception and never a hang.

Seeds are the files in tests/data and IR printed from the strategies' random graphs, kernels
and programs; mutations delete, repeat, insert and swap pieces of them. Each example has a
deadline, and the number of examples is bounded, so the test stays a few seconds long.
"""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchburn.ir import dtypes as dt
from torchburn.ir.parser import IRParseError, parse_all, parse_expr
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import VerificationError, verify

from .strategies import graphs, kernels, programs

DATA = Path(__file__).resolve().parents[1] / "data"
SEEDS = [p.read_text() for p in sorted(DATA.glob("*.tbir"))]
FUZZ = settings(max_examples=150, deadline=timedelta(seconds=10),
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

#: Pieces of IR text the random inserts draw from (tokens, and sizes at the edges).
PIECES = ["graph", "kernel", "program", "for", "parallel", "vectorized", "let", "alloc", "if", "else",
          "return", "call", "temp", "workspace", "offset", "strides", "symbols", "attrs", "local", "loc",
          "%x", "%0", "@k", "i0", "s0", "f32", "i64", "bool", "u8", "f16", "(", ")", "[", "]", "{", "}",
          "<", ">", ",", ":", "=", "..", "..+", "->", "+", "-", "*", "//", "%", "==", "<=", "&", "|", "^",
          "<<", ">>", "0", "1", "-4", "7:i32", "1.5:f32", "-inf:f64", "nan", "true", "none", '"s"',
          "9223372036854775808", "18446744073709551616", "9" * 5000, "cast<f32>(", "bitcast<i32>(",
          "ramp(", "broadcast(", "select(", "vreduce_add(", "exp(", "max(", "\n", " ", "\t", "// c\n",
          "\u00e9", "\x00", "\\"]


def check_text(text: str) -> None:
    """Parse and verify `text`; only located parse and verification errors may come out."""
    try:
        items = parse_all(text, filename="fuzz.tbir")
    except IRParseError as err:
        assert err.filename == "fuzz.tbir" and err.line >= 1 and err.col >= 1, str(err)
        assert err.message, str(err)
        return
    for item in items:
        try:
            verify(item)
        except VerificationError as err:
            assert err.where.startswith(("graph @", "kernel @", "program @")), str(err)
            assert err.message, str(err)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A seed text with a few random edits."""
    source = draw(st.sampled_from(["file", "graph", "kernel", "program"]))
    if source == "file":
        text = draw(st.sampled_from(SEEDS))
    else:
        text = print_ir(draw({"graph": graphs(), "kernel": kernels(), "program": programs()}[source]))
    for _ in range(draw(st.integers(1, 4))):
        n = len(text)
        a = draw(st.integers(0, n))
        b = draw(st.integers(a, min(n, a + 40)))
        edit = draw(st.sampled_from(["delete", "repeat", "insert", "replace", "swap"]))
        if edit == "delete":
            text = text[:a] + text[b:]
        elif edit == "repeat":
            text = text[:b] + text[a:b] + text[b:]
        elif edit == "insert":
            text = text[:a] + draw(st.sampled_from(PIECES)) + text[a:]
        elif edit == "replace":
            text = text[:a] + draw(st.sampled_from(PIECES)) + text[b:]
        else:
            lines = text.split("\n")
            i, j = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, len(lines) - 1))
            lines[i], lines[j] = lines[j], lines[i]
            text = "\n".join(lines)
    return text


@FUZZ
@given(mutated())
def test_mutated_ir_gives_only_located_errors(text: str) -> None:
    check_text(text)


@FUZZ
@given(st.lists(st.sampled_from(PIECES), max_size=60).map(" ".join))
def test_random_token_soup_gives_only_located_errors(text: str) -> None:
    check_text(text)


@FUZZ
@given(st.text(max_size=300))
def test_random_characters_give_only_located_errors(text: str) -> None:
    check_text(text)


def test_huge_dimension_is_a_parse_error_at_its_place() -> None:
    digits = "9" * 5000
    text = f"graph @g(%x: f32[{digits}]) {{\n  return %x\n}}\n"
    try:
        parse_all(text, filename="big.tbir")
    except IRParseError as err:
        assert (err.line, err.col) == (1, text.index(digits) + 1)
        assert "does not fit in 64 bits" in err.message
    else:
        raise AssertionError("a 5,000-digit dimension parsed")


def test_expression_parse_errors_are_located() -> None:
    for text in ("1 +", "exp(", "%x[0", "cast<q7>(1)", "ramp(1, 1, 99999999999999999999999)"):
        try:
            parse_expr(text, buffers={"x": dt.f32})
        except IRParseError as err:
            assert err.line == 1 and err.col >= 1
        else:
            raise AssertionError(text)
