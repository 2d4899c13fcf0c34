"""Tests for torchburn/ir/parser.py: round trips (printer -> parser) and error reporting."""
from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.parser import (IRParseError, parse, parse_all, parse_expr, parse_graph, parse_kernel,
                                 parse_program, parse_stmt)
from torchburn.ir.printer import print_expr, print_ir, print_kernel, print_program, print_stmt
from torchburn.ir.tensor import Graph, TensorType

from .strategies import expressions, graphs, kernels, programs

SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

F32 = ex.ScalarType(dt.f32)
I = ex.INDEX


def v(name: str, t: ex.ScalarType = I) -> ex.Var:
    return ex.Var(name, t)


# ---- round trips (property based) -----------------------------------------------------------

@SETTINGS
@given(expressions())
def test_expression_round_trip(pair: tuple[ex.Expr, object]) -> None:
    e, env = pair
    text = print_expr(e)
    assert parse_expr(text, var_types=env.vars, buffers=env.buffers) == e, text  # type: ignore[attr-defined]


@SETTINGS
@given(kernels())
def test_kernel_round_trip(k: lp.Kernel) -> None:
    text = print_kernel(k)
    parsed = parse_kernel(text)
    assert parsed == k, text
    assert print_kernel(parsed) == text
    assert parse(text) == k


@settings(SETTINGS, max_examples=60)
@given(programs())
def test_program_round_trip(p: lp.Program) -> None:
    text = print_program(p)
    assert parse_program(text) == p, text
    assert parse(text) == p


@settings(SETTINGS, max_examples=60)
@given(graphs())
def test_graph_round_trip(g: Graph) -> None:
    text = print_ir(g)
    parsed = parse_graph(text)
    assert parsed == g
    assert print_ir(parsed) == text
    # Producers are linked like Graph.add_op links them.
    for op in parsed.ops:
        assert all(r.producer is op for r in op.results)


# ---- expressions ---------------------------------------------------------------------------

def test_precedence_and_left_associativity() -> None:
    a, b, c = v("a"), v("b"), v("c")
    assert parse_expr("a - b - c") == ex.Binary("sub", ex.Binary("sub", a, b, I), c, I)
    assert parse_expr("a - (b - c)") == ex.Binary("sub", a, ex.Binary("sub", b, c, I), I)
    assert parse_expr("a + b * c") == ex.Binary("add", a, ex.Binary("mul", b, c, I), I)
    assert parse_expr("(a + b) * c") == ex.Binary("mul", ex.Binary("add", a, b, I), c, I)
    assert parse_expr("a // b % c") == ex.Binary("mod", ex.Binary("floordiv", a, b, I), c, I)
    # Bitwise below comparisons below shifts below additive, as printer.PRECEDENCE says.
    e = parse_expr("a | b ^ c & a == b << c + a")
    assert print_expr(e) == "a | b ^ c & a == b << c + a"
    assert e.op == "or" and e.b.op == "xor" and e.b.b.op == "and"  # type: ignore[attr-defined]
    assert e.b.b.b.op == "eq" and e.b.b.b.b.op == "shl" and e.b.b.b.b.b.op == "add"  # type: ignore[attr-defined]


def test_constants_carry_their_type() -> None:
    assert parse_expr("3") == ex.Const(3)
    assert parse_expr("-3") == ex.Const(-3)
    assert parse_expr("3:i32") == ex.Const(3, ex.ScalarType(dt.i32))
    assert parse_expr("200:u8") == ex.Const(200, ex.ScalarType(dt.u8))
    assert parse_expr("1.5:f32") == ex.Const(1.5, F32)
    assert parse_expr("1e+20:f64") == ex.Const(1e20, ex.ScalarType(dt.f64))
    assert parse_expr("true") == ex.Const(True, ex.BOOL)
    assert parse_expr("false") == ex.Const(False, ex.BOOL)
    nan = parse_expr("nan:f32")
    assert isinstance(nan, ex.Const) and math.isnan(nan.value) and nan.type == F32
    assert parse_expr("-inf:f64") == ex.Const(-math.inf, ex.ScalarType(dt.f64))
    assert parse_expr("a - -3") == ex.Binary("sub", v("a"), ex.Const(-3), I)
    # Folding helpers are not used: printed forms come back unfolded.
    assert parse_expr("1 + 2") == ex.Binary("add", ex.Const(1), ex.Const(2), I)


