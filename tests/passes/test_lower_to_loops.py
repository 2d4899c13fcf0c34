"""`lower-to-loops` (passes/lower_to_loops.py): each distinct kernel root is lowered once
(`loopgen/root_key.py`), near-identical roots are not shared, and constant slices of buffers
reach kernels as views at a byte offset (`KernelCall.offsets`)."""
from __future__ import annotations

import ctypes
from typing import Iterator

import numpy as np
import pytest

from torchburn.codegen.target import host_target
from torchburn.compiler import driver, kernel_cache as kc
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_graph, parse_program
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify
from torchburn.passes.base import PassManager
from torchburn.passes.loop.dedup_kernels import DedupKernels
from torchburn.passes.gpu.lower import LowerToLoopsGpu
from torchburn.passes.lower_to_loops import LowerToLoops
from torchburn.passes.pipeline import Pipeline
from torchburn.runtime import config


def lower(text: str, dedup: bool = True) -> lp.Program:
    """The graph through the default tensor passes and `lower-to-loops{dedup=...}`."""
    target = host_target()
    graph = PassManager(Pipeline.default().tensor, [], target=target).run(parse_graph(text))
    program = PassManager([LowerToLoops(dedup=dedup)], [], target=target).run(graph)
    assert isinstance(program, lp.Program)
    verify(program)
    return program


def two_chains(second: str = "%y", y_type: str = "f32[8, 8]", y_strides: str = "",
               perm: str = "[1, 0]") -> str:
    """Two chains `exp(permute(a) * w)` on different inputs: equal unless a change is asked."""
    strides = f" strides {y_strides}" if y_strides else ""
    return f"""graph @g(%x: f32[8, 8], %y: {y_type}{strides}, %w0: f32[8, 8], %w1: f32[8, 8]) {{
  %0 = permute(%x) {{dims = [1, 0]}} : f32[8, 8]
  %1 = mul(%0, %w0) : f32[8, 8]
  %2 = exp(%1) : f32[8, 8]
  %3 = permute({second}) {{dims = {perm}}} : f32[8, 8]
  %4 = mul(%3, %w1) : f32[8, 8]
  %5 = exp(%4) : f32[8, 8]
  return %2, %5
}}"""


def test_equal_roots_are_lowered_once_to_the_program_dedup_kernels_gives() -> None:
    program = lower(two_chains())
    assert len(program.kernels) == 1 and len(program.calls) == 2
    assert [c.args for c in program.calls] == [("x", "w0", "out0"), ("y", "w1", "out1")]
    assert print_ir(program) == print_ir(DedupKernels().run(lower(two_chains(), dedup=False)))


@pytest.mark.parametrize("change", [
    {"y_strides": "[1, 8]"},        # the same shape, another layout: the kernel indexes differently
    {"perm": "[0, 1]"},             # an attribute (a permutation of a square tensor: same types)
    {"y_type": "f64[8, 8]"},        # a dtype (through a cast the canonicalizer keeps)
])
def test_near_identical_roots_are_not_shared(change: dict[str, str]) -> None:
    text = two_chains(**change)
    if "y_type" in change:  # cast back, so the chain's types match the first's
        text = text.replace("%3 = permute(%y)", "%c = cast(%y) {dtype = f32} : f32[8, 8]\n  %3 = permute(%c)")
    program = lower(text)
    assert len(program.kernels) == 2
    assert print_ir(program) == print_ir(DedupKernels().run(lower(text, dedup=False)))


def test_program_symbols_keep_roots_apart() -> None:
    text = """graph @g(%x: f32[s0, 8], %y: f32[s1, 8]) {
  %0 = exp(%x) : f32[s0, 8]
  %1 = exp(%y) : f32[s1, 8]
  return %0, %1
}"""
    assert len(lower(text).kernels) == 2
    same = text.replace("s1", "s0")
    assert len(lower(same).kernels) == 1


def stacked(layers: int, rows: str = "8") -> str:
    """Per layer, `exp(cache[i])`: constant slices of one stacked input."""
    lines = [f"graph @g(%c: f32[{layers}, {rows}, 16]) {{"]
    outs = []
    for i in range(layers):
        lines += [f"  %s{i} = slice(%c) {{dim = 0, start = {i}, end = {i + 1}, step = 1}} : f32[1, {rows}, 16]",
                  f"  %r{i} = reshape(%s{i}) {{shape = [{rows}, 16]}} : f32[{rows}, 16]",
                  f"  %o{i} = exp(%r{i}) : f32[{rows}, 16]"]
        outs.append(f"%o{i}")
    lines += ["  return " + ", ".join(outs), "}"]
    return "\n".join(lines)


def test_constant_slices_are_views_and_share_one_kernel() -> None:
    program = lower(stacked(4))
    assert len(program.kernels) == 1 and len(program.calls) == 4
    assert [c.args[0] for c in program.calls] == ["c"] * 4
    assert [c.offsets[0] for c in program.calls] == [ex.Const(i * 8 * 16 * 4) for i in range(4)]
    assert [c.offsets[1] for c in program.calls] == [None] * 4  # the output: the buffer itself
    text = print_ir(program)
    assert "call @k0(%c offset 512, %out1)" in text
    assert parse_program(text) == program  # the offsets print and parse back


