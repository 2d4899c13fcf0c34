"""What a compiled kernel is for the runtime: WGSL source, bindings and how to size its grid.

Binding 0 of every shader is the program's uniform block of symbols (one `i32` per program
symbol, in program order); bindings 1.. are the kernel's buffer parameters in order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...ir.expr import Expr


@dataclass(frozen=True)
class Binding:
    """A kernel parameter bound as a storage buffer."""

    buffer: str
    #: WGSL element type of the storage array (`f32`, `vec4<f32>`, `u32`...).
    element: str
    writable: bool


@dataclass(frozen=True)
class Grid:
    """How many workgroups a dispatch needs, as index expressions over the program symbols.

    `groups` are the (x, y, z) workgroup counts; the runtime splits an x count above the
    device's per-dimension limit into x and y (shaders index workgroups as `y * nx + x`).
    """

    groups: tuple[Expr, Expr, Expr]
    #: Invocations per workgroup (the shader's `@workgroup_size`).
    workgroup: int
    #: "threads" (an invocation per element), "groups" (a workgroup per output element,
    #: cooperative reduction inside), "gemm" (a workgroup per output tile) or "single".
    mode: str


@dataclass(frozen=True)
class KernelShader:
    name: str
    source: str
    bindings: tuple[Binding, ...]
    grid: Grid
    #: Which mapping the kernel got, for reports: "threads", "threads/vec4", "groups/tree-add"...
    summary: str
    #: The loop iterations one invocation may run, over the program symbols, where the device
    #: limits them and the count depends on the sizes (`gpu-chunk-serial`); the launcher runs
    #: a call past the limit in PyTorch. None: within the limit, or no limit.
    iterations: Optional[Expr] = None

    @property
    def fault(self) -> bool:
        """Whether the shader sets the fault flag (an index out of range, `checked_index`):
        binding `len(bindings) + 1`, a `u32` the launcher reads after the run."""
        return "var<storage, read_write> tb_fault" in self.source
