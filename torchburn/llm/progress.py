"""Progress bars for loading: tqdm on a terminal, nothing otherwise."""
from __future__ import annotations

import sys
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def progress(items: Iterable[T], desc: str) -> Iterator[T]:
    """Iterate ``items``, drawing a bar on stderr only when stderr is a terminal."""
    if not sys.stderr.isatty():
        yield from items
        return
    from tqdm import tqdm

    yield from tqdm(items, desc=desc, leave=False, unit="tensor")
