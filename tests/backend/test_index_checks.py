"""Indices read from tensors are checked in compiled code (issue 28): an index out of range
raises eager's own error from the compiled call (the kernel counts a fault instead of reading
or writing outside the tensor, and the launcher runs the call in PyTorch, which raises), and
negative indices count from the end exactly where eager lets them."""
from __future__ import annotations

from typing import Any, Callable

import pytest
import torch
import torch.nn.functional as F

from torchburn.runtime import faults
from tests.helpers import assert_fully_compiled, engine, run_compiled

X = torch.arange(12.0).reshape(4, 3)
ONES = torch.ones(1, 3)

#: Every compiled gather, scatter and index op, each of an index tensor `i` (one element).
OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "embedding": lambda i, x: F.embedding(i, x) * 2,
    "embedding_2d": lambda i, x: F.embedding(i[None], x) * 2,
    "index_select": lambda i, x: x.index_select(0, i) * 2,
    "getitem": lambda i, x: x[i] * 2,
    "getitem_dim1": lambda i, x: x[:, i % 3 + (i >= 4) * 3] * 2,
    "take": lambda i, x: x.take(i * 3) * 2,
    "gather": lambda i, x: x.gather(0, i.expand(1, 3)) * 2,
    "index_put": lambda i, x: x.index_put((i,), torch.ones(3)) * 2,
    "index_put_acc": lambda i, x: x.index_put((i,), torch.ones(3), accumulate=True) * 2,
    "index_add": lambda i, x: x.index_add(0, i, ONES) * 2,
    "index_copy": lambda i, x: x.index_copy(0, i, ONES) * 2,
    "scatter": lambda i, x: x.scatter(0, i.expand(1, 3), 1.0) * 2,
    "scatter_add": lambda i, x: x.scatter_add(0, i.expand(1, 3), ONES) * 2,
    "scatter_reduce": lambda i, x: x.scatter_reduce(0, i.expand(1, 3), ONES, "amax") * 2,
}


def outcome(fn: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "value", fn(*args)
    except Exception as err:  # noqa: BLE001 - eager's error is what we compare with
        return "error", (type(err), str(err))


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()


@pytest.mark.parametrize("name", list(OPS))
def test_out_of_range_raises_eagers_error_and_negatives_follow_eager(name: str) -> None:
    fn = OPS[name]
    compiled = torch.compile(fn, backend="torchburn", dynamic=False)
    for i in (2, 4, 3, -1, -4, -5, 1 << 40, -(1 << 40)):
        idx = torch.tensor([i])
        kind, expected = outcome(fn, idx, X)
        got_kind, got = outcome(compiled, idx, X)
        assert got_kind == kind, (i, expected, got)
        if kind == "value":
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        else:
            assert got == expected, i


def test_in_range_calls_are_fully_compiled_and_fault_free() -> None:
    for name in ("embedding", "index_select", "gather", "scatter_add", "index_add", "index_copy"):
        _, reports = run_compiled(OPS[name], torch.tensor([3]), X)
        assert_fully_compiled(reports)
    before = faults.counter.value
    torch.compile(OPS["embedding_2d"], backend="torchburn")(torch.tensor([0, 3, 1]), X)
    assert faults.counter.value == before


def test_embedding_id_equal_to_vocabulary_size_raises_in_a_large_batch() -> None:
    """The issue's case: a token id equal to the vocabulary size, among many valid ones (the
    vectorized, parallel embedding kernel), raises eager's IndexError."""
    weight = torch.randn(50, 64)
    ids = torch.randint(0, 50, (8, 512))
    compiled = torch.compile(lambda t, w: F.embedding(t, w) + 1, backend="torchburn", dynamic=False)
    torch.testing.assert_close(compiled(ids, weight), F.embedding(ids, weight) + 1)
    ids[5, 300] = 50
    with pytest.raises(IndexError, match="index out of range in self"):
        compiled(ids, weight)
    ids[5, 300] = -1
    with pytest.raises(IndexError, match="index out of range in self"):
        compiled(ids, weight)


def test_out_of_range_write_leaves_the_input_untouched() -> None:
    """A scatter whose index is out of range raises, and writes nothing into the last valid
    element (the clamping of old)."""
    x = torch.zeros(5)
    fn = lambda t, i: t.index_put_((i,), torch.tensor([7.0])) and None  # noqa: E731
    compiled = torch.compile(lambda t, i: t.index_put((i,), torch.tensor([7.0])), backend="torchburn")
    with pytest.raises(IndexError):
        compiled(x, torch.tensor([5]))
    assert fn is not None and x.tolist() == [0.0] * 5


def test_reference_engine_counts_the_fault_too() -> None:
    with engine("reference"):
        compiled = torch.compile(OPS["gather"], backend="torchburn", dynamic=False)
        torch.testing.assert_close(compiled(torch.tensor([1]), X), OPS["gather"](torch.tensor([1]), X))
        expected = outcome(OPS["gather"], torch.tensor([4]), X)
        assert outcome(compiled, torch.tensor([4]), X) == expected