def test_symbolic_slice_offsets() -> None:
    program = lower(stacked(3, rows="s0"))
    assert len(program.kernels) == 1
    offsets = [c.offsets[0] for c in program.calls]
    assert offsets[0] == ex.Const(0)
    assert ex.free_vars(offsets[2]) == {"s0"}
    assert ex.evaluate_index(offsets[2], {"s0": 5}) == 2 * 5 * 16 * 4


def test_gpu_lowering_makes_no_views() -> None:
    target = host_target()
    graph = PassManager(Pipeline.default().tensor, [], target=target).run(parse_graph(stacked(2)))
    program = PassManager([LowerToLoopsGpu()], [], target=target).run(graph)
    assert all(not c.offsets for c in program.calls)  # type: ignore[union-attr]


def test_wrong_number_of_offsets_is_rejected() -> None:
    program = lower(stacked(2))
    bad = lp.KernelCall(program.calls[0].kernel, program.calls[0].args, (None,))
    with pytest.raises(Exception, match="offsets"):
        verify(lp.Program(program.name, program.inputs, program.outputs, program.temps, program.symbols,
                          (bad,), program.kernels))


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    config.reload_config()
    monkeypatch.setattr(driver, "_cache", driver.ModuleCache(64))
    monkeypatch.setattr(kc, "_cache", kc.KernelCache(1024))
    yield
    monkeypatch.undo()
    config.reload_config()


def test_views_run_natively(fresh: None) -> None:
    compiled, _ = driver.compile_graph(parse_graph(stacked(5)))
    program = compiled.signature()
    assert {c.kernel for c in program.calls} == {program.kernels[0].name}
    cache = np.random.default_rng(0).standard_normal((5, 8, 16)).astype(np.float32)
    outs = [np.zeros((8, 16), np.float32) for _ in range(5)]
    arrays = [cache, *outs]
    buffers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    workspace = np.zeros(max(int(program.workspace_bytes.value), 8), np.uint8)  # type: ignore[attr-defined]
    compiled.entry(buffers, None, workspace.ctypes.data)
    for i, out in enumerate(outs):
        np.testing.assert_allclose(out, np.exp(cache[i]), rtol=1e-6)


def test_a_lone_slice_keeps_its_index_arithmetic() -> None:
    program = lower(stacked(1))  # nothing to share: the kernel's code stays as it was
    assert all(not c.offsets for c in program.calls)
    assert any(b.name == "c" for b in program.kernels[0].params)


def test_reshape_index_with_sizes_that_are_not_products() -> None:
    """A reshape between shapes whose sizes are not products of symbols (`s1 // 4`, a
    convolution's output under dynamic shapes) maps every element where row-major order puts
    it. Two such sizes were once taken for equal products whatever they were: `[s0, h * h, 8]`
    read `[s0, h, h, 8]` at `[i0, i1, i2 // 8, i2 % 8]` (wrong results after a convolution,
    permute and view in ConvNeXt-like code under dynamic=True)."""
    import itertools

    from torchburn.ir.expr import Const, Var
    from torchburn.passes.loopgen.views import regroup_index

    h = ex.floordiv(Var("s1"), 4)
    h_other = ex.add(ex.floordiv(ex.sub(Var("s1"), 4), 4), 1)  # the same size, written otherwise
    cases = [((Var("s0"), ex.mul(h, h), Const(8)), (Var("s0"), h, h, Const(8))),
             ((Var("s0"), h, h, Const(8)), (Var("s0"), ex.mul(h, h), Const(8))),
             ((Var("s0"), Const(8), h, h), (Var("s0"), Const(8), h_other, h_other)),
             ((ex.mul(Var("s0"), h), Const(2)), (Var("s0"), h, Const(2)))]
    env = {"s0": 2, "s1": 13}
    for shape, to in cases:
        sizes = [ex.evaluate_index(d, env) for d in shape]
        target = [ex.evaluate_index(d, env) for d in to]
        flat = np.arange(int(np.prod(sizes)))
        src, dst = flat.reshape(target), flat.reshape(sizes)
        names = [Var(f"i{k}") for k in range(len(shape))]
        index = regroup_index(tuple(names), shape, to)
        for point in itertools.product(*(range(n) for n in sizes)):
            at = {**env, **{v.name: p for v, p in zip(names, point)}}
            assert src[tuple(ex.evaluate_index(e, at) for e in index)] == dst[point], (shape, to, point)


