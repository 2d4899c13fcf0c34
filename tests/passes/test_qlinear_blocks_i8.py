"""The int8-activation kernel for weights in ggml blocks (`passes/quant/qlinear_blocks_i8.py`):
every block type the table reads that way, against the float64 product of gguf-py's
dequantized weight and x quantized as the kernel quantizes it (int8 per block, round half
to even), over ragged shapes (widths that are not multiples of 256 for the 32-weight
blocks, odd N, several rows); the wide code vectors against the table's per-run codes; a
target without VNNI (AVX2, `pmaddubsw`); the reference interpreter; the byte-pattern loads
codegen makes of the legacy blocks' nibble halves; no access outside any buffer."""
from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.passes.test_qlinear import Compiled, run_guard_script
from tests.quant.test_block_types import blocks_graph, gguf_reference, random_blocks
from torchburn.ir.qblocks import BLOCK_TYPES, WIDE
from torchburn.passes.quant.qlinear import PREFETCH_BYTES
from torchburn.passes.quant.qlinear_blocks_i8 import split

pytest.importorskip("gguf")
#: The types the kernel reads (Q8_0's signed codes take the int8 layout instead).
TYPES = [name for name, bt in BLOCK_TYPES.items() if split(bt) is not None]


def _has_dot() -> bool:
    from torchburn.codegen import host_target

    t = host_target()
    return t.native_dot4(8) or t.small_dot4(8)


def quantized_x(x: np.ndarray, group: int) -> np.ndarray:
    """x as the kernel sees it: per row and group, `d = amax / 127`, `q = round(x * 127 / amax)`
    (f32 arithmetic, half to even), `d * q` in float64."""
    m, k = x.shape
    g = x.reshape(m, k // group, group)
    amax = np.abs(g).max(axis=-1, keepdims=True).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.round((g * inv).astype(np.float32))
    d = (amax / np.float32(127.0)).astype(np.float32)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(m, k)


def run_case(name: str, m: int, n: int, blocks: int, seed: int, c: Any = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, str]:
    bt = BLOCK_TYPES[name]
    k = blocks * bt.block
    if c is None:
        c = Compiled(blocks_graph(m, n, k, name, "auto"))
    attrs = dict(c.program.kernels[0].attrs)
    plan = attrs["qlinear"]
    weight = next(p.name for p in c.program.kernels[0].params if p.dtype.name == "u8")
    assert attrs["prefetch"] == f"{weight}:{PREFETCH_BYTES}"  # the streamed weight, ahead
    raw = random_blocks(name, n, blocks, seed)
    w = gguf_reference(raw, name).astype(np.float64)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)).astype(np.float32)
    x[:, :bt.block] *= 100.0  # blocks of x with different scales
    b = rng.standard_normal(n).astype(np.float32)
    out = np.zeros((m, n), np.float32)
    c({"x": x, "q": np.ascontiguousarray(raw), "b": b, "out0": out})
    expected = quantized_x(x, bt.block) @ w.T + b
    scale = np.abs(x).astype(np.float64) @ np.abs(w).T + 1
    return out, expected, scale, plan


@pytest.mark.parametrize("name", TYPES)
@pytest.mark.parametrize("m, n, blocks", [(1, 7, 3), (1, 33, 1), (3, 5, 2), (6, 9, 4)])
def test_matches_reference(name: str, m: int, n: int, blocks: int) -> None:
    """Integer sums are exact: against the product of the quantized x and the dequantized
    weight only f32 rounding of the block scales and of the sum over blocks remains."""
    if not _has_dot():
        pytest.skip("no byte dot product on 8 lanes here")
    bt = BLOCK_TYPES[name]
    if bt.block == 32:
        blocks *= 7  # 224 .. 896 weights: widths that are not multiples of 256
    out, expected, scale, plan = run_case(name, m, n, blocks, seed=blocks + m)
    assert plan.startswith(f"blocks-i8 block={name} mr={min(m, 4)} "), plan
    from torchburn.codegen import host_target
    assert ("pack=2" in plan) == (bt.block == 32 and host_target().native_dot4(16)), plan
    paired = name in ("Q2_K", "Q4_K", "Q6_K")  # chunks c, c + 4 differ only by byte offsets
    assert ("pair=yes" in plan) == (paired and host_target().native_dot4(16)), plan
    err = np.abs(out - expected) / scale
    assert err.max() <= 2e-6, err.max()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from(TYPES), m=st.integers(1, 5), n=st.integers(1, 40), blocks=st.integers(1, 9),
       seed=st.integers(0, 1000))
