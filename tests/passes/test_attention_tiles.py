"""The prefill (tile) form of the CPU attention kernel (`passes/loopgen/attention_tiles.py`):
against eager PyTorch's sdpa for causal and full attention, grouped-query ratios 1/3/4/7,
head dims 32/64/80/128, lengths that are not multiples of the tile, the LLM engine's chunked
prefill (a cache prefix with masked slots, then the step's own causal keys), boolean masks and
fully masked rows; which form a step takes; and the skipping of dead key blocks."""
from __future__ import annotations

import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from torchburn.ir.printer import print_ir
from torchburn.passes.loopgen.attention_tiles import TilePlan, tile_plan
from tests.passes.test_matmul import Compiled

MASKED = float(torch.finfo(torch.float32).min)


def _causal_graph(hq: int, hk: int, tq: int, tk: int, d: int, causal: bool, scale: float) -> str:
    return f"""graph @main(%q: f32[1, {hq}, {tq}, {d}], %k: f32[1, {hk}, {tk}, {d}], %v: f32[1, {hk}, {tk}, {d}]) {{
  %0 = attention(%q, %k, %v) {{scale = {scale}, causal = {str(causal).lower()}, masked = false, segments = 1}} : f32[1, {hq}, {tq}, {d}]
  return %0
}}"""


def _run(c: Compiled, arrays: dict[str, np.ndarray], shape: tuple[int, ...]) -> torch.Tensor:
    out = np.full(shape, np.nan, np.float32)
    c({**arrays, c.program.outputs[0].name: out})
    return torch.from_numpy(out)


# (heads q, heads kv, Tq = Tk, head dim): every GQA ratio, head dim and ragged length at least once
CASES = [(1, 1, 1, 64), (3, 1, 7, 32), (4, 1, 33, 80), (7, 1, 130, 128), (6, 2, 513, 64),
         (9, 3, 130, 64), (4, 4, 33, 128), (7, 1, 7, 80), (3, 1, 513, 32), (8, 2, 16, 64)]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("hq,hk,t,d", CASES)
def test_matches_eager_sdpa(hq: int, hk: int, t: int, d: int, causal: bool) -> None:
    g = torch.Generator().manual_seed(hq * 1000 + t + d)
    q = torch.randn(1, hq, t, d, generator=g)
    k, v = (torch.randn(1, hk, t, d, generator=g) for _ in range(2))
    scale = 1.0 / d ** 0.5
    c = Compiled(_causal_graph(hq, hk, t, t, d, causal, scale))
    assert ("alloc %qt" in print_ir(c.program.kernels[0])) == (t >= 8)  # the tile form from 8 rows
    out = _run(c, {"q": q.numpy(), "k": k.numpy(), "v": v.numpy()}, (1, hq, t, d))
    want = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale, enable_gqa=hq != hk)
    # f32 with a polynomial exp and sums in another order: a few ulp per term
    torch.testing.assert_close(out, want, rtol=2e-5, atol=2e-5)


def _engine_graph(hq: int, hk: int, t: int, p: int, d: int, mask_dtype: str) -> str:
    """The LLM engine's step (`decoder.py`): the cache view of `p` slots (the filled ones, then
    the step's own, masked) and the step's `t` own keys, each segment with a mask."""
    return f"""graph @main(%q: f32[1, {hq}, {t}, {d}], %kp: f32[1, {hk}, {p}, {d}], %vp: f32[1, {hk}, {p}, {d}], %k: f32[1, {hk}, {t}, {d}], %v: f32[1, {hk}, {t}, {d}], %mp: {mask_dtype}[1, 1, {t}, {p}], %mn: {mask_dtype}[1, 1, {t}, {t}]) {{
  %0 = expand(%mp) {{shape = [1, {hq}, {t}, {p}]}} : {mask_dtype}[1, {hq}, {t}, {p}]
  %1 = expand(%mn) {{shape = [1, {hq}, {t}, {t}]}} : {mask_dtype}[1, {hq}, {t}, {t}]
  %2 = attention(%q, %kp, %vp, %k, %v, %0, %1) {{scale = 0.125, causal = false, masked = true, segments = 2}} : f32[1, {hq}, {t}, {d}]
  return %2
}}"""


