"""Target description: host CPU, vector width from features, lanes per dtype."""
from __future__ import annotations

from torchburn.codegen import Target
from torchburn.codegen.target import vector_bits_for
from torchburn.ir import dtypes as dt


def test_vector_bits_from_features() -> None:
    assert vector_bits_for("+sse2,+avx,+avx2,+avx512f") == 512
    assert vector_bits_for("+sse2,+avx,+avx2,-avx512f") == 256
    assert vector_bits_for("+sse2,-avx") == 128
    assert vector_bits_for("+neon") == 128


def test_lanes() -> None:
    t = Target.from_features("x86_64-unknown-linux-gnu", "skylake-avx512", "+avx2,+avx512f")
    assert t.lanes(dt.f32) == 16 and t.lanes(dt.f64) == 8 and t.lanes(dt.bf16) == 32
    t2 = Target.from_features("aarch64-unknown-linux-gnu", "neoverse-n1", "+neon")
    assert t2.lanes(dt.f32) == 4


def test_host_is_cached_and_consistent() -> None:
    h = Target.host()
    assert h is Target.host()
    assert h.cpu and h.triple
    assert h.vector_bits == vector_bits_for(h.features)
