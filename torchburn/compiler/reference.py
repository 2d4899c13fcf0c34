"""The reference engine's side of the driver: the pipeline it runs and its compiled form.

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
import time
from typing import TYPE_CHECKING, Any, Optional

if TYPE_CHECKING:
    from ..ir.loop import Program
    from ..ir.tensor import Graph
    from ..passes.pipeline import Pipeline
    from ..runtime.reference import ReferenceEntry
    from .dump import DumpFolder

#: The engine's name in `TORCHBURN_ENGINE`, `active_engine()` and cache keys.
ENGINE = "reference"


def reference_pipeline(p: "Pipeline") -> "Pipeline":
    """`p` for the reference engine (module docstring): built-in loop passes dropped, user
    loop passes kept, matrix products lowered as plain nests, epilogues at the product's index
    and row kernels kept apart (as the plain product nest needs, see `gpu_lower.py`)."""
    from ..passes.fusion import Fuse
    from ..passes.gpu_lower import LowerToLoopsGpu
    from ..passes.lower_to_loops import LowerToLoops
    from ..passes.pipeline import Pipeline, user_loop_passes

    loop = user_loop_passes(p)
    lowering = LowerToLoopsGpu() if type(p.lowering) is LowerToLoops else p.lowering
    tensor = [dataclasses.replace(x, epilogue_reshape=False, row_reductions=False) if isinstance(x, Fuse) else x
              for x in p.tensor]
    return Pipeline(tensor=tensor, lowering=lowering, loop=loop, final=list(p.final))


def lower_for_reference(graph: "Graph", pipeline: "Pipeline", dump: Optional["DumpFolder"] = None
                        ) -> tuple["Program", "ReferenceEntry", dict[str, float], list[tuple[str, float]]]:
    """Run the reference pipeline on `graph`: (program, entry, timings, pass times)."""
    from ..ir.loop import Program
    from ..ir.printer import print_ir
    from ..passes.base import PassError, PassManager, TimePasses
    from ..runtime.reference import ReferenceEntry

    timer = TimePasses()
    instruments: list[Any] = [timer] + ([dump] if dump is not None else [])
    t0 = time.perf_counter()
    program = PassManager(reference_pipeline(pipeline).passes(), instruments).run(graph)
    if not isinstance(program, Program):
        raise PassError(f"the pipeline ended with {type(program).__name__}, not a loop Program")
    t1 = time.perf_counter()
    entry = ReferenceEntry(program)
    t2 = time.perf_counter()
    if dump is not None:
        dump.write("program.tbir", print_ir(program))
    return program, entry, {"passes": t1 - t0, "interpreter": t2 - t1}, timer.times
