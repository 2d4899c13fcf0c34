"""Element types of the IR.

The IR names its own dtypes instead of borrowing torch's so that IR text, passes and codegen
stay independent of any framework. Each dtype knows its width and kind, which is all that
type promotion, codegen and the runtime need.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class DType:
    """A scalar element type: `name` is its spelling in IR text (`f32`, `i64`, `bool`)."""

    name: str
    bits: int
    kind: str  # "f" float, "i" signed int, "u" unsigned int, "b" bool

    @property
    def is_float(self) -> bool:
        return self.kind == "f"

    @property
    def is_int(self) -> bool:
        return self.kind in ("i", "u")

    @property
    def is_signed(self) -> bool:
        return self.kind in ("i", "f")

    @property
    def is_bool(self) -> bool:
        return self.kind == "b"

    @property
    def itemsize(self) -> int:
        return max(1, self.bits // 8)

    def __repr__(self) -> str:
        return self.name

    def __str__(self) -> str:
        return self.name


bool_ = DType("bool", 8, "b")
i8 = DType("i8", 8, "i")
i16 = DType("i16", 16, "i")
i32 = DType("i32", 32, "i")
i64 = DType("i64", 64, "i")
u8 = DType("u8", 8, "u")
f16 = DType("f16", 16, "f")
bf16 = DType("bf16", 16, "f")
f32 = DType("f32", 32, "f")
f64 = DType("f64", 64, "f")

#: The type of every index, size, stride and symbolic dimension (64-bit, as the issue asks).
index = i64

ALL_DTYPES: tuple[DType, ...] = (bool_, i8, i16, i32, i64, u8, f16, bf16, f32, f64)
BY_NAME: dict[str, DType] = {d.name: d for d in ALL_DTYPES}


def dtype_from_name(name: str) -> DType:
    """Look a dtype up by its IR spelling, with an error that lists the valid spellings."""
    try:
        return BY_NAME[name]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; expected one of {sorted(BY_NAME)}") from None


def compute_dtype(dtype: DType) -> DType:
    """The dtype arithmetic happens in: half-precision floats compute in f32, others in themselves."""
    return f32 if dtype in (f16, bf16) else dtype
