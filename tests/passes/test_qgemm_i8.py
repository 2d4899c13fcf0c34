"""The many-row int8 `qlinear` kernel (`passes/quant/qgemm_i8.py`): results against a float64
reference of the quantized x and the dequantized weight for int4 (symmetric, with mins,
groups 32-128) and int8 (grouped, per channel) over ragged shapes, several row blocks, a
target without VNNI, the reference interpreter, no access outside any buffer; and
`qlinear-to-gemm` leaving these products to it."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from tests.passes.test_qlinear import Compiled, qlinear_graph, reference, run_guard_script, weights
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir

CASES = [  # m, n, k, kind, group, symmetric
    (32, 40, 256, "int4", 32, False), (33, 37, 128, "int4", 32, True), (37, 70, 576, "int4", 64, False),
    (40, 9, 256, "int4", 128, True), (48, 64, 320, "int8", 32, True), (35, 33, 256, "int8", None, True),
    (64, 17, 384, "int8", 64, True), (130, 50, 96, "int4", 32, False),
]


def _run(c: Compiled, m: int, n: int, k: int, kind: str, group: Optional[int], symmetric: bool,
         seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    arrays, wd = weights(n, k, kind, group, symmetric)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({**arrays, "x": x, "b": b, "out0": out})
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    return out, reference(x, wd, b, plan=plan, kind=kind, group=group or k)


def _skip_unless_planned(kind: str) -> None:
    """Skip where activations "auto" do not give this kind the kernel on the host: no byte
    dot product at all, or int8 weights without VNNI (they take dequantize + GEMM there)."""
    from torchburn.codegen import host_target

    host = host_target()
    if not (host.native_dot4(16) or host.small_dot4(8)):
        pytest.skip("no byte dot product on this host")
    if kind == "int8" and not host.native_dot4(16):
        pytest.skip("int8 weights take this kernel with VNNI only (activations auto); the host has none")


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_kernel_matches_reference(case: tuple) -> None:  # type: ignore[type-arg]
    """Integer sums are exact: only f32 rounding of scales and sums remains (1e-4)."""
    m, n, k, kind, group, symmetric = case
    _skip_unless_planned(kind)
    c = Compiled(qlinear_graph(m, n, k, kind, group, symmetric, activations="auto"))
    assert len(c.program.kernels) == 1, "the epilogue is fused"
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert plan.startswith("qgemm") and "act=int8" in plan, plan
    out, expected = _run(c, m, n, k, kind, group, symmetric)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_row_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """x larger than one block of quantized rows: blocks of 8 rows, the last one short."""
    from torchburn.passes.quant import qgemm_i8

    monkeypatch.setattr(qgemm_i8, "MAX_BLOCK_BYTES", 8 * 256)
    m, n, k = 45, 40, 256
    c = Compiled(qlinear_graph(m, n, k, "int4", 32, False, activations="auto"))
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert "rows=8 " in plan, plan
    out, expected = _run(c, m, n, k, "int4", 32, False)
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)


def test_without_vnni_the_same_sums() -> None:
    """A target without AVX-512 (AVX2's `pmaddubsw`, 8 lanes, signed int8 codes): int4 gives the
    host's outputs bit for bit (the same integer sums, the same f32 operations per column);
    int8 the reference's."""
    from torchburn.codegen import Target, emit_program, entry_name, host_target
    from torchburn.passes.base import PassManager
    from torchburn.passes.pipeline import Pipeline
    from torchburn.runtime import jit
    from tests.passes import test_matmul
    from torchburn.ir.verifier import verify

    host = host_target()
    if not host.has_feature("avx512vnni"):
        pytest.skip("the host has no AVX512-VNNI to compare with")
    feats = ",".join(f for f in host.features.split(",")
                     if not f.startswith(("+avx512", "+amx")) and "avxvnni" not in f)
    avx2 = Target.from_features(host.triple, "haswell", feats)
    for m, n, k, kind, group, symmetric in [(40, 21, 256, "int4", 32, False), (33, 19, 128, "int8", 32, True)]:
        text = qlinear_graph(m, n, k, kind, group, symmetric, activations="auto" if kind == "int4" else "int8")
        outs = []
        for target in (host, avx2):
            pipeline = Pipeline.default()
            pipeline.loop = test_matmul._loop_passes()
            c = Compiled(text)
            c.program = PassManager(pipeline.passes(), target=target).run(parse_graph(text))
            verify(c.program)
            llvm_ir = emit_program(c.program, target)
            assert ("vpdpbusd" in llvm_ir) == (target is host)
            c.native = jit.load_object(jit.compile_llvm_ir(llvm_ir, target))
            c.entry = c.native.entry(entry_name(c.program))
            plan = dict(c.program.kernels[0].attrs)["qlinear"]
            assert plan.startswith("qgemm") and (("nr=32" in plan) == (target is host)), plan
            out, expected = _run(c, m, n, k, kind, group, symmetric)
            np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
            outs.append(out)
        if kind == "int4":
            np.testing.assert_array_equal(outs[0], outs[1])


def test_reference_interpreter_runs_the_kernel() -> None:
    """The golden model executes the same loop program (lane-changing bitcasts, byte dot
    products) with the compiled kernel's results."""
    from torchburn.runtime.reference.interp import program_code

    m, n, k = 32, 18, 64
    c = Compiled(qlinear_graph(m, n, k, "int4", 32, False, activations="auto"))
    assert dict(c.program.kernels[0].attrs)["qlinear"].startswith("qgemm")
    assert "bitcast<u8, 64>" in print_ir(c.program) or "bitcast<u8, 32>" in print_ir(c.program)
    out, expected = _run(c, m, n, k, "int4", 32, False)
    arrays, _ = weights(n, k, "int4", 32, False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ref_out = np.zeros((m, n), np.float32)
    memory = {name: a.reshape(-1) for name, a in {**arrays, "x": x, "b": b, "out0": ref_out}.items()}
    program_code(c.program).run(memory, {})
    np.testing.assert_allclose(ref_out, out, rtol=1e-5, atol=1e-5)


def test_lane_changing_bitcast_round_trips_and_is_checked() -> None:
    from torchburn.ir.parser import parse_kernel, parse_program
    from torchburn.ir.verifier import VerificationError, verify

    c = Compiled(qlinear_graph(32, 8, 64, "int8", 32, True, activations="int8"))  # int8 x: on any host
    text = print_ir(c.program)
    assert "bitcast<i32, 1>" in text
    assert print_ir(parse_program(text)) == text
    good = "kernel @k(%a: i32[4] strides [1], %o: u8[16] strides [1]) {\n  %o[ramp(0, 1, 16)] = bitcast<u8, 16>(%a[ramp(0, 1, 4)])\n}"
    verify(parse_kernel(good))
    with pytest.raises(VerificationError, match="total width"):
        verify(parse_kernel(good.replace("bitcast<u8, 16>", "bitcast<u8, 8>").replace("ramp(0, 1, 16)", "ramp(0, 1, 8)")))


def test_qlinear_to_gemm_leaves_these_products() -> None:
    """On a target with VNNI, int4, int8 and ggml-block `qlinear`s of many rows stay for this
    kernel; with `int8_gemm=false`, and ggml blocks on a target without VNNI (AVX2), they take
    the dequantize + GEMM rewrite."""
    from tests.quant.test_block_types import blocks_graph
    from torchburn.codegen import Target, host_target
    from torchburn.passes.base import PassContext
    from torchburn.passes.tensor.qlinear_to_gemm import QLinearToGemm

    host = host_target()
    if not host.has_feature("avx512vnni"):
        pytest.skip("the host has no AVX512-VNNI")
    ctx = PassContext(host)
    blocks = blocks_graph(64, 8, 256, "Q6_K").replace("symmetric = true", 'symmetric = true, activations = "auto"')
    for text in (qlinear_graph(64, 16, 128, "int4", 32, True, activations="auto"),
                 qlinear_graph(64, 16, 128, "int8", 32, True, activations="auto"), blocks):
        assert "qlinear(" in print_ir(QLinearToGemm().run_in(parse_graph(text), ctx))
        assert "dequantize(" in print_ir(QLinearToGemm(int8_gemm=False).run_in(parse_graph(text), ctx))
    feats = ",".join(f for f in host.features.split(",") if not f.startswith(("+avx512", "+amx")) and "avxvnni" not in f)
    avx2 = PassContext(Target.from_features(host.triple, "haswell", feats))
    assert "dequantize(" in print_ir(QLinearToGemm().run_in(parse_graph(blocks), avx2))


GUARD_SCRIPT = r'''
import sys
import numpy as np
sys.path.insert(0, {root!r})
from tests.passes import test_qlinear as t
from tests.passes import test_qgemm_i8 as g8
from tests.passes.test_qlinear import Compiled
exec(t.GUARDED_ARRAY)

for (m, n, k, kind, group, sym) in g8.CASES:
    c = Compiled(t.qlinear_graph(m, n, k, kind, group, sym, activations="int8"))  # the kernel on any host
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert plan.startswith("qgemm"), plan
    arrays, wd = t.weights(n, k, kind, group, sym)
    rng = np.random.default_rng(0)
    for at_end in (True, False):
        gd = {{name: guarded(a.shape, a.dtype, at_end) for name, a in arrays.items()}}
        for name, a in arrays.items():
            gd[name][...] = a
        x = guarded((m, k), np.float32, at_end); x[...] = rng.standard_normal((m, k))
        b = guarded((n,), np.float32, at_end); b[...] = rng.standard_normal(n)
        out = guarded((m, n), np.float32, at_end)
        c({{**gd, "x": x, "b": b, "out0": out}})
        expected = t.reference(x, wd, b, plan=plan, kind=kind, group=group or k)
        np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-4)
print("GUARDS OK")
'''


def test_no_access_outside_buffers() -> None:
    """Every operand against an inaccessible page (after it, then before it); a read or write
    past either end would crash the child process."""
    run_guard_script(GUARD_SCRIPT)


@pytest.mark.parametrize("quant", ["int4", "int8"])
def test_quantized_linear_module_through_torch_compile(quant: str) -> None:
    """`QuantizedLinear` on 2 x 40 rows through torch.compile (a 3-D x, a bias), fully compiled,
    against eager within the error int8 activations can make: per group of x, each element is
    off by at most half its step (`amax / 254`), so an output is off by at most
    `sum_k |w_k| amax_G(k) / 254` (plus f32 rounding)."""
    import torch

    from tests.helpers import assert_fully_compiled, run_compiled
    from torchburn.quant import QuantizedLinear

    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 96)
    layer = QuantizedLinear.from_float(lin, quant, group_size=32)
    x = torch.randn(2, 40, 256)
    with torch.no_grad():
        expected = layer(x)
        weight = (layer(torch.eye(256)) - layer(torch.zeros(1, 256))).T  # the dequantized weight
        out, reports = run_compiled(layer, x)
    assert_fully_compiled(reports)
    amax = x.abs().reshape(2, 40, 8, 32).amax(-1, keepdim=True).expand(2, 40, 8, 32).reshape(2, 40, 256)
    bound = (amax / 254) @ weight.abs().T * 1.01 + 1e-4
    err = (out - expected).abs()
    assert torch.all(err <= bound), float((err / bound).max())
    assert float(err.max()) > 0, "int8 activations were expected (a bit-exact result means f32 ones ran)"


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_block_types(name: str) -> None:
    """Every ggml block type through the block table into the panel (codes offset by 128),
    against gguf-py's weights times x quantized per run as the kernel does."""
    from tests.passes.test_qlinear import quantized_x
    from tests.quant.test_block_types import blocks_graph, gguf_reference, random_blocks
    from torchburn.codegen import host_target
    from torchburn.ir.qblocks import BLOCK_TYPES

    if not host_target().has_feature("avx512vnni"):
        pytest.skip("ggml blocks take the panel kernel only with VNNI")
    bt = BLOCK_TYPES[name]
    m, n, k = 37, 35, 2 * max(bt.block, 128)
    c = Compiled(blocks_graph(m, n, k, name).replace('symmetric = true', 'symmetric = true, activations = "auto"'))
    plan = dict(c.program.kernels[0].attrs)["qlinear"]
    assert plan.startswith("qgemm"), plan
    raw = random_blocks(name, n, k // bt.block, 5)
    w = gguf_reference(raw, name).astype(np.float64)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({"x": x, "q": np.ascontiguousarray(raw), "b": b, "out0": out})
    expected = quantized_x(x, bt.run) @ w.T + b
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T + 1
    assert np.all(np.abs(out - expected) <= 2e-6 * scale), np.max(np.abs(out - expected) / scale)
