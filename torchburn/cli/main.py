"""`python -m torchburn demo`: compile the README's MLP, check it, time it, show the IR.
`python -m torchburn cache info|clear`: the on-disk compile cache (`TORCHBURN_CACHE_DIR`)."""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable


def _median_us(fn: Callable[[], object], repeats: int, inner: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times) * 1e6


def demo(args: argparse.Namespace) -> int:
    dump = Path(args.dump) if args.dump else Path(tempfile.mkdtemp(prefix="torchburn-dump-"))
    os.environ["TORCHBURN_DUMP"] = str(dump)
    import torch

    from ..runtime import config
    from ..backend.explainer import explain

    config.reload_config()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 256)).eval()
    x = torch.randn(args.batch, 512)
    t0 = time.perf_counter()
    compiled = torch.compile(model, backend="torchburn")
    with torch.no_grad():
        y = compiled(x)
    cold = time.perf_counter() - t0
    with torch.no_grad():
        expected = model(x)
        torch.testing.assert_close(y, expected, rtol=1e-4, atol=1e-4)
        eager_us = _median_us(lambda: model(x), 7, 20)
        ours_us = _median_us(lambda: compiled(x), 7, 20)
    err = (y - expected).abs().max().item()
    print(f"MLP Linear(512,1024) -> GELU -> Linear(1024,256), batch {args.batch}")
    print(f"  result matches eager (max abs error {err:.2e})")
    print(f"  first call (compile + run): {cold * 1e3:.0f} ms")
    print(f"  eager:     {eager_us:9.1f} us/call")
    print(f"  torchburn: {ours_us:9.1f} us/call  ({eager_us / ours_us:.2f}x eager)")
    with torch.no_grad():
        report = explain(model, x)
    print()
    print(report)
    print()
    print(f"IR of every stage (tensor IR, after each pass, loop IR, LLVM IR, assembly): {dump}")
    return 0


def cache(args: argparse.Namespace) -> int:
    from ..runtime.config import get_config
    from ..runtime.disk_cache import disk_cache

    store = disk_cache(get_config().cache_dir)
    if store is None:
        print("disk cache: off (TORCHBURN_CACHE_DIR=off)")
        return 0
    if args.action == "clear":
        n = store.clear()
        print(f"disk cache: removed {n} entr{'y' if n == 1 else 'ies'} from {store.folder}")
        return 0
    info = store.info()
    print(f"location: {info['location']}")
    print(f"entries:  {info['entries']}")
    print(f"graphs:   {info['graphs']} (FX-graph manifests and decomposition recipes, for warm starts)")
    print(f"size:     {_human(int(info['bytes']))} (bound {_human(int(info['max_bytes']))}, least recently used go first)")  # type: ignore[arg-type]
    return 0


def _human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{n} B"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m torchburn", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("demo", help="compile the README MLP, check it against eager, time it")
    d.add_argument("--batch", type=int, default=32)
    d.add_argument("--dump", help="folder for the IR dumps (default: a new temporary folder)")
    c = sub.add_parser("cache", help="show (info) or empty (clear) the on-disk compile cache")
    c.add_argument("action", choices=("info", "clear"))
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo(args)
    if args.command == "cache":
        return cache(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
