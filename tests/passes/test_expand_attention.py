"""`expand-attention` (`passes/tensor/expand_attention.py`): the fused attention op rewritten as
matrix products around one row softmax computes what the op computes (compiled here on the
CPU, where the expanded graph runs through the ordinary pipeline), for grouped-query heads
folded or repeated, two key segments with boolean and additive masks, causal prefill and
odd sizes; ops it cannot rewrite are left alone."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest
import torch

from tests.passes.test_matmul import Compiled
from torchburn.frontend.attention_op import attention
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify
from torchburn.passes.tensor import expand_attention
from torchburn.passes.tensor.expand_attention import ExpandAttention


def _docstring_graph(part: str) -> str:
    text = (expand_attention.__doc__ or "").split(f"{part}:\n\n")[1]
    lines = [line[4:] for line in text.splitlines()]
    return "\n".join(lines[:lines.index("}") + 1])


def _expand(text: str, **options: bool) -> str:
    g = ExpandAttention(**options).run(parse_graph(text))
    verify(g)
    g.rename_canonically()
    return print_ir(g).strip()


def test_docstring_example() -> None:
    assert _expand(_docstring_graph("Before")) == _docstring_graph("After").strip()


def _shape(t: tuple[int, ...]) -> str:
    return ", ".join(map(str, t))


def _graph(q: tuple[int, ...], segs: list[tuple[int, ...]], masks: list[Optional[str]], causal: bool,
           scale: float, dv: int) -> str:
    """An attention graph: `masks[s]` is None, "bool" or "f32" (masks then for every segment)."""
    params = [f"%q: f32[{_shape(q)}]"]
    ops = ["%q"]
    for s, k in enumerate(segs):
        params += [f"%k{s}: f32[{_shape(k)}]", f"%v{s}: f32[{_shape((*k[:-1], dv))}]"]
        ops += [f"%k{s}", f"%v{s}"]
    masked = any(m is not None for m in masks)
    if masked:
        for s, (m, k) in enumerate(zip(masks, segs)):
            params.append(f"%m{s}: {m}[{_shape((*q[:-1], k[-2]))}]")
            ops.append(f"%m{s}")
    out = _shape((*q[:-1], dv))
    return (f"graph @main({', '.join(params)}) {{\n"
            f"  %0 = attention({', '.join(ops)}) {{scale = {scale}, causal = {str(causal).lower()}, "
            f"masked = {str(masked).lower()}, segments = {len(segs)}}} : f32[{out}]\n"
            f"  return %0\n}}\n")


CASES = [
    # decode: one query row, a cache segment and the step's own key, GQA (4 query heads over 2)
    ((1, 4, 1, 16), [(1, 2, 13, 16), (1, 2, 1, 16)], ["f32", "f32"], False, 16),
    # prefill: causal, odd sizes, GQA with 3 heads per key/value head
    ((2, 6, 7, 8), [(2, 2, 7, 8)], [None], True, 8),
    # causal with fewer queries than keys (top-left aligned), one head group
    ((1, 2, 3, 4), [(1, 2, 5, 4)], [None], True, 6),
    # boolean masks over two segments, value dim unlike the head dim
    ((2, 2, 5, 8), [(2, 1, 6, 8), (2, 1, 3, 8)], ["bool", "bool"], False, 5),
]


def _arrays_and_reference(rng: np.random.Generator, q: tuple[int, ...], segs: list, masks: list,
                          causal: bool, scale: float, dv: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Random operands named as `_graph` names them (masks keep each row's first key) and the
    op's result computed by PyTorch."""
    arrays: dict[str, np.ndarray] = {"q": rng.standard_normal(q).astype(np.float32)}
    for s, k in enumerate(segs):
        arrays[f"k{s}"] = rng.standard_normal(k).astype(np.float32)
        arrays[f"v{s}"] = rng.standard_normal((*k[:-1], dv)).astype(np.float32)
        if masks[s] == "bool":
            m = rng.random((*q[:-1], k[-2])) > 0.4
            m[..., 0] = True
            arrays[f"m{s}"] = m
        elif masks[s] == "f32":
            arrays[f"m{s}"] = np.where(rng.random((*q[:-1], k[-2])) > 0.3, 0.0, -1e30).astype(np.float32)
    t = {n: torch.from_numpy(a) for n, a in arrays.items()}
    with torch.no_grad():
        want = attention(t["q"], [t[f"k{s}"] for s in range(len(segs))], [t[f"v{s}"] for s in range(len(segs))],
                         [t.get(f"m{s}") for s in range(len(segs))], scale, causal).numpy()
    return arrays, want


@pytest.mark.parametrize("fold_groups", [True, False])
@pytest.mark.parametrize("q,segs,masks,causal,dv", CASES)
def test_expanded_attention_computes_the_op(q, segs, masks, causal, dv, fold_groups) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(len(segs) + q[2])
    scale = 0.3
    text = _graph(q, segs, masks, causal, scale, dv)
    expanded = _expand(text, fold_groups=fold_groups)
    assert "attention(" not in expanded
    if fold_groups and q[1] != segs[0][1]:
        assert "expand(%k" not in expanded and "expand(%v" not in expanded
    arrays, want = _arrays_and_reference(rng, q, segs, masks, causal, scale, dv)
    compiled = Compiled(expanded)
    out = np.full(want.shape, np.nan, np.float32)
    compiled({**arrays, "out0": out})
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_symbolic_unequal_heads_are_left_alone() -> None:
    text = """
graph @main(%q: f32[1, s0, 2, 8], %k: f32[1, s1, 3, 8], %v: f32[1, s1, 3, 8], s0, s1) {
  %0 = attention(%q, %k, %v) {scale = 0.5, causal = false, masked = false, segments = 1} : f32[1, s0, 2, 8]
  return %0
}
"""
    assert "attention(" in _expand(text)


def test_keep_flash_expands_only_what_the_gpu_kernel_does_not_cover() -> None:
    """With `keep_flash` (the GPU pipeline), ops the flash kernel computes stay fused; head dims
    above its register budget, symbolic head dims and ops binding more than `max_buffers` are
    expanded."""
    kept = _graph((1, 4, 1, 64), [(1, 2, 13, 64), (1, 2, 1, 64)], ["f32", "f32"], False, 0.25, 64)
    assert "attention(" in _expand(kept, keep_flash=True)
    assert "attention(" not in _expand(kept)
    wide = _graph((1, 1, 5, 320), [(1, 1, 5, 320)], [None], False, 0.25, 320)
    assert "attention(" not in _expand(wide, keep_flash=True)
    three = _graph((1, 2, 1, 8), [(1, 2, 4, 8)] * 3, ["bool"] * 3, False, 0.25, 8)
    assert "attention(" not in _expand(three, keep_flash=True)
    symbolic = """
graph @main(%q: f32[1, 2, 3, s0], %k: f32[1, 2, 5, s0], %v: f32[1, 2, 5, s0], s0) {
  %0 = attention(%q, %k, %v) {scale = 0.5, causal = false, masked = false, segments = 1} : f32[1, 2, 3, s0]
  return %0
}
"""
    assert "attention(" not in _expand(symbolic, keep_flash=True)
