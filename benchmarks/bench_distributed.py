"""DDP training step time on 2 ranks x 1 thread (gloo): eager vs inductor vs torchburn, in one run.

    python benchmarks/bench_distributed.py [--rounds 15] [--steps 5] [--json out.json]

Each rank trains its replica of a small transformer (embedding, 2 pre-norm blocks, head,
cross-entropy) under `DistributedDataParallel(torch.compile(model, backend=...))` with SGD;
the contenders are warmed up (compiled), then run in interleaved rounds of a fixed number of
steps (the same on both ranks, so their collectives stay in step); the figure is rank 0's
median seconds per step (forward, backward with DDP's all-reduces, optimizer step). Two ranks
on two cores show correctness and overhead, not scaling.
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import format_table, machine_info, write_json  # noqa: E402

VOCAB, DIM, HEADS, SEQ, BATCH, LAYERS = 512, 64, 4, 32, 4, 2
CONTENDERS = ("eager", "inductor", "torchburn")


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(DIM), nn.LayerNorm(DIM)
        self.qkv, self.out = nn.Linear(DIM, 3 * DIM), nn.Linear(DIM, DIM)
        self.fc, self.proj = nn.Linear(DIM, 4 * DIM), nn.Linear(4 * DIM, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = (z.view(b, t, HEADS, d // HEADS).transpose(1, 2) for z in self.qkv(self.ln1(x)).chunk(3, -1))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, t, d))
        return x + self.proj(F.gelu(self.fc(self.ln2(x))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, DIM)
        self.blocks = nn.Sequential(*(Block() for _ in range(LAYERS)))
        self.ln, self.head = nn.LayerNorm(DIM), nn.Linear(DIM, VOCAB)

    def forward(self, idx: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        logits = self.head(self.ln(self.blocks(self.emb(idx))))
        return F.cross_entropy(logits.view(-1, VOCAB), target.view(-1))


def _rank(rank: int, store: str, rounds: int, steps: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(minutes=30))
    from torch.nn.parallel import DistributedDataParallel as DDP

    g = torch.Generator().manual_seed(rank)
    idx, target = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2))
    runs: dict[str, Any] = {}
    compile_s: dict[str, float] = {}
    for name in CONTENDERS:
        torch.manual_seed(0)
        model = Model()
        net = DDP(model if name == "eager" else torch.compile(model, backend=name))
        opt = torch.optim.SGD(net.parameters(), lr=0.01)

        def step(net: Any = net, opt: Any = opt) -> None:
            net(idx, target).backward()
            opt.step()
            opt.zero_grad()

        t0 = time.perf_counter()
        step()  # compiles
        compile_s[name] = time.perf_counter() - t0
        step()
        runs[name] = step
    samples: dict[str, list[float]] = {n: [] for n in CONTENDERS}
    for _ in range(rounds):
        for name in CONTENDERS:
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(steps):
                runs[name]()
            samples[name].append((time.perf_counter() - t0) / steps)
    if rank == 0:
        torch.save({"samples": samples, "compile_s": compile_s}, out)
    dist.barrier()
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--steps", type=int, default=5, help="training steps per round")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.pt")
        mp.spawn(_rank, args=(os.path.join(tmp, "store"), args.rounds, args.steps, out), nprocs=2, join=True)
        result = torch.load(out)
    med = {n: statistics.median(s) for n, s in result["samples"].items()}
    rows = [[n, f"{med[n] * 1e3:.2f}", f"{min(result['samples'][n]) * 1e3:.2f}",
             f"{med[n] / med['eager']:.2f}x", f"{result['compile_s'][n]:.1f}"] for n in CONTENDERS]
    print(f"DDP training step, 2 ranks x 1 thread (gloo), batch {BATCH}x{SEQ}, dim {DIM}, {LAYERS} blocks, "
          f"vocab {VOCAB}; median of {args.rounds} rounds of {args.steps} steps")
    print(format_table(["contender", "ms/step (median)", "ms/step (min)", "vs eager", "first step s"], rows))
    write_json(args.json, {"machine": machine_info(), "median_s": med, **result})


if __name__ == "__main__":
    main()
