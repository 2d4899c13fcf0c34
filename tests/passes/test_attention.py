"""The `attention` IR op and its flash-attention kernel (`passes/loopgen/attention.py`): text
round trip and type rules, one kernel with no score matrix in memory, causal block skipping,
and results on the LLVM and reference engines against eager PyTorch over many shapes (decode
`Tq = 1`, prefill `Tq = Tk`, odd sizes, grouped-query heads, masks, two key segments)."""
from __future__ import annotations

import math
import re
from typing import Optional

import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchburn.frontend.attention_op import attention
from torchburn.ir import dtypes as dt
from torchburn.ir.ops import OpError, infer_types
from torchburn.ir.tensor_type import TensorType
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.passes.tensor.fusion import Fuse
from tests.helpers import engine, run_compiled, assert_fully_compiled
from tests.passes.test_matmul import Compiled

GRAPH = """graph @main(%q: f32[2, 4, 5, 8], %k: f32[2, 2, s0, 8], %v: f32[2, 2, s0, 8], %m: f32[2, 4, 5, s0]) {
  %0 = attention(%q, %k, %v, %m) {scale = 0.35, causal = false, masked = true, segments = 1} : f32[2, 4, 5, 8]
  return %0
}
"""


def test_round_trip() -> None:
    g = parse_graph(GRAPH)
    assert print_ir(g) == GRAPH.rstrip("\n") or print_ir(parse_graph(print_ir(g))) == print_ir(g)
    assert print_ir(parse_graph(print_ir(g))) == print_ir(g)


def _t(*shape: int) -> TensorType:
    return TensorType.of(dt.f32, shape)


Q, K, V, K3 = _t(1, 4, 5, 8), _t(1, 2, 6, 8), _t(1, 2, 6, 8), _t(1, 3, 6, 8)
ATTRS = dict(scale=0.5, causal=False, masked=False, segments=1)


@pytest.mark.parametrize("types,attrs,message", [
    ([Q, K, V], dict(masked=True), "expected 4 operands"),
    ([Q, K, V], dict(scale=1), "scale must be a float"),
    ([Q, K, V, K, V], dict(causal=True, segments=2), "causal takes one segment"),
    ([Q, K3, K3], {}, "do not group"),
    ([Q, K, _t(1, 2, 7, 8)], {}, "heads and keys of k and v"),
    ([Q, K, V, _t(1, 4, 5, 7)], dict(masked=True), "mask shape"),
    ([Q, _t(1, 2, 6, 4), V], {}, "head dim of q and k"),
])
def test_type_errors(types: list[TensorType], attrs: dict, message: str) -> None:
    with pytest.raises(OpError, match=message):
        infer_types("attention", types, {**ATTRS, **attrs})


def test_result_type() -> None:
    assert infer_types("attention", [Q, K, _t(1, 2, 6, 3)], ATTRS) == [_t(1, 4, 5, 3)]


def test_one_kernel_and_no_score_matrix() -> None:
    """Tq = Tk = 512: one kernel, no workspace (no [Tq, Tk] scores), a parallel outer loop and
    vector loads along the head dim."""
    text = """graph @main(%q: f32[1, 2, 512, 64], %k: f32[1, 2, 512, 64], %v: f32[1, 2, 512, 64]) {
  %0 = attention(%q, %k, %v) {scale = 0.125, causal = true, masked = false, segments = 1} : f32[1, 2, 512, 64]
  return %0
}"""
    c = Compiled(text)
    assert len(c.program.kernels) == 1 and not c.program.temps
    body = print_ir(c.program.kernels[0])
    assert "parallel for" in body and "ramp(" in body
    # causal: the key blocks of a tile of rows stop at the diagonal of its last row (in blocks
    # of 16 with AVX-512's 32 vector registers, 13 with AVX2's 16), counted back from there
    found = re.search(r"let (e\d+) = top\d+ \+ 1\n\s*let (nb\d+) = \(\1 \+ (\d+)\) // (\d+)\n"
                      r"\s*let lead\d+ = \2 \* \4 - \1\n\s*for jb\d+ in 0\.\.\2 ", body)
    assert found and int(found.group(3)) + 1 == int(found.group(4)), body


