"""The GPU variant of the pipeline (`passes/gpu_pipeline.py`): what it keeps and drops."""
from __future__ import annotations

from torchburn.passes.gpu_pipeline import gpu_pipeline
from torchburn.passes.fusion import Fuse
from torchburn.passes.pipeline import Pipeline


def test_gpu_pipeline_keeps_rows_apart_and_maps_last() -> None:
    p = gpu_pipeline(Pipeline.default())
    fuses = [x for x in p.tensor if isinstance(x, Fuse)]
    # Row kernels would run each row serially in one invocation; gpu-map spreads a plain
    # reduction over a workgroup (softmax fell from 900 to 22 GB/s on an H200 with rows fused).
    assert fuses and all(not f.row_reductions and not f.epilogue_reshape for f in fuses)
    assert p.lowering.name == "lower-to-loops-gpu"
    assert p.loop[-1].name == "gpu-map"
    cpu_only = {"parallelize", "vectorize", "unroll", "split-accumulators", "fuse-sibling-loops"}
    assert not cpu_only & {x.name for x in p.loop}