def test_property_matches_reference(name: str, m: int, n: int, blocks: int, seed: int) -> None:
    if not _has_dot():
        pytest.skip("no byte dot product on 8 lanes here")
    out, expected, scale, _ = run_case(name, m, n, blocks, seed)
    assert (np.abs(out - expected) / scale).max() <= 2e-6


@pytest.mark.parametrize("name", TYPES)
def test_wide_codes_are_the_runs_codes(name: str) -> None:
    """`wide(c)` lane l is `code(r)` lane l' for weight 32 c + l = run r, lane l' (the table's
    claim the kernel is built on), evaluated by the eager reference's gather."""
    import torch

    from torchburn.quant.blocks import _Evaluator

    bt = BLOCK_TYPES[name]
    raw = torch.from_numpy(random_blocks(name, 3, 2, 5)).reshape(3, 2, bt.nbytes)
    assert bt.wide is not None
    codes = torch.cat([_Evaluator(raw, bt.run)(bt.code(r)).expand(3, 2, bt.run) for r in range(bt.runs)], dim=-1)
    for c in range(bt.block // WIDE):
        wide = _Evaluator(raw, WIDE)(bt.wide(c))
        torch.testing.assert_close(wide, codes[..., c * WIDE:(c + 1) * WIDE], rtol=0, atol=0)


def test_without_vnni_the_same_sums() -> None:
    """AVX2 (`pmaddubsw` + `pmaddwd`: the codes are below 64, no pair sum saturates) gives the
    host's VNNI outputs bit for bit where both take the same chunks per dot product (Q3_K, Q5_K;
    with VNNI the legacy blocks go two to a 512-bit dot product and Q2_K, Q4_K, Q6_K their
    chunk pairs, which sums in another order), and the reference's within its tolerance."""
    from tests.passes import test_matmul
    from torchburn.codegen import Target, emit_program, entry_name, host_target
    from torchburn.ir.parser import parse_graph
    from torchburn.passes.base import PassManager
    from torchburn.passes.pipeline import Pipeline
    from torchburn.runtime import jit

    host = host_target()
    if not host.has_feature("avx512vnni"):
        pytest.skip("the host has no AVX512-VNNI to compare with")
    feats = ",".join(f for f in host.features.split(",")
                     if not f.startswith(("+avx512", "+amx")) and "avxvnni" not in f)
    avx2 = Target.from_features(host.triple, "haswell", feats)
    for name, m, n, blocks in [("Q6_K", 1, 9, 2), ("Q5_0", 2, 7, 9), ("Q2_K", 1, 5, 1), ("Q5_1", 1, 3, 4),
                               ("Q3_K", 2, 5, 2)]:
        text = blocks_graph(m, n, blocks * BLOCK_TYPES[name].block, name, "auto")
        outs = []
        for target in (host, avx2):
            pipeline = Pipeline.default()
            pipeline.loop = test_matmul._loop_passes()
            c = Compiled.__new__(Compiled)
            c.program = PassManager(pipeline.passes(), target=target).run(parse_graph(text))
            llvm_ir = emit_program(c.program, target)
            assert ("vpdpbusd" in llvm_ir) == (target is host)
            c.native = jit.load_object(jit.compile_llvm_ir(llvm_ir, target))
            c.entry = c.native.entry(entry_name(c.program))
            out, expected, scale, plan = run_case(name, m, n, blocks, 1, c)
            assert plan.startswith("blocks-i8"), plan
            assert (np.abs(out - expected) / scale).max() <= 2e-6
            outs.append((out, plan))
        if "pack=" not in outs[0][1] and "pair=" not in outs[0][1]:
            np.testing.assert_array_equal(outs[0][0], outs[1][0])


@pytest.mark.parametrize("name", ["Q6_K", "Q5_0", "Q4_K"])
def test_reference_interpreter_runs_the_kernel(name: str) -> None:
    """The golden model executes the same loop program (byte patterns, dot products, lane
    blends of run scales) with the compiled kernel's results."""
    from torchburn.runtime.reference.interp import program_code

    bt = BLOCK_TYPES[name]
    m, n, blocks = 2, 5, 2 if bt.block == 256 else 9
    c = Compiled(blocks_graph(m, n, blocks * bt.block, name, "auto"))
    out, expected, scale, plan = run_case(name, m, n, blocks, 3, c)
    assert plan.startswith("blocks-i8"), plan
    raw = random_blocks(name, n, blocks, 3)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((m, blocks * bt.block)).astype(np.float32)
    x[:, :bt.block] *= 100.0
    b = rng.standard_normal(n).astype(np.float32)
    ref_out = np.zeros((m, n), np.float32)
    memory = {"x": x.reshape(-1), "q": raw.reshape(-1), "b": b, "out0": ref_out.reshape(-1)}
    program_code(c.program).run(memory, {})
    np.testing.assert_allclose(ref_out, out, rtol=1e-5, atol=1e-5 * float(np.abs(out).max()))


def test_legacy_halves_are_byte_shuffles_not_gathers() -> None:
    """Q5_0's `%blk[6 + l % 16]` and `%blk[2 + l // 8]` are one load and a shuffle each."""
    from torchburn.codegen import emit_program, host_target

    c = Compiled(blocks_graph(1, 4, 64, "Q5_0", "auto"))
    llvm_ir = emit_program(c.program, host_target())
    assert "shufflevector" in llvm_ir
    assert "masked.gather" not in llvm_ir


def test_f32_activations_keep_the_f32_form() -> None:
    c = Compiled(blocks_graph(1, 4, 256, "Q6_K", "f32"))
    assert dict(c.program.kernels[0].attrs)["qlinear"].startswith("block=Q6_K ")


GUARD_SCRIPT = r'''
import sys
import numpy as np
sys.path.insert(0, {root!r})
from tests.passes import test_qlinear as t
from tests.passes import test_qlinear_blocks_i8 as g
from tests.quant.test_block_types import blocks_graph, gguf_reference, random_blocks
from torchburn.ir.qblocks import BLOCK_TYPES
exec(t.GUARDED_ARRAY)

for name, m, n, blocks in [("Q6_K", 1, 5, 2), ("Q5_0", 2, 3, 7), ("Q2_K", 1, 3, 1), ("Q5_1", 1, 2, 3)]:
    bt = BLOCK_TYPES[name]
    k = blocks * bt.block
    c = t.Compiled(blocks_graph(m, n, k, name, "auto"))
    assert dict(c.program.kernels[0].attrs)["qlinear"].startswith("blocks-i8")
    raw = random_blocks(name, n, blocks, 0)
    w = gguf_reference(raw, name).astype(np.float64)
    rng = np.random.default_rng(0)
    for at_end in (True, False):
        q = guarded(raw.shape, np.uint8, at_end); q[...] = raw
        x = guarded((m, k), np.float32, at_end); x[...] = rng.standard_normal((m, k))
        b = guarded((n,), np.float32, at_end); b[...] = rng.standard_normal(n)
        out = guarded((m, n), np.float32, at_end)
        c({{"x": x, "q": q, "b": b, "out0": out}})
        expected = g.quantized_x(np.asarray(x), bt.block) @ w.T + b
        scale = np.abs(x).astype(np.float64) @ np.abs(w).T + 1
        assert (np.abs(out - expected) / scale).max() <= 2e-6
print("GUARDS OK")
'''


def test_no_access_outside_buffers() -> None:
    """Every operand against an inaccessible page (after it, then before it)."""
    if not _has_dot():
        pytest.skip("no byte dot product on 8 lanes here")
    run_guard_script(GUARD_SCRIPT)
