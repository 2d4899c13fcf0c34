"""Passes over both IR levels, the pass manager and the built-in pipeline.

The rooms, by level: `tensor/` (passes on the tensor graph: canonicalize, fusion, attention
forms), `loopgen/` (the rules that turn a fused kernel into a loop nest), `quant/` (the
quantized-product kernels those rules call), `loop/` (passes on loop nests: simplify, tile,
vectorize, parallelize, memory planning) and `gpu/` (the WGSL engine's lowering and mapping).
At the root: the pass framework (`base`, `pattern`, `pipeline`) and `lower_to_loops`, the one
pass between the two levels. tests/test_layering.py holds the rooms' import rules.

Importing this package registers every built-in CPU pass."""
from . import base, lower_to_loops, pattern  # noqa: F401
from .loop import (expand_math, fuse_sibling_loops, keep_constant_prep, memory_plan, parallelize, simplify,  # noqa: F401
                   split_accumulators, split_reductions, tile, unroll, vectorize)
from .tensor import canonicalize, fold_batch_norm, form_attention, fusion, max_pool_scatter, qlinear_to_gemm  # noqa: F401
from .quant import dequantize  # noqa: F401  (the `dequantize` op's loop rule)
# The GPU engine's passes (`expand-attention`, `gpu-lower`, `gpu-map`, `gpu-split`, `gpu-split-k`)
# load with `gpu.pipeline` (or by name: `get_pass` imports every pass module on demand), so a
# CPU compile does not compile their source.
from .base import (Instrument, LoopPass, Pass, PassError, PassManager, PrintAfterAll, TensorPass,
                   TimePasses, VerifyAfterEach, get_pass, parse_pipeline, register_pass)

__all__ = ["Instrument", "LoopPass", "Pass", "PassError", "PassManager", "PrintAfterAll",
           "TensorPass", "TimePasses", "VerifyAfterEach", "get_pass", "parse_pipeline", "register_pass"]
