"""A training forward tells AOTAutograd the strides its outputs really have, so the backward
is compiled for the saved activations as the compiled forward lays them out."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchburn.llm.cli.profile import capture_launchers


def _attention_block(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    b, s, d = x.shape
    q, k, v = (x @ w).view(b, s, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
    # CPU flash attention's output (saved for its backward) is laid out [b, s, h, d] in eager
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return a.transpose(1, 2).reshape(b, s, d).tanh()


@pytest.mark.parametrize("partitioner", ["save-all", "min-cut"])
def test_backward_runs_compiled_when_a_saved_output_is_not_contiguous_in_eager(partitioner: str) -> None:
    torch._dynamo.reset()
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16, requires_grad=True)
    w = torch.randn(16, 48, requires_grad=True)
    fn = torch.compile(_attention_block, backend="torchburn", options={"partitioner": partitioner})
    with capture_launchers() as made:
        fn(x, w).sum().backward()
    expected = [t.grad.clone() for t in (x, w)]
    for t in (x, w):
        t.grad = None
    fn(x, w).sum().backward()
    ref_x, ref_w = x.detach().requires_grad_(), w.detach().requires_grad_()
    _attention_block(ref_x, ref_w).sum().backward()
    torch.testing.assert_close(x.grad, ref_x.grad)
    torch.testing.assert_close(w.grad, ref_w.grad)
    torch.testing.assert_close(expected[0], ref_x.grad)
    assert len(made) == 2  # forward and backward, each one launcher
    assert [launcher.stats.eager_fallbacks for launcher in made] == [0, 0]


def test_unknown_partitioner_is_an_error() -> None:
    torch._dynamo.reset()
    with pytest.raises(Exception, match="option partitioner='greedy'"):
        torch.compile(_attention_block, backend="torchburn", options={"partitioner": "greedy"})(
            torch.randn(2, 8, 16), torch.randn(16, 48))