def _engine_case(hq: int, hk: int, t: int, filled: int, d: int, start: int, seed: int):
    """Inputs and the allowed keys of a chunk of `t` tokens after `filled` cache slots, rows
    starting at slot `start` (left padding before it is never attended)."""
    g = torch.Generator().manual_seed(seed)
    p = filled + t
    q = torch.randn(1, hq, t, d, generator=g)
    kp, vp = (torch.randn(1, hk, p, d, generator=g) for _ in range(2))
    k, v = (torch.randn(1, hk, t, d, generator=g) for _ in range(2))
    slot = torch.arange(t)[:, None] + filled
    old_ok = (torch.arange(p)[None, :] < filled) & (torch.arange(p)[None, :] >= start)
    old_ok = old_ok.expand(t, p)
    new_ok = (torch.arange(t)[None, :] + filled <= slot) & (torch.arange(t)[None, :] + filled >= start)
    return q, kp, vp, k, v, old_ok[None, None], new_ok[None, None]


def _eager_engine(q, kp, vp, k, v, old_ok, new_ok) -> torch.Tensor:
    """Eager sdpa on the concatenated keys with the engine's additive mask (`decoder.MASKED`)."""
    mask = torch.where(torch.cat([old_ok, new_ok], -1), 0.0, MASKED)
    return F.scaled_dot_product_attention(q, torch.cat([kp, k], -2), torch.cat([vp, v], -2), attn_mask=mask,
                                          scale=0.125, enable_gqa=q.shape[1] != k.shape[1])


@pytest.mark.parametrize("hq,hk,t,filled,d", [(9, 3, 33, 0, 64), (9, 3, 130, 5, 64), (4, 1, 33, 130, 80),
                                               (7, 1, 130, 130, 32), (8, 8, 7, 40, 128), (6, 2, 513, 17, 64)])
def test_chunked_prefill_with_a_cache_prefix(hq: int, hk: int, t: int, filled: int, d: int) -> None:
    """The engine's chunk: the cache's filled slots, its own slots in the cache view (masked:
    the blocks the kernel skips), then its own keys under a causal mask."""
    q, kp, vp, k, v, old_ok, new_ok = _engine_case(hq, hk, t, filled, d, 0, t + filled)
    c = Compiled(_engine_graph(hq, hk, t, filled + t, d, "f32"))
    arrays = {"q": q.numpy(), "kp": kp.numpy(), "vp": vp.numpy(), "k": k.numpy(), "v": v.numpy(),
              "mp": torch.where(old_ok, 0.0, MASKED).numpy(), "mn": torch.where(new_ok, 0.0, MASKED).numpy()}
    out = _run(c, arrays, (1, hq, t, d))
    torch.testing.assert_close(out, _eager_engine(q, kp, vp, k, v, old_ok, new_ok), rtol=2e-5, atol=2e-5)


def test_boolean_masks_and_left_padding() -> None:
    """Boolean masks (keep where true), with the rows' first 20 slots padding: the first 20
    rows of the step are padding themselves, masked everywhere (eager's softmax of a row of
    -inf is NaN; the engine's additive masks keep such rows finite, see the next test)."""
    hq, hk, t, filled, d = 6, 2, 70, 12, 64
    q, kp, vp, k, v, old_ok, new_ok = _engine_case(hq, hk, t, filled, d, 20, 5)
    c = Compiled(_engine_graph(hq, hk, t, filled + t, d, "bool"))
    arrays = {"q": q.numpy(), "kp": kp.numpy(), "vp": vp.numpy(), "k": k.numpy(), "v": v.numpy(),
              "mp": old_ok.contiguous().numpy(), "mn": new_ok.contiguous().numpy()}
    out = _run(c, arrays, (1, hq, t, d))
    want = _eager_engine(q, kp, vp, k, v, old_ok, new_ok)
    live = slice(20 - filled, None)  # rows whose slot is at or after the start
    torch.testing.assert_close(out[:, :, live], want[:, :, live], rtol=2e-5, atol=2e-5)


def test_fully_masked_rows_stay_eager_s_average() -> None:
    """Rows masked everywhere by finite additive masks (left padding) never see a live key,
    so no block of theirs is skipped: each is the same average of the values as eager's."""
    hq, hk, t, filled, d = 3, 1, 40, 8, 32
    q, kp, vp, k, v, old_ok, new_ok = _engine_case(hq, hk, t, filled, d, 30, 11)
    c = Compiled(_engine_graph(hq, hk, t, filled + t, d, "f32"))
    arrays = {"q": q.numpy(), "kp": kp.numpy(), "vp": vp.numpy(), "k": k.numpy(), "v": v.numpy(),
              "mp": torch.where(old_ok, 0.0, MASKED).numpy(), "mn": torch.where(new_ok, 0.0, MASKED).numpy()}
    out = _run(c, arrays, (1, hq, t, d))
    want = _eager_engine(q, kp, vp, k, v, old_ok, new_ok)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, want, rtol=2e-5, atol=2e-5)