def test_inferred_types() -> None:
    x = v("x", F32)
    env = {"x": F32, "m": ex.ScalarType(dt.bool_, 4)}
    assert parse_expr("x < x", env).type == ex.BOOL
    assert parse_expr("isnan(x)", env).type == ex.BOOL
    assert parse_expr("signbit(x)", env).type == ex.BOOL
    assert parse_expr("exp(x)", env) == ex.Call("exp", (x,), F32)
    assert parse_expr("fma(x, x, x)", env) == ex.Call("fma", (x, x, x), F32)
    assert parse_expr("min(x, x)", env) == ex.Binary("min", x, x, F32)
    assert parse_expr("cast<f16>(x)", env) == ex.Cast(x, ex.ScalarType(dt.f16))
    assert parse_expr("bitcast<i32>(x)", env) == ex.Bitcast(x, ex.ScalarType(dt.i32))
    ramp = parse_expr("ramp(i, 1, 16)")
    assert ramp == ex.Ramp(v("i"), ex.Const(1), ex.ScalarType(dt.i64, 16))
    assert parse_expr("broadcast(x, 8)", env).type == ex.ScalarType(dt.f32, 8)
    assert parse_expr("vreduce_max(broadcast(x, 8))", env).type == F32
    assert parse_expr("select(m, broadcast(x, 4), broadcast(x, 4))", env).type == ex.ScalarType(dt.f32, 4)
    load = parse_expr("%buf[i, ramp(j, 1, 8)]", buffers={"buf": dt.f16})
    assert load == ex.Load("buf", (v("i"), ex.Ramp(v("j"), ex.Const(1), ex.ScalarType(dt.i64, 8))),
                           ex.ScalarType(dt.f16, 8))
    assert parse_expr("i % %buf[i]", buffers={"buf": dt.i64}).op == "mod"  # type: ignore[attr-defined]


def test_let_binds_types_for_the_rest_of_its_block() -> None:
    k = parse_kernel("""
kernel @k(%x: f32[8] strides [1], %y: f32[8] strides [1]) {
  for i in 0..8 {
    let t = %x[i] * 2.0:f32
    let v = ramp(i, 1, 4)
    %y[i] = t
  }
  let t = 3
  %y[t] = 1.0:f32
}
""")
    loop, let_t, store = k.body.stmts  # type: ignore[attr-defined]
    t_let, v_let, inner_store = loop.body.stmts
    assert t_let.var == v("t", F32) and v_let.var.type == ex.ScalarType(dt.i64, 4)
    assert inner_store.value == v("t", F32)
    assert let_t.var == v("t") and store.index == (v("t"),)


def test_statement_forms() -> None:
    text = """\
alloc %acc: f32[4] strides [1] local
unrolled for i in 0..4 attrs {origin = "aten.sum"} {
  %acc[i] = 0.0:f32
}
for j in 2..+n {
  if j < 4 {
    %acc[0] = %acc[0] + 1.0:f32
  } else {
  }
}
"""
    s = parse_stmt(text)
    assert print_stmt(s) == text
    alloc, unrolled, serial = s.stmts  # type: ignore[attr-defined]
    assert alloc.buffer.scope == "local" and unrolled.kind == "unrolled"
    assert unrolled.annotations == (("origin", "aten.sum"),)
    assert serial.start == ex.Const(2) and serial.extent == v("n")
    assert serial.body.orelse == lp.Block(())


def test_docstring_examples_parse() -> None:
    program = parse("""
program @main(%x: f32[s0, 4] strides [4, 1]) -> (%out: f32[s0, 4] strides [4, 1]) {
  call @k0(%x, %out)
}
kernel @k0(%x: f32[s0, 4] strides [4, 1], %out: f32[s0, 4] strides [4, 1]) {
  parallel for i0 in 0..s0 {
    for i1 in 0..4 {
      %out[i0, i1] = exp(%x[i0, i1])
    }
  }
}
""")
    assert isinstance(program, lp.Program) and [k.name for k in program.kernels] == ["k0"]
    graph = parse("""
graph @main(%x: f32[s0, 512], %w: f32[1024, 512]) {
  %0 = permute(%w) {dims = [1, 0]} : f32[512, 1024]
  %1 = matmul(%x, %0) : f32[s0, 1024]
  return %1
}
""")
    assert isinstance(graph, Graph) and [op.name for op in graph.ops] == ["permute", "matmul"]


