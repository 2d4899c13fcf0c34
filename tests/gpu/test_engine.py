"""The wgpu engine end to end: graphs compiled with TORCHBURN_DEVICE=gpu match eager PyTorch
(elementwise, reductions, GEMM, softmax, layer norm, attention, the README MLP, a GPT block),
what the GPU cannot run falls back to the CPU engine with a reason, and parameters stay
resident on the device."""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import torchburn
from torchburn.backend import report as rep
from torchburn.backend.entry import torchburn_backend
from torchburn.backend.explainer import explain
from tests.gpu.conftest import check_gpu, engines
from tests.helpers import run_compiled


def test_info_and_engine(gpu) -> None:  # type: ignore[no-untyped-def]
    info = torchburn.gpu_info()
    assert info is not None and info["name"] and info["backend"] and info["device_type"]
    assert torchburn.gpu_available()
    assert torchburn.active_engine() == "wgpu"


def test_cpu_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchburn.runtime.config import reload_config

    monkeypatch.delenv("TORCHBURN_DEVICE", raising=False)
    monkeypatch.delenv("TORCHBURN_ENGINE", raising=False)
    reload_config()
    try:
        assert torchburn.active_engine() == "llvm"
    finally:
        monkeypatch.undo()
        reload_config()


# ---- elementwise ----------------------------------------------------------------------------------

ELEMENTWISE = {
    "affine": (lambda a, b: a * 1.5 + b, [torch.randn(64, 256), torch.randn(64, 256)]),
    "odd_sizes": (lambda a, b: (a - b) / (b.abs() + 1), [torch.randn(7, 13), torch.randn(7, 13)]),
    "broadcast_bias": (lambda a, b: torch.relu(a + b), [torch.randn(33, 64), torch.randn(64)]),
    "transposed_input": (lambda a: a.t() * 2 + 1, [torch.randn(24, 40)]),
    "math": (lambda a: torch.exp(a) + torch.log(a.abs() + 1) + torch.tanh(a) + torch.sigmoid(a) + torch.sqrt(a.abs()),
             [torch.randn(16, 64) * 3]),
    "gelu_erf": (lambda a: F.gelu(a), [torch.randn(32, 48) * 4]),
    "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), [torch.randn(32, 48) * 4]),
    "silu_clamp": (lambda a: F.silu(a).clamp(-0.5, 2.0), [torch.randn(32, 48) * 4]),
    "where_compare": (lambda a: torch.where((a > 0) & (a < 1), a, -a * 0.1), [torch.randn(10, 12)]),
    "bool_out": (lambda a, b: (a > b) | (a < -1), [torch.randn(10, 16), torch.randn(10, 16)]),
    "pow_abs_neg": (lambda a: torch.pow(a.abs() + 0.5, 1.7) - (-a).abs(), [torch.randn(8, 20)]),
    "int32": (lambda a, b: (a * 3 - b) // 4 + a % 5, [torch.randint(-50, 50, (8, 12), dtype=torch.int32),
                                                     torch.randint(-50, 50, (8, 12), dtype=torch.int32)]),
    "f16": (lambda a, b: a * 2 + b, [torch.randn(8, 64).half(), torch.randn(8, 64).half()]),
    "bf16": (lambda a: (a * 3).sigmoid(), [torch.randn(8, 64).bfloat16()]),
    "cast_to_f16": (lambda a: (a * 1.1).half(), [torch.randn(8, 9)]),
}


@pytest.mark.parametrize("name", sorted(ELEMENTWISE))
def test_elementwise(gpu, name: str) -> None:  # type: ignore[no-untyped-def]
    fn, args = ELEMENTWISE[name]
    # WGSL's exp is accurate to a few f32 ulps, not correctly rounded: a bf16 result near a
    # rounding boundary may land one bf16 ulp (2^-8 relative) from eager's
    rtol = 2 ** -8 if name == "bf16" else 1e-5
    check_gpu(fn, *args, rtol=rtol, atol=2e-6)


# ---- reductions ---------------------------------------------------------------------------------