def _sdpa(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
          masks: list[Optional[torch.Tensor]], scale: float, causal: bool) -> torch.Tensor:
    """Eager PyTorch's sdpa over the concatenated segments (the independent reference)."""
    k, v = torch.cat(keys, -2), torch.cat(values, -2)
    mask = None
    if masks:
        parts = [m.broadcast_to((*q.shape[:-1], kk.shape[-2])) if m is not None
                 else torch.zeros((*q.shape[:-1], kk.shape[-2])) for m, kk in zip(masks, keys)]
        mask = torch.cat([p if p.dtype != torch.bool else torch.zeros(p.shape).masked_fill(~p, -math.inf)
                          for p in parts], -1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale,
                                          enable_gqa=q.shape[-3] != k.shape[-3])


CASES = st.fixed_dictionaries({
    "tq": st.sampled_from([1, 2, 5, 33]), "tk": st.sampled_from([1, 3, 17, 40, 70]),
    "d": st.sampled_from([4, 8, 12, 64]), "heads": st.sampled_from([(1, 1), (4, 2), (4, 1), (3, 3)]),
    "batch": st.sampled_from([1, 2]), "mask": st.sampled_from(["none", "bool", "float", "causal"]),
    "segments": st.sampled_from([1, 2]), "dv": st.sampled_from([None, 4]),
})


