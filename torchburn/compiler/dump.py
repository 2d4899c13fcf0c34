"""`TORCHBURN_DUMP=<folder>`: write every stage of every compiled graph to files.

One subfolder per compiled graph (`<n>_<hash prefix>/`), holding `00_fx_graph.py`,
`01_tensor_ir.tbir`, one numbered file per pass (`02_after_fuse.tbir`, ...), `program.tbir`
(the final loop IR), `module.ll` and `module.s`.

Dumping is a diagnostic, never a reason not to compile: a folder that cannot be created or
written (read-only, full disk) stops the dump with one warning per folder, and compilation
goes on as without `TORCHBURN_DUMP`.
"""
from __future__ import annotations

import itertools
import logging
import re
from pathlib import Path
from typing import Optional

from ..ir.printer import print_ir
from ..passes.base import IR, Instrument, Pass

_counter = itertools.count()
log = logging.getLogger("torchburn")
#: Dump roots already warned about (one warning per folder and process).
_warned: set[str] = set()


def _warn_once(root: Path, err: OSError) -> None:
    if str(root) not in _warned:
        _warned.add(str(root))
        log.warning("torchburn: TORCHBURN_DUMP folder %s cannot be written (%s); compiling without "
                    "dumps", root, err)


class DumpFolder(Instrument):
    """A pass-manager instrument that also offers `write(name, text)` for non-pass stages."""

    def __init__(self, root: Path, key: str) -> None:
        self.root = root
        self.folder = root / f"{next(_counter):03d}_{key[:12]}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._step = itertools.count(2)
        self.broken = False

    def write(self, name: str, text: str) -> Optional[Path]:
        """Write one stage; after a failed write (warned once) nothing more is written."""
        if self.broken:
            return None
        path = self.folder / name
        try:
            path.write_text(text)
        except OSError as err:
            self.broken = True
            _warn_once(self.root, err)
            return None
        return path

    def after_pass(self, p: Pass, ir: IR, seconds: float) -> None:
        if self.broken:
            return
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", p.spelling())
        self.write(f"{next(self._step):02d}_after_{slug}.tbir", print_ir(ir))


def make_dump(root: Optional[Path], key: str) -> Optional[DumpFolder]:
    """The dump folder of one graph, or None: no TORCHBURN_DUMP, or it cannot be created."""
    if root is None:
        return None
    try:
        return DumpFolder(root, key)
    except OSError as err:
        _warn_once(root, err)
        return None
