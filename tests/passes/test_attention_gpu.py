"""The GPU loop nest of `attention` (`passes/gpu/attention.py`): its accessor loops are
there for the WGSL flash kernel to find, it is marked so that `gpu-map` leaves it alone, and as
a plain loop program (run here on the reference interpreter) it computes the op: causal,
masked, grouped-query heads, two segments, odd head dims."""
from __future__ import annotations

from typing import Optional

import numpy as np
import pytest

from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_graph
from torchburn.passes.gpu.lower import LowerToLoopsGpu
from torchburn.passes.gpu.map import GpuMap
from torchburn.runtime.reference.entry import run_arrays
from tests.passes.test_expand_attention import _arrays_and_reference, _graph


def _program(text: str) -> lp.Program:
    return LowerToLoopsGpu().run(parse_graph(text))


def _tags(k: lp.Kernel) -> list[str]:
    return [s.annotation("attn") or "" for s in lp.walk_stmts(k.body) if isinstance(s, lp.For) and s.annotation("attn")]


def test_nest_is_marked_and_gpu_map_leaves_it() -> None:
    prog = _program(_graph((1, 4, 1, 16), [(1, 2, 13, 16), (1, 2, 1, 16)], ["f32", "f32"], False, 0.25, 16))
    (k,) = prog.kernels
    assert k.body.annotation("gpu") == "attention" and k.body.annotation("attn_segments") == "2"
    assert sorted(_tags(k)) == sorted(["q", "keys", "k0", "m0", "v0", "keys", "k1", "m1", "v1", "out"])
    assert GpuMap().run(prog).kernels[0] == k


CASES = [
    # decode, a cache segment and the step's key, GQA, additive masks
    ((1, 4, 1, 16), [(1, 2, 13, 16), (1, 2, 1, 16)], ["f32", "f32"], False, 16),
    # causal prefill, GQA 3 per key/value head, fewer rows than keys
    ((2, 6, 5, 8), [(2, 2, 9, 8)], [None], True, 8),
    # boolean mask, odd head dims
    ((2, 2, 5, 7), [(2, 1, 6, 7)], ["bool"], False, 5),
]


@pytest.mark.parametrize("q,segs,masks,causal,dv", CASES)
def test_nest_computes_the_op(q, segs, masks: list[Optional[str]], causal: bool, dv: int) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(q[2] + len(segs))
    scale = 0.3
    prog = _program(_graph(q, segs, masks, causal, scale, dv))
    arrays, want = _arrays_and_reference(rng, q, segs, masks, causal, scale, dv)
    out = run_arrays(prog, arrays)["out0"]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


def test_nest_stores_through_views() -> None:
    """Returned through a permute and a reshape (`fuse` puts the op in the view's kernel), the
    nest's `out` accessor stores at the view's index: one kernel, the view's values."""
    from torchburn.passes.tensor.fusion import Fuse

    q, segs, masks, causal, dv = CASES[1]
    text = _graph(q, segs, masks, causal, 0.3, dv).replace(
        "  return %0\n", "  %1 = permute(%0) {dims = [2, 0, 1, 3]} : f32[5, 2, 6, 8]\n"
        "  %2 = reshape(%1) {shape = [5, 2, 48]} : f32[5, 2, 48]\n  return %2\n")
    prog = LowerToLoopsGpu().run(Fuse().run(parse_graph(text)))
    (k,) = prog.kernels
    assert k.body.annotation("gpu") == "attention" and not prog.temps
    arrays, want = _arrays_and_reference(np.random.default_rng(7), q, segs, masks, causal, 0.3, dv)
    out = run_arrays(prog, arrays)["out0"]
    np.testing.assert_allclose(out, want.transpose(2, 0, 1, 3).reshape(5, 2, 48), rtol=1e-5, atol=1e-5)
