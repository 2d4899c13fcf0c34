"""What each rank runs for test_collectives.py: compiled functions with collectives between
their compute, and `explain()` of each."""
from __future__ import annotations

from typing import Any, Callable

import torch
import torch._dynamo
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

from .models import report_summary


def _funcol_all_reduce(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 2
    z = funcol.all_reduce(y, "sum", dist.group.WORLD)
    return torch.relu(z - 1) + x  # reads the reduced sum: wrong if the collective moved or vanished


def _gather_then_scatter(x: torch.Tensor) -> torch.Tensor:
    g = funcol.all_gather_tensor(x * 3, 0, dist.group.WORLD)  # (2 * n,)
    s = funcol.reduce_scatter_tensor(torch.exp(g), "sum", 0, dist.group.WORLD)  # (n,)
    return s / 2 + x


def _c10d_in_place(x: torch.Tensor) -> torch.Tensor:
    y = x * 3
    dist.all_reduce(y)  # Dynamo turns it into a functional collective
    return torch.tanh(y / 8)


CASES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "funcol_all_reduce": _funcol_all_reduce, "gather_then_scatter": _gather_then_scatter,
    "c10d_in_place": _c10d_in_place}


def collective_cases(rank: int) -> dict[str, Any]:
    import torchburn

    x = torch.linspace(-1, 1, 6) * (rank + 1)
    out: dict[str, Any] = {"input": x}
    for name, fn in CASES.items():
        report = torchburn.explain(fn, x)
        torch._dynamo.reset()
        compiled = torch.compile(fn, backend="torchburn")
        out[name] = {"explain": str(report), "reports": report_summary(report.graphs),
                     "compiled": [compiled(x), compiled(x)], "eager": fn(x)}
        torch._dynamo.reset()
    return out
