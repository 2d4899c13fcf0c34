"""Building target descriptions: the host probe, and CPUs named by `TORCHBURN_TARGET`.

The description itself (`torchburn.ir.target.Target`) is plain data that passes receive; this
module is where it is *built*: from LLVM's view of the host (`host_target()`) or from a name
(`named_target("avx512")`), and where it is decided whether code for a target can run in this
process (`runs_here`). Code for another CPU is compiled to object code and assembly only.

| name | triple | cpu | vectors |
|---|---|---|---|
| `host` | this machine | LLVM's host CPU name and features | the host's |
| `avx2`, `x86-64-v3` | x86_64-unknown-linux-gnu | x86-64-v3 | 256 bits (ymm, 8 f32) |
| `avx512`, `x86-64-v4`, `skylake-avx512` | x86_64-unknown-linux-gnu | skylake-avx512 | 512 bits (zmm, 16 f32) |
| `znver4` | x86_64-unknown-linux-gnu | znver4 (AVX-512 with VNNI, BF16) | 512 bits |
| `neon`, `aarch64` | aarch64-unknown-linux-gnu | neoverse-n1 | 128 bits (v registers, 4 f32) |

Any other CPU is written `triple:cpu:features` (`aarch64-unknown-linux-gnu:generic:+neon`).
Environment variables are read elsewhere (the runtime configuration).
"""
from __future__ import annotations

import functools
import os

from ..ir.target import GENERIC, Target, arch_of, vector_bits_for
from .amx import request_tiles, without_tiles
from .target_names import NAMED_TARGETS, check_target_name

__all__ = ["Target", "TargetError", "GENERIC", "host_target", "named_target", "runs_here",
           "vector_bits_for", "arch_of", "NAMED_TARGETS", "gpu_target"]

class TargetError(ValueError):
    """A target name that describes no known CPU, or code that cannot run on this machine."""


def _sysconf(name: str, default: int) -> int:
    try:
        value = os.sysconf(name)
    except (ValueError, OSError):
        return default
    return value if value and value > 0 else default


def _machine_fields() -> dict[str, int]:
    """Cache sizes and CPU count of this machine: what GEMM blocking plans for (a named target
    takes them too; the machine it will run on is not known here)."""
    return {"l1_bytes": _sysconf("SC_LEVEL1_DCACHE_SIZE", 32 * 1024),
            "l2_bytes": _sysconf("SC_LEVEL2_CACHE_SIZE", 1024 * 1024),
            "threads": os.cpu_count() or 1}


@functools.lru_cache(maxsize=1)
def host_target() -> Target:
    """The machine this process runs on, as LLVM describes it (computed once); AMX only where
    the kernel grants this process the tile state (`amx.request_tiles`)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    triple = llvm.get_process_triple()
    cpu = llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features().flatten()
    if "+amx-tile" in features.split(",") and not request_tiles():
        features = without_tiles(features)  # the kernel said no: compile as for a CPU without AMX
    return Target.from_features(triple, cpu, features, name="host", **_machine_fields())


@functools.lru_cache(maxsize=32)
def named_target(spec: str) -> Target:
    """The target `spec` names: `host`, a name of `NAMED_TARGETS`, or `triple:cpu:features`."""
    try:
        key = check_target_name(spec)
    except ValueError as err:
        raise TargetError(f"target {spec.strip()!r}: {err}") from None
    if key == "host":
        return host_target()
    if key in NAMED_TARGETS:
        triple, cpu, features = NAMED_TARGETS[key]
        return Target.from_features(triple, cpu, features, name=key, **_machine_fields())
    triple, cpu, features = key.split(":")
    if arch_of(triple) not in ("x86_64", "aarch64"):
        raise TargetError(f"target {key!r}: architecture {arch_of(triple)!r} is not supported (x86_64 or aarch64)")
    return Target.from_features(triple, cpu, features, name=key, **_machine_fields())


def gpu_target(tag: str = "", storage_buffers: int = 8, loop_iterations: int = 0) -> Target:
    """The description of the wgpu engine's target: the device limits passes plan for
    (`storage_buffers` per kernel and `loop_iterations` per invocation, the device's; the rest
    of its limits live with the device)."""
    return Target(engine="wgpu", arch="", triple="", cpu="", features="", vector_bits=128, name=tag or "wgpu",
                  gpu_storage_buffers=storage_buffers, gpu_loop_iterations=loop_iterations)


#: CPU names that imply no feature beyond their architecture's baseline (or the ones listed).
_PLAIN_CPUS = frozenset({"generic", "x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4"})


def reference_target() -> Target:
    """The description of the reference engine's target (the NumPy interpreter: no ISA)."""
    return Target(engine="reference", arch="", triple="", cpu="", features="", vector_bits=128, name="reference")


def runs_here(target: Target) -> bool:
    """Whether code for `target` can run in this process: the host's architecture, a CPU name
    that implies nothing the feature string does not say (or the host's own), and every feature
    it enables one the host has (AVX2 code runs on an AVX-512 machine, not the reverse)."""
    if target.engine != "llvm" or target.name == "host":
        return True
    host = host_target()
    if target.arch != host.arch or target.triple.split("-", 1)[0] != host.triple.split("-", 1)[0]:
        return False
    if target.cpu != host.cpu and target.cpu not in _PLAIN_CPUS and target.name not in NAMED_TARGETS:
        return False
    have = {f[1:] for f in host.features.split(",") if f.startswith("+")}
    want = {f[1:] for f in target.features.split(",") if f.startswith("+")}
    return want <= have
