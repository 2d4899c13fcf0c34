"""Loop IR -> WGSL compute shaders, one per kernel, for the wgpu engine (`runtime/gpu.py`).

    from torchburn.codegen.wgsl import Caps, emit_program
    shaders = emit_program(program, Caps(f16=False))   # after the `gpu-map` pass

`WgslUnsupported` says why a program cannot run on WebGPU (f64, i64 tensors, too many buffers,
an op without a WGSL form); the caller runs it on the CPU engine instead.
"""
from .program import emit_kernel, emit_program, program_caps, refuse_data_divisors
from .shader import Binding, Grid, KernelShader
from .types import Caps, WgslUnsupported, host_dtype, storage_itemsize, storage_type

__all__ = ["Binding", "Caps", "Grid", "KernelShader", "WgslUnsupported", "emit_kernel", "emit_program",
           "host_dtype", "program_caps", "refuse_data_divisors", "storage_itemsize", "storage_type"]
