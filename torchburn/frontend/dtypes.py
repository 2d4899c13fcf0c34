"""Mapping between torch dtypes and IR dtypes (the one place that knows both)."""
from __future__ import annotations

import torch

from ..ir import dtypes as dt
from ..ir.dtypes import DType

TORCH_TO_IR: dict[torch.dtype, DType] = {
    torch.bool: dt.bool_,
    torch.int8: dt.i8,
    torch.int16: dt.i16,
    torch.int32: dt.i32,
    torch.int64: dt.i64,
    torch.uint8: dt.u8,
    torch.float16: dt.f16,
    torch.bfloat16: dt.bf16,
    torch.float32: dt.f32,
    torch.float64: dt.f64,
}
IR_TO_TORCH: dict[DType, torch.dtype] = {v: k for k, v in TORCH_TO_IR.items()}


class UnsupportedDType(TypeError):
    """A tensor has a dtype the compiler does not handle (complex, float8, quantized...)."""


def to_ir(dtype: torch.dtype) -> DType:
    try:
        return TORCH_TO_IR[dtype]
    except KeyError:
        raise UnsupportedDType(f"dtype {dtype} is not supported by torchburn") from None


def to_torch(dtype: DType) -> torch.dtype:
    return IR_TO_TORCH[dtype]


def is_supported(dtype: torch.dtype) -> bool:
    return dtype in TORCH_TO_IR
