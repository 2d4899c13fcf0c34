"""Per-call overhead of a cached tiny compiled graph: eager, Inductor and TorchBurn.

    python benchmarks/bench_overhead.py [--rounds 41] [--json PATH]

Each case is a graph whose own work is a few nanoseconds (`x + 1` on 4 elements, ...), so what
a call costs is the machinery around it: Dynamo's guards, the runtime wrapper of AOTAutograd
(or what replaces it), the launcher's guards and output allocation, the native call. All
contenders run in the same process, interleaved round by round (see `common.compare`), and each
is summarized by the median of its rounds. Run it in its own scheduling group on a shared
machine (`echo -20 > /proc/self/autogroup`).

The target is TorchBurn under 20 us per call on `x + 1`.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import compare, format_table, machine_info, write_json  # noqa: E402

from torchburn.backend.entry import torchburn_backend  # noqa: E402


def cases() -> dict[str, tuple[Callable[..., Any], tuple[torch.Tensor, ...]]]:
    """Name -> (function, inputs): tiny graphs whose cost is all overhead."""
    x = torch.randn(4)
    y = torch.randn(4)
    m = torch.randn(4, 4)
    return {
        "x + 1": (lambda a: a + 1, (x,)),
        "x * y + 1": (lambda a, b: a * b + 1, (x, y)),
        "relu(m).sum(1)": (lambda a: torch.relu(a).sum(1), (m,)),
    }


def contenders(fn: Callable[..., Any]) -> dict[str, Callable[..., Any]]:
    """The same function run eagerly and compiled by each backend (fresh Dynamo caches each)."""
    return {
        "eager": fn,
        "inductor": torch.compile(fn, backend="inductor", dynamic=False),
        "torchburn": torch.compile(fn, backend=torchburn_backend, dynamic=False),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=41)
    ap.add_argument("--min-round-s", type=float, default=0.02)
    ap.add_argument("--grad", action="store_true", help="inputs that require grad (training path)")
    ap.add_argument("--json", help="write the results as JSON to this path")
    args = ap.parse_args()
    torch.manual_seed(0)
    results: dict[str, Any] = {}
    rows = []
    for name, (fn, inputs) in cases().items():
        if args.grad:
            inputs = tuple(t.clone().requires_grad_() for t in inputs)
        torch._dynamo.reset()
        fns = contenders(fn)
        with torch.enable_grad():  # a plain call: no input requires grad unless --grad
            expected = fn(*inputs)
            for label, f in fns.items():  # compile (and check) before timing
                torch.testing.assert_close(f(*inputs), expected, msg=lambda m: f"{label} on {name}: {m}")
            timings = compare(fns, inputs, rounds=args.rounds, min_round_s=args.min_round_s)
        results[name] = timings
        rows.append([name] + [f"{timings[k].median_s * 1e6:.1f}" for k in fns]
                    + [f"{timings['torchburn'].iqr_s * 1e6:.1f}"])
    print(f"per-call time in us (median of {args.rounds} interleaved rounds"
          f"{', inputs require grad' if args.grad else ', inference'})")
    print(format_table(["graph", "eager", "inductor", "torchburn", "torchburn iqr"], rows))
    write_json(args.json, {"machine": machine_info(), "rounds": args.rounds, "grad": args.grad,
                           "results": results})
    return 0


if __name__ == "__main__":
    sys.exit(main())