def _inputs(c: dict, seed: int) -> tuple:
    g = torch.Generator().manual_seed(seed)
    hq, hk = c["heads"]
    tq, tk, d, b = c["tq"], c["tk"], c["d"], c["batch"]
    if c["mask"] == "causal":
        tq = tk
    dv = c["dv"] or d
    q = torch.randn(b, hq, tq, d, generator=g)
    lens = [tk] if c["segments"] == 1 or c["mask"] == "causal" else [tk, max(1, tk // 3)]
    keys = [torch.randn(b, hk, n, d, generator=g) for n in lens]
    values = [torch.randn(b, hk, n, dv, generator=g) for n in lens]
    masks: list[Optional[torch.Tensor]] = []
    if c["mask"] == "float":
        masks = [torch.randn(b, 1, tq, n, generator=g) for n in lens]
    elif c["mask"] == "bool":  # every row keeps its first key, so no row is all masked
        masks = []
        for n in lens:
            m = torch.rand(tq, n, generator=g) > 0.4
            m[:, 0] = True
            masks.append(m)
        if len(lens) == 2:
            masks[1] = None  # an unmasked segment next to a masked one
    return q, keys, values, masks, 1.0 / math.sqrt(d), c["mask"] == "causal"


@settings(max_examples=14, deadline=None, suppress_health_check=list(HealthCheck))
@given(CASES, st.integers(0, 1000))
def test_llvm_and_reference_match_eager(case: dict, seed: int) -> None:
    q, keys, values, masks, scale, causal = _inputs(case, seed)
    expected = _sdpa(q, keys, values, masks, scale, causal)
    torch.testing.assert_close(attention(q, keys, values, masks, scale, causal), expected, rtol=1e-5, atol=1e-5)

    def fn(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
           masks: list[Optional[torch.Tensor]]) -> torch.Tensor:
        return attention(q, keys, values, masks, scale, causal)

    out, reports = run_compiled(fn, q, keys, values, masks)
    assert_fully_compiled(reports)
    # f32 with a polynomial exp and a reassociated (vector) dot product: a few ulp per term
    torch.testing.assert_close(out, expected, rtol=2e-5, atol=2e-5)
    if seed % 3 == 0:  # the reference interpreter is slow: a third of the cases
        with engine("reference"):
            golden, reports = run_compiled(fn, q, keys, values, masks)
        assert {s.engine for r in reports for s in r.subgraphs if s.compiled} == {"reference"}
        torch.testing.assert_close(golden, expected, rtol=2e-5, atol=2e-5)


def test_output_through_views_is_stored_by_the_attention_kernel() -> None:
    """An attention result returned through a permute and a reshape (heads merged into
    `[B, T, H*D]`) is stored at the view's index by the attention kernel: one kernel, no
    temporary; equal to eager (GQA, causal, ragged rows)."""
    text = """graph @main(%q: f32[2, 4, 7, 8], %k: f32[2, 2, 7, 8], %v: f32[2, 2, 7, 8]) {
  %0 = attention(%q, %k, %v) {scale = 0.3, causal = true, masked = false, segments = 1} : f32[2, 4, 7, 8]
  %1 = permute(%0) {dims = [0, 2, 1, 3]} : f32[2, 7, 4, 8]
  %2 = reshape(%1) {shape = [2, 7, 32]} : f32[2, 7, 32]
  return %2
}"""
    c = Compiled(text)
    assert len(c.program.kernels) == 1 and not c.program.temps, print_ir(c.program)
    # the heads' rows of 8 merged into the last dim, stored as vectors along it
    assert re.search(r"%out0\[b\d+, i\d+, ramp\(h\d+ \* 8, 1, 8\)\]", print_ir(c.program.kernels[0]))
    g = torch.Generator().manual_seed(2)
    q = torch.randn(2, 4, 7, 8, generator=g)
    k, v = (torch.randn(2, 2, 7, 8, generator=g) for _ in range(2))
    fn = lambda a, b, c: attention(a, [b], [c], [], 0.3, True).transpose(1, 2).reshape(2, 7, 32)  # noqa: E731
    out, reports = run_compiled(fn, q, k, v)
    assert_fully_compiled(reports)
    kernels = [x for r in reports for s in r.subgraphs for x in s.kernels]
    assert len(kernels) == 1, kernels
    expected = _sdpa(q, [k], [v], [], 0.3, True).transpose(1, 2).reshape(2, 7, 32)
    torch.testing.assert_close(out, expected, rtol=2e-5, atol=2e-5)


def test_attention_read_beside_its_view_keeps_its_buffer() -> None:
    """The result also read by another op (here: returned itself) is stored once; the view
    copies it in a kernel of its own."""
    text = """graph @main(%q: f32[1, 2, 7, 8], %k: f32[1, 2, 7, 8], %v: f32[1, 2, 7, 8]) {
  %0 = attention(%q, %k, %v) {scale = 0.5, causal = false, masked = false, segments = 1} : f32[1, 2, 7, 8]
  %1 = permute(%0) {dims = [2, 0, 1, 3]} : f32[7, 1, 2, 8]
  return %0, %1
}"""
    graph = Fuse().run(parse_graph(text))
    assert [op.attrs.get("kernel") for op in graph.ops] == [0, 1]


def test_half_precision_inputs() -> None:
    q, k, v = (torch.randn(1, 2, 9, 16).to(torch.bfloat16) for _ in range(3))
    out, reports = run_compiled(lambda a, b, c: attention(a, [b], [c], [], 0.25, True), q, k, v)
    assert_fully_compiled(reports)
    torch.testing.assert_close(out, _sdpa(q.float(), [k.float()], [v.float()], [], 0.25, True).to(torch.bfloat16))


def test_dynamic_key_length_compiles_once() -> None:
    """The key length is symbolic (marked dynamic, as the LLM marks its cache view): one
    compiled graph serves every length."""
    from torchburn.backend import report as rep

    torch._dynamo.reset()
    fn = torch.compile(lambda q, k, v: attention(q, [k], [v], [], 0.5, False), backend="torchburn")
    q = torch.randn(1, 2, 1, 8)
    records = rep.start_recording()
    try:
        for n in (5, 9, 23):
            k, v = torch.randn(1, 2, n, 8), torch.randn(1, 2, n, 8)
            torch._dynamo.mark_dynamic(k, 2)
            torch._dynamo.mark_dynamic(v, 2)
            torch.testing.assert_close(fn(q, k, v), _sdpa(q, [k], [v], [], 0.5, False), rtol=2e-5, atol=2e-5)
    finally:
        rep.stop_recording()
    assert len(records) == 1
    assert_fully_compiled(list(records))


def test_gpu_form_is_the_flash_kernel_nest() -> None:
    """`lower-to-loops-gpu` writes the `(*B, Hq, Tq)` row nest of `loopgen/attention_gpu.py`,
    marked for WGSL's flash-attention kernel, which `gpu-map` leaves as it is."""
    from torchburn.codegen import host_target
    from torchburn.passes.base import PassManager, get_pass
    from torchburn.passes.gpu import lower as gpu_lower, map as gpu_map  # noqa: F401  (registers the passes)

    p = PassManager([get_pass("fuse")(), get_pass("lower-to-loops-gpu")(), get_pass("gpu-map")()],
                    target=host_target()).run(parse_graph(GRAPH))
    text = print_ir(p.kernels[0])
    assert len(p.kernels) == 1 and p.kernels[0].body.annotation("gpu") == "attention", text
    assert 'gpu = "grid"' not in text and 'attn = "q"' in text and 'attn = "out"' in text, text



def test_block_sizes_are_pass_options() -> None:
    """`lower-to-loops{attention_block_q=2,attention_block_k=8,attention_rows=1}` parses,
    changes the kernel's key blocks and keeps the numbers; a non-positive size is refused."""
    import numpy as np

    from torchburn.passes import PassError, parse_pipeline
    from torchburn.passes.lower_to_loops import LowerToLoops

    (small,) = parse_pipeline("lower-to-loops{attention_block_q=2,attention_block_k=8,attention_rows=1}")
    assert small == LowerToLoops(attention_block_q=2, attention_block_k=8, attention_rows=1)
    assert small.uuid() != LowerToLoops().uuid()
    text = """graph @main(%q: f32[1, 2, 19, 8], %k: f32[1, 2, 19, 8], %v: f32[1, 2, 19, 8]) {
  %0 = attention(%q, %k, %v) {scale = 0.35, causal = true, masked = false, segments = 1} : f32[1, 2, 19, 8]
  return %0
}"""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 19, 8, generator=g) for _ in range(3))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.35).numpy()
    bodies = []
    for lowering in (LowerToLoops(), small):
        c = Compiled(text, lowering=lowering)
        out = np.zeros((1, 2, 19, 8), np.float32)
        c({"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), c.program.outputs[0].name: out})
        np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
        bodies.append(print_ir(c.program.kernels[0]))
    assert bodies[0] != bodies[1] and "+ 7) // 8" in bodies[1] and "+ 7) // 8" not in bodies[0]
    with pytest.raises(PassError, match="attention_rows=0; expected a positive integer"):
        LowerToLoops(attention_rows=0)


@pytest.mark.parametrize("head_dim", [8, 16, 32])
def test_a_row_gets_the_same_result_wherever_it_starts_in_the_cache(head_dim: int) -> None:
    """Bit for bit: one row's keys at the end of a cache view of `L + pad` slots, the `pad`
    slots before them masked (`MASKED`, as a row beside longer ones in the server's shared
    cache), give the result of the same keys alone (`pad = 0`), compiled once for every length
    as the LLM's step is. The blocks end at the view's end (`block_origin`), and every loop over a
    block's keys runs all of its lanes: found on AVX-512, where `split-accumulators` split the
    value sum of a loop starting at block 0's first key, so each key's partial sum depended on
    the pad."""
    masked = torch.finfo(torch.float32).min

    def step(q, kv, start, k, v, new_mask):  # type: ignore[no-untyped-def]
        p = kv.shape[3]
        old_mask = torch.where(torch.arange(p) < start, masked, 0.0).view(1, 1, 1, p)
        return attention(q, [kv[0], k], [kv[1], v], [old_mask, new_mask], 0.25, False)

    torch._dynamo.reset()
    compiled = torch.compile(step, backend="torchburn")
    g = torch.Generator().manual_seed(head_dim)
    q = torch.randn(1, 4, 1, head_dim, generator=g)
    k, v = torch.randn(2, 1, 2, 1, head_dim, generator=g)
    new_mask = torch.zeros(1, 1, 1, 1)
    for length in (4, 7, 20, 33):
        row = torch.randn(2, 1, 2, length, head_dim, generator=g)
        alone = None
        for pad in (0, 1, 3, 5, 12, 16, 30, 41):
            kv = torch.randn(2, 1, 2, length + pad, head_dim, generator=g)
            kv[..., pad:, :] = row
            torch._dynamo.mark_dynamic(kv, 3)
            out = compiled(q, kv, torch.tensor(pad), k, v, new_mask)
            if alone is None:
                alone = out
                torch.testing.assert_close(out, _sdpa(q, [row[0], k], [row[1], v], [], 0.25, False),
                                           rtol=2e-5, atol=2e-5)
            assert torch.equal(out, alone), (length, pad, float((out - alone).abs().max()))
