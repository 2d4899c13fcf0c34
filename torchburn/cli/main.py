"""`python -m torchburn demo`: compile the README's MLP, check it, time it, show the IR
(`torchburn.cli.demo`).
`python -m torchburn cache info|clear`: the on-disk compile cache (`TORCHBURN_CACHE_DIR`)."""
from __future__ import annotations

import argparse
import sys

from . import demo as demo_cmd


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
    demo_cmd.add_arguments(d)
    c = sub.add_parser("cache", help="show (info) or empty (clear) the on-disk compile cache")
    c.add_argument("action", choices=("info", "clear"))
    args = parser.parse_args(argv)
    if args.command == "demo":
        return demo_cmd.demo(args)
    if args.command == "cache":
        return cache(args)
    return 2


if __name__ == "__main__":
    sys.exit(main())