def test_strides_default_to_row_major() -> None:
    k = parse_kernel("kernel @k(%x: f32[s0, 4, 2]) {\n}\n")
    assert k.params[0].strides == lp.contiguous_strides(k.params[0].shape)


# ---- tensor level --------------------------------------------------------------------------

def test_graph_attributes_and_locations() -> None:
    g = parse_graph("""
graph @g(%x: f32[s0, 4] strides [4, 1], s0) {
  %a = reshape(%x) {shape = [s0 * 4], i = -2, f = 1.5, g = -inf, h = nan, b = true, s = "q\\"\\u00e9", d = f16, n = none, e = (3:i32), l = [], k = 2 * s0} : f32[s0 * 4] loc("model.py:3")
  %b, %c = custom(%a, %a) : f32[2], i64[]
  return %a, %c
}
""")
    assert g.inputs[1] == v("s0") and g.tensor_inputs()[0].strides == (ex.Const(4), ex.Const(1))
    op = g.ops[0]
    a = op.attrs
    assert a["shape"] == (ex.Binary("mul", v("s0"), ex.Const(4), I),)
    assert a["i"] == -2 and type(a["i"]) is int
    assert a["f"] == 1.5 and a["g"] == -math.inf and math.isnan(a["h"])
    assert a["b"] is True and a["s"] == 'q"\u00e9' and a["d"] == dt.f16 and a["n"] is None
    assert a["e"] == ex.Const(3, ex.ScalarType(dt.i32)) and a["l"] == ()
    assert a["k"] == ex.Binary("mul", ex.Const(2), v("s0"), I)
    assert op.loc == "model.py:3"
    assert op.results[0].type == TensorType(dt.f32, (ex.Binary("mul", v("s0"), ex.Const(4), I),))
    multi = g.ops[1]
    assert [r.name for r in multi.results] == ["b", "c"]
    assert multi.results[1].type == TensorType(dt.i64, ())
    assert [o.name for o in g.outputs] == ["a", "c"]
    assert parse_graph(str(g)) == g


def test_result_types_are_taken_from_the_text() -> None:
    # A wrong type parses (the verifier, not the parser, checks it).
    g = parse_graph("graph @g(%x: f32[4]) {\n  %y = exp(%x) : f16[7]\n  return %y\n}\n")
    assert g.ops[0].results[0].type == TensorType.of(dt.f16, [7])


# ---- top level -----------------------------------------------------------------------------

def test_parse_returns_one_item_or_a_list() -> None:
    k = "kernel @a(%x: f32[1] strides [1]) {\n}\n"
    g = "graph @g(%x: f32[1]) {\n  return %x\n}\n"
    p = "program @p(%x: f32[1] strides [1]) -> () {\n  call @b(%x)\n}\n" + k.replace("@a", "@b")
    assert isinstance(parse(k), lp.Kernel)
    items = parse(k + g + p)
    assert isinstance(items, list) and [type(i) for i in items] == [lp.Kernel, Graph, lp.Program]
    # The kernels after a program belong to it.
    assert [x.name for x in items[2].kernels] == ["b"]  # type: ignore[union-attr]
    assert len(parse_all(p + k)) == 1 and len(parse_all(p + k)[0].kernels) == 2  # type: ignore[union-attr]
    assert parse_all(k) == [parse(k)]


def test_comments() -> None:
    text = """// leading comment
kernel @k(%x: i64[8] strides [1]) { // after a brace
  // on its own line, with odd characters: ' # " ` \\
  for i in 0..8 {
    %x[i] = i // 2
    // the line above divides; a comment after an expression must go on its own line
  }
}   // trailing
"""
    k = parse_kernel(text)
    store = k.body.body  # type: ignore[attr-defined]
    assert store.value == ex.Binary("floordiv", v("i"), ex.Const(2), I)
    g = parse_graph("graph @g(%x: f32[4]) { // c\n  %y = exp(%x) : f32[4 // 2] // c2\n  return %y // c3\n}\n")
    assert g.ops[0].results[0].type.shape == (ex.Binary("floordiv", ex.Const(4), ex.Const(2), I),)


# ---- errors --------------------------------------------------------------------------------

