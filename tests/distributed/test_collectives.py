"""Collectives inside compiled graphs (functional collectives, `dist.all_reduce`) stay in
PyTorch at their place in the graph, the compute around them is compiled, and explain() lists
them as collectives, not as missing lowerings or internal errors."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from torchburn.frontend.partition import COLLECTIVE_REASON, is_deliberate

from .collectives_worker import CASES, collective_cases
from .launch import run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(collective_cases, tmp_path_factory.mktemp("collectives"))


def _by_hand(case: str, xs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each rank's result computed here from both ranks' inputs, without torch.distributed."""
    if case == "funcol_all_reduce":
        z = sum(torch.sin(x) * 2 for x in xs)
        return [torch.relu(z - 1) + x for x in xs]
    if case == "gather_then_scatter":
        s = sum(torch.exp(torch.cat([x * 3 for x in xs])) for _ in xs)
        return [s[r * len(x):(r + 1) * len(x)] / 2 + x for r, x in enumerate(xs)]
    z = sum(x * 3 for x in xs)
    return [torch.tanh(z / 8) for _ in xs]


@pytest.mark.parametrize("case", list(CASES))
def test_results_equal_eager(ranks: list[dict[str, Any]], case: str) -> None:
    xs = [r["input"] for r in ranks]
    for r, want in zip(ranks, _by_hand(case, xs)):
        assert_close(r[case]["eager"], want, rtol=1e-5, atol=1e-5)
        for got in r[case]["compiled"]:
            assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", list(CASES))
def test_collectives_stay_in_pytorch_compute_compiled(ranks: list[dict[str, Any]], case: str) -> None:
    for r in ranks:
        (graph,) = r[case]["reports"]
        assert not graph["internal_errors"] and not graph["not_compiled"]
        ops = [op for op, _ in graph["fallbacks"]]
        assert ops and all(op.split(".")[0] == "_c10d_functional" for op in ops), graph["fallbacks"]
        assert "_c10d_functional.wait_tensor.default" in ops
        assert all(why == COLLECTIVE_REASON and is_deliberate(op, why) for op, why in graph["fallbacks"])
        assert len(graph["compiled"]) >= 2, graph  # the compute before and after the collective
        assert "a collective: it runs in PyTorch" in r[case]["explain"]
        assert "INTERNAL" not in r[case]["explain"] and "no lowering" not in r[case]["explain"]
