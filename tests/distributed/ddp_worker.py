"""What each rank runs for test_ddp.py: eager DDP, DDP around a compiled model, and a compiled
DDP model, 5 SGD steps each from the same start; plus the graphs Dynamo hands a backend."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch._dynamo
from torch.nn.parallel import DistributedDataParallel as DDP

from .models import SLOW_PATHS, TinyLM, batches, report_summary, watch_slow_paths

STEPS = 5
BUCKET_MB = 1  # DDPOptimizer's first bucket is 1 MB; a smaller cap is refused by torch


def _recording(seen: list[list[str]], then: Callable[..., Any]) -> Callable[..., Any]:
    """A backend that notes the ops of each graph it is handed, then hands it to `then`."""

    def backend(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        seen.append([str(n.target) for n in gm.graph.nodes if n.op == "call_function"])
        return then(gm, example_inputs)

    return backend


def _eager(gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
    return gm.forward


def _train(rank: int, wrap: Callable[[torch.nn.Module], torch.nn.Module]) -> dict[str, Any]:
    from torchburn.backend import report as rep

    torch.manual_seed(0)
    model = TinyLM()
    net = wrap(model)
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
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
    return {"losses": torch.stack(losses), "params": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "reports": report_summary(rep.recent_reports()[before:]),
            "slow_paths": SLOW_PATHS[slow_before:]}


def ddp_scenarios(rank: int) -> dict[str, Any]:
    from torchburn.backend import torchburn_backend

    out: dict[str, Any] = {"graphs": {}}

    def ddp(m: torch.nn.Module) -> torch.nn.Module:
        return DDP(m, bucket_cap_mb=BUCKET_MB)

    out["eager"] = _train(rank, ddp)
    for name in ("inner", "outer", "received"):
        seen: list[list[str]] = []
        backend = _recording(seen, _eager if name == "received" else torchburn_backend)
        if name == "inner":
            out[name] = _train(rank, lambda m: ddp(torch.compile(m, backend=backend)))
        else:
            out[name] = _train(rank, lambda m: torch.compile(ddp(m), backend=backend))
        out["graphs"][name] = seen
    return out