def _error(fn, text: str) -> IRParseError:  # type: ignore[no-untyped-def]
    with pytest.raises(IRParseError) as info:
        fn(text, filename="file.tbir")
    return info.value


def test_error_has_position_and_caret() -> None:
    text = "graph @g(%x: f32[4]) {\n  %y = exp(%x) : f32[4\n  return %y\n}\n"
    err = _error(parse_graph, text)
    assert (err.line, err.col) == (3, 3)
    lines = str(err).splitlines()
    assert lines[0] == "file.tbir:3:3: expected ']' but found 'return'"
    assert lines[1] == "    return %y"
    assert lines[2] == "    ^"


@pytest.mark.parametrize("fn, text, line, col, message", [
    (parse_graph, "graph @g(%x: f32[4) {\n}", 1, 19, "expected ']' but found ')'"),
    (parse_graph, "graph @g(%x: f33[4]) {\n}", 1, 14, "unknown dtype 'f33'"),
    (parse_graph, "graph @g(%x: f32[4]) {\n  %y = exp(%z) : f32[4]\n  return %y\n}", 2, 12, "use of undefined value %z"),
    (parse_graph, "graph @g(%x: f32[4]) {\n  %x = exp(%x) : f32[4]\n  return %x\n}", 2, 3, "value %x is defined twice"),
    (parse_graph, "graph @g(%x: f32[4]) {\n  %y = exp(%x) : f32[4]\n  return %q\n}", 3, 10, "use of undefined value %q"),
    (parse_graph, "graph @g(%x: f32[4]) {\n  %a, %b = f(%x) : f32[4]\n  return %a\n}", 2, 12, "2 results but 1 result types"),
    (parse_kernel, "kernel @k(%x: f32[4]) {\n  %x[0] = 1.5\n}", 2, 11, "float constant 1.5 needs a dtype"),
    (parse_kernel, "kernel @k(%x: f32[4]) {\n  %x[0] = %y[0]\n}", 2, 11, "load from unknown buffer %y"),
    (parse_kernel, "kernel @k(%x: f32[4]) {\n  for i in 1..4 {\n  }\n}", 2, 12, "written start..+extent"),
    (parse_kernel, "kernel @k(%x: f32[4]) {\n  %x[0] = 1.0:f32 $ 2\n}", 2, 19, "unexpected character '$'"),
    (parse_kernel, "kernel @k(%x: f32[4]) {\n  x = 1\n}", 2, 3, "expected a statement"),
    (parse_kernel, "kernel @k(%x: f32[4]) {\n  %x[0] = -x\n}", 2, 12, "expected a number after '-'"),
    (parse_kernel, "kernel @k(%x: f32[4]) {\n  %x[0] = 1.0:f32\n", 3, 1, "expected '}' but found end of input"),
    (parse_kernel, "kernel @k(%x: f32[4] strides [1, 1]) {\n}", 1, 11, "1 dims but 2 strides"),
    (parse_kernel, "kernel @k(%x: f32[4]) {\n  %x[0] = select(true, 1.0:f32)\n}", 2, 11, "select takes 3 arguments"),
    (parse_kernel, "program @p() -> () {\n}", 1, 1, "expected 'kernel' but found 'program'"),
    (parse_kernel, "kernel @k() {\n}\nkernel @j() {\n}", 3, 1, "unexpected 'kernel' after the end"),
    (parse_program, "program @p() -> () {\n  tmp %t: f32[4]\n}", 2, 3, "expected 'temp', 'workspace', 'constant', 'kept', 'call'"),
    (parse, "", 1, 1, "expected 'graph', 'kernel' or 'program' but found end of input"),
    (parse, "graph @g() {\n  return\n}\nfoo", 4, 1, "expected 'graph', 'kernel' or 'program' but found 'foo'"),
])
def test_error_messages(fn, text: str, line: int, col: int, message: str) -> None:  # type: ignore[no-untyped-def]
    err = _error(fn, text)
    assert message in err.message
    assert (err.line, err.col) == (line, col), str(err)
    assert str(err).startswith(f"file.tbir:{line}:{col}: ")


def test_parse_expr_errors() -> None:
    with pytest.raises(IRParseError, match="unexpected '\\)' after the end"):
        parse_expr("a + b)")
    with pytest.raises(IRParseError, match="needs an argument"):
        parse_expr("f()")
    with pytest.raises(IRParseError, match="bool constants"):
        parse_expr("1:bool")


