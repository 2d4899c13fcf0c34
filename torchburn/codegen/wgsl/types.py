"""How IR dtypes live on a WebGPU device: value types, storage types, host conversions.

WGSL has 32-bit scalars only (plus `f16` behind the `shader-f16` feature): no 64-bit
integers, no f64, no 8- or 16-bit integers. The table below says, for every IR dtype, which
WGSL type a value has in a shader, which element type its storage array has, and which dtype
the host converts a tensor to before upload (and back after download).

| IR dtype | value in WGSL | storage element | host tensor uploaded as |
|---|---|---|---|
| f32 | f32 | f32 | as is |
| f16 | f16 (shader-f16) or f32 | f16 or f32 | as is, or converted to f32 |
| bf16 | f32 (casts round to bf16) | f32 | converted to f32 |
| i32 | i32 | i32 | as is |
| i8, i16, u8 | i32 (casts wrap) | i32 | converted to i32 |
| i8, u8 of a program that writes none (`packed_bytes`) | i32 | u32, four bytes a word | as is (raw bytes) |
| bool | bool | u32 | converted to i32 |
| i64 | i32 (token ids, positions, slots: values must fit 32 bits) | i32 | converted to i32, range-checked |
| f64 | rejected | rejected | rejected |

Packed bytes: a quantized model's weights are u8 (int4 nibbles, ggml blocks) or i8 (int8), read
and never written. Widened to i32 they take four times the memory and the bandwidth of what a
decode step must read (an int4 weight cost as much as an f16 one). A program none of whose
kernels writes an 8-bit buffer stores them as they are, four to a `u32` word
(`program_caps`); the accessor `ld_x(i)` extracts byte `i % 4` of word `i / 4`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ...ir import dtypes as dt
from ...ir.dtypes import DType
from ..errors import CodegenError


class WgslUnsupported(CodegenError):
    """The program cannot run as WGSL (a dtype, op or limit of WebGPU); the caller falls back
    to the CPU engine. The message says what and why."""


@dataclass(frozen=True)
class Caps:
    """What the adapter allows; the runtime fills it from the device's features and limits."""

    #: The adapter has `shader-f16`: f16 values and storage are native.
    f16: bool = False
    #: The adapter has `subgroups`: row reductions use `subgroupAdd`/`Max`/... (`rows.py`).
    subgroups: bool = False
    max_storage_buffers: int = 8
    max_invocations: int = 256
    max_workgroup_storage: int = 16384
    #: Loop iterations one invocation may run, all loops together (0: no limit): llvmpipe's
    #: 65,535 (`Target.gpu_loop_iterations`, `runtime/gpu.py`'s `loop_limit`).
    loop_iterations: int = 0
    #: 8-bit integer buffers (u8, i8) stored four to a `u32` word, not widened to i32: set per
    #: program by `program_caps` when no kernel of it writes one.
    packed_bytes: bool = False


#: value type, storage element type and host upload dtype of each IR dtype (native f16 aside).
_TABLE: dict[str, tuple[str, str, Optional[DType]]] = {
    "f32": ("f32", "f32", None),
    "f16": ("f32", "f32", dt.f32),
    "bf16": ("f32", "f32", dt.f32),
    "i32": ("i32", "i32", None),
    "i16": ("i32", "i32", dt.i32),
    "i8": ("i32", "i32", dt.i32),
    "u8": ("i32", "i32", dt.i32),
    "bool": ("bool", "u32", dt.i32),
    # i64 tensors (token ids, positions, cache slots) are stored as i32: the launcher checks
    # at upload that the values fit (else the call runs in PyTorch); values computed past
    # 32 bits in a kernel wrap, as i64 index arithmetic always did here
    "i64": ("i32", "i32", dt.i32),
}
_REJECT = {
    "f64": "WGSL has no 64-bit floats (f64)",
}


#: The dtypes `Caps.packed_bytes` stores four to a word.
PACKABLE = (dt.u8, dt.i8)


def packed(d: DType, caps: Caps) -> bool:
    """Whether a buffer of dtype `d` is stored as bytes packed in `u32` words."""
    return caps.packed_bytes and d in PACKABLE


def _row(d: DType, caps: Caps) -> tuple[str, str, Optional[DType]]:
    if d == dt.f16 and caps.f16:
        return ("f16", "f16", None)
    if packed(d, caps):
        return ("i32", "u32", None)
    row = _TABLE.get(d.name)
    if row is None:
        raise WgslUnsupported(_REJECT.get(d.name, f"dtype {d} has no WGSL form"))
    return row


def value_type(d: DType, caps: Caps) -> str:
    """The WGSL scalar type of a value of dtype `d` (i64 index arithmetic computes in i32)."""
    if d == dt.i64:
        return "i32"
    return _row(d, caps)[0]


def storage_type(d: DType, caps: Caps) -> str:
    """The element type of a storage array holding a tensor of dtype `d`."""
    return _row(d, caps)[1]


def host_dtype(d: DType, caps: Caps) -> DType:
    """The dtype the host converts a tensor of dtype `d` to before upload."""
    conv = _row(d, caps)[2]
    return d if conv is None else conv


def storage_itemsize(d: DType, caps: Caps) -> int:
    """Bytes one element takes on the device (a packed byte buffer's size is rounded up to whole
    words where it is allocated)."""
    if packed(d, caps):
        return 1
    return 2 if storage_type(d, caps) == "f16" else 4


def vec(t: str, lanes: int) -> str:
    return t if lanes == 1 else f"vec{lanes}<{t}>"
