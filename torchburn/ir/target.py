"""The machine code is compiled for, as plain data: what passes may know about it.

A pass never probes the host: the pass manager hands it a `Target` (see `passes/base.py`,
`PassContext`), built elsewhere, by the runtime's host probe (`codegen/target.py`) or from a
name such as `avx2`, `avx512` or `neon` (`TORCHBURN_TARGET`). So the same pass compiles for
this machine or for another one, and IR tools run passes for a target without LLVM.

    Target(engine="llvm", arch="x86_64", triple="x86_64-unknown-linux-gnu", cpu="znver3",
           features="+avx,+avx2,+fma,...", vector_bits=256, l1_bytes=32768, l2_bytes=524288,
           threads=2)
    target.lanes(f32) == 8;  target.native_dot4(8) is False (no AVX512-VNNI)
    target.vector_registers() == 16;  target.has_fma() is True
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # only annotations: a warm start loading cached code never imports the IR
    from .dtypes import DType

#: The engines a target may name: LLVM native code, WGSL on wgpu, the NumPy reference interpreter.
ENGINES = ("llvm", "wgpu", "reference")

#: Features `dot4_u8i8_acc` needs, by i32 lane count, to be one instruction (`vpdpbusd` of
#: AVX512-VNNI; the 256- and 128-bit forms also need AVX512VL). Elsewhere it is a plain sequence.
DOT4_FEATURES: dict[int, tuple[str, ...]] = {
    16: ("avx512vnni",),
    8: ("avx512vnni", "avx512vl"),
    4: ("avx512vnni", "avx512vl"),
}

#: Features `tile_dot_u8i8` / `tile_dot_i8i8` need to be one AMX instruction (`tdpbusd`,
#: `tdpbssd`); the host target drops them where the kernel refuses this process the tile
#: state (`codegen/amx.py`).
TILE_FEATURES: tuple[str, ...] = ("amx-tile", "amx-int8")

#: Features of which any one makes `dot4_u8i8_acc` with a u8 operand below 128 two
#: instructions (`pmaddubsw` + `pmaddwd`), by i32 lane count: the int4 weight's nibbles.
SMALL_DOT4_FEATURES: dict[int, tuple[str, ...]] = {
    4: ("ssse3", "avx", "avx2"),
    8: ("avx2",),
    16: ("avx512bw",),
}


@dataclass(frozen=True)
class Target:
    """A compilation target. For CPUs, `features` is LLVM's comma-separated `+feat,-feat` string;
    the cache sizes and thread count are what GEMM blocking plans for."""

    #: "llvm", "wgpu" or "reference" (see `ENGINES`).
    engine: str = "llvm"
    #: "x86_64" or "aarch64" for CPUs; "" for a GPU.
    arch: str = "x86_64"
    triple: str = "x86_64-unknown-linux-gnu"
    cpu: str = "x86-64-v3"
    features: str = "+avx,+avx2,+fma,+f16c"
    #: Width of one SIMD register in bits: 512 (AVX-512), 256 (AVX/AVX2) or 128 (SSE, NEON).
    vector_bits: int = 256
    l1_bytes: int = 32 * 1024
    l2_bytes: int = 1024 * 1024
    threads: int = 1
    #: How the target was asked for ("host", "avx2", ...), for messages.
    name: str = "generic"
    #: Storage buffers one GPU kernel may bind: the device's `maxStorageBuffersPerShaderStage`
    #: (WebGPU guarantees 8); `gpu-split-wide` splits kernels that bind more.
    gpu_storage_buffers: int = 8
    #: Loop iterations one GPU invocation may run, all its loops counted together; 0: no
    #: limit. Mesa's llvmpipe ends every loop of an invocation once 65,535 iterations have run
    #: (gallivm's loop limiter, shared by all loops of a shader), so a longer kernel's result
    #: would be silently wrong there; `gpu-chunk-serial` plans within it.
    gpu_loop_iterations: int = 0

    @classmethod
    def from_features(cls, triple: str, cpu: str, features: str, **fields: object) -> "Target":
        """Describe a CPU from LLVM's triple, CPU name and feature string (other fields, such
        as cache sizes and threads, by keyword)."""
        return cls(arch=arch_of(triple), triple=triple, cpu=cpu, features=features,  # type: ignore[arg-type]
                   vector_bits=vector_bits_for(features), **fields)

    def lanes(self, dtype: "DType") -> int:
        """How many elements of `dtype` fill one vector register."""
        return max(1, self.vector_bits // dtype.bits)

    def has_feature(self, name: str) -> bool:
        return "+" + name in self.features.split(",")

    def vector_registers(self) -> int:
        """How many SIMD registers code may keep values in: 32 on AArch64 (v0-v31) and on
        x86-64 with AVX-512 (zmm0-31), 16 on other x86-64 (ymm/xmm0-15). Register-blocked
        kernels (the GEMM micro-tile) size themselves by it."""
        if self.arch == "aarch64" or (self.arch == "x86_64" and self.vector_bits >= 512):
            return 32
        return 16

    def has_fma(self) -> bool:
        """Whether a fused multiply-add is one instruction (FMA3 on x86-64, always on AArch64);
        elsewhere `fma` is a library call, and kernels multiply and add instead."""
        if self.arch == "aarch64":
            return True
        return self.has_feature("fma") or self.vector_bits >= 512

    def fma_broadcast_operand(self) -> bool:
        """Whether an fma takes a scalar broadcast from memory as its operand (AVX-512's
        embedded broadcast, `vfmadd231ps (%rax){1to16}, %zmm1, %zmm2`), so the broadcast needs
        no register of its own. AVX2 and NEON broadcast into a register first."""
        return self.arch == "x86_64" and self.vector_bits >= 512

    def native_dot4(self, lanes: int) -> bool:
        """Whether `dot4_u8i8_acc` on `lanes` i32 lanes is one instruction here."""
        needed = DOT4_FEATURES.get(lanes)
        if needed is None or self.arch != "x86_64":
            return False
        return all(self.has_feature(f) for f in needed)

    def small_dot4(self, lanes: int) -> bool:
        """Whether `dot4_u8i8_acc` on `lanes` lanes is a short sequence when its u8 operand is
        below 128 (`pmaddubsw`, `pmaddwd`; codegen/llvm/dot.py), or one instruction anyway."""
        if self.native_dot4(lanes):
            return True
        needed = SMALL_DOT4_FEATURES.get(lanes)
        return needed is not None and self.arch == "x86_64" and any(self.has_feature(f) for f in needed)

    def tile_dot(self) -> bool:
        """Whether the byte tile products (`tile_dot_u8i8`) are AMX instructions here."""
        return self.arch == "x86_64" and all(self.has_feature(f) for f in TILE_FEATURES)

    def describe(self) -> str:
        if not self.arch:
            return f"{self.engine} ({self.name})"
        return f"{self.name}: {self.triple} cpu={self.cpu} {self.vector_bits}-bit vectors"


#: What a pass assumes when it runs outside a pipeline that names a target (a test calling
#: `Vectorize().run(program)`): an x86-64-v3 (AVX2) CPU, 256-bit vectors, one thread.
GENERIC = Target()


def arch_of(triple: str) -> str:
    """The architecture of an LLVM triple ("x86_64", "aarch64", or its first component)."""
    head = triple.split("-", 1)[0]
    if head in ("x86_64", "amd64"):
        return "x86_64"
    if head in ("aarch64", "arm64"):
        return "aarch64"
    return head


def vector_bits_for(features: str) -> int:
    """SIMD register width implied by a feature string; 128 when nothing wider is enabled."""
    enabled = {f[1:] for f in features.split(",") if f.startswith("+")}
    if "avx512f" in enabled:
        return 512
    if "avx2" in enabled or "avx" in enabled:
        return 256
    return 128
