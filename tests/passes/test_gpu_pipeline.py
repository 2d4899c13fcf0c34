"""The GPU variant of the pipeline (`passes/gpu/pipeline.py`): what it keeps and drops."""
from __future__ import annotations

from torchburn.passes.gpu.pipeline import gpu_pipeline
from torchburn.passes.tensor.fusion import Fuse
from torchburn.passes.pipeline import Pipeline


def test_gpu_pipeline_keeps_row_fusion_and_maps_last() -> None:
    p = gpu_pipeline(Pipeline.default())
    fuses = [x for x in p.tensor if isinstance(x, Fuse)]
    # Row kernels get a workgroup per row from gpu-map (`gpu_rows.py`): one pass for softmax;
    # a product's epilogue may pass a reshape of its rows (stored at the regrouped index).
    assert fuses and all(f.row_reductions and f.epilogue_reshape for f in fuses)
    assert p.lowering.name == "lower-to-loops-gpu"
    # the mapping last, but for the count of what its invocations loop (`gpu-chunk-serial`)
    assert [x.name for x in p.loop[-2:]] == ["gpu-map", "gpu-chunk-serial"]
    names = [x.name for x in p.loop]
    assert names.index("gpu-split-phases") < names.index("gpu-split-wide")
    cpu_only = {"parallelize", "vectorize", "unroll", "split-accumulators", "fuse-sibling-loops"}
    assert not cpu_only & {x.name for x in p.loop}
    # quantized products stay one kernel (no f32 copy of the weight in GPU memory)
    assert "qlinear-to-gemm" in [x.name for x in Pipeline.default().tensor]
    assert "qlinear-to-gemm" not in [x.name for x in p.tensor]


def test_gpu_pipeline_expands_attention_before_fusion() -> None:
    """The GPU pipeline keeps the attention ops its flash kernel computes and rewrites the
    others into products and a softmax (`expand-attention{keep_flash}`) before `fuse` sees
    them; `flash=False` expands them all."""
    tensor = gpu_pipeline(Pipeline.default()).tensor
    names = [x.name for x in tensor]
    assert names.count("expand-attention") == 1
    assert names.index("expand-attention") < names.index("fuse")
    assert tensor[names.index("expand-attention")].keep_flash  # type: ignore[attr-defined]
    plain = gpu_pipeline(Pipeline.default(), flash=False).tensor
    assert not next(x for x in plain if x.name == "expand-attention").keep_flash  # type: ignore[attr-defined]
    assert "expand-attention" not in [x.name for x in Pipeline.default().tensor]
