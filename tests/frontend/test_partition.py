"""`partition` (frontend/partition.py): the linear-time convex case gives exactly the partition
torch's `CapabilityBasedPartitioner` proposes, and defers to it otherwise."""
from __future__ import annotations

from typing import Any, Callable, Optional

import torch
from torch.fx.experimental.proxy_tensor import make_fx
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from torchburn.frontend.partition import _Support, convex_partition, partition


def traced(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(fn)(*args)


def plans(gm: torch.fx.GraphModule) -> tuple[Optional[list[list[tuple[str, Optional[int]]]]], list, list, list]:
    """(convex plan or None, torch's plan, and the reasons each recorded, in order)."""
    mine: dict = {}
    fast = convex_partition(gm, _Support(mine))
    theirs: dict = {}
    slow = CapabilityBasedPartitioner(gm, _Support(theirs), allows_single_node_partition=True).propose_partitions()

    def plan(parts: list) -> list[list[tuple[str, Optional[int]]]]:
        return [[(n.name, o) for n, o in p.nodes.items()] for p in parts]

    return (None if fast is None else plan(fast)), plan(slow), list(mine.items()), list(theirs.items())


def two_outputs(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return (x * y).exp() + x.sin(), torch.max(y, dim=1).values.cos()  # a tuple op and its getitems


def unsupported_between(x: torch.Tensor) -> torch.Tensor:
    return torch.nonzero(x.exp() > 1).to(x.dtype).sum() + x.sum()  # nonzero: data-dependent, not compiled


def test_all_supported_is_torchs_one_partition() -> None:
    gm = traced(two_outputs, torch.randn(4, 8), torch.randn(4, 8))
    fast, slow, mine, theirs = plans(gm)
    assert fast is not None and fast == slow and len(fast) == 1
    assert [(n.name, r) for n, r in mine] == [(n.name, r) for n, r in theirs]  # placeholders, output


def test_an_unsupported_node_between_defers_to_torch() -> None:
    gm = traced(unsupported_between, torch.randn(4, 8))
    fast, slow, _, _ = plans(gm)
    assert fast is None
    assert len(slow) >= 1
    result = partition(gm)  # still partitions, through torch's partitioner
    assert result.subgraphs



def _images_of_two_sizes(f: Any) -> list[Any]:
    """`f` compiled with dynamic=True on 32x32 and 48x48 images, each result equal to eager:
    the reports of both calls."""
    from tests.helpers import run_compiled

    records: list[Any] = []
    with torch.no_grad():
        for size in (32, 48):
            x = torch.randn(2, 3, size, size)
            out, new = run_compiled(f, x, dynamic=True, reset=size == 32)
            torch.testing.assert_close(out, f(x), rtol=1e-4, atol=1e-5)
            records += new
    return records

def test_a_subgraph_gets_the_size_symbols_its_metadata_names() -> None:
    """After a stride-4 convolution and an op left to PyTorch, the second subgraph's inputs
    have sizes `s0 // 4` only, while its stride-2 convolution's result is `s0 // 8` in torch's
    metadata: the subgraph is handed `s0` itself (its launcher once failed: 'symbol s0 cannot
    be bound from the inputs'; wav2vec2 and HuBERT under dynamic=True)."""
    conv4 = torch.nn.Conv2d(3, 4, 4, stride=4)
    conv2 = torch.nn.Conv2d(4, 4, 2, stride=2)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = torch.special.zeta(conv4(x).abs() + 2, 3.0)  # NOT_COMPILED: splits the graph
        return conv2(y) * 2

    records = _images_of_two_sizes(f)
    subgraphs = [s for r in records for s in r.subgraphs]
    assert len(subgraphs) == 2 and all(s.compiled for s in subgraphs), [(s.name, s.reason) for s in subgraphs]


def test_sizes_of_computed_tensors_do_not_cut_the_graph() -> None:
    """`flatten` of a convolution's output under dynamic=True reads the output's sizes
    (`sym_size` of a computed tensor, Python arithmetic): rebuilt from the input's sizes
    (`size_nodes.py`), they no longer force a subgraph boundary, so the whole function is one
    subgraph (ConvNeXt was cut into five, and a channels-last intermediate crossing a cut made
    PyTorch's `view` fail at run time)."""
    from tests.helpers import assert_fully_compiled

    conv = torch.nn.Conv2d(3, 8, 4, stride=4)
    lin = torch.nn.Linear(8, 5)

    def f(x: torch.Tensor) -> torch.Tensor:
        y = conv(x.to(memory_format=torch.channels_last))
        return lin(y.permute(0, 2, 3, 1).reshape(y.shape[0], -1, 8)).flatten(1)

    records = _images_of_two_sizes(f)
    assert [len(r.subgraphs) for r in records] == [1]
    assert_fully_compiled(records)
