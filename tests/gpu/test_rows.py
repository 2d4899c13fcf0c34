"""Row kernels on the GPU (`passes/gpu/rows.py`, `codegen/wgsl/rows.py`): softmax, LayerNorm,
RMSNorm and plain row reductions in one pass per row; what the shader holds (register cache,
vec4, tree or subgroup reductions, f16 storage behind `shader-f16`) and numerics on the device."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchburn.codegen.wgsl import Caps, emit_kernel
from torchburn.ir import loop as lp
from torchburn.passes.gpu.map import GpuMap
from tests.gpu.conftest import check_gpu
from tests.helpers import run_compiled
from tests.passes.util import kernel, run_pass

SOFTMAX = """
    kernel @k0(%x: {d}[8, {n}] strides [{n}, 1], %out0: {d}[8, {n}] strides [{n}, 1]) {{
      for i0 in 0..8 {{
        alloc %acc3: f32[1] strides [1] local
        %acc3[0] = 0.0:f32
        alloc %acc6: f32[1] strides [1] local
        %acc6[0] = -inf:f32
        for r5 in 0..{n} {{
          let x7 = cast<f32>(%x[i0, r5])
          %acc6[0] = max(%acc6[0], x7)
        }}
        let t8 = %acc6[0]
        for r2 in 0..{n} {{
          let x4 = cast<f32>(%x[i0, r2])
          let t9 = x4 - t8
          let t10 = exp(t9)
          %acc3[0] = %acc3[0] + t10
          %out0[i0, r2] = cast<{d}>(t10)
        }}
        let t11 = %acc3[0]
        let t13 = 1.0:f32 / t11
        for i1 in 0..{n} {{
          let c12 = cast<f32>(%out0[i0, i1])
          let t14 = c12 * t13
          %out0[i0, i1] = cast<{d}>(t14)
        }}
      }}
    }}
"""


def softmax_kernel(n: int = 1000, d: str = "f32") -> lp.Kernel:
    return run_pass(GpuMap(), kernel(SOFTMAX.format(n=n, d=d)))


def annotations(k: lp.Kernel, key: str) -> list[str]:
    return [s.annotation(key) or "" for s in lp.walk_stmts(k.body) if isinstance(s, lp.For)]


def test_gpu_map_gives_row_kernels_the_rows_mapping() -> None:
    k = softmax_kernel()
    assert annotations(k, "gpu") == ["rows", "lanes", "lanes", "lanes"]
    assert annotations(k, "gpu_accs") == ["", "acc6=max", "acc3=add", ""]
    assert annotations(k, "gpu_vec")[1:] == ["4"] * 3
    assert k.body.annotation("gpu_row_wg") == "256"


def test_a_loop_reading_another_elements_store_is_not_a_row_kernel() -> None:
    """Element `r` of a loop reads `%out0[i0, 999 - r]`, stored by another invocation: no rows."""
    text = SOFTMAX.format(n=1000, d="f32").replace("cast<f32>(%out0[i0, i1])", "cast<f32>(%out0[i0, 999 - i1])")
    k = run_pass(GpuMap(), kernel(text))
    assert "rows" not in annotations(k, "gpu")


@pytest.mark.parametrize("old,new", [
    ("%out0[i0, i1] = cast<f32>(t14)", "%out0[i0, i1 // 2] = cast<f32>(t14)"),  # two iterations, one element
    ("let t13 = 1.0:f32 / t11", "let t13 = cast<f32>(%out0[i0, 0]) / t11"),  # lane 0's element read by all
])
def test_stores_other_invocations_would_race_on_are_not_row_kernels(old: str, new: str) -> None:
    text = SOFTMAX.format(n=1000, d="f32")
    assert old in text
    k = run_pass(GpuMap(), kernel(text.replace(old, new)))
    assert "rows" not in annotations(k, "gpu")


def test_softmax_shader_is_one_pass_with_the_row_in_registers() -> None:
    shader = emit_kernel(softmax_kernel(4096), (), Caps())
    src = shader.source
    assert shader.summary == "rows/vec4/cached/tree"
    assert shader.grid.mode == "rows" and shader.grid.groups[0].value == 8
    # the row: 4096 = 4 steps of 256 invocations x vec4, the input and the exp in registers
    assert "var tb_c0: array<vec4<f32>, 4>;" in src and "var tb_c1: array<vec4<f32>, 4>;" in src
    # each loop unrolled into its 4 steps (constant register indices)
    assert "let tb_k = 3u;" in src and "for (var tb_k" not in src
    assert src.count("ld4_x(") == 1 + 4  # the accessor and one load of the row per step
    assert src.count("st4_out0(((") == 4  # the exp's store is dropped: the last loop overwrites it
    assert "tb_e < u32(" not in src  # 4096 fills every step: no bounds test needed
    assert "subgroup" not in src


def test_uneven_row_is_bounds_checked() -> None:
    src = emit_kernel(softmax_kernel(1003), (), Caps()).source
    assert "tb_e < u32(1003i)" in src and "vec4" not in src.split("fn main")[1]


def test_subgroup_reductions_only_where_the_adapter_has_them() -> None:
    k = softmax_kernel(4096)
    with_sg = emit_kernel(k, (), Caps(subgroups=True))
    assert with_sg.summary.endswith("/subgroup")
    assert "subgroupMax(l_acc6)" in with_sg.source and "subgroupAdd(l_acc3)" in with_sg.source
    assert "@builtin(subgroup_size) tb_sg_n: u32" in with_sg.source
    without = emit_kernel(k, (), Caps(subgroups=False)).source
    assert "subgroup" not in without and "tb_red0_f32[lid + 128u]" in without


LAYER_NORM = """
    kernel @k0(%x: f32[4, 256] strides [256, 1], %out: f32[4, 256] strides [256, 1]) {
      for i0 in 0..4 {
        alloc %acc1: f32[1] strides [1] local
        %acc1[0] = 0.0:f32
        for r2 in 0..256 {
          %acc1[0] = %acc1[0] + %x[i0, r2]
        }
        let t3 = %acc1[0]
        alloc %acc4: f32[1] strides [1] local
        %acc4[0] = 0.0:f32
        for r5 in 0..256 {
          let x6 = %x[i0, r5]
          %acc4[0] = %acc4[0] + x6 * x6
        }
        let t7 = %acc4[0] - t3 * t3 / 256.0:f32
        alloc %acc8: f32[1] strides [1] local
        %acc8[0] = t7
        for r9 in 0..256 {
          %acc8[0] = max(%acc8[0], %x[i0, r9] - t3)
        }
        for i10 in 0..256 {
          %out[i0, i10] = (%x[i0, i10] - t3) * rsqrt(t7 + 1e-05:f32) + %acc8[0]
        }
      }
    }
