"""Tests for torchburn/ir/verifier.py: generated IR is accepted, each broken invariant rejected."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_graph, parse_kernel, parse_program
from torchburn.ir.printer import print_kernel, print_program
from torchburn.ir.tensor import Graph, Op, TensorType, Value
from torchburn.ir.verifier import VerificationError, verify

from .strategies import graphs, kernels, programs

SETTINGS = settings(max_examples=50, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


# ---- acceptance ----------------------------------------------------------------------------

@SETTINGS
@given(kernels())
def test_generated_kernels_verify(k: lp.Kernel) -> None:
    verify(k)
    verify(parse_kernel(print_kernel(k)))


@settings(SETTINGS, max_examples=30)
@given(programs())
def test_generated_programs_verify(p: lp.Program) -> None:
    verify(p)
    verify(parse_program(print_program(p)))


@SETTINGS
@given(graphs())
def test_generated_graphs_verify(g: Graph) -> None:
    verify(g)
    verify(parse_graph(str(g)))


def test_verify_rejects_other_objects() -> None:
    with pytest.raises(TypeError):
        verify(ex.Const(1))  # type: ignore[arg-type]


# ---- graph ---------------------------------------------------------------------------------

GRAPH = """graph @g(%x: f32[4, s0], s0) {
  %a = exp(%x) : f32[4, s0]
  %b = reduce_sum(%a) {dims = [1], keepdim = false} : f32[4]
  return %b
}
"""


def _rejects(ir: object, match: str) -> None:
    with pytest.raises(VerificationError, match=match):
        verify(ir)  # type: ignore[arg-type]


def test_good_graph_verifies() -> None:
    verify(parse_graph(GRAPH))


@pytest.mark.parametrize("old, new, match", [
    ("%b = reduce_sum(%a) {dims = [1], keepdim = false} : f32[4]",
     "%b = reduce_sum(%a) {dims = [1], keepdim = false} : f32[4, 1]",
     r"op `%b = reduce_sum.*`: result types f32\[4, 1\] but the op gives f32\[4\]"),
    ("%a = exp(%x) : f32[4, s0]", "%a = exp(%x) : f16[4, s0]", "result types f16"),
    ("%a = exp(%x)", "%a = frobnicate(%x)", "unknown op 'frobnicate'"),
    ("{dims = [1], keepdim = false}", "{keepdim = false}", "missing attribute 'dims'"),
    ("{dims = [1], keepdim = false}", "{dims = [5], keepdim = false}", "dim 5 out of range for rank 2"),
    ("%a = exp(%x) : f32[4, s0]", "%a = add(%x) : f32[4, s0]", "add: expected 2 operands, got 1"),
])
def test_graph_rejections_from_text(old: str, new: str, match: str) -> None:
    assert old in GRAPH
    _rejects(parse_graph(GRAPH.replace(old, new)), match)


def _small_graph() -> tuple[Graph, Value]:
    x = Value("x", TensorType.of(dt.f32, [4]))
    g = Graph("g", [x])
    y = g.add_op("exp", [x]).result
    g.outputs = [y]
    return g, x


def test_graph_use_before_definition() -> None:
    g, x = _small_graph()
    later = g.add_op("neg", [x]).result
    g.ops[0].operands = [later]
    _rejects(g, r"operand %v\d+ is not defined before use")


def test_graph_value_defined_twice() -> None:
    g, x = _small_graph()
    g.ops[0].results[0].name = "x"
    _rejects(g, "value %x is defined twice")
    g, x = _small_graph()
    g.ops.append(g.ops[0])
    _rejects(g, r"value %v\d+ \(one object\) is defined twice")


def test_graph_value_from_another_graph() -> None:
    g, x = _small_graph()
    stranger = Value("z", TensorType.of(dt.f32, [4]))
    g.ops[0].operands = [stranger]
    _rejects(g, "operand %z is not defined before use")


def test_graph_undefined_output() -> None:
    g, x = _small_graph()
    g.outputs = [Value("w", TensorType.of(dt.f32, [4]))]
    _rejects(g, "output %w is not defined")


def test_graph_bad_input_strides_and_symbols() -> None:
    g, x = _small_graph()
    x.strides = (ex.Const(1), ex.Const(1))
    _rejects(g, "input %x has 1 dims but 2 strides")
    g, x = _small_graph()
    g.inputs.append(ex.Var("n", ex.ScalarType(dt.i32)))
    _rejects(g, "symbol n must be i64")


def test_graph_op_with_extra_results() -> None:
    g, x = _small_graph()
    op: Op = g.ops[0]
    op.results.append(Value("extra", TensorType.of(dt.f32, [4]), producer=op))
    _rejects(g, "result types f32\\[4\\], f32\\[4\\] but the op gives f32\\[4\\]")


# ---- kernel --------------------------------------------------------------------------------

KERNEL = """kernel @k(%x: f32[s0, 8] strides [8, 1], %y: f32[s0, 8] strides [8, 1]) symbols(s0) {
  parallel for i in 0..s0 {
    vectorized for j in 0..8 {
      let t = %x[i, j] * 2.0:f32
      %y[i, j] = t
    }
    %y[i, ramp(0, 1, 8)] = %x[i, ramp(0, 1, 8)]
    alloc %acc: f32[1] strides [1] local
    %acc[0] = vreduce_add(%x[i, ramp(0, 1, 8)])
    if %acc[0] > 0.0:f32 {
      %y[i, 0] = select(isnan(%acc[0]), 0.0:f32, %acc[0])
    }
  }
}
"""


def test_good_kernel_verifies() -> None:
    verify(parse_kernel(KERNEL))


@pytest.mark.parametrize("old, new, match", [
    ("%y[i, j] = t", "%z[i, j] = t", r"in `%z\[i, j\] = t`: %z is neither a parameter nor an allocation in scope"),
    ("%y[i, j] = t", "%y[i] = t", "%y has 2 dims but is indexed with 1"),
    ("%y[i, j] = t", "%y[i, k] = t", "variable k is not bound here"),
    ("%y[i, j] = t", "%y[i, j] = cast<f16>(t)", "stores f16 into %y of dtype f32"),
    ("%y[i, j] = t", "%y[i, j] = broadcast(t, 8)", "stores a value of 8 lanes at an index of 1 lanes"),
    ("%y[i, j] = t", "%y[i, j] = t\n      let t = 1", "variable t is bound again"),
    ("vectorized for j in 0..8", "vectorized for i in 0..8", "variable i is bound again"),
    ("vectorized for j in 0..8", "vectorized for j in 0..s0", "vectorized loop needs a constant extent, not s0"),
    ("vectorized for j in 0..8", "unrolled for j in 0..s0", "unrolled loop needs a constant extent"),
    ("vectorized for j in 0..8 {", "vectorized for j in 0..8 {\n parallel for q in 0..2 {\n }",
     "parallel loop inside a vectorized loop"),
    ("%x[i, j] * 2.0:f32", "%x[i, j] * 2.0:f64", r"operands of mul differ in type: f32 vs f64"),
    ("%x[i, j] * 2.0:f32", "%x[i, jj] * 2.0:f32", "variable jj is not bound"),
    ("%x[i, j] * 2.0:f32", "%x[i, 1.0:f32] * 2.0:f32", "index 1.0:f32 of %x is f32, not an integer"),
    ("select(isnan(%acc[0]), 0.0:f32, %acc[0])", "select(%acc[0], 0.0:f32, %acc[0])",
     "select condition must be bool"),
    ("select(isnan(%acc[0]), 0.0:f32, %acc[0])", "select(broadcast(true, 4), 0.0:f32, %acc[0])",
     "select condition has 4 lanes but operands 1"),
    ("select(isnan(%acc[0]), 0.0:f32, %acc[0])", "select(true, 0.0:f32, 1:i32)", "select operands differ"),
    ("if %acc[0] > 0.0:f32", "if %acc[0]", "if condition must be a scalar bool"),
    ("%y[i, ramp(0, 1, 8)] = %x[i, ramp(0, 1, 8)]", "%y[ramp(0, 1, 4), ramp(0, 1, 8)] = %x[i, ramp(0, 1, 8)]",
     "mixes vectors of 4 and 8 lanes"),
    ("vreduce_add(%x[i, ramp(0, 1, 8)])", "vreduce_add(%acc[0])", "vector reduction of a scalar"),
    ("vreduce_add(%x[i, ramp(0, 1, 8)])", "vreduce_xor(%x[i, ramp(0, 1, 8)])", "unknown vector reduction 'xor'"),
    ("let t = %x[i, j] * 2.0:f32", "let t = bitcast<f64>(%x[i, j])", "bitcast between f32 and f64"),
    ("let t = %x[i, j] * 2.0:f32", "let t = exp(%x[i, j], %x[i, j])", "exp takes one argument"),
    ("let t = %x[i, j] * 2.0:f32", "let t = 1.0:f32 << 2.0:f32", "shl needs integer operands"),
    ("alloc %acc: f32[1] strides [1] local", "alloc %acc: f32[1] strides [1]", "alloc %acc must have local scope"),
    ("alloc %acc: f32[1] strides [1] local", "alloc %acc: f32[1] local\n    alloc %acc: f32[1] local",
     "buffer %acc is declared again"),
    ("alloc %acc: f32[1] strides [1] local", "alloc %acc: f32[n] strides [1] local", "variable n is not bound"),
    ("parallel for i in 0..s0", "parallel for i in 0..2:i32", "loop extent must be i64, not i32"),
])
def test_kernel_rejections_from_text(old: str, new: str, match: str) -> None:
    assert old in KERNEL
    _rejects(parse_kernel(KERNEL.replace(old, new)), match)


def test_kernel_params_may_only_use_symbols() -> None:
    _rejects(parse_kernel("kernel @k(%x: f32[n] strides [1]) {\n}\n"), "variable n is not bound")
    _rejects(parse_kernel("kernel @k(%x: f32[4], %x: f32[4]) {\n}\n"), "buffer %x is declared again")


def test_allocation_is_scoped_to_its_block() -> None:
    text = """kernel @k(%y: f32[4]) {
  for i in 0..4 {
    alloc %acc: f32[4] local
  }
  %y[0] = 0.0:f32
  for i in 0..4 {
    %acc[i] = 0.0:f32
  }
}
"""
    _rejects(parse_kernel(text), "%acc is neither a parameter nor an allocation in scope")
    # Sibling loops may reuse a loop variable name: it is not in scope any more.
    verify(parse_kernel(text.replace("%acc[i] = 0.0:f32", "%y[i] = 0.0:f32")))


def test_kernel_node_type_mismatches() -> None:
    """Types the parser would never produce, but a buggy pass could."""
    x = lp.Buffer("x", dt.f32, (ex.Const(4),), (ex.Const(1),))
    i = ex.Var("i")
    load = ex.Load("x", (i,), ex.ScalarType(dt.f32))

    def kernel(value: ex.Expr, var: ex.Var = i) -> lp.Kernel:
        body = lp.For(var, ex.Const(0), ex.Const(4), "serial", lp.Store("x", (i,), value))
        return lp.Kernel("k", (x,), (), body)

    verify(kernel(load))
    _rejects(kernel(replace(load, type=ex.ScalarType(dt.f16))), r"%x\[i\] has type f16 but should have f32")
    _rejects(kernel(ex.Binary("lt", load, load, ex.ScalarType(dt.f32))), "has type f32 but should have bool")
    _rejects(kernel(ex.Call("exp", (load,), ex.ScalarType(dt.f64))), "has type f64 but should have f32")
    _rejects(kernel(ex.Call("min", (load, load), ex.ScalarType(dt.f32))), "min must be its own node")
    _rejects(kernel(ex.Const(1.0, ex.ScalarType(dt.f32, 4))), "vector constants are written broadcast")
    _rejects(kernel(ex.Broadcast(ex.Broadcast(load, ex.ScalarType(dt.f32, 2)), ex.ScalarType(dt.f32, 4))),
             "broadcast of a vector")
    _rejects(kernel(load, var=ex.Var("i", ex.ScalarType(dt.i32))), "loop variable i must be i64")
    let = lp.Let(ex.Var("t", ex.ScalarType(dt.i32)), ex.Const(1))
    _rejects(lp.Kernel("k", (x,), (), let), "let t has type i32 but its value is i64")
    _rejects(lp.Kernel("k", (x,), (ex.Var("s", ex.ScalarType(dt.i32)),), lp.Block(())), "symbol s must be i64")


# ---- program -------------------------------------------------------------------------------

PROGRAM = """program @main(%x: f32[s0, 4] strides [4, 1]) -> (%out: f32[s0, 4] strides [4, 1]) symbols(s0) {
  temp %t: f32[s0, 4] strides [4, 1] offset 0
  workspace s0 * 16
  call @k0(%x, %t)
  call @k0(%t, %out)
}
kernel @k0(%a: f32[s0, 4] strides [4, 1], %b: f32[s0, 4] strides [4, 1]) symbols(s0) {
  for i in 0..s0 {
    for j in 0..4 {
      %b[i, j] = exp(%a[i, j])
    }
  }
}
"""


def test_good_program_verifies() -> None:
    verify(parse_program(PROGRAM))


@pytest.mark.parametrize("old, new, match", [
    ("call @k0(%x, %t)", "call @k1(%x, %t)", "call @k1: no kernel @k1 in the program"),
    ("call @k0(%x, %t)", "call @k0(%x)", "call @k0: 1 arguments for 2 parameters"),
    ("call @k0(%x, %t)", "call @k0(%x, %nope)", "argument %nope is not a buffer of the program"),
    ("%x: f32[s0, 4] strides [4, 1]) ->", "%x: f16[s0, 4] strides [4, 1]) ->",
     "argument %x is f16 but parameter %a is f32"),
    ("%x: f32[s0, 4] strides [4, 1]) ->", "%x: f32[s0] strides [1]) ->",
     "argument %x has rank 1 but parameter %a has rank 2"),
    (" offset 0", " offset n", "offset of %t uses n, which is not a program symbol"),
    ("workspace s0 * 16", "workspace s1 * 16", "workspace size uses s1"),
    (" symbols(s0) {\n  temp", " {\n  temp", "uses s0, which is not a program symbol"),
    ("temp %t: f32[s0, 4] strides [4, 1] offset 0", "temp %x: f32[s0, 4] strides [4, 1] offset 0",
     "buffer %x is declared twice"),
    ("for j in 0..4", "for j in 0..q", "kernel @k0: in `for j in 0..q {`: variable q is not bound"),
])
def test_program_rejections_from_text(old: str, new: str, match: str) -> None:
    assert old in PROGRAM
    _rejects(parse_program(PROGRAM.replace(old, new)), match)


def test_program_kernel_symbols_must_be_program_symbols() -> None:
    text = PROGRAM.replace("symbols(s0) {\n  for", "symbols(s0, s9) {\n  for")
    _rejects(parse_program(text), "kernel @k0 uses symbol s9, which is not a program symbol")


def test_program_structural_rejections() -> None:
    p = parse_program(PROGRAM)
    _rejects(replace(p, kernels=p.kernels * 2), "kernel @k0 is declared twice")
    _rejects(replace(p, temp_offsets=(("t", ex.Const(0)), ("x", ex.Const(0)))),
             "offset given for %x, which is not a temporary")
    local = replace(p.temps[0], scope="local")
    _rejects(replace(p, temps=(local,)), "buffer %t must have global scope")


def test_workspace_is_planned_for_all_temporaries_or_none() -> None:
    unplanned = parse_program(PROGRAM.replace(" offset 0", ""))
    verify(unplanned)  # before memory planning
    with pytest.raises(VerificationError, match="temporary %t has no workspace offset"):
        verify(unplanned, planned=True)
    verify(parse_program(PROGRAM), planned=True)
    extra = "  temp %t2: f32[4] strides [1]\n  workspace"
    _rejects(parse_program(PROGRAM.replace("  workspace", extra)), "temporary %t2 has no workspace offset")


# ---- sizes and extents -----------------------------------------------------------------------

@pytest.mark.parametrize("old, new", [
    ("%x: f32[s0, 8]", "%x: f32[s0, 9223372036854775808]"),
    ("%x: f32[s0, 8] strides [8, 1]", "%x: f32[s0, 8] strides [9223372036854775808, 1]"),
])
def test_sizes_past_the_index_type_are_parse_errors_at_their_place(old: str, new: str) -> None:
    """2**63 would wrap to a negative index constant: refused where it is written."""
    from torchburn.ir.parser import IRParseError

    with pytest.raises(IRParseError, match=r"9223372036854775808 is past the index type \(2\*\*63\)") as info:
        parse_kernel(KERNEL.replace(old, new))
    assert ":" in str(info.value)  # file:line:col


@pytest.mark.parametrize("old, new, match", [
    ("%x: f32[s0, 8]", "%x: f32[s0, -4]", r"%x has a negative size -4 in dim 1"),
    ("%x: f32[s0, 8] strides [8, 1]", "%x: f32[4294967296, 4294967296] strides [4294967296, 1]",
     r"%x has 18446744073709551616 elements, past the index type"),
    ("alloc %acc: f32[1] strides [1] local", "alloc %acc: f32[-1] strides [1] local",
     r"in `alloc %acc.*`: buffer %acc has a negative size -1"),
    ("vectorized for j in 0..8", "vectorized for j in 0..16",
     r"in `let t = %x\[i, j\] \* 2.0:f32`: index j of %x \(dim 1\) runs over 0..15, past the extent 8"),
    ("vectorized for j in 0..8", "vectorized for j in 1..+8", r"runs over 1..8, past the extent 8"),
    ("%y[i, ramp(0, 1, 8)] = %x[i, ramp(0, 1, 8)]", "%y[i, ramp(0, 1, 8)] = %x[i, ramp(1, 1, 8)]",
     r"index 1 of %x \(dim 1\) runs over 1..8"),
    ("%acc[0] = vreduce_add", "%acc[2 - 1] = vreduce_add", r"index 2 - 1 of %acc \(dim 0\) runs over 1..1"),
    ("let t = %x[i, j] * 2.0:f32", "let q = j * 2 - 1\n      let t = %x[i, q] * 2.0:f32",
     r"index q of %x \(dim 1\) runs over -1..13"),
])
def test_sizes_and_provable_overruns_are_rejected(old: str, new: str, match: str) -> None:
    assert old in KERNEL
    _rejects(parse_kernel(KERNEL.replace(old, new)), match)


@pytest.mark.parametrize("old, new", [
    # guarded by an `if`: the loop range does not prove the access is made
    ("%y[i, 0] = select", "%y[i, 9] = select"),
    # not linear (clamped), or the loop runs over a symbolic range
    ("%y[i, j] = t", "%y[i, min(j * 2, 7)] = t"),
    ("%y[i, j] = t", "%y[i, j % 8] = t"),
    ("vectorized for j in 0..8", "vectorized for j in 0..0"),
])
def test_unprovable_accesses_are_accepted(old: str, new: str) -> None:
    assert old in KERNEL
    verify(parse_kernel(KERNEL.replace(old, new)))


def test_graph_sizes_are_checked() -> None:
    _rejects(parse_graph(GRAPH.replace("%x: f32[4, s0]", "%x: f32[-4, s0]")), "input %x has a negative size -4")
    _rejects(parse_graph(GRAPH.replace(": f32[4]\n", ": f32[-4]\n")), r"op `%b = .*`: result %b has a negative size")


def test_errors_carry_where_and_what() -> None:
    with pytest.raises(VerificationError) as info:
        verify(parse_kernel(KERNEL.replace("%y[i, j] = t", "%z[i, j] = t")))
    err = info.value
    assert err.where == "kernel @k: in `%z[i, j] = t`"
    assert err.message == "%z is neither a parameter nor an allocation in scope"
    import pickle
    back = pickle.loads(pickle.dumps(err))
    assert (back.where, back.message, str(back)) == (err.where, err.message, str(err))


def test_added_ops_never_reuse_a_name_the_graph_has() -> None:
    """A parsed graph may name its values `%v0, %v1...`, the names `add_op` generates: new
    results skip them, so the graph still verifies and prints unambiguously."""
    from torchburn.ir import tensor as tensor_ir
    from torchburn.ir.parser import parse_graph
    from torchburn.ir.printer import print_ir

    taken = [f"v{n}" for n in range(next(tensor_ir._value_ids) + 1, next(tensor_ir._value_ids) + 6)]
    params = ", ".join(f"%{n}: f32[4]" for n in taken)
    g = parse_graph(f"graph @main({params}) {{\n  return %{taken[0]}\n}}")
    x = g.inputs[0]
    for _ in range(8):
        x = g.add_op("neg", [x]).result
    g.outputs = [x]
    verify(g)
    text = print_ir(g)
    assert len({r.name for op in g.ops for r in op.results} | set(taken)) == 8 + len(taken), text
