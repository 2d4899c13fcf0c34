"""FSDP2 (`fully_shard`, CPU and gloo) with torchburn: the compiled sharded model trains as the
eager one does, every graph compiled, and explain() on a rank says what stayed in PyTorch
(FSDP2's hooks, which Dynamo does not trace, and their collectives between the graphs)."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.testing import assert_close

from .fsdp_worker import fsdp_scenarios
from .launch import run_ranks


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(fsdp_scenarios, tmp_path_factory.mktemp("fsdp"))


def test_training_matches_eager_fsdp(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        assert_close(r["compiled"]["losses"], r["eager"]["losses"], rtol=1e-5, atol=1e-5)
        for name, value in r["eager"]["params"].items():
            assert_close(r["compiled"]["params"][name], value, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    assert not torch.equal(ranks[0]["compiled"]["losses"], ranks[1]["compiled"]["losses"])


def test_every_graph_compiled_without_fallback(ranks: list[dict[str, Any]]) -> None:
    for r in ranks:
        reports = r["compiled"]["reports"]
        kinds = [g["kind"] for g in reports]
        assert kinds.count("forward") >= 2 and kinds.count("forward") == kinds.count("backward"), kinds
        for g in reports:
            assert g["compiled"] and not g["fallbacks"] and not g["not_compiled"] and not g["internal_errors"], g
        assert r["compiled"]["slow_paths"] == []  # no compiled graph ran in PyTorch at run time


def test_explain_on_a_rank(ranks: list[dict[str, Any]]) -> None:
    text = ranks[0]["explain"]
    assert "INTERNAL" not in text
    assert "graph breaks" in text and "`disable`" in text  # FSDP2's hooks are not traced by Dynamo
    assert "c10d::_allgather_base_" in text  # FSDP2's all-gathers ran in PyTorch between the graphs
    for g in ranks[0]["explain_reports"]:
        assert g["compiled"] and not g["fallbacks"], g