REDUCTIONS = {
    "sum_last_long": (lambda x: x.sum(-1), [torch.randn(37, 300)]),
    "sum_last_short": (lambda x: x.sum(-1), [torch.randn(37, 5)]),
    "mean_keepdim": (lambda x: x.mean(1, keepdim=True), [torch.randn(9, 128)]),
    "amax_dim0": (lambda x: x.amax(0), [torch.randn(300, 7)]),
    "amin_two_dims": (lambda x: x.amin((0, 2)), [torch.randn(6, 5, 40)]),
    "sum_all": (lambda x: x.sum(), [torch.randn(1000)]),
    "prod": (lambda x: x.prod(-1), [torch.rand(4, 80) + 0.5]),
    "any_all": (lambda x: ((x > 2).any(-1), (x > -3).all(-1)), [torch.randn(6, 200)]),
    "int_sum": (lambda x: x.sum(-1, dtype=torch.int32), [torch.randint(-9, 9, (5, 100), dtype=torch.int32)]),
}


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_reduction(gpu, name: str) -> None:  # type: ignore[no-untyped-def]
    fn, args = REDUCTIONS[name]
    check_gpu(fn, *args, rtol=1e-5, atol=1e-4)


def test_softmax_and_log_softmax(gpu) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(16, 1000) * 3
    check_gpu(lambda t: (torch.softmax(t, -1), torch.log_softmax(t, -1)), x, rtol=1e-5, atol=1e-6)


def test_layer_norm(gpu) -> None:  # type: ignore[no-untyped-def]
    x, w, b = torch.randn(16, 256), torch.randn(256), torch.randn(256)
    check_gpu(lambda t: F.layer_norm(t, (256,), w, b), x, rtol=1e-5, atol=1e-5)


# ---- matrix products -----------------------------------------------------------------------------

@pytest.mark.parametrize("m,n,k", [(64, 96, 128), (70, 90, 50), (1, 33, 7), (130, 129, 257)])
def test_mm(gpu, m: int, n: int, k: int) -> None:  # type: ignore[no-untyped-def]
    a, b = torch.randn(m, k), torch.randn(k, n)
    reports = check_gpu(lambda x, y: x @ y, a, b, rtol=1e-4, atol=1e-4)
    kernels = [k for r in reports for s in r.subgraphs for k in s.kernels]
    # one output row is a matrix-vector product: a reduction per output, not a GEMM tile
    assert any("gemm" in k for k in kernels) == (m > 1), kernels


def test_mm_transposed_operands(gpu) -> None:  # type: ignore[no-untyped-def]
    a, b = torch.randn(96, 64), torch.randn(80, 96)
    check_gpu(lambda x, y: x.t() @ y.t(), a, b, rtol=1e-4, atol=1e-4)


def test_bmm_and_linear(gpu) -> None:  # type: ignore[no-untyped-def]
    a, b = torch.randn(3, 33, 20), torch.randn(3, 20, 17)
    check_gpu(torch.bmm, a, b, rtol=1e-4, atol=1e-4)
    lin = nn.Linear(64, 48)
    check_gpu(lin, torch.randn(10, 64), rtol=1e-4, atol=1e-4)


def test_linear_epilogues_through_a_reshape_of_the_rows(gpu) -> None:  # type: ignore[no-untyped-def]
    """A linear layer on `[batch, seq, features]` is a product of `batch * seq` rows reshaped
    back: its bias, GELU and residual add stay in the product's kernel (stored at the reshaped
    index), also in the sum of a split reduction, a batched product regrouped into rows, and a
    decode-shaped product (a reduction per output)."""
    torch.manual_seed(0)
    fc, down, sq = nn.Linear(32, 48), nn.Linear(1024, 24), nn.Linear(32, 32)

    def kernels(reports: list) -> list[str]:  # type: ignore[type-arg]
        return [k.split(";")[0] for r in reports for s in r.subgraphs for k in s.kernels]

    x, r = torch.randn(2, 12, 32), torch.randn(2, 12, 24)
    ks = kernels(check_gpu(lambda a: F.gelu(fc(a)), x, rtol=1e-4, atol=1e-4))
    assert len(ks) == 1 and "gemm" in ks[0], ks
    ks = kernels(check_gpu(lambda a, b: b + down(a), torch.randn(2, 12, 1024), r, rtol=1e-4, atol=1e-4))
    assert len(ks) == 2 and "_part: gemm" in ks[0] and "_sum: threads" in ks[1], ks  # split-K
    bias = torch.randn(12)
    ks = kernels(check_gpu(lambda a, b: torch.relu(torch.bmm(a, b).reshape(24, 12) + bias),
                           torch.randn(3, 8, 16), torch.randn(3, 16, 12), rtol=1e-4, atol=1e-4))
    assert len(ks) == 1 and "gemm" in ks[0], ks
    ks = kernels(check_gpu(lambda a: a + F.gelu(sq(a)), torch.randn(1, 1, 32), rtol=1e-4, atol=1e-4))
    assert len(ks) == 1 and "single" not in ks[0], ks


