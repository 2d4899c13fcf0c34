"""Target descriptions: vector width from features, lanes per dtype, the host probe, named
targets (`TORCHBURN_TARGET`) and whether their code can run here."""
from __future__ import annotations

import pytest

from torchburn.codegen.target import NAMED_TARGETS, Target, TargetError, host_target, named_target, runs_here
from torchburn.ir import dtypes as dt
from torchburn.ir.target import GENERIC, arch_of, vector_bits_for


def test_vector_bits_from_features() -> None:
    assert vector_bits_for("+sse2,+avx,+avx2,+avx512f") == 512
    assert vector_bits_for("+sse2,+avx,+avx2,-avx512f") == 256
    assert vector_bits_for("+sse2,-avx") == 128
    assert vector_bits_for("+neon") == 128


def test_lanes_and_dot4() -> None:
    t = Target.from_features("x86_64-unknown-linux-gnu", "skylake-avx512", "+avx2,+avx512f")
    assert t.lanes(dt.f32) == 16 and t.lanes(dt.f64) == 8 and t.lanes(dt.bf16) == 32
    assert t.arch == "x86_64" and not t.native_dot4(16)
    t2 = Target.from_features("aarch64-unknown-linux-gnu", "neoverse-n1", "+neon")
    assert t2.lanes(dt.f32) == 4 and t2.arch == "aarch64" and not t2.native_dot4(4)
    vnni = Target.from_features("x86_64-unknown-linux-gnu", "znver4", "+avx512f,+avx512vnni")
    assert vnni.native_dot4(16) and not vnni.native_dot4(8)  # the 256-bit form needs AVX512VL
    assert arch_of("arm64-apple-darwin") == "aarch64" and GENERIC.lanes(dt.f32) == 8


def test_host_is_cached_and_consistent() -> None:
    h = host_target()
    assert h is host_target() and h.name == "host" and h.engine == "llvm"
    assert h.cpu and h.triple and h.threads >= 1 and h.l2_bytes > 0
    assert h.vector_bits == vector_bits_for(h.features)
    assert runs_here(h) and named_target("host") == h  # equal: another test may have cleared the cache between


def test_named_targets() -> None:
    assert named_target("avx2").vector_bits == 256 and named_target("x86-64-v3").cpu == "x86-64-v3"
    assert named_target("avx512").vector_bits == 512 and named_target("AVX512").cpu == "skylake-avx512"
    neon = named_target("neon")
    assert (neon.arch, neon.vector_bits, neon.lanes(dt.f32)) == ("aarch64", 128, 4)
    assert not runs_here(neon)
    assert named_target("znver4").native_dot4(16)
    custom = named_target("aarch64-unknown-linux-gnu:generic:+neon")
    assert custom.arch == "aarch64" and custom.cpu == "generic"
    assert set(NAMED_TARGETS) >= {"avx2", "avx512", "neon"}


def test_avx512_runs_only_on_an_avx512_host() -> None:
    host = host_target()
    assert runs_here(named_target("avx512")) == host.has_feature("avx512f") and host.arch == "x86_64" \
        or host.arch != "x86_64"
    assert runs_here(named_target("avx2")) == (host.arch == "x86_64" and host.has_feature("avx2") and host.has_feature("fma"))


def test_unknown_names_say_what_is_known() -> None:
    with pytest.raises(TargetError, match="avx512.*neon"):
        named_target("pentium")
    with pytest.raises(TargetError, match="not supported"):
        named_target("riscv64-unknown-linux-gnu:generic:+v")
