"""What each rank runs for test_fsdp.py: the tiny LM sharded with FSDP2 (`fully_shard` on the
block and the root), trained 5 SGD steps eagerly and compiled by torchburn; then `explain()`."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch._dynamo
from torch.distributed.fsdp import fully_shard

from .models import SLOW_PATHS, TinyLM, batches, report_summary, watch_slow_paths

STEPS = 5


def _sharded() -> TinyLM:
    torch.manual_seed(0)
    model = TinyLM()
    fully_shard(model.block)
    fully_shard(model)
    return model


def _full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The parameters unsharded (each a DTensor shard: all-gathered on every rank)."""
    return {k: v.full_tensor().detach().clone() for k, v in model.named_parameters()}


def _train(rank: int, wrap: Callable[[torch.nn.Module], Callable[..., torch.Tensor]]) -> dict[str, Any]:
    from torchburn.backend import report as rep

    model = _sharded()
    net = wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    watch_slow_paths()
    before, slow_before = len(rep.recent_reports()), len(SLOW_PATHS)
    losses = []
    for idx, target in batches(rank, STEPS):
        loss = net(idx, target)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.detach())
    torch._dynamo.reset()
    return {"losses": torch.stack(losses), "params": _full_params(model),
            "reports": report_summary(rep.recent_reports()[before:]),
            "slow_paths": SLOW_PATHS[slow_before:]}


def fsdp_scenarios(rank: int) -> dict[str, Any]:
    import torchburn

    out = {"eager": _train(rank, lambda m: m),
           "compiled": _train(rank, lambda m: torch.compile(m, backend="torchburn"))}
    model = _sharded()
    idx, target = batches(rank, 1)[0]

    report = torchburn.explain(model, idx, target)
    out["explain"] = str(report)
    out["explain_reports"] = report_summary(report.graphs)
    return out
