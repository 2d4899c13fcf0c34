"""What the parts of a kernel's WGSL emission share: how each buffer is accessed, the local
arrays, and the face of the kernel emitter (`kernel.KernelEmitter`) that a special form such
as the tiled GEMM (`gemm.py`) writes through.

`kernel.py` calls `gemm.py`; `gemm.py` sees the emitter only through `KernelContext`, so the
two files do not import each other.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ...ir import loop as lp
from ...ir.expr import Expr
from .expr import ExprRenderer, Helpers
from .shader import Binding
from .types import Caps


@dataclass
class Access:
    """How one kernel parameter is accessed: scalar, vec4, read, written."""

    buffer: lp.Buffer
    vec4: bool = False
    written: bool = False


@dataclass
class Local:
    """A local buffer of the kernel, as a WGSL function-scope array of `size` elements."""

    buffer: lp.Buffer
    size: int


class KernelContext(Protocol):
    """The kernel emitter as a special form (the GEMM) uses it: its kernel and device limits,
    the expression renderer and helpers, buffers, the lines being written, and assembly."""

    kernel: lp.Kernel
    symbols: set[str]
    caps: Caps
    helpers: Helpers
    r: ExprRenderer
    params: dict[str, Access]
    locals: dict[str, Local]
    workgroup_arrays: dict[str, str]
    lines: list[str]
    indent: int

    def line(self, text: str) -> None: ...

    def stmt(self, s: lp.Stmt) -> None: ...

    def offset(self, b: lp.Buffer, index: tuple[Expr, ...]) -> str: ...

    def unflatten(self, linear: str, loops: list[lp.For], extents: list[Expr], scale_last: int = 1) -> None: ...

    def bindings(self) -> tuple[Binding, ...]: ...

    @property
    def uses_fault(self) -> bool: ...

    def assemble(self, bindings: tuple[Binding, ...], wg: int, body: list[str]) -> str: ...