def test_degenerate_graph_forms() -> None:
    """Ops without results, empty returns and Windows line ends still round-trip."""
    g = parse_graph("graph @g(%x: f32[4], s0) {\r\n   = side_effect(%x) {k = [1, (2)]} : \r\n  return\r\n}\r\n")
    assert g.ops[0].results == [] and g.outputs == []
    assert g.ops[0].attrs["k"] == (1, ex.Const(2))
    assert parse_graph(str(g)) == g


def test_parse_error_pickles() -> None:
    import pickle

    err = _error(parse_graph, "graph @g(%x: f32[4) {\n}")
    again = pickle.loads(pickle.dumps(err))
    assert str(again) == str(err) and again.line == 1


def test_program_return_line_round_trips_and_is_verified() -> None:
    from torchburn.ir.verifier import VerificationError, verify

    text = ("program @f(%x: f16[] strides [], %y: f32[4] strides [1]) -> (%out0: f32[4] strides [1]) {\n"
            "  call @k0(%y, %out0)\n"
            "  return %x, %out0, %out0\n"
            "}\n"
            "kernel @k0(%y: f32[4] strides [1], %out0: f32[4] strides [1]) {\n"
            "  for i0 in 0..4 {\n"
            "    %out0[i0] = %y[i0]\n"
            "  }\n"
            "}\n")
    p = parse_program(text)
    assert p.results == ("x", "out0", "out0")
    assert print_program(p) == text
    verify(p)
    plain = parse_program(text.replace("  return %x, %out0, %out0\n", ""))
    assert plain.results == () and plain.result_names() == ("out0",)
    with pytest.raises(VerificationError, match="returns %k0"):
        verify(parse_program(text.replace("return %x,", "return %k0,")))


def test_program_returns_a_result_viewed_in_another_shape() -> None:
    """`return %out0 as [...]` (`Program.result_views`) round-trips; the verifier checks the
    view holds as many elements as the buffer, at constant and symbolic sizes."""
    from torchburn.ir.verifier import VerificationError, verify

    text = ("program @f(%y: f32[s0, 6] strides [6, 1]) -> (%out0: f32[s0, 6] strides [6, 1]) symbols(s0) {\n"
            "  call @k0(%y, %out0)\n"
            "  return %out0 as [s0, 2, 3], %y\n"
            "}\n"
            "kernel @k0(%y: f32[s0, 6] strides [6, 1], %out0: f32[s0, 6] strides [6, 1]) symbols(s0) {\n"
            "  for i0 in 0..s0 {\n"
            "    for i1 in 0..6 {\n"
            "      %out0[i0, i1] = %y[i0, i1]\n"
            "    }\n"
            "  }\n"
            "}\n")
    p = parse_program(text)
    assert p.results == ("out0", "y") and p.result_view(0) == (v("s0"), ex.Const(2), ex.Const(3))
    assert p.result_view(1) is None
    assert print_program(p) == text
    verify(p)
    with pytest.raises(VerificationError, match="holds"):
        verify(parse_program(text.replace("as [s0, 2, 3]", "as [s0, 2, 2]")))
    with pytest.raises(VerificationError, match="holds"):
        verify(parse_program(text.replace("as [s0, 2, 3]", "as [6, 3]")))
    with pytest.raises(VerificationError, match="not contiguous"):
        verify(parse_program(text.replace("return %out0 as [s0, 2, 3], %y", "return %y as [s0, 6], %y")
                             .replace("%y: f32[s0, 6] strides [6, 1]) ->", "%y: f32[s0, 6] strides [12, 1]) ->")))


def test_constant_inputs_round_trip_and_take_part_in_the_hash() -> None:
    from torchburn.ir.hashing import structural_hash

    text = ("graph @main(%x: f32[4, 8], %w: f32[8, 4] const) {\n"
            "  %0 = matmul(%x, %w) : f32[4, 4]\n  return %0\n}\n")
    g = parse_graph(text)
    assert [v.constant for v in g.inputs] == [False, True]  # type: ignore[union-attr]
    assert str(g) == text
    # a program compiled for constant weights keeps work between calls: not the same program
    assert structural_hash(g) != structural_hash(parse_graph(text.replace(" const", "")))