def test_dead_blocks_are_skipped_after_a_live_maximum() -> None:
    """The masked segments run last-first and each block's work sits under `if dead == false`,
    dead meaning every mask value <= -1e30 and every row's max >= -1e29; an unmasked segment
    has no such test."""
    body = print_ir(Compiled(_engine_graph(9, 3, 64, 128, 64, "f32")).program.kernels[0])
    assert len(re.findall(r"vreduce_max\(.*\) <= -1e\+30:f32 & vreduce_min\(.*\) >= -1e\+29:f32", body)) == 2, body
    assert len(re.findall(r"if dead\d+ == false", body)) == 2
    # the step's own keys (%k) are read before the cache's (%kp)
    assert body.index("%k[") < body.index("%kp[")
    plain = print_ir(Compiled(_causal_graph(9, 3, 64, 64, 64, True, 0.125)).program.kernels[0])
    assert "dead" not in plain


def test_tile_plan_fits_the_registers() -> None:
    """Scores and output columns take the registers less three; key blocks are whole register
    tiles."""
    assert tile_plan(16, 32, 16) == TilePlan(16, 1, 16, 16, 16)
    assert tile_plan(8, 16, 16) == TilePlan(8, 1, 13, 13, 13)
    assert tile_plan(8, 16, 32) == TilePlan(8, 1, 26, 13, 13)
    assert tile_plan(2, 16, 16) is None  # no vectors worth the name: the row form


def test_reference_engine_runs_the_tile_form() -> None:
    """The reference interpreter (the golden model) computes the tile form's loop IR, vectors
    and skipped blocks included, to eager's numbers: a chunk of 20 after 5 filled slots."""
    from torchburn.frontend.attention_op import attention
    from tests.helpers import assert_fully_compiled, engine, run_compiled

    q, kp, vp, k, v, old_ok, new_ok = _engine_case(6, 2, 20, 5, 32, 0, 4)
    masks = [torch.where(old_ok, 0.0, MASKED), torch.where(new_ok, 0.0, MASKED)]
    fn = lambda *a: attention(a[0], [a[1], a[3]], [a[2], a[4]], [a[5], a[6]], 0.125, False)  # noqa: E731
    with engine("reference"):
        out, reports = run_compiled(fn, q, kp, vp, k, v, *masks)
    assert_fully_compiled(reports)
    assert {s.engine for r in reports for s in r.subgraphs if s.compiled} == {"reference"}
    torch.testing.assert_close(out, _eager_engine(q, kp, vp, k, v, old_ok, new_ok), rtol=2e-5, atol=2e-5)


