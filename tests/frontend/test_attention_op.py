"""`torchburn::attention` (`frontend/attention_op.py`): eager semantics and errors, and
`F.scaled_dot_product_attention` compiled to one attention kernel."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchburn.frontend.attention_op import attention
from tests.helpers import assert_fully_compiled, run_compiled


def _kernels(reports: list) -> list[str]:
    return [k for r in reports for s in r.subgraphs for k in s.kernels]


def test_eager_matches_sdpa_with_gqa_and_two_segments() -> None:
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 7, 8), torch.randn(2, 2, 7, 8)
    m = torch.randn(3, 7)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=m, scale=0.3, enable_gqa=True)
    torch.testing.assert_close(attention(q, [k], [v], [m], 0.3, False), want)
    # masks broadcast over the keys (a last dim of 1) and 0-d masks, as sdpa's
    torch.testing.assert_close(attention(q, [k], [v], [torch.randn(3, 1)], 0.3, False),
                               attention(q, [k], [v], [], 0.3, False))   # a shift per row: the same softmax
    torch.testing.assert_close(attention(q, [k], [v], [torch.tensor(0.5)], 0.3, False),
                               attention(q, [k], [v], [], 0.3, False))
    # split at 4: one softmax over both segments
    got = attention(q, [k[..., :4, :], k[..., 4:, :]], [v[..., :4, :], v[..., 4:, :]], [m[:, :4], m[:, 4:]], 0.3, False)
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("args,message", [
    (lambda q, k, v: (q, [k], [v, v], [], 0.5, False), "1 key and 2 value segments"),
    (lambda q, k, v: (q, [k, k], [v, v], [], 0.5, True), "causal takes one segment"),
    (lambda q, k, v: (q, [k[..., :4]], [v], [], 0.5, False), "do not fit"),
    (lambda q, k, v: (q[0, 0], [k], [v], [], 0.5, False), "q must be"),
    (lambda q, k, v: (q, [k], [v], [torch.zeros(3, 6)], 0.5, False), r"mask \[3, 6\] does not span keys"),
])
def test_bad_operands_raise(args, message: str) -> None:  # type: ignore[no-untyped-def]
    q, k, v = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    with pytest.raises(ValueError, match=message):
        attention(*args(q, k, v))


@pytest.mark.parametrize("mask", [None, "float", "bool"])
def test_sdpa_is_one_attention_kernel(mask: str) -> None:
    q, k, v = torch.randn(2, 4, 9, 16), torch.randn(2, 4, 11, 16), torch.randn(2, 4, 11, 16)
    m = {None: None, "float": torch.randn(9, 11), "bool": torch.rand(9, 11) > 0.3}[mask]
    if m is not None and m.dtype == torch.bool:
        m[:, 0] = True

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, is_causal=m is None).transpose(1, 2).reshape(2, 9, 64)

    with torch.no_grad():
        out, reports = run_compiled(fn, q, k, v)
        torch.testing.assert_close(out, fn(q, k, v), rtol=2e-5, atol=2e-5)
    assert_fully_compiled(reports)
    kernels = _kernels(reports)
    # one attention kernel that stores straight into the [B, T, H * D] output (the transpose
    # is its store index, `fuse{attention_views}`); sdpa turns a bool mask into a float one
    # first (a `where` kernel)
    if mask == "bool":
        assert "aten.where" in kernels[0], kernels
        kernels = kernels[1:]
    assert len(kernels) == 1 and "torchburn.attention" in kernels[0] and "aten.permute" in kernels[0], kernels


def test_masks_and_keys_marked_dynamic_one_by_one_compile() -> None:
    """A cache view, its values and its mask marked dynamic each on its own (three symbols):
    the mask's check says they are one length, so the graph compiles whole (before, an internal
    compiler error: the mask's length could not be expanded to the keys')."""
    from torchburn.backend import report as rep

    torch._dynamo.reset()
    fn = torch.compile(lambda q, kp, vp, k, v, om, nm: attention(q, [kp, k], [vp, v], [om, nm], 0.25, False),
                       backend="torchburn")
    records = rep.start_recording()
    try:
        for p in (5, 9, 20):
            q, k, v = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 1, 16), torch.randn(1, 2, 1, 16)
            kp, vp, om = torch.randn(1, 2, p, 16), torch.randn(1, 2, p, 16), torch.randn(1, 1, 1, p)
            nm = torch.zeros(1, 1, 1, 1)
            for x in (kp, vp, om):
                torch._dynamo.mark_dynamic(x, x.dim() - 2 if x is not om else 3)
            torch.testing.assert_close(fn(q, kp, vp, k, v, om, nm), attention(q, [kp, k], [vp, v], [om, nm], 0.25, False),
                                       rtol=2e-5, atol=2e-5)
    finally:
        rep.stop_recording()
    assert_fully_compiled(list(records))