#: A product `%2` stored by kernel 0 is read, through a reshape and a slice, by the epilogue of
#: another product `%6` (torch's no-grad LSTM: each step adds `x @ W_ih^T + b`, viewed per time
#: step, to `h @ W_hh^T`). Written with its fusion decided, so that only the lowering is tested.
VIEW_OF_ANOTHER_PRODUCT = """graph @g(%x: f32[12, 6], %w: f32[6, 20], %h: f32[3, 5], %u: f32[5, 20], %b: f32[20]) {
  %0 = reshape(%b) {shape = [1, 20], fused_into = [1]} : f32[1, 20]
  %1 = expand(%0) {shape = [12, 20], fused_into = [1]} : f32[12, 20]
  %2 = matmul(%x, %w) {kernel = 0} : f32[12, 20]
  %3 = add(%2, %1) {fused_into = [1]} : f32[12, 20]
  %4 = reshape(%3) {shape = [4, 3, 20], fused_into = [1]} : f32[4, 3, 20]
  %5 = slice(%4) {dim = 0, start = 1, end = 2, step = 1, fused_into = [1]} : f32[1, 3, 20]
  %7 = reshape(%5) {shape = [3, 20], fused_into = [1]} : f32[3, 20]
  %6 = matmul(%h, %u) {fused_into = [1]} : f32[3, 20]
  %8 = add(%7, %6) {kernel = 1} : f32[3, 20]
  return %8
}"""


@pytest.mark.parametrize("lowering", ["never", "always", "gpu"])
def test_an_epilogue_indexes_a_view_of_another_products_buffer_as_it_is(lowering: str) -> None:
    """`matmul.epilogue_views` took the reshapes of `%2` (another kernel's product, read from its
    buffer) for reshapes of the kernel's own product and read `%2` at the wrong index: out of
    its buffer (the no-grad LSTM compiled to NaN once `fuse` stopped storing `%3`). CPU GEMM
    plain and swapped, and the GPU lowering (which shares the rule)."""
    from torchburn.runtime.reference.interp import program_code

    target = host_target()
    lower_pass = LowerToLoopsGpu() if lowering == "gpu" else LowerToLoops(gemm_swap=lowering)
    program = PassManager([lower_pass], [], target=target).run(
        parse_graph(VIEW_OF_ANOTHER_PRODUCT))
    assert isinstance(program, lp.Program)
    verify(program)
    rng = np.random.default_rng(0)
    args = {b.name: rng.standard_normal([int(d.value) for d in b.shape]).astype(np.float32)  # type: ignore[attr-defined]
            for b in program.inputs}
    memory = {name: a.reshape(-1) for name, a in args.items()}
    for b in (*program.outputs, *program.temps):
        memory[b.name] = np.full(int(np.prod([int(d.value) for d in b.shape])), np.nan, np.float32)  # type: ignore[attr-defined]
    program_code(program).run(memory, {})  # checks every load against its buffer
    x, w, h, u, b = (args[n] for n in ("x", "w", "h", "u", "b"))
    expected = (x @ w + b).reshape(4, 3, 20)[1] + h @ u
    np.testing.assert_allclose(memory[program.outputs[0].name].reshape(3, 20), expected, rtol=1e-5, atol=1e-5)


VIEWED_OUTPUT = """graph @g(%a: f32[8, 5], %b: f32[5, 12], %c: f32[6, 4]) {
  %0 = matmul(%a, %b) : f32[8, 12]
  %1 = reshape(%0) {shape = [8, 2, 6]} : f32[8, 2, 6]
  %2 = exp(%c) : f32[6, 4]
  %3 = reshape(%2) {shape = [24]} : f32[24]
  %4 = add(%c, %c) : f32[6, 4]
  %5 = reshape(%4) {shape = [2, 12]} : f32[2, 12]
  %6 = mul(%4, %c) : f32[6, 4]
  return %1, %3, %5, %6
}"""


@pytest.mark.parametrize("lowering", [LowerToLoops, LowerToLoopsGpu])
def test_an_output_that_reshapes_another_kernels_result_is_its_buffer_viewed(lowering) -> None:  # type: ignore[no-untyped-def]
    """The GEMM stores into the output buffer in its own shape and the program returns it
    viewed `[8, 2, 6]`: no kernel copies it. A reshape whose operand is computed in its own
    kernel (`exp`, `add` inlined) keeps its kernel."""
    target = host_target()
    graph = PassManager(Pipeline.default().tensor, [], target=target).run(parse_graph(VIEWED_OUTPUT))
    program = PassManager([lowering()], [], target=target).run(graph)
    verify(program)
    text = print_ir(program)
    assert program.result_view(0) == (ex.Const(8), ex.Const(2), ex.Const(6)), text
    assert program.buffer(program.results[0]).shape == (ex.Const(8), ex.Const(12))
    assert [c.args[-1] for c in program.calls] == ["out0", "out1", "out2", "out3"], text  # one kernel an output
    assert [program.result_view(k) for k in (1, 2, 3)] == [None, None, None]
    assert parse_program(text.split("\nkernel ")[0] + "\n") == lp.Program(
        program.name, program.inputs, program.outputs, program.temps, program.symbols, program.calls, (),
        program.temp_offsets, program.workspace_bytes, program.results, program.result_views)
