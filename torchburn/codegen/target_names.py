"""The CPUs `TORCHBURN_TARGET` can name, as LLVM spells them: name -> (triple, cpu, features).

Plain strings, so the runtime configuration checks a name without loading the IR or LLVM;
`target.py` builds the `Target` descriptions from them.
"""
from __future__ import annotations

X86 = "x86_64-unknown-linux-gnu"
AARCH64 = "aarch64-unknown-linux-gnu"
_V3 = "+sse,+sse2,+sse3,+ssse3,+sse4.1,+sse4.2,+popcnt,+cx16,+avx,+avx2,+fma,+f16c,+bmi,+bmi2,+lzcnt,+movbe,+xsave"
_V4 = _V3 + ",+avx512f,+avx512bw,+avx512cd,+avx512dq,+avx512vl"

NAMED_TARGETS: dict[str, tuple[str, str, str]] = {
    "avx2": (X86, "x86-64-v3", _V3),
    "x86-64-v3": (X86, "x86-64-v3", _V3),
    "avx512": (X86, "skylake-avx512", _V4),
    "x86-64-v4": (X86, "skylake-avx512", _V4),
    "skylake-avx512": (X86, "skylake-avx512", _V4),
    "znver4": (X86, "znver4", _V4 + ",+avx512vnni,+avx512bf16,+avx512vbmi,+avx512ifma"),
    "neon": (AARCH64, "neoverse-n1", "+neon,+fp-armv8"),
    "aarch64": (AARCH64, "neoverse-n1", "+neon,+fp-armv8"),
}
#: Names of this machine.
HOST_NAMES = ("host", "native")


def check_target_name(spec: str) -> str:
    """`spec` normalized (names lower-cased), or ValueError saying what is accepted: `host`, a
    name of `NAMED_TARGETS`, or `triple:cpu:features`."""
    spec = spec.strip()
    if not spec or spec.lower() in HOST_NAMES:
        return "host"
    if spec.lower() in NAMED_TARGETS:
        return spec.lower()
    parts = spec.split(":")
    if len(parts) == 3 and "-" in parts[0] and parts[1] and not any(c.isspace() for c in spec):
        return spec
    raise ValueError(f"expected host, one of {', '.join(NAMED_TARGETS)}, or triple:cpu:features "
                     "(for example aarch64-unknown-linux-gnu:generic:+neon)")
