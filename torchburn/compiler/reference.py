"""The reference engine's pipeline (`ReferenceEngine` in `engines.py` runs it through the driver).

The reference engine is the golden model, so its pipeline is the plainest that still makes
loop IR: the tensor passes, a lowering that writes matrix products as their definition
(`lower-to-loops-gpu`, no cache-blocked micro-kernels), the user's own loop passes, none of
the built-in CPU loop passes (no tiling, threads, SIMD, unrolling), and memory planning (the
launcher hands over one workspace, as to native code). The program is not compiled: its
entry is `runtime.reference.ReferenceEntry`, which interprets it on NumPy, called exactly as
native code is. Nothing here imports llvmlite or wgpu.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..passes.pipeline import Pipeline

#: The engine's name in `TORCHBURN_ENGINE`, `active_engine()` and cache keys.
ENGINE = "reference"


def reference_pipeline(p: "Pipeline") -> "Pipeline":
    """`p` for the reference engine (module docstring): built-in loop passes dropped, user
    loop passes kept, matrix products lowered as plain nests, epilogues at the product's index
    and row kernels kept apart (as the plain product nest needs, see `gpu_lower.py`)."""
    from ..passes.tensor.fusion import Fuse
    from ..passes.gpu.lower import LowerToLoopsGpu
    from ..passes.lower_to_loops import LowerToLoops
    from ..passes.pipeline import Pipeline, user_loop_passes

    loop = user_loop_passes(p)
    lowering = LowerToLoopsGpu() if type(p.lowering) is LowerToLoops else p.lowering
    tensor = [dataclasses.replace(x, epilogue_reshape=False, row_reductions=False) if isinstance(x, Fuse) else x
              for x in p.tensor]
    return Pipeline(tensor=tensor, lowering=lowering, loop=loop, final=list(p.final))