"""


def test_independent_reductions_share_one_tree() -> None:
    """The sum and the sum of squares do not read each other: one tree for both; the max
    starts from `t7` (both results): its tree, and its init, come after."""
    src = emit_kernel(run_pass(GpuMap(), kernel(LAYER_NORM)), (), Caps()).source
    body = src.split("fn main")[1]
    assert body.count("if (tb_lane < 32u)") == 2  # two trees (64 lanes of vec4), not three
    assert "tb_red0_f32[lid] = (tb_red0_f32[lid] + tb_red0_f32[lid + 32u]); tb_red1_f32" in body
    assert body.index("l_acc8 = v_t7;") < body.index("tb_va_acc8")  # the init precedes its loop


def test_short_rows_share_a_workgroup() -> None:
    """Rows of 32 invocations, two a workgroup: combined by a tree in workgroup memory, or by
    shuffles inside each row's invocations where the adapter has subgroups (whatever their
    size: blocks of min(32, subgroup size) lanes, then workgroup memory between blocks)."""
    k = softmax_kernel(40)
    assert k.body.annotation("gpu_row_wg") == "32" and k.body.annotation("gpu_wg") == "64"
    tree = emit_kernel(k, (), Caps(subgroups=False))
    assert tree.summary.endswith("/tree") and "tb_live" in tree.source and "subgroup" not in tree.source
    assert tree.grid.groups[0].value == 4  # 8 rows, 2 per workgroup
    shuffled = emit_kernel(k, (), Caps(subgroups=True))
    assert shuffled.summary.endswith("/subgroup") and "tb_live" in shuffled.source
    assert "subgroupShuffleXor" in shuffled.source and "subgroupAdd" not in shuffled.source
    assert "let tb_b0 = min(32u, tb_sg_n);" in shuffled.source


def test_f16_rows_store_f16_and_accumulate_in_f32() -> None:
    k = softmax_kernel(1024, "f16")
    native = emit_kernel(k, (), Caps(f16=True)).source
    assert "enable f16;" in native and "array<vec4<f16>>" in native
    assert "var l_acc3: f32;" in native and "var tb_c0: array<vec4<f16>, 1>;" in native
    fallback = emit_kernel(k, (), Caps(f16=False)).source
    assert "enable f16" not in fallback and "<f16>" not in fallback and ": f16" not in fallback
    assert "array<vec4<f32>>" in fallback and "pack2x16float" in fallback  # f32 storage, f16 rounding


# ---- on the device ---------------------------------------------------------------------------------

def row_kernels(reports: list) -> list[str]:  # type: ignore[type-arg]
    kernels = [k for r in reports for sg in r.subgraphs for k in sg.kernels]
    assert len(kernels) == 1, kernels  # one pass over the rows
    return kernels


SHAPES = [(3, 1000), (5, 37), (70, 16), (2, 2050), (4, 64)]


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize("shape", SHAPES)
def test_softmax_on_the_device(gpu, shape: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(shape) * 4
    (k,) = row_kernels(check_gpu(lambda t: torch.softmax(t, -1), x))
    assert ("rows/vec4" if shape[-1] % 4 == 0 else "rows/cached") in k


@pytest.mark.parametrize("shape", SHAPES[:3])
def test_layer_norm_and_rms_norm_on_the_device(gpu, shape: tuple[int, int]) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(shape) + 3
    w, b = torch.randn(shape[-1]), torch.randn(shape[-1])
    assert "rows" in row_kernels(check_gpu(lambda t: F.layer_norm(t, (shape[-1],), w, b), x, rtol=1e-4, atol=1e-4))[0]
    assert "rows" in row_kernels(check_gpu(lambda t: rms_norm(t, w), x, rtol=1e-4, atol=1e-5))[0]


def test_residual_and_layer_norm_after_a_linear_is_a_row_kernel(gpu) -> None:  # type: ignore[no-untyped-def]
    """The GPT block's `x + proj(y)` then LayerNorm: row fusion hoists a load of the bias before
    the row loops (a prelude `gpu-map` keeps); no kernel may fall to one invocation."""
    x, y = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    lin, g, b = torch.nn.Linear(64, 64), torch.randn(64), torch.randn(64)
    with torch.no_grad():
        reports = check_gpu(lambda u, v: F.layer_norm(u + lin(v), (64,), g, b), x, y, rtol=1e-4, atol=1e-4)
    kernels = [k for r in reports for sg in r.subgraphs for k in sg.kernels]
    assert any(k.split(": ")[1].startswith("rows") for k in kernels), kernels
    assert not any(": single" in k for k in kernels), kernels


def test_row_reductions_and_dynamic_rows_on_the_device(gpu) -> None:  # type: ignore[no-untyped-def]
    x = torch.randn(6, 300)
    check_gpu(lambda t: (t.amax(-1), t.sum(-1, keepdim=True)), x, rtol=1e-5, atol=1e-4)
    (k,) = row_kernels(check_gpu(lambda t: torch.log_softmax(t, -1), torch.randn(9, 130), dynamic=True))
    assert "rows" in k


def test_subgroups_only_when_the_adapter_and_the_shader_front_end_take_them(gpu) -> None:  # type: ignore[no-untyped-def]
    from torchburn.runtime.gpu import _subgroups_compile, get_device

    dev = get_device()
    if "subgroup" not in dev.adapter.features:  # llvmpipe: the probe shader is rejected, no crash
        assert not _subgroups_compile(dev.device) and not dev.caps.subgroups
    else:
        assert dev.caps.subgroups == _subgroups_compile(dev.device)


def test_subgroup_and_f16_rows_where_the_adapter_has_them(gpu) -> None:  # type: ignore[no-untyped-def]
    """Runs the paths llvmpipe through OpenGL lacks where the adapter has them (the H200; Mesa's
    lavapipe through Vulkan, `TORCHBURN_WGPU_BACKEND=vulkan`, has both)."""
    from torchburn.runtime.gpu import get_device

    caps = get_device().caps
    if not (caps.subgroups or caps.f16):
        pytest.skip("the adapter has neither subgroups nor shader-f16")
    x = torch.randn(6, 1000)
    if caps.subgroups:
        (k,) = row_kernels(check_gpu(lambda t: torch.softmax(t, -1), x))
        assert "/subgroup" in k
    if caps.f16:
        h = x.half()
        with torch.no_grad():
            out, reports = run_compiled(lambda t: torch.softmax(t, -1), h)
        torch.testing.assert_close(out, torch.softmax(x, -1).half(), rtol=2e-3, atol=1e-4)
        assert out.dtype == torch.float16 and "rows" in row_kernels(reports)[0]


@pytest.mark.parametrize("vocab", [5000, 49152])
def test_greedy_argmax_in_chunks_on_the_device(gpu, vocab: int) -> None:  # type: ignore[no-untyped-def]
    """The GPU greedy step's argmax (`first_argmax_in_chunks`: maxima of 128 chunks, the least
    index holding the maximum) on the device: a row padded with -inf (5000 is not a multiple
    of 128) and a tie across chunks, where the first index wins."""
    from torchburn.llm.runtime.sampling import first_argmax_in_chunks

    torch.manual_seed(vocab)
    logits = torch.randn(2, vocab)
    logits[0, 17] = logits[0, vocab - 3] = 9.0
    logits[1, vocab - 1] = 9.0
    reports = check_gpu(first_argmax_in_chunks, logits)
    assert first_argmax_in_chunks(logits)[:, 0].tolist() == [17, vocab - 1]
    # spread over the device: per-chunk reductions of 2 x 128 rows, not one row per workgroup
    kernels = [k for r in reports for s in r.subgraphs for k in s.kernels]
    assert len(kernels) >= 3, kernels
