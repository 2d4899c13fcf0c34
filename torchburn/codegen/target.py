"""The machine code is generated for: triple, CPU name, CPU features and SIMD width.

The vectorizer asks `lanes(dtype)` how many elements fill one vector register; codegen and the
JIT build the LLVM target machine from the same triple, CPU and features, so the vectors the
IR asks for are the vectors the CPU has. Environment variables are read elsewhere (the runtime
configuration); this module only describes machines.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: a warm start loading cached code never imports the IR
    from ..ir.dtypes import DType


@dataclass(frozen=True)
class Target:
    """A CPU target. `features` is LLVM's comma-separated `+feat,-feat` string."""

    triple: str
    cpu: str
    features: str
    #: Width of one SIMD register in bits: 512 (AVX-512), 256 (AVX/AVX2) or 128 (SSE, NEON).
    vector_bits: int

    @classmethod
    def from_features(cls, triple: str, cpu: str, features: str) -> "Target":
        """Describe a CPU from LLVM's triple, CPU name and feature string."""
        return cls(triple, cpu, features, vector_bits_for(features))

    @staticmethod
    def host() -> "Target":
        """The machine this process runs on (computed once)."""
        return _host_target()

    def lanes(self, dtype: DType) -> int:
        """How many elements of `dtype` fill one vector register."""
        return max(1, self.vector_bits // dtype.bits)

    def has_feature(self, name: str) -> bool:
        return "+" + name in self.features.split(",")


def vector_bits_for(features: str) -> int:
    """SIMD register width implied by a feature string; 128 when nothing wider is enabled."""
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    if "avx512f" in enabled:
        return 512
    if "avx2" in enabled or "avx" in enabled:
        return 256
    return 128


@functools.lru_cache(maxsize=1)
def _host_target() -> Target:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    triple = llvm.get_process_triple()
    cpu = llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features().flatten()
    return Target.from_features(triple, cpu, features)
