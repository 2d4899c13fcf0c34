"""`TORCHBURN_DUMP=<folder>`: write every stage of every compiled graph to files.

One subfolder per compiled graph (`<n>_<hash prefix>/`), holding `00_fx_graph.py`,
`01_tensor_ir.tbir`, one numbered file per pass (`02_after_fuse.tbir`, ...), `program.tbir`
(the final loop IR), `module.ll` and `module.s`.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Optional

from ..ir.printer import print_ir
from ..passes.base import IR, Instrument, Pass

_counter = itertools.count()


class DumpFolder(Instrument):
    """A pass-manager instrument that also offers `write(name, text)` for non-pass stages."""

    def __init__(self, root: Path, key: str) -> None:
        self.folder = root / f"{next(_counter):03d}_{key[:12]}"
        self.folder.mkdir(parents=True, exist_ok=True)
        self._step = itertools.count(2)

    def write(self, name: str, text: str) -> Path:
        path = self.folder / name
        path.write_text(text)
        return path

    def after_pass(self, p: Pass, ir: IR, seconds: float) -> None:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", p.spelling())
        self.write(f"{next(self._step):02d}_after_{slug}.tbir", print_ir(ir))


def make_dump(root: Optional[Path], key: str) -> Optional[DumpFolder]:
    return DumpFolder(root, key) if root is not None else None