def test_symbolic_length_takes_the_tile_form() -> None:
    """A symbolic query length (a dynamic sequence) takes the tile form; one program serves a
    length below one tile and one across three."""
    text = """graph @main(%q: f32[1, 4, s0, 32], %k: f32[1, 2, s0, 32], %v: f32[1, 2, s0, 32]) {
  %0 = attention(%q, %k, %v) {scale = 0.25, causal = true, masked = false, segments = 1} : f32[1, 4, s0, 32]
  return %0
}"""
    c = Compiled(text)
    assert "alloc %qt" in print_ir(c.program.kernels[0])
    for t in (5, 37):
        g = torch.Generator().manual_seed(t)
        q = torch.randn(1, 4, t, 32, generator=g)
        k, v = (torch.randn(1, 2, t, 32, generator=g) for _ in range(2))
        out = np.full((1, 4, t, 32), np.nan, np.float32)
        c({"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), c.program.outputs[0].name: out}, [t])
        want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25, enable_gqa=True)
        torch.testing.assert_close(torch.from_numpy(out), want, rtol=2e-5, atol=2e-5)


def test_output_through_views_in_the_tile_form() -> None:
    """The tile form stores at the index of the permute and reshape computed in its kernel
    (heads merged into `[B, T, H*D]`, as a model's attention block returns them)."""
    text = """graph @main(%q: f32[2, 4, 40, 16], %k: f32[2, 2, 40, 16], %v: f32[2, 2, 40, 16]) {
  %0 = attention(%q, %k, %v) {scale = 0.3, causal = true, masked = false, segments = 1} : f32[2, 4, 40, 16]
  %1 = permute(%0) {dims = [0, 2, 1, 3]} : f32[2, 40, 4, 16]
  %2 = reshape(%1) {shape = [2, 40, 64]} : f32[2, 40, 64]
  return %2
}"""
    c = Compiled(text)
    assert len(c.program.kernels) == 1 and not c.program.temps
    assert "alloc %qt" in print_ir(c.program.kernels[0])
    g = torch.Generator().manual_seed(6)
    q = torch.randn(2, 4, 40, 16, generator=g)
    k, v = (torch.randn(2, 2, 40, 16, generator=g) for _ in range(2))
    out = np.full((2, 40, 64), np.nan, np.float32)
    c({"q": q.numpy(), "k": k.numpy(), "v": v.numpy(), c.program.outputs[0].name: out})
    want = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(torch.from_numpy(out), want.transpose(1, 2).reshape(2, 40, 64), rtol=2e-5, atol=2e-5)


def test_the_option_keeps_the_row_form() -> None:
    """`lower-to-loops{attention_tiles=false}` parses, changes the cache key and keeps the row
    form for a prefill step."""
    from torchburn.passes import parse_pipeline
    from torchburn.passes.lower_to_loops import LowerToLoops

    (rows,) = parse_pipeline("lower-to-loops{attention_tiles=false}")
    assert rows == LowerToLoops(attention_tiles=False) and rows.uuid() != LowerToLoops().uuid()
    text = _causal_graph(4, 2, 40, 40, 32, True, 0.25)
    assert "alloc %qt" not in print_ir(Compiled(text, lowering=rows).program.kernels[0])
    assert "alloc %qt" in print_ir(Compiled(text).program.kernels[0])


@pytest.mark.parametrize("t", [1, 3, 16])
def test_a_rows_result_does_not_depend_on_where_it_starts(t: int) -> None:
    """Bit for bit: the same query rows over the same keys give the same result whether their
    keys sit from slot 0 of the cache or after 1-100 slots of another request's keys (masked),
    in the row form (decode: 1 and 3 rows) and the tile form (a 16-token chunk). Key blocks
    count back from a segment's end (`block_origin`), where a row's keys end wherever it
    starts; counted from slot 0 they grouped the keys by the row's start, and a request's
    tokens depended on its company in the server's batch (docs/serve.md)."""
    hq, hk, d, filled = 6, 2, 64, 45
    g = torch.Generator().manual_seed(t)
    q = torch.randn(1, hq, t, d, generator=g)
    own_kp, own_vp = (torch.randn(1, hk, filled, d, generator=g) for _ in range(2))
    k, v = (torch.randn(1, hk, t, d, generator=g) for _ in range(2))
    results = {}
    for shift in (0, 1, 5, 31, 32, 33, 100):
        other_kp, other_vp = (torch.randn(1, hk, shift, d, generator=g) * 3 for _ in range(2))
        pad_kp, pad_vp = (torch.randn(1, hk, t, d, generator=g) for _ in range(2))  # the step's own slots
        kp, vp = torch.cat([other_kp, own_kp, pad_kp], -2), torch.cat([other_vp, own_vp, pad_vp], -2)
        p = shift + filled + t
        slot = torch.arange(t)[:, None] + shift + filled
        old_ok = ((torch.arange(p)[None, :] < shift + filled) & (torch.arange(p)[None, :] >= shift)).expand(t, p)
        new_ok = torch.arange(t)[None, :] + shift + filled <= slot
        c = Compiled(_engine_graph(hq, hk, t, p, d, "f32"))
        assert ("alloc %qt" in print_ir(c.program.kernels[0])) == (t >= 8)
        arrays = {"q": q.numpy(), "kp": kp.numpy(), "vp": vp.numpy(), "k": k.numpy(), "v": v.numpy(),
                  "mp": torch.where(old_ok, 0.0, MASKED)[None, None].numpy(),
                  "mn": torch.where(new_ok, 0.0, MASKED)[None, None].numpy()}
        results[shift] = _run(c, arrays, (1, hq, t, d))
    want = _eager_engine(q, own_kp, own_vp, k, v, torch.ones(1, 1, t, filled, dtype=torch.bool),
                         (torch.arange(t)[None, :] <= torch.arange(t)[:, None])[None, None])
    torch.testing.assert_close(results[0], want, rtol=2e-5, atol=2e-5)
    for shift, out in results.items():
        assert torch.equal(out, results[0]), (shift, float((out - results[0]).abs().max()))
