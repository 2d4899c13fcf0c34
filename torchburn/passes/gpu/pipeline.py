"""The pipeline the wgpu engine runs: the CPU pipeline's tensor passes and the user's loop
passes, without the CPU's loop passes, with GPU lowering and `gpu-map`.

    Pipeline.default()   canonicalize, form-attention, fold-batch-norm, fuse | lower-to-loops | simplify, ..., vectorize, unroll, ... | plan-memory
    gpu_pipeline(p)      canonicalize, form-attention, fold-batch-norm, expand-attention{keep_flash=true}, fuse
                         (no qlinear-to-gemm: a quantized product stays one kernel on the GPU; no
                         max-pool-grad-to-scatter: a scatter's updates are one invocation there)
                         | lower-to-loops-gpu | gpu-inline-rows, gpu-split-phases, gpu-split-wide, gpu-split-k,
                           gpu-map, gpu-chunk-serial

The compile driver asks for it when the target's engine is `wgpu` (`compiler/engines.py`).
"""
from __future__ import annotations

import dataclasses

from ..tensor.expand_attention import ExpandAttention
from ..tensor.fusion import Fuse
from .inline_rows import GpuInlineRows
from .lower import LowerToLoopsGpu
from .map import GpuMap
from .serial import GpuChunkSerial, GpuSplitPhases
from .split import GpuSplitWide
from .split_k import GpuSplitK
from ..lower_to_loops import LowerToLoops
from ..pipeline import Pipeline, user_loop_passes


def gpu_pipeline(p: Pipeline, flash: bool = True) -> Pipeline:
    """The GPU variant of a pipeline: the same tensor passes, the user's loop passes but none
    of the built-in CPU loop passes (threads, SIMD, unrolling), matrix products lowered as plain
    nests (`lower-to-loops-gpu`), then `gpu-inline-rows` (a one-row kernel, a decode step's
    RMSNorm, computed inside the product that reads it, `inline_rows.py`), `gpu-split-phases`
    (a kernel of several top-level loops, a scatter's copy and updates, as a kernel per phase,
    `serial.py`), `gpu-split-wide` (kernels binding too many buffers,
    `gpu_split.py`), `gpu-split-k` (products with few output tiles, `gpu_split_k.py`) and
    `gpu-map`, then `gpu-chunk-serial` (single-invocation loops within the device's loop limit,
    `serial.py`) (unless the user placed them). Row fusion stays:
    `gpu-map` gives its row kernels a workgroup per row (`gpu_rows.py`). A fused `attention`
    op stays one kernel, the flash-attention shader (`codegen/wgsl/attention.py`), where that
    covers it; `expand-attention{keep_flash}` expands the others into products and a softmax
    before fusion (and all of them with `flash=False`)."""
    loop = user_loop_passes(p)
    if not any(x.name == GpuMap.name for x in loop):
        loop.append(GpuMap())
    if not any(x.name == GpuSplitWide.name for x in loop):
        # before the mapping, so that each chunk is mapped on its own
        loop.insert(next(k for k, x in enumerate(loop) if x.name == GpuMap.name), GpuSplitWide())
    if not any(x.name == GpuInlineRows.name for x in loop):
        # first: a norm's row computed inside the product that reads it is one dispatch less
        loop.insert(next(k for k, x in enumerate(loop) if x.name == GpuSplitWide.name), GpuInlineRows())
    if not any(x.name == GpuSplitPhases.name for x in loop):
        # before the split of wide kernels: a phase binds fewer buffers than the whole
        loop.insert(next(k for k, x in enumerate(loop) if x.name == GpuSplitWide.name), GpuSplitPhases())
    if not any(x.name == GpuChunkSerial.name for x in loop):
        # after the mapping: it counts what each invocation loops
        loop.insert(next(k for k, x in enumerate(loop) if x.name == GpuMap.name) + 1, GpuChunkSerial())
    if not any(x.name == GpuSplitK.name for x in loop):
        # before the mapping: the parts are a GEMM, their sum an elementwise kernel
        loop.insert(next(k for k, x in enumerate(loop) if x.name == GpuMap.name), GpuSplitK())
    lowering = LowerToLoopsGpu() if type(p.lowering) is LowerToLoops else p.lowering
    # The CPU's dequantize + GEMM form of many-row quantized products would write the weight
    # as f32 in GPU memory; the GPU keeps the quantized product (its plain nest is one
    # invocation per output element, which `gpu-map` maps as any element nest).
    # A scatter's updates are one invocation on the GPU (`gpu-map` maps no loop of them): max
    # pooling's gradient stays `pool_grad`, an invocation per input element.
    tensor = [x for x in p.tensor if x.name not in ("qlinear-to-gemm", "max-pool-grad-to-scatter")]
    # A stored value costs a dispatch: rotary embeddings and SiLU * up are computed inside the
    # attention and matrix-vector kernels that read them (`fusion.py`, `vector_producers`).
    tensor = [dataclasses.replace(x, vector_producers=True) if type(x) is Fuse else x for x in tensor]
    if not any(x.name == ExpandAttention.name for x in tensor):
        at = next((k for k, x in enumerate(tensor) if isinstance(x, Fuse)), len(tensor))
        tensor.insert(at, ExpandAttention(keep_flash=flash))
    return Pipeline(tensor=tensor, lowering=lowering, loop=loop, final=[])
