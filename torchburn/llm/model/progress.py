"""What the engine is doing while someone waits: bars for loading, a line for each slow step.

- Bars (tqdm, on stderr, only when stderr is a terminal): loading weights, in bytes;
  extracting the default model.
- Steps (`Step`): a step still running after `ANNOUNCE_AFTER_S` seconds (compiling the
  prefill or decode step, reading one from the disk cache, reading the weights from it) is
  announced through the ``torchburn.progress`` logger at INFO, and its end with what it made
  and how long it took. Shorter steps say nothing.

A library only logs: the messages show where the application configured `logging`. The
``torchburn`` command shows them on stderr (`show_on_stderr`) unless ``--quiet``, which also
turns the bars off (`set_quiet`)."""
from __future__ import annotations

import logging
import sys
import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Optional, TypeVar

T = TypeVar("T")

log = logging.getLogger("torchburn.progress")

#: A step that runs longer than this is announced (and its end reported).
ANNOUNCE_AFTER_S = 1.0

_quiet = False
_handler: Optional[logging.Handler] = None


def set_quiet(quiet: bool) -> None:
    """Bars off (``True``) or back on where stderr is a terminal."""
    global _quiet
    _quiet = quiet


def bars_on() -> bool:
    return not _quiet and sys.stderr.isatty()


def show_on_stderr(on: bool = True) -> None:
    """The command line's set-up: step messages printed on stderr as plain lines (``on``), or
    neither messages nor bars (``--quiet``)."""
    global _handler
    set_quiet(not on)
    if _handler is not None:
        log.removeHandler(_handler)
        _handler = None
    if on:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("%(message)s"))
        log.addHandler(_handler)
        log.setLevel(logging.INFO)
        log.propagate = False  # not twice where TORCHBURN_DEBUG also logs "torchburn" to stderr
    else:
        log.propagate = True
        log.setLevel(logging.NOTSET)


def progress(items: Iterable[T], desc: str, unit: str = "tensor", total: Optional[int] = None,
             size: Optional[Callable[[T], int]] = None) -> Iterator[T]:
    """Iterate ``items`` under a bar; with ``size`` (bytes of an item) and ``total`` (bytes of
    all), the bar counts bytes."""
    if not bars_on():
        yield from items
        return
    from tqdm import tqdm

    if size is None:
        yield from tqdm(items, desc=desc, leave=False, unit=unit, total=total)
        return
    with tqdm(total=total, desc=desc, leave=False, unit="B", unit_scale=True,
              unit_divisor=1024) as bar:
        for item in items:
            yield item
            bar.update(size(item))


class _NoBar:
    def update(self, n: int) -> None:
        pass


@contextmanager
def byte_bar(total: int, desc: str) -> Iterator[Any]:
    """A bar of ``total`` bytes (``update(n)`` per chunk), or one that draws nothing."""
    if not bars_on():
        yield _NoBar()
        return
    from tqdm import tqdm

    with tqdm(total=total, desc=desc, leave=False, unit="B", unit_scale=True,
              unit_divisor=1024) as bar:
        yield bar


class Step:
    """A step the user may wait on: ``with Step("compiling the decode step") as s: ...;
    s.note = "12 kernels"``. Announced once it has run `after` seconds (default
    `ANNOUNCE_AFTER_S`) (from a timer thread:
    the step itself is not interrupted), and its end reported then, with `note` and the time."""

    def __init__(self, what: str, after: Optional[float] = None) -> None:
        self.what = what
        self.after = ANNOUNCE_AFTER_S if after is None else after
        self.note = ""
        self.seconds = 0.0
        self._announced = threading.Event()
        self._timer: Optional[threading.Timer] = None
        self._t0 = 0.0

    def _announce(self) -> None:
        self._announced.set()
        log.info("torchburn: %s ...", self.what)

    def __enter__(self) -> "Step":
        self._t0 = time.perf_counter()
        if log.isEnabledFor(logging.INFO):
            self._timer = threading.Timer(self.after, self._announce)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __exit__(self, kind: Any, err: Any, tb: Any) -> None:
        self.seconds = time.perf_counter() - self._t0
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        if kind is None and (self._announced.is_set() or self.seconds >= self.after):
            note = f"{self.note}, " if self.note else ""
            log.info("torchburn: %s: done (%s%.1f s)", self.what, note, self.seconds)
