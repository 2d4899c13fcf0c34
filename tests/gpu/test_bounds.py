"""Generated WGSL keeps every access in range by itself.

Shader modules are created without wgpu's runtime checks (`runtime/gpu.py`,
`wgpuDeviceCreateShaderModuleTrusted`: naga no longer clamps indices), so a load past a row, a
tile or a buffer reads whatever lies there. Each input here is a view at offset 0 into a larger
storage filled with NaN around it (`poisoned`): the engine binds the whole storage, so a load
past the view's last column or row reads NaN, which reaches the output and fails the comparison
with eager. Shapes are not multiples of any tile, vec4 width or workgroup size, except where a
test says so (the unchecked loads of whole tiles)."""
from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

from torchburn.backend import report as rep
from torchburn.backend.entry import torchburn_backend
from torchburn.runtime.config import get_config, reload_config


@pytest.fixture
def trusted(gpu, monkeypatch: pytest.MonkeyPatch) -> Any:  # type: ignore[no-untyped-def]
    """The GPU engine with wgpu's runtime checks off (the default: TORCHBURN_DEBUG without bounds)."""
    monkeypatch.delenv("TORCHBURN_DEBUG", raising=False)
    reload_config()
    assert not get_config().bounds_check
    yield gpu


def poisoned(*shape: int, pad: int = 4) -> torch.Tensor:
    """A random tensor of `shape`, a view at offset 0 of a storage `pad` larger in every
    dimension, NaN outside the view."""
    big = torch.full([n + pad for n in shape], float("nan"))
    view = big[tuple(slice(0, n) for n in shape)]
    view.copy_(torch.randn(shape))
    assert view.storage_offset() == 0
    return view


def compiled(fn: Any, *args: torch.Tensor, passes: tuple[str, ...] = ()) -> tuple[torch.Tensor, list[str]]:
    """`fn(*args)` through the GPU engine, and the kernels it ran (every subgraph on the GPU)."""
    torch._dynamo.reset()
    opts = {"passes": {"before-codegen": list(passes)}} if passes else None
    records = rep.start_recording()
    try:
        with torch.no_grad():
            out = torch.compile(fn, backend=torchburn_backend, options=opts)(*args)
    finally:
        rep.stop_recording()
    subgraphs = [s for r in records for s in r.subgraphs if s.compiled]
    assert subgraphs and all(s.engine == "wgpu" for s in subgraphs), [(s.engine, s.engine_note) for s in subgraphs]
    return out, [k for s in subgraphs for k in s.kernels]


@pytest.mark.parametrize("tile", ["64x64x16/4x4", "64x32x8/4x4/s2/sw/w"])
def test_gemm_of_whole_tiles_reads_nothing_outside(trusted, tile: str) -> None:  # type: ignore[no-untyped-def]
    """Extents the tile divides are loaded and stored without checks: still nothing outside."""
    a, b = poisoned(128, 64), poisoned(128, 64)
    out, kernels = compiled(lambda x, y: x @ y.t(), a, b, passes=(f"gpu-map{{gemm_tile={tile}}}",))
    assert any(f"gemm {tile} A:k4 B:k4" in s for s in kernels), kernels
    torch.testing.assert_close(out, a @ b.t(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("k", [37, 36])  # scalar operand loads; vec4 loads along k (k4: rows of 40)
@pytest.mark.parametrize("tile", ["64x64x16/4x4/s2", "32x32x16/4x4", "32x32x16/4x4/s2/ar/g2", "64x32x8/4x4/s2/sw/w"])
def test_gemm_edges_read_nothing_outside(trusted, tile: str, k: int) -> None:  # type: ignore[no-untyped-def]
    a, b = poisoned(67, k), poisoned(45, k)
    out, kernels = compiled(lambda x, y: torch.relu(x @ y.t()), a, b, passes=(f"gpu-map{{gemm_tile={tile}}}",))
    mode = "A:k4 B:k4" if k % 4 == 0 else "A:scalar B:scalar"
    assert any(f"gemm {tile} {mode}" in s for s in kernels), kernels
    torch.testing.assert_close(out, torch.relu(a @ b.t()), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("d", [20, 18])  # vec4 rows; a head dim that is not a multiple of 4
def test_flash_attention_edges_read_nothing_outside(trusted, d: int) -> None:  # type: ignore[no-untyped-def]
    q, k, v = poisoned(1, 2, 70, d), poisoned(1, 2, 70, d), poisoned(1, 2, 70, d)
    fn = lambda x, y, z: F.scaled_dot_product_attention(x, y, z, is_causal=True)  # noqa: E731
    out, kernels = compiled(fn, q, k, v, passes=("gpu-map{attention_tile=32x32/4x4/s2}",))
    assert any("attention/flash 32x32/4x4/s2" in s for s in kernels), kernels
    torch.testing.assert_close(out, fn(q, k, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("tile", ["32x32/4x4/s2", "32x32/4x4"])
def test_flash_attention_of_whole_tiles_reads_nothing_outside(trusted, causal: bool, tile: str, tmp_path: Any,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows and keys the tile divides are loaded and stored without checks (the shader has
    none), and still nothing outside is read."""
    monkeypatch.setenv("TORCHBURN_DUMP", str(tmp_path))
    reload_config()
    q, k, v = poisoned(1, 2, 96, 16), poisoned(1, 2, 96, 16), poisoned(1, 2, 96, 16)
    fn = lambda x, y, z: F.scaled_dot_product_attention(x, y, z, is_causal=causal)  # noqa: E731
    out, kernels = compiled(fn, q, k, v, passes=(f"gpu-map{{attention_tile={tile}}}",))
    assert any(f"attention/flash {tile}" in s for s in kernels), kernels
    torch.testing.assert_close(out, fn(q, k, v), rtol=1e-5, atol=1e-5)
    sources = [p.read_text() for p in tmp_path.rglob("*.wgsl")]
    flash = [src for src in sources if "fa_Qs" in src]
    assert flash and not any("jj < fa_E" in src or "row < fa_tq" in src for src in flash)


def test_rows_and_elementwise_edges_read_nothing_outside(trusted) -> None:  # type: ignore[no-untyped-def]
    x, y = poisoned(13, 1027), poisoned(13, 1027)
    fn = lambda a, b: (torch.softmax(a, -1) * 2 + b, F.layer_norm(a + b, (1027,)))  # noqa: E731
    out, _ = compiled(fn, x, y)
    torch.testing.assert_close(out, fn(x, y), rtol=1e-5, atol=1e-5)
