"""Strided views among a graph's outputs are made by PyTorch with the recorded strides, so the
backward graph compiled for those strides runs compiled (no launcher slow path)."""
from __future__ import annotations

import operator

import torch
import torch.fx
from torch.testing import assert_close

from torchburn.backend.launcher import Launcher
from torchburn.frontend.view_outputs import MARK, views_to_pytorch

aten = torch.ops.aten


def _traced(fn, *args):  # type: ignore[no-untyped-def]
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="fake")(*args)


def test_strided_output_view_gets_its_own_chain() -> None:
    def fn(w: torch.Tensor, x: torch.Tensor):  # type: ignore[no-untyped-def]
        t = aten.permute.default(w, [1, 0])
        return aten.mm.default(x, t), t, aten.view.default(x, [8])

    gm = _traced(fn, torch.randn(3, 4), torch.randn(2, 4))
    assert views_to_pytorch(gm) == 1  # the contiguous view of x needs no copy
    marked = [n for n in gm.graph.nodes if n.meta.get(MARK)]
    assert [n.target for n in marked] == [aten.permute.default]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    assert output.args[0][1] is marked[0] and output.args[0][0].args[1] is not marked[0]
    w, x = torch.randn(3, 4), torch.randn(2, 4)
    for got, want in zip(gm(w, x), fn(w, x)):
        assert_close(got, want)
        assert got.stride() == want.stride()


def test_views_of_a_split_are_followed_to_the_base() -> None:
    def fn(x: torch.Tensor):  # type: ignore[no-untyped-def]
        y = aten.mul.Tensor(x, 2)
        a, b = aten.split.Tensor(y, 2, 1)
        return aten.transpose.int(a, 0, 1), b

    gm = _traced(fn, torch.randn(3, 4))
    assert views_to_pytorch(gm) == 2
    marked = [n.target for n in gm.graph.nodes if n.meta.get(MARK)]
    assert aten.split.Tensor in marked and operator.getitem in marked and aten.transpose.int in marked


def test_training_step_backward_runs_compiled(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A saved `permute(weight)` (and the heads of a split qkv) reach the backward with the
    strides it was compiled for: no call takes the launcher's slow path."""
    slow: list[str] = []
    original = Launcher._slow

    def watched(self, *args, why):  # type: ignore[no-untyped-def]
        slow.append(why)
        return original(self, *args, why=why)

    monkeypatch.setattr(Launcher, "_slow", watched)

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.qkv, self.out = torch.nn.Linear(8, 24), torch.nn.Linear(8, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            q, k, v = (z.view(2, 3, 2, 4).transpose(1, 2) for z in self.qkv(x).chunk(3, -1))
            a = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.out(a.transpose(1, 2).reshape(2, 3, 8)).sum()

    torch.manual_seed(0)
    net = Net()
    eager = Net()
    eager.load_state_dict(net.state_dict())
    compiled = torch.compile(net, backend="torchburn")
    x = torch.randn(2, 3, 8)
    for _ in range(2):
        compiled(x).backward()
        eager(x).backward()
    assert slow == []
    for (name, p), q in zip(net.named_parameters(), eager.parameters()):
        assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
