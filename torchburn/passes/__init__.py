"""Passes over both IR levels, the pass manager and the built-in pipeline.

Importing this package registers every built-in pass."""
from . import base, fusion, lower_to_loops, memory_plan  # noqa: F401
from . import canonicalize, fold_batch_norm, form_attention, pattern  # noqa: F401
from . import expand_math, fuse_sibling_loops, parallelize, simplify, split_accumulators, tile, unroll, vectorize  # noqa: F401
# The GPU engine's passes (`expand-attention`, `gpu-lower`, `gpu-map`, `gpu-split`, `gpu-split-k`)
# load with `gpu_pipeline` (or by name: `get_pass` imports every pass module on demand), so a
# CPU compile does not compile their source.
from .base import (Instrument, LoopPass, Pass, PassError, PassManager, PrintAfterAll, TensorPass,
                   TimePasses, VerifyAfterEach, get_pass, parse_pipeline, register_pass)

__all__ = ["Instrument", "LoopPass", "Pass", "PassError", "PassManager", "PrintAfterAll",
           "TensorPass", "TimePasses", "VerifyAfterEach", "get_pass", "parse_pipeline", "register_pass"]
