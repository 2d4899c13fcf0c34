"""Every ggml block type of the table (`ir/qblocks.py`): the reference dequantization equals
gguf-py's `gguf.quants.dequantize` bit for bit on random blocks, the eager custom ops
(`linear_blocks`, `embedding_blocks`) follow it, and the compiler's generated kernels (the SIMD
form, the plain per-element form, and the reference engine running the same loop IR) match the
float64 product for GEMV and GEMM shapes, ragged M and N included."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import assert_fully_compiled, run_compiled
from torchburn.ir.qblocks import BLOCK_TYPES, f16_offsets
from torchburn.quant import BlockEmbedding, BlockWeight, QuantizedLinear, dequantize_block_rows

gguf = pytest.importorskip("gguf")
TYPES = list(BLOCK_TYPES)


def random_blocks(name: str, rows: int, n_blocks: int, seed: int) -> np.ndarray:
    """uint8 ``[rows, n_blocks * nbytes]``: random bytes, with finite float16 scales (normal,
    subnormal and zero ones mixed in, negative too)."""
    bt = BLOCK_TYPES[name]
    rng = np.random.default_rng(seed)
    raw = rng.integers(0, 256, (rows, n_blocks, bt.nbytes), dtype=np.uint8)
    for o in f16_offsets(bt):
        scale = rng.standard_normal((rows, n_blocks)) * 10.0 ** rng.integers(-6, 1, (rows, n_blocks))
        scale[rng.random((rows, n_blocks)) < 0.05] = 0.0
        raw[:, :, o:o + 2] = scale.astype(np.float16).view(np.uint8).reshape(rows, n_blocks, 2)
    return raw.reshape(rows, -1)


def gguf_reference(raw: np.ndarray, name: str) -> np.ndarray:
    return gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[name])


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("seed", range(4))
def test_dequantize_equals_gguf_py_bit_for_bit(name: str, seed: int) -> None:
    raw = random_blocks(name, 5, 3, seed)
    expected = gguf_reference(raw, name)
    got = dequantize_block_rows(torch.from_numpy(raw), name).numpy()
    assert got.shape == expected.shape
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_table_sizes_are_gguf_sizes() -> None:
    from gguf.constants import GGML_QUANT_SIZES

    for name, bt in BLOCK_TYPES.items():
        kind = gguf.GGMLQuantizationType[name]
        assert int(kind) == bt.ggml_type
        assert GGML_QUANT_SIZES[kind] == (bt.block, bt.nbytes)
        assert bt.block % bt.run == 0


@pytest.mark.parametrize("name", TYPES)
def test_eager_linear_and_embedding(name: str) -> None:
    bt = BLOCK_TYPES[name]
    n_blocks = 512 // bt.block
    raw = random_blocks(name, 37, n_blocks, 7)
    w = torch.from_numpy(gguf_reference(raw, name))
    weight = BlockWeight(torch.from_numpy(raw), name)
    assert (weight.out_features, weight.in_features) == (37, 512)
    bias = torch.randn(37)
    layer = QuantizedLinear.from_weight(weight, bias)
    x = torch.randn(3, 2, 512)
    torch.testing.assert_close(layer(x), x @ w.T + bias, rtol=1e-5, atol=1e-5)
    emb = BlockEmbedding(weight)
    ids = torch.tensor([[3, 0, 36], [5, 5, 1]])
    torch.testing.assert_close(emb(ids), w[ids], rtol=0, atol=0)


@pytest.mark.parametrize("name", TYPES)
def test_compiled_embedding_is_exact_and_checks_ids(name: str) -> None:
    """`embedding_blocks` compiles (the asked rows gathered, then decoded by the table): the
    eager op's values exactly, and a token id out of range is the eager op's IndexError."""
    bt = BLOCK_TYPES[name]
    raw = random_blocks(name, 37, 512 // bt.block, 3)
    emb = BlockEmbedding(BlockWeight(torch.from_numpy(raw), name))
    ids = torch.tensor([[3, 0, 36], [5, 5, 1]])
    out, reports = run_compiled(emb, ids)
    assert_fully_compiled(reports)
    torch.testing.assert_close(out, torch.from_numpy(gguf_reference(raw, name))[ids], rtol=0, atol=0)
    compiled = torch.compile(emb, backend="torchburn")
    compiled(ids)
    with pytest.raises(IndexError):
        compiled(torch.tensor([[3, 0, 37], [5, 5, 1]]))


def test_bad_block_weights_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown block type 'IQ4_XS'"):
        BlockWeight(torch.zeros(2, 136, dtype=torch.uint8), "IQ4_XS")
    with pytest.raises(ValueError, match="not whole blocks of 210 bytes"):
        BlockWeight(torch.zeros(2, 200, dtype=torch.uint8), "Q6_K")
    layer = QuantizedLinear.from_weight(BlockWeight(torch.zeros(2, 210, dtype=torch.uint8), "Q6_K"))
    with pytest.raises(ValueError, match="in_features=256"):
        layer(torch.zeros(1, 128))


# ---- kernels generated from the table -----------------------------------------------------------

def blocks_graph(m: int, n: int, k: int, name: str, activations: str = "") -> str:
    """`qlinear` of kind "blocks" plus a bias, as tensor IR text (`activations`: the op's
    attribute, none by default)."""
    bt = BLOCK_TYPES[name]
    act = f', activations = "{activations}"' if activations else ""
    attrs = f'{{kind = "blocks", block_type = "{name}", group_size = {bt.block}, symmetric = true{act}}}'
    return (f"graph @main(%x: f32[{m}, {k}], %q: u8[{n}, {k // bt.block * bt.nbytes}], %b: f32[{n}]) {{\n"
            f"  %0 = qlinear(%x, %q) {attrs} : f32[{m}, {n}]\n"
            f"  %1 = expand(%b) {{shape = [{m}, {n}]}} : f32[{m}, {n}]\n"
            f"  %2 = add(%0, %1) : f32[{m}, {n}]\n  return %2\n}}")


@pytest.fixture
def no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("form", ["simd", "plain"])
@pytest.mark.parametrize("m", [1, 5])
def test_generated_kernels_match_reference(name: str, form: str, m: int, no_disk_cache: Any) -> None:
    """GEMV (M = 1) and the multi-row form with a ragged last tile (M = 5 by MR = 4, N = 7 by
    NR = 2), SIMD and plain (GPU) forms of f32 activations, against the float64 product of
    gguf-py's weights (int8 activations: tests/passes/test_qlinear_blocks_i8.py)."""
    from tests.passes.test_qlinear import Compiled

    bt = BLOCK_TYPES[name]
    n, k = 7, 2 * max(bt.block, 128)
    c = Compiled(blocks_graph(m, n, k, name, "f32"), lowering="lower-to-loops" if form == "simd" else "lower-to-loops-gpu")
    plans = [dict(kk.attrs).get("qlinear") for kk in c.program.kernels]
    assert len(plans) == 1 and (plans[0] is not None) == (form == "simd")
    assert form != "simd" or plans[0].startswith(f"block={name} mr={min(m, 4)} ")
    raw = random_blocks(name, n, k // bt.block, m)
    w = gguf_reference(raw, name).astype(np.float64)
    rng = np.random.default_rng(m)
    x = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({"x": x, "q": np.ascontiguousarray(raw), "b": b, "out0": out})
    expected = x.astype(np.float64) @ w.T + b
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T + 1
    assert np.all(np.abs(out - expected) <= 2e-6 * scale), np.max(np.abs(out - expected) / scale)


@pytest.fixture
def engine(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Any:
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_ENGINE", request.param)
    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")
    reload_config()
    yield request.param
    monkeypatch.undo()
    reload_config()


@pytest.mark.parametrize("engine", ["llvm", "reference"], indirect=True)
@pytest.mark.parametrize("name", ["Q4_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_compiled_op_matches_eager(name: str, engine: str) -> None:
    """`torch.compile` of a `QuantizedLinear` holding blocks: fully compiled (strict mode),
    equal to the eager op, on the native and the reference engines; GEMV, a ragged GEMM and a
    dynamic M. The random blocks' scales make terms up to ~1e4 whose sums may cancel, so the
    tolerance is f32 rounding of the terms (`|x| @ |w|^T`), not of the result (on an AVX2
    host the 6-row product is a dequantize + GEMM, summing in another order than eager's)."""
    bt = BLOCK_TYPES[name]
    raw = random_blocks(name, 21, 512 // bt.block, 3)
    layer = QuantizedLinear.from_weight(BlockWeight(torch.from_numpy(raw), name), torch.randn(21))
    w = dequantize_block_rows(torch.from_numpy(raw), name).float()
    for shape in [(1, 512), (6, 512)]:
        x = torch.randn(shape)
        with torch.no_grad():
            expected = layer(x)
            out, reports = run_compiled(layer, x)
        scale = x.abs() @ w.abs().T + 1
        assert torch.all((out - expected).abs() <= 2e-6 * scale), ((out - expected).abs() / scale).max()
        assert_fully_compiled(reports)


#: target -> a vector register of its assembly, and the f32 lanes of its LLVM IR
TARGETS = {"avx2": (r"%ymm\d+", 8), "avx512": (r"%zmm\d+", 16), "neon": (r"\bv\d+\.4s\b", 4)}


@pytest.mark.parametrize("target", list(TARGETS))
@pytest.mark.parametrize("name", TYPES)
def test_kernels_for_each_target(name: str, target: str, no_disk_cache: Any) -> None:
    """The kernels compiled for AVX2, AVX-512 and aarch64 NEON: vectors of the target's width
    in the LLVM IR and its registers in the assembly; run (GEMV and a ragged GEMM in one
    program) where this CPU can, else emitted and assembled only."""
    import ctypes
    import re

    from torchburn.codegen.target import named_target, runs_here
    from torchburn.compiler import driver
    from torchburn.ir.parser import parse_graph

    bt = BLOCK_TYPES[name]
    t = named_target(target)
    register, lanes = TARGETS[target]
    n, k = 9, 2 * max(bt.block, 128)
    for m in (1, 6):
        compiled, _ = driver.compile_graph(parse_graph(blocks_graph(m, n, k, name, "f32")), target=t)
        assert f"<{lanes} x float>" in compiled.llvm_ir
        assert f"<{2 * lanes} x float>" not in compiled.llvm_ir, "vectors wider than the target's"
        assert re.search(register, compiled.assembly()), f"no {register} in the {target} assembly"
        if not runs_here(t):
            continue
        raw = random_blocks(name, n, k // bt.block, m)
        rng = np.random.default_rng(m)
        x = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal(n).astype(np.float32)
        out = np.zeros((m, n), np.float32)
        arrays = {"x": x, "q": np.ascontiguousarray(raw), "b": b, "out0": out}
        program = compiled.signature()
        names = [buf.name for buf in (*program.inputs, *program.outputs)]
        ptrs = (ctypes.c_void_p * len(names))(*[arrays[nm].ctypes.data for nm in names])
        syms = (ctypes.c_int64 * 1)(0)
        size = int(getattr(program.workspace_bytes, "value", 0))
        ws = np.zeros(size + 64, np.uint8)
        compiled.entry(ctypes.addressof(ptrs), ctypes.addressof(syms), ws.ctypes.data)
        w = gguf_reference(raw, name).astype(np.float64)
        expected = x.astype(np.float64) @ w.T + b
        scale = np.abs(x).astype(np.float64) @ np.abs(w).T + 1
        assert np.all(np.abs(out - expected) <= 2e-6 * scale)


def test_verifier_rejects_bad_block_ops() -> None:
    from torchburn.ir.ops import OpError
    from torchburn.ir.parser import parse_graph
    from torchburn.ir.verifier import verify

    good = blocks_graph(2, 8, 512, "Q4_K")
    verify(parse_graph(good))
    for old, new, message in [
        ('block_type = "Q4_K"', 'block_type = "IQ4_XS"', "block_type must be one of"),
        ("group_size = 256", "group_size = 32", "needs group_size = 256"),
        ("%q: u8[8, 288]", "%q: u8[8, 290]", "bytes per row"),
        ("%q: u8[8, 288]", "%q: i8[8, 288]", "must be u8"),
    ]:
        assert old in good
        with pytest.raises((OpError, ValueError), match=message):
            verify(parse_graph(good.replace(old, new)))


def test_state_dict_round_trip() -> None:
    raw = random_blocks("Q3_K", 5, 2, 0)
    layer = QuantizedLinear.from_weight(BlockWeight(torch.from_numpy(raw), "Q3_K"), torch.randn(5))
    fresh = QuantizedLinear(512, 5, bias=True, quant_type="blocks", block_type="Q3_K")
    fresh.load_state_dict(layer.state_dict())
    x = torch.randn(2, 512)
    torch.testing.assert_close(fresh(x), layer(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="block_type is given exactly when"):
        QuantizedLinear(512, 5, quant_type="int8", block_type="Q3_K")