@pytest.mark.parametrize("tile", ["128x128x16/8x8", "128x128x8/8x16/s2", "128x64x16/8x4", "64x64x16/4x4/s2",
                                  "128x128x8/8x8/ar/g4", "64x64x16/4x4/s2/ar", "128x128x16/8x8/sw/w",
                                  "128x128x8/8x8/s2/sw", "64x64x32/4x4/ar/sw/w"])
def test_gemm_tiles(gpu, tile: str) -> None:  # type: ignore[no-untyped-def]
    """Every tile the benchmark uses is right, also on edges (sizes not multiples of the tile)."""
    a, b = torch.randn(200, 132), torch.randn(132, 260)
    opts = {"passes": {"before-codegen": [f"gpu-map{{gemm_tile={tile}}}"]}}
    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        out = torch.compile(lambda x, y: x @ y, backend=torchburn_backend, options=opts)(a, b)
    finally:
        rep.stop_recording()
    torch.testing.assert_close(out, a @ b, rtol=1e-4, atol=1e-4)
    kernels = [k for r in records for s in r.subgraphs for k in s.kernels]
    assert any(f"gemm {tile}" in k for k in kernels), kernels


@pytest.mark.parametrize("k,m,mode", [(44, 300, "r4"), (45, 301, "scalar")])
def test_gemm_a_rows_from_every_load_form(gpu, k: int, m: int, mode: str) -> None:  # type: ignore[no-untyped-def]
    """`/ar` (A kept as rows of k in workgroup memory) from A loaded as vec4s along m (a
    transposed operand) and as scalars; `/g3` groups 3 tile rows of 5 (the last group short)."""
    a, b = torch.randn(k, m), torch.randn(k, 70)
    tile = "64x64x16/4x4/ar/g3"
    opts = {"passes": {"before-codegen": [f"gpu-map{{gemm_tile={tile}}}"]}}
    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        out = torch.compile(lambda x, y: x.t() @ y, backend=torchburn_backend, options=opts)(a, b)
    finally:
        rep.stop_recording()
    torch.testing.assert_close(out, a.t() @ b, rtol=1e-4, atol=1e-4)
    kernels = [x for r in records for s in r.subgraphs for x in s.kernels]
    assert any(f"gemm {tile} A:{mode}" in x for x in kernels), kernels


@pytest.mark.parametrize("case", ["k4,r4", "r4,k4", "scalar,scalar"])
@pytest.mark.parametrize("tile", ["64x64x16/4x4/sw/w", "64x32x8/4x4/s2/sw", "32x64x64/4x8/sw"])
def test_gemm_swizzled_tiles_from_every_load_form(gpu, case: str, tile: str) -> None:  # type: ignore[no-untyped-def]
    """`/sw` (k-major tiles XOR-swizzled) and `/w` (8 x 4 invocation blocks) with each operand
    loaded as vec4s along k, along its rows, or as scalars, at sizes that are not multiples of
    the tile (the swizzle's span is 2, 4 and 8 slots for BK 8, 16 and 64)."""
    a_mode, b_mode = case.split(",")
    m, n, k = (200, 132, 260) if a_mode != "scalar" else (201, 133, 259)
    a = torch.randn(m, k) if a_mode != "r4" else torch.randn(k, m)
    b = torch.randn(k, n) if b_mode != "k4" else torch.randn(n, k)

    def fn(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return (x.t() if a_mode == "r4" else x) @ (y.t() if b_mode == "k4" else y)

    opts = {"passes": {"before-codegen": [f"gpu-map{{gemm_tile={tile}}}"]}}
    torch._dynamo.reset()
    records = rep.start_recording()
    try:
        out = torch.compile(fn, backend=torchburn_backend, options=opts)(a, b)
    finally:
        rep.stop_recording()
    torch.testing.assert_close(out, fn(a, b), rtol=1e-4, atol=1e-4)
    kernels = [x for r in records for s in r.subgraphs for x in s.kernels]
    assert any(f"gemm {tile} A:{a_mode} B:{b_mode}" in x for x in kernels), kernels


def test_attention(gpu) -> None:  # type: ignore[no-untyped-def]
    q, k, v = (torch.randn(2, 4, 16, 8) for _ in range(3))
    check_gpu(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, is_causal=True), q, k, v,
              rtol=1e-5, atol=1e-5)


def test_readme_mlp(gpu) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 256))
    check_gpu(model, torch.randn(32, 512), rtol=1e-4, atol=1e-4)


class Block(nn.Module):
    def __init__(self, d: int = 64, h: int = 4) -> None:
        super().__init__()
        self.h = h
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.fc, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.h, C // self.h).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.fc2(F.gelu(self.fc(self.ln2(x))))


