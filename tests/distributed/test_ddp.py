"""DDP with torchburn: `DDP(torch.compile(model))` and `torch.compile(DDP(model))` train as
eager DDP does, compile every graph Dynamo hands the backend, and fall back nowhere."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch.testing import assert_close

from .ddp_worker import ddp_scenarios
from .launch import run_ranks

pytestmark = pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return run_ranks(ddp_scenarios, tmp_path_factory.mktemp("ddp"))


@pytest.mark.parametrize("form", ["inner", "outer"])
def test_training_matches_eager_ddp(ranks: list[dict[str, Any]], form: str) -> None:
    for r in ranks:
        assert_close(r[form]["losses"], r["eager"]["losses"], rtol=1e-5, atol=1e-5)
        for name, value in r["eager"]["params"].items():
            assert_close(r[form]["params"][name], value, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name}: {m}")
    # DDP kept the replicas equal: rank 1 trained on other data, yet ends where rank 0 does
    for name, value in ranks[0][form]["params"].items():
        assert_close(ranks[1][form]["params"][name], value, rtol=0, atol=0)
    assert not torch.equal(ranks[0][form]["losses"], ranks[1][form]["losses"])


@pytest.mark.parametrize("form", ["inner", "outer"])
def test_every_graph_compiled_without_fallback(ranks: list[dict[str, Any]], form: str) -> None:
    for r in ranks:
        reports = r[form]["reports"]
        graphs = r["graphs"][form]
        assert [g["kind"] for g in reports].count("forward") == len(graphs)
        assert [g["kind"] for g in reports].count("backward") == len(graphs)
        for g in reports:
            assert g["compiled"] and not g["fallbacks"] and not g["not_compiled"] and not g["internal_errors"], g
        assert r[form]["slow_paths"] == []  # no compiled graph ran in PyTorch at run time


def test_ddp_optimizer_splits_at_buckets_for_us_as_for_any_backend(ranks: list[dict[str, Any]]) -> None:
    """Dynamo's DDPOptimizer (optimize_ddp="ddp_optimizer", the default) splits the graph at
    DDP's bucket boundaries whenever a DDP module is running, in both forms, and hands each
    piece to the backend: torchburn gets the pieces Inductor (or a recording backend) gets."""
    assert torch._dynamo.config.optimize_ddp is True
    for r in ranks:
        received = r["graphs"]["received"]
        assert len(received) == 2, received  # the head fills one 1 MB bucket, the rest makes the second
        assert r["graphs"]["inner"] == received
        assert r["graphs"]["outer"] == received
