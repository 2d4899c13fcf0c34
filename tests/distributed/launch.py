"""Run a function on 2 ranks of a gloo process group, each a fresh process with 1 thread.

The ranks are spawned (torch.multiprocessing), rendezvous through a file store in the test's
tmp folder (no network), and hand their results back as `torch.save` files. The children
inherit the suite's environment (strict mode, no disk cache: tests/conftest.py sets them in
`os.environ`) and check it, so nothing a rank compiles falls back silently."""
from __future__ import annotations

import datetime
import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
TIMEOUT = datetime.timedelta(seconds=240)


def _rank_main(rank: int, fn: Callable[..., Any], folder: str, args: tuple[Any, ...], strict: str) -> None:
    os.environ["TORCHBURN_STRICT"] = strict
    torch.set_num_threads(1)
    from torchburn.runtime.config import get_config

    assert get_config().strict == (strict == "1"), "strict mode did not reach the rank"
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=WORLD, timeout=TIMEOUT)
    try:
        result = fn(rank, *args)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    torch.save(result, os.path.join(folder, f"rank{rank}.pt"))


def run_ranks(fn: Callable[..., Any], folder: Path, *args: Any) -> list[Any]:
    """`fn(rank, *args)` on each of 2 ranks; their return values, by rank. `fn` must be a
    module-level function (the ranks import it by name)."""
    folder.mkdir(parents=True, exist_ok=True)
    strict = os.environ.get("TORCHBURN_STRICT", "0")
    mp.spawn(_rank_main, args=(fn, str(folder), args, strict), nprocs=WORLD, join=True)
    return [torch.load(folder / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