def test_gpt_block(gpu) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    check_gpu(Block(), torch.randn(2, 16, 64), rtol=1e-4, atol=1e-4)


def test_dynamic_shapes(gpu) -> None:  # type: ignore[no-untyped-def]
    fn = lambda x: torch.softmax(x, -1) * 2  # noqa: E731
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=torchburn_backend, dynamic=True)
    for rows in (5, 9):
        x = torch.randn(rows, 100)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-5, atol=1e-6)


# ---- fallback and residency -------------------------------------------------------------------------

def test_f64_falls_back_to_cpu_engine(gpu) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(10, dtype=torch.float64)
    out, reports = run_compiled(lambda t: t * 2 + 1, x)
    torch.testing.assert_close(out, x * 2 + 1)
    (engine, note), = engines(reports)
    assert engine == "cpu" and note is not None and "f64" in note
    text = str(explain(lambda t: t * 2 + 1, x))
    assert "on cpu" in text and "note:" in text and "f64" in text


def test_i64_is_stored_as_i32_and_values_past_32_bits_run_in_pytorch(gpu) -> None:  # type: ignore[no-untyped-def]
    x = torch.arange(12)
    out, reports = run_compiled(lambda t: t * 3 + 1, x)
    torch.testing.assert_close(out, x * 3 + 1)
    (engine, note), = engines(reports)
    assert engine == "wgpu" and note is None
    from torchburn.backend import gpu_launcher

    big = torch.full((12,), 1 << 40)
    torch._dynamo.reset()
    fn = torch.compile(lambda t: t * 3 + 1, backend=torchburn_backend)
    fn(x)
    launcher = gpu_launcher.recent_launchers()[-1]
    torch.testing.assert_close(fn(big), big * 3 + 1)  # the upload refuses it: PyTorch runs it
    assert launcher.eager_fallbacks == 1


def test_parameters_stay_resident(gpu) -> None:  # type: ignore[no-untyped-def]
    from torchburn.backend import gpu_launcher

    torch.manual_seed(0)
    model = nn.Linear(32, 16)
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=torchburn_backend)
    x = torch.randn(4, 32)
    with torch.no_grad():
        before = set(map(id, gpu_launcher.recent_launchers()))
        compiled(x)
        (launcher,) = [L for L in gpu_launcher.recent_launchers() if id(L) not in before]
        tr = launcher.transfers  # resident copies (backend/gpu_resident.py), bytes counted
        assert tr.last_up == (16 * 32 + 16 + 4 * 32) * 4  # weight, bias, x
        compiled(torch.randn(4, 32))
        assert tr.last_up == 4 * 32 * 4  # only the new input
        model.weight.mul_(2)  # an in-place change bumps the version: uploaded again
        y = compiled(x)
        assert tr.last_up == 16 * 32 * 4  # the weight; x is the first call's tensor, still resident
        torch.testing.assert_close(y, model(x), rtol=1e-5, atol=1e-5)


def test_an_output_that_reshapes_a_product_is_its_buffer_viewed(gpu) -> None:  # type: ignore[no-untyped-def]
    """`Program.result_views` on the GPU engine: the product's buffer comes back viewed in
    the output's shape (no copy kernel), at static and symbolic sizes."""
    a, b = torch.randn(16, 40), torch.randn(40, 36)
    reports = check_gpu(lambda x, y: (x @ y).reshape(16, 4, 3, 3), a, b, rtol=1e-4, atol=1e-4)
    assert sum(len(s.kernels) for r in reports for s in r.subgraphs if s.compiled) == 1
    w = torch.randn(7, 6)
    for n in (4, 9):
        check_gpu(lambda x: (x @ w).reshape(x.shape[0], 5, 3, 2), torch.randn(n, 5, 7), rtol=1e-4, atol=1e-4,
                  dynamic=True)


def test_benchmark_times_the_programs_runs(gpu: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """`GpuLauncher.benchmark` (the GPU sweep's and the tuner's clock): a positive time per run
    from the device clock where the adapter has timestamps, else from the host; and the runs
    it times leave the result as a run does."""
    from torchburn.backend import gpu_launcher

    monkeypatch.setattr(gpu_launcher.GpuLauncher, "record_args", True)
    before = set(map(id, gpu_launcher.recent_launchers()))
    x, w = torch.randn(1, 64), torch.randn(96, 64)
    check_gpu(lambda a, b: torch.relu(a @ b.t()), x, w)
    launchers = [z for z in gpu_launcher.recent_launchers() if id(z) not in before]
    assert launchers
    for z in launchers:
        t = z.benchmark(*z.last_args, iters=3)
        assert 0 < t < 10, t
