"""Convolution kernels (`passes/loopgen/conv.py`) and their fused epilogues.

Tensor IR compiled directly (no Dynamo), results against torch in f64: a table of shapes
with edge sizes, strides, padding, dilation, groups (depthwise included), 1-d to 3-d, both
kernel forms, AVX2- and AVX-512-sized plans, one and two threads; random configurations
with hypothesis; the epilogue seen in the IR; and no access outside any buffer, checked
with guard pages around every operand.
"""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from typing import Optional, Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.passes.test_matmul import Compiled
from torchburn.ir.target import Target


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchburn.compiler import driver

    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    driver.memory_cache().clear()


def _dims(xs: Sequence[int]) -> str:
    return ", ".join(str(x) for x in xs)


def out_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


class ConvCase:
    """`out = epilogue(conv(x, w[, b]))` as tensor IR; epilogue "" or "res_tanh"
    (`tanh(conv + r)` with a residual input r)."""

    def __init__(self, n: int, c: int, co: int, size: Sequence[int], k: Sequence[int], stride: Sequence[int],
                 padding: Sequence[int], dilation: Sequence[int], groups: int, bias: bool = True,
                 epilogue: str = "") -> None:
        self.n, self.c, self.co, self.groups = n, c, co, groups
        self.size, self.k = tuple(size), tuple(k)
        self.stride, self.padding, self.dilation = tuple(stride), tuple(padding), tuple(dilation)
        self.bias, self.epilogue = bias, epilogue
        self.out = tuple(out_size(*a) for a in zip(self.size, self.k, self.stride, self.padding, self.dilation))

    def text(self) -> str:
        xs = (self.n, self.c, *self.size)
        ws = (self.co, self.c // self.groups, *self.k)
        os_ = (self.n, self.co, *self.out)
        operands = "%x, %w, %b" if self.bias else "%x, %w"
        lines = [f"graph @g(%x: f32[{_dims(xs)}], %w: f32[{_dims(ws)}], %b: f32[{self.co}], %r: f32[{_dims(os_)}]) {{",
                 f"  %0 = conv({operands}) {{stride = [{_dims(self.stride)}], padding = [{_dims(self.padding)}], "
                 f"dilation = [{_dims(self.dilation)}], groups = {self.groups}}} : f32[{_dims(os_)}]"]
        last = "%0"
        if self.epilogue == "res_tanh":
            lines += [f"  %1 = add(%0, %r) : f32[{_dims(os_)}]", f"  %2 = tanh(%1) : f32[{_dims(os_)}]"]
            last = "%2"
        lines += [f"  return {last}", "}"]
        return "\n".join(lines)

    def arrays(self, seed: int = 0) -> dict[str, np.ndarray]:
        rng = np.random.default_rng(seed)
        return {"x": rng.standard_normal((self.n, self.c, *self.size)).astype(np.float32),
                "w": rng.standard_normal((self.co, self.c // self.groups, *self.k)).astype(np.float32),
                "b": rng.standard_normal(self.co).astype(np.float32),
                "r": rng.standard_normal((self.n, self.co, *self.out)).astype(np.float32)}

    def expected(self, a: dict[str, np.ndarray]) -> np.ndarray:
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[len(self.size)]
        x, w, b = (torch.from_numpy(a[k]).double() for k in ("x", "w", "b"))
        y = conv(x, w, b if self.bias else None, self.stride, self.padding, self.dilation, self.groups)
        if self.epilogue == "res_tanh":
            y = torch.tanh(y + torch.from_numpy(a["r"]).double())
        return y.numpy()

    def run(self, machine: Optional[Target] = None, seed: int = 0) -> Compiled:
        compiled = Compiled(self.text(), machine=machine)
        a = self.arrays(seed)
        out = np.full((self.n, self.co, *self.out), np.nan, np.float32)
        compiled({**a, "out0": out})
        taps = self.c // self.groups * int(np.prod(self.k))
        np.testing.assert_allclose(out, self.expected(a), rtol=1e-4, atol=1e-4 * max(1.0, np.sqrt(taps)))
        return compiled


def conv_plans(c: Compiled) -> list[str]:
    return [dict(k.attrs)["conv"] for k in c.program.kernels if "conv" in dict(k.attrs)]


AVX2 = Target(vector_bits=256, l1_bytes=32 * 1024, l2_bytes=512 * 1024, threads=1, name="avx2-1t")
AVX512_2T = Target(vector_bits=512, l1_bytes=32 * 1024, l2_bytes=1 << 20, threads=2, name="avx512-2t")

#: (n, c, co, size, k, stride, padding, dilation, groups, bias, form on AVX2)
TABLE = [
    (2, 16, 32, (9, 9), (3, 3), (1, 1), (1, 1), (1, 1), 1, True, "channels"),
    (1, 8, 16, (10, 11), (3, 3), (2, 2), (1, 1), (1, 1), 1, False, "channels"),
    (1, 8, 8, (12, 12), (3, 3), (1, 1), (2, 2), (2, 2), 1, True, "channels"),
    (2, 8, 16, (7, 7), (3, 3), (1, 1), (1, 1), (1, 1), 2, True, "channels"),
    (1, 6, 20, (5, 9), (3, 2), (2, 1), (0, 2), (1, 3), 1, True, "channels"),  # asymmetric, Cout % 8 != 0
    (1, 8, 8, (3, 3), (3, 3), (1, 1), (2, 2), (1, 1), 1, True, "channels"),   # rows entirely in padding
    (2, 24, 24, (5, 5), (1, 1), (1, 1), (0, 0), (1, 1), 1, False, "gemm"),  # pointwise: panels cross rows of 5
    (1, 32, 20, (9, 11), (1, 1), (2, 2), (0, 0), (1, 1), 1, True, "gemm"),  # strided pointwise, Cout % MR != 0
    (2, 24, 16, (3, 21), (1, 1), (1, 1), (0, 0), (1, 1), 1, True, "gemm"),  # rows longer than a panel
    (2, 16, 24, (5, 5), (1, 1), (1, 1), (0, 0), (1, 1), 1, False, "channels"),  # 16 input channels: direct
    (1, 16, 16, (10, 10), (1, 1), (1, 1), (1, 1), (1, 1), 1, True, "channels"),  # padded 1x1: direct kernel
    (2, 32, 8, (1, 1), (1, 1), (1, 1), (0, 0), (1, 1), 1, True, "channels"),    # squeeze-excite 1x1
    (2, 64, 64, (2, 2), (3, 3), (1, 1), (1, 1), (1, 1), 1, False, "channels"),  # a deep stage
    (2, 24, 24, (9, 13), (3, 3), (1, 1), (1, 1), (1, 1), 24, False, "width"),   # depthwise
    (1, 16, 16, (8, 8), (5, 5), (2, 2), (2, 2), (1, 1), 16, False, "width"),    # depthwise k5 s2
    (1, 4, 8, (6, 10), (3, 3), (1, 1), (1, 1), (1, 1), 4, True, "width"),       # channel multiplier 2
    (1, 5, 3, (6, 17), (3, 3), (1, 1), (1, 1), (1, 1), 1, True, "width"),       # few output channels
    (1, 8, 8, (5, 3), (3, 3), (1, 1), (1, 1), (1, 1), 8, True, "width"),        # width 3: 2-lane vectors
    (1, 12, 12, (7, 37), (3, 3), (2, 2), (1, 1), (1, 1), 12, False, "width"),   # depthwise s2: phases of the stride
    (1, 6, 6, (5, 29), (5, 5), (3, 3), (2, 3), (2, 2), 6, True, "width"),       # s3, dilated, padded copy
    (2, 8, 8, (3, 40), (3, 3), (1, 2), (0, 0), (1, 1), 8, False, "width"),      # strided, no padding
    (1, 12, 40, (3, 35), (1, 1), (1, 1), (0, 0), (1, 1), 1, True, "width"),     # pointwise over long rows
    (2, 32, 32, (23,), (3,), (2,), (0,), (1,), 1, True, "channels"),
    (2, 32, 40, (37,), (1,), (1,), (0,), (1,), 1, True, "gemm"),             # pointwise conv1d
    (1, 1, 32, (100,), (10,), (5,), (0,), (1,), 1, False, "channels"),
    (2, 64, 64, (17,), (5,), (1,), (2,), (1,), 64, False, "width"),
    (1, 4, 8, (5, 6, 7), (3, 3, 3), (1, 1, 1), (1, 1, 1), (1, 1, 1), 1, True, "channels"),
    (1, 24, 24, (3, 4, 5), (1, 1, 1), (1, 1, 1), (0, 0, 0), (1, 1, 1), 1, False, "gemm"),  # pointwise conv3d
    (1, 6, 6, (4, 1), (3, 1), (1, 1), (1, 0), (1, 1), 6, True, None),           # width 1: per-element nest
    (1, 8, 8, (6, 18), (3, 3), (1, 1), (0, 0), (1, 1), 1, True, "channels"),    # unpadded rows of 16 outputs
    (1, 8, 8, (5, 36), (5, 5), (1, 1), (0, 0), (1, 2), 1, True, "channels"),    # ... of 32, dilated, tap tiles cut
]


@pytest.mark.parametrize("case", TABLE, ids=lambda c: f"{c[1]}x{c[2]}-{c[3]}-k{c[4]}-s{c[5]}-p{c[6]}-d{c[7]}-g{c[8]}")
@pytest.mark.parametrize("machine", [AVX2, AVX512_2T], ids=["avx2", "avx512-2t"])
def test_table(case: tuple, machine: Target) -> None:  # type: ignore[type-arg]
    *args, form = case
    compiled = ConvCase(*args).run(machine)
    plans = conv_plans(compiled)
    if machine is AVX2:
        assert (plans[0].split()[0] if plans else None) == form, plans


def test_avx512_tiles_leave_registers_to_spare() -> None:
    """On 32 registers a channels-form tile keeps at most 20 accumulators: with 24 (and 4 weight
    vectors and a broadcast) LLVM spilled accumulators inside the inner loop of ResNet's 3x3
    layers, which then ran at 1.3-1.7x the time. AVX2 keeps its 12."""
    from torchburn.ir import dtypes as dt
    from torchburn.passes.loopgen.conv import plan_conv
    from torchburn.passes.loopgen.matmul import CpuInfo

    wide = plan_conv(64, 1, 64, 9, 60, 60 * 60, 1, dt.f32, CpuInfo(vector_bits=512))
    assert wide is not None and wide.form == "channels" and (wide.cv, wide.pos) == (4, 5)
    narrow = plan_conv(64, 1, 64, 9, 56, 56 * 56, 1, dt.f32, CpuInfo(vector_bits=256))
    assert narrow is not None and narrow.cv * narrow.pos == 12


@pytest.mark.parametrize("cout,k,out_w,tile", [(64, 3, 56, (2, 4)), (256, 3, 14, (2, 5)), (512, 3, 7, (2, 4)),
                                               (64, 7, 112, (2, 5)), (64, 1, 56, (2, 6)), (8, 3, 56, (1, 12))])
def test_avx2_tiles_fit_the_register_file(cout: int, k: int, out_w: int, tile: tuple) -> None:  # type: ignore[type-arg]
    """On AVX2's 16 registers a channels-form tile keeps its accumulators, its weight vectors,
    a broadcast and the broadcasts LLVM reuses across the last dim's taps (up to 2): 4 x 3
    (19 registers with 3 taps) spilled weight vectors in the inner loop and ran ResNet-50's
    3x3 layers at 1.2-1.9x the time of 2 x 5."""
    from torchburn.ir import dtypes as dt
    from torchburn.passes.loopgen.conv import REUSED_BROADCASTS, plan_conv
    from torchburn.passes.loopgen.matmul import CpuInfo

    plan = plan_conv(cout, 1, 64, k * k, out_w, out_w * out_w, 1, dt.f32, CpuInfo(vector_bits=256), k_last=k)
    assert plan is not None and plan.form == "channels" and (plan.cv, plan.pos) == tile, plan
    assert plan.cv * plan.pos + plan.cv + 1 + min(k - 1, REUSED_BROADCASTS) <= 16


@pytest.mark.parametrize("out_w,pos", [(28, 4), (56, 4), (14, 5), (60, 5), (128, 5), (3199, 5), (3, 3)])
def test_tile_positions_waste_least_of_the_row(out_w: int, pos: int) -> None:
    """Among the 3/4 largest tiles of positions, the fewest tiles x (positions + 1): VGG's
    28-wide rows take 7 tiles of 4, not 6 of 5 with 2 positions computed for nothing; a
    128-wide row 26 of 5 (2 wasted), not 32 of 4."""
    from torchburn.ir import dtypes as dt
    from torchburn.passes.loopgen.conv import plan_conv
    from torchburn.passes.loopgen.matmul import CpuInfo

    plan = plan_conv(512, 1, 512, 9, out_w, out_w * out_w, 1, dt.f32, CpuInfo(vector_bits=512))
    assert plan is not None and plan.form == "channels" and (plan.cv, plan.pos) == (4, pos)


def _padded_inputs(c: Compiled, shape: tuple[int, ...]) -> list[tuple[int, ...]]:
    """The shapes of `c`'s kernel buffers of `shape`'s rank whose first two dims are `shape`'s
    and whose spatial dims are at least as large, some larger (padded copies of an input)."""
    from torchburn.passes.loopgen.matmul import static_int

    found = []
    for k in c.program.kernels:
        for p in k.params:
            dims = tuple(static_int(d) for d in p.shape)
            if (len(dims) == len(shape) and dims[:2] == shape[:2] and None not in dims
                    and all(d >= s for d, s in zip(dims[2:], shape[2:])) and dims != shape):  # type: ignore[operator]
                found.append(dims)
    return found


@pytest.mark.parametrize("size,padding,padded", [((9, 13), (1, 1), (2, 16, 11, 18)),  # padded: 4 tiles of 4
                                                 ((6, 15), (0, 0), (2, 16, 6, 18))])  # 13 wide: 4 of 4
def test_channels_form_reads_a_padded_copy(size: tuple, padding: tuple, padded: tuple) -> None:  # type: ignore[type-arg]
    """Where a tile would clamp and mask its loads (padding, or a last tile of positions that
    is not whole), the channels form reads a zero-padded copy of the input covering whole
    tiles: every tile takes the plain path (VGG's 512-channel 3x3 at 28x28, one thread:
    33.6 -> 29.9 ms)."""
    case = ConvCase(2, 16, 64, size, (3, 3), (1, 1), padding, (1, 1), 1, True, "res_tanh")
    compiled = case.run(AVX512_2T)
    assert _padded_inputs(compiled, (2, 16, *size)) == [padded], conv_plans(compiled)


def test_whole_tiles_without_padding_read_the_input_itself() -> None:
    case = ConvCase(1, 16, 64, (6, 18), (3, 3), (1, 1), (0, 0), (1, 1), 1, True)  # 16 wide: 4 tiles of 4
    compiled = case.run(AVX512_2T)
    assert _padded_inputs(compiled, (1, 16, 6, 18)) == [], conv_plans(compiled)


@pytest.mark.parametrize("cout,pos", [(64, 4), (32, 8), (48, 4), (16, 16)])
def test_a_fused_epilogue_gets_a_power_of_two_of_positions(cout: int, pos: int) -> None:
    """The epilogue is vectorized along a tile's positions: a power of two leaves no scalar
    tail (6 positions were a vector of 4 and two scalar SiLUs)."""
    from torchburn.ir import dtypes as dt
    from torchburn.passes.loopgen.conv import plan_conv
    from torchburn.passes.loopgen.matmul import CpuInfo

    plan = plan_conv(cout, 1, 64, 9, 56, 56 * 56, 1, dt.f32, CpuInfo(vector_bits=512), epilogue=True)
    assert plan is not None and plan.form == "channels" and plan.pos == pos


def test_epilogue_tiles_compute_what_eager_does() -> None:
    """A channels-form convolution with a fused epilogue whose tile (8 positions) does not
    divide the width (13): whole tiles, an edge tile, the residual and tanh."""
    case = ConvCase(2, 16, 32, (6, 13), (3, 3), (1, 1), (1, 1), (1, 1), 1, True, "res_tanh")
    compiled = case.run(AVX512_2T)
    assert ["cv=2 pos=8" in p for p in conv_plans(compiled)] == [True], conv_plans(compiled)


@pytest.mark.parametrize("groups,co", [(1, 16), (8, 8)])
def test_epilogue_is_fused(groups: int, co: int) -> None:
    """Residual add and tanh run on the conv's tile: one kernel, which reads the residual."""
    case = ConvCase(2, 8, co, (6, 9), (3, 3), (1, 1), (1, 1), (1, 1), groups, True, "res_tanh")
    compiled = case.run(AVX2)
    convs = [k for k in compiled.program.kernels if "conv" in dict(k.attrs)]
    assert len(compiled.program.kernels) - (1 if groups == 1 else 0) <= 1 or len(convs) == 1
    assert len(convs) == 1 and "r" in {p.name for p in convs[0].params}


def test_pointwise_channel_tiles_go_inner_when_the_input_outgrows_l2() -> None:
    """ResNet-50's 256-to-64 1x1 at 56x56 (3.2 MB of input): every tile of 10 channels read the
    whole input again (one thread 4.9 -> 3.3 ms with the channel tiles inner); its 64-to-256
    layer (0.8 MB, fits in L2) keeps the order that holds a tile's weights in L1."""
    from torchburn.ir import dtypes as dt
    from torchburn.passes.loopgen.conv import plan_conv
    from torchburn.passes.loopgen.matmul import CpuInfo

    cpu = CpuInfo(vector_bits=512)
    squeeze = plan_conv(64, 1, 256, 1, 56, 56 * 56, 1, dt.f32, cpu, stride_one=True)
    expand = plan_conv(256, 1, 64, 1, 56, 56 * 56, 1, dt.f32, cpu, stride_one=True)
    assert squeeze is not None and squeeze.form == "width" and squeeze.channels_inner
    assert expand is not None and expand.form == "width" and not expand.channels_inner
    assert "channel tiles inner" in squeeze.describe()


SMALL_L2 = Target(vector_bits=512, l1_bytes=32 * 1024, l2_bytes=32 * 1024, threads=1, name="avx512-32k-l2")


@pytest.mark.parametrize("epilogue", ["", "res_tanh"])
def test_channel_tiles_inner_compute_what_eager_does(epilogue: str) -> None:
    """The width form with its channel tiles innermost (an L2 of 32 KB makes a small pointwise
    layer's input outgrow it; fewer than 16 output channels keep it out of the GEMM form):
    whole and edge tiles of channels and positions, a residual."""
    case = ConvCase(2, 64, 12, (5, 37), (1, 1), (1, 1), (0, 0), (1, 1), 1, True, epilogue)
    compiled = case.run(SMALL_L2)
    assert ["channel tiles inner" in p for p in conv_plans(compiled)] == [True], conv_plans(compiled)


def test_channels_form_blocks_positions_when_the_input_outgrows_l2() -> None:
    """wav2vec2's 512-to-512 conv1d k3 s2 over 3199 steps (6.5 MB of input): each of its 8
    tiles of channels streamed the whole input (62 ms against eager's 19-20, one thread); in
    blocks of positions whose input fits in L2, 25 ms. Its input gradient's one-tap phase
    (width form, a weight too large for the channel tiles to go inner): 12.3 -> 6.4 ms (eager
    5.5). An input that fits keeps no blocks."""
    from torchburn.ir import dtypes as dt
    from torchburn.passes.loopgen.conv import plan_conv
    from torchburn.passes.loopgen.matmul import CpuInfo

    cpu = CpuInfo(vector_bits=512)
    big = plan_conv(512, 1, 512, 3, 1599, 1599, 1, dt.f32, cpu, in_positions=3199, input_reuse=1.5)
    small = plan_conv(512, 1, 512, 3, 99, 99, 1, dt.f32, cpu, in_positions=199, input_reuse=1.5)
    assert big is not None and big.form == "channels" and big.block > 0
    assert "position blocks" in big.describe()
    assert small is not None and small.form == "channels" and small.block == 0
    # VGG's 256-to-256 3x3 at 56x56: the input (3.2 MB) outgrows L2, but each of its elements
    # feeds 9 taps (blocked 30.6 ms, not 29.0)
    vgg = plan_conv(256, 1, 256, 9, 56, 56 * 56, 1, dt.f32, cpu, in_positions=56 * 56, input_reuse=9.0)
    assert vgg is not None and vgg.form == "channels" and vgg.block == 0
    # ResNet-50's 64-to-256 1x1 at 56x56: its input (0.8 MB) fits in L2 (blocked 1.95 ms, not 1.70)
    expand = plan_conv(256, 1, 64, 1, 56, 56 * 56, 1, dt.f32, cpu, stride_one=True, in_positions=56 * 56,
                       input_reuse=1.0)
    assert expand is not None and expand.block == 0
    # the one-tap phase of its input gradient: pointwise rows (width form), 1 MB of weight
    phase = plan_conv(512, 1, 512, 1, 1600, 1600, 1, dt.f32, cpu, stride_one=True, in_positions=1600)
    assert phase is not None and phase.form == "width" and not phase.channels_inner and phase.block > 0


#: (n, c, co, size, k, stride, padding, dilation, form): cases whose input outgrows `SMALL_L2`,
#: with several tiles of channels, a partial last block of positions, rows; the width form's
#: pointwise rows with a weight too large for its channel tiles to go inner.
BLOCKED = [
    (2, 16, 80, (600,), (3,), (2,), (1,), (1,), "channels"),
    (1, 16, 80, (17, 41), (1, 3), (1, 2), (1, 0), (1, 1), "channels"),
    (1, 24, 72, (23, 17), (2, 2), (2, 1), (1, 1), (1, 2), "channels"),
    (2, 64, 80, (300,), (1,), (1,), (1,), (1,), "width"),  # (padded: an unpadded 1x1 takes the GEMM form)
    (1, 64, 72, (5, 37), (1, 1), (1, 1), (0, 1), (1, 1), "width"),
]


@pytest.mark.parametrize("case", BLOCKED, ids=lambda c: f"{c[1]}x{c[2]}-{c[3]}-k{c[4]}-s{c[5]}")
@pytest.mark.parametrize("epilogue", ["", "res_tanh"])
def test_position_blocks_compute_what_eager_does(case: tuple, epilogue: str) -> None:  # type: ignore[type-arg]
    """Both forms in blocks of positions (an L2 of 32 KB): whole and partial blocks, edge
    tiles of channels and positions, padding rows, a fused residual and tanh."""
    *args, form = case
    compiled = ConvCase(*args, 1, True, epilogue).run(SMALL_L2)
    plans = conv_plans(compiled)
    assert len(plans) == 1 and plans[0].startswith(form) and "position blocks" in plans[0], plans


def test_reference_engine_runs_a_conv_kernel_in_position_blocks() -> None:
    """The blocked channels form through the NumPy reference interpreter."""
    from torchburn.ir.parser import parse_graph
    from torchburn.passes.base import PassManager
    from torchburn.passes.pipeline import Pipeline
    from torchburn.runtime.reference import run_arrays

    case = ConvCase(1, 16, 80, (17, 41), (1, 3), (1, 2), (1, 0), (1, 1), 1, True, "res_tanh")
    program = PassManager(Pipeline.default().passes(), target=SMALL_L2).run(parse_graph(case.text()))
    assert any("position blocks" in dict(k.attrs).get("conv", "") for k in program.kernels)
    a = case.arrays()
    out = run_arrays(program, a)
    np.testing.assert_allclose(out["out0"], case.expected(a), rtol=1e-4, atol=1e-4 * np.sqrt(16 * 3))


def test_reference_engine_runs_the_conv_kernel() -> None:
    """The same loop program through the NumPy reference interpreter (the golden model)."""
    from torchburn.ir.parser import parse_graph
    from torchburn.passes.base import PassManager
    from torchburn.passes.pipeline import Pipeline
    from torchburn.runtime.reference import run_arrays

    case = ConvCase(1, 8, 16, (5, 6), (3, 3), (2, 1), (1, 1), (1, 1), 1, True, "res_tanh")
    program = PassManager(Pipeline.default().passes(), target=AVX2).run(parse_graph(case.text()))
    a = case.arrays()
    out = run_arrays(program, a)
    np.testing.assert_allclose(out["out0"], case.expected(a), rtol=1e-4, atol=1e-4)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_random_configurations(data: st.DataObject) -> None:
    nsp = data.draw(st.integers(1, 2), "nsp")
    groups = data.draw(st.sampled_from([1, 1, 2, 3]), "groups")
    depthwise = data.draw(st.booleans(), "depthwise")
    cg = data.draw(st.integers(1, 5), "cin per group")
    c = cg * groups
    co = groups * data.draw(st.integers(1, 12), "cout per group")
    if depthwise:
        c = co = data.draw(st.integers(1, 20), "channels")
        groups = c
    k = [data.draw(st.integers(1, 4)) for _ in range(nsp)]
    s = [data.draw(st.integers(1, 3)) for _ in range(nsp)]
    d = [data.draw(st.integers(1, 2)) for _ in range(nsp)]
    p = [data.draw(st.integers(0, 2)) for _ in range(nsp)]
    size = [data.draw(st.integers(max(1, d[i] * (k[i] - 1) + 1 - 2 * p[i]), 19)) for i in range(nsp)]
    machine = data.draw(st.sampled_from([AVX2, AVX512_2T]))
    ConvCase(data.draw(st.integers(1, 3)), c, co, size, k, s, p, d, groups, data.draw(st.booleans()),
             data.draw(st.sampled_from(["", "res_tanh"]))).run(machine)


class GradWeightCase(ConvCase):
    """`gw = conv_grad_weight(g, x)`, the weight gradient of the convolution `ConvCase` describes."""

    def text(self) -> str:
        xs = (self.n, self.c, *self.size)
        gs = (self.n, self.co, *self.out)
        ws = (self.co, self.c // self.groups, *self.k)
        return "\n".join([
            f"graph @g(%g: f32[{_dims(gs)}], %x: f32[{_dims(xs)}]) {{",
            f"  %0 = conv_grad_weight(%g, %x) {{stride = [{_dims(self.stride)}], padding = [{_dims(self.padding)}], "
            f"dilation = [{_dims(self.dilation)}], groups = {self.groups}, window = [{_dims(self.k)}]}} : f32[{_dims(ws)}]",
            "  return %0", "}"])

    def arrays(self, seed: int = 0) -> dict[str, np.ndarray]:
        a = super().arrays(seed)
        return {"x": a["x"], "g": a["r"]}

    def expected(self, a: dict[str, np.ndarray]) -> np.ndarray:
        x, g = torch.from_numpy(a["x"]).double(), torch.from_numpy(a["g"]).double()
        w = torch.zeros(self.co, self.c // self.groups, *self.k, dtype=torch.float64)
        return torch.ops.aten.convolution_backward(g, x, w, None, list(self.stride), list(self.padding),
                                                   list(self.dilation), False, [0] * len(self.k), self.groups,
                                                   [False, True, False])[1].numpy()

    def run(self, machine: Optional[Target] = None, seed: int = 0) -> Compiled:
        compiled = Compiled(self.text(), machine=machine)
        a = self.arrays(seed)
        out = np.full((self.co, self.c // self.groups, *self.k), np.nan, np.float32)
        compiled({**a, "out0": out})
        red = self.n * int(np.prod(self.out))
        np.testing.assert_allclose(out, self.expected(a), rtol=1e-4, atol=1e-4 * max(1.0, np.sqrt(red)))
        return compiled


@pytest.mark.parametrize("case", TABLE, ids=lambda c: f"{c[1]}x{c[2]}-{c[3]}-k{c[4]}-s{c[5]}-p{c[6]}-d{c[7]}-g{c[8]}")
@pytest.mark.parametrize("machine", [AVX2, AVX512_2T], ids=["avx2", "avx512-2t"])
def test_grad_weight_table(case: tuple, machine: Target) -> None:  # type: ignore[type-arg]
    """Against eager: padding, strides, dilations and tap tiles cut by the window (padded or
    strided rows read from a zero-padded copy, `padded_rows`; unpadded stride-1 rows with
    the plain and the clamped, masked vectors of positions in loops of their own)."""
    gw = GradWeightCase(*case[:-1])
    plans = conv_plans(gw.run(machine))
    # The dot form where the output is at least 2 wide; below that the per-element nest.
    assert [p.split()[0] for p in plans] == (["grad-weight"] if gw.out[-1] >= 2 else [])


@pytest.mark.parametrize("k,rows_avx2,rows_avx512", [(3, 3, 4), (1, 4, 4), (5, 2, 3)])
def test_grad_weight_tiles_fit_the_register_file(k: int, rows_avx2: int, rows_avx512: int) -> None:
    """Rows x taps accumulators, a vector of `g` per row and of `x` per tap, within the vector
    registers: 4 rows of 3 taps needed 19 of AVX2's 16 and LLVM kept 8 accumulators on the
    stack (U-Net's 64-to-32 3x3 at 128x128, a training step of the one convolution, one
    thread: 56.7 -> 41.4 ms with 3 rows, eager 40-41)."""
    for machine, rows in ((AVX2, rows_avx2), (AVX512_2T, rows_avx512)):
        plans = conv_plans(GradWeightCase(1, 8, 8, (10, 20), (k, k), (1, 1), (k // 2, k // 2), (1, 1), 1).run(machine))
        assert [p for p in plans if f"rows={rows} " in p] == plans and plans, (machine.name, plans)


@pytest.mark.parametrize("conv", ["1d", "2d", "transposed"])
def test_grad_weight_ignores_inputs_no_output_reads(conv: str) -> None:
    """The last input of a strided row that no output reads (and a transposed convolution's
    output padding) may be inf: eager's weight gradient stays finite, and so must ours, whose
    last whole vector reads such an input at a position past the output (its `g` a padded
    zero, and 0 * inf is NaN: the lanes past OW select zero instead)."""
    torch.manual_seed(0)
    if conv == "transposed":
        m = torch.nn.ConvTranspose1d(4, 6, 3, stride=2, output_padding=1)
        x = torch.randn(2, 4, 9)
    else:
        m = (torch.nn.Conv1d if conv == "1d" else torch.nn.Conv2d)(4, 8, 3, stride=2)
        x = torch.randn(2, 4, 8) if conv == "1d" else torch.randn(2, 4, 5, 8)
        x[..., 7] = float("inf")  # read by no output: 3 outputs read 0..6
    compiled = torch.compile(copy.deepcopy(m), backend="torchburn", options={"tune": "off"})
    g = None
    if conv == "transposed":
        y = m(x)
        g = torch.randn_like(y)
        g[..., -1] = float("inf")  # the output padding's position: no input feeds it
    (m(x) * (1 if g is None else g)).nan_to_num(posinf=0.0).sum().backward()
    (compiled(x) * (1 if g is None else g)).nan_to_num(posinf=0.0).sum().backward()
    want, got = m.weight.grad, compiled.weight.grad
    assert torch.isfinite(want).all()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", [
    (1, 8, 8, (9, 56), (3, 3), (1, 1), (1, 1), (1, 1), 1),    # 56 = 3 x 16 + 8 (ResNet's rows)
    (2, 4, 8, (5, 7), (3, 3), (1, 1), (1, 1), (1, 1), 1),     # a row of 7: one vector of 8
    (1, 4, 4, (6, 30), (3, 3), (1, 1), (0, 0), (1, 1), 1),    # unpadded: 28 wide
    (1, 6, 6, (8, 19), (5, 5), (1, 2), (2, 2), (1, 1), 6),    # depthwise, strided
], ids=["w56", "w7", "w28-unpadded", "dw-s2"])
def test_grad_weight_rows_in_whole_vectors(case: tuple) -> None:  # type: ignore[type-arg]
    """Where a row is not a whole number of vectors, `g` and `x` are read from zero-padded
    copies as wide as whole vectors (`padded_gradient`): no scalar tail loop is left, and the
    result is eager's. The tail had cost twice the vectors at 56 wide (ResNet's 64-channel 3x3
    weight gradient, one thread, AVX-512: 6.2 -> 2.5 ms, oneDNN 2.4)."""
    from torchburn.ir import expr as ex
    from torchburn.ir import loop as lp

    compiled = GradWeightCase(*case).run(AVX512_2T)
    (plan,) = conv_plans(compiled)
    assert plan.endswith("whole-vectors"), plan
    (kernel,) = [k for k in compiled.program.kernels if "conv" in dict(k.attrs)]
    assert len(kernel.params) >= 2 and sum(b.name.startswith(f"{kernel.name}_ws") for b in kernel.params) == 2
    tiles = [s for s in lp.walk_stmts(kernel.body) if isinstance(s, lp.For) and dict(s.annotations).get("conv")]
    loads = {e.buffer for s in lp.walk_stmts(tiles[0]) for e0 in lp.stmt_exprs(s) for e in ex.walk(e0)
             if isinstance(e, ex.Load) and e.buffer in ("g", "x") + tuple(b.name for b in kernel.params)}
    assert loads == {f"{kernel.name}_ws0", f"{kernel.name}_ws1"}, loads  # neither g nor x read in place


@pytest.mark.parametrize("case", [
    (1, 8, 8, (10, 20), (3, 3), (1, 1), (1, 1), (1, 1), 1),   # padded, stride 1
    (1, 8, 16, (11, 21), (3, 3), (2, 2), (1, 1), (1, 1), 1),  # padded, stride 2
    (2, 4, 4, (9, 30), (2, 3), (1, 3), (0, 0), (1, 2), 1),    # stride 3, dilated, unpadded
    (1, 6, 6, (8, 19), (5, 5), (1, 2), (2, 2), (1, 1), 6),    # depthwise k5, s2 along the width
], ids=["p1", "p1-s2", "s3-d2", "dw-k5-s2"])
@pytest.mark.parametrize("machine", [AVX2, AVX512_2T], ids=["avx2", "avx512-2t"])
def test_grad_weight_reads_padded_rows_in_plain_vectors(case: tuple, machine: Target) -> None:  # type: ignore[type-arg]
    """With padding or a stride along the last dim, the weight gradient reads a zero-padded
    copy of the input's rows split by phase of the stride (`GradWeightBuilder.padded_rows`):
    every vector load of its tiles is a contiguous vector (a clamped, masked or strided one
    was a gather: U-Net's 64-to-32 3x3 at 128x128 11.6 -> 8.3 ms, one thread); against eager."""
    from torchburn.ir import expr as ex
    from torchburn.ir import loop as lp

    compiled = GradWeightCase(*case).run(machine)
    (kernel,) = [k for k in compiled.program.kernels if "conv" in dict(k.attrs)]
    tiles = [s for s in lp.walk_stmts(kernel.body) if isinstance(s, lp.For) and dict(s.annotations).get("conv")]
    assert len(tiles) == 1
    loads = [e for s in lp.walk_stmts(tiles[0]) for e0 in lp.stmt_exprs(s) for e in ex.walk(e0)
             if isinstance(e, ex.Load) and e.type.lanes > 1]
    assert loads and any(e.buffer.endswith("_ws0") for e in loads)
    from torchburn.codegen.llvm.memory import lane_affine

    lets = {s.var.name: s.value for s in lp.walk_stmts(kernel.body) if isinstance(s, lp.Let) and s.value.lanes > 1}
    for e in loads:
        last = e.index[-1]
        while ex.free_vars(last) & lets.keys():  # the vectorized tail's lane vectors, bound by lets
            last = ex.substitute(last, lets)
        affine = lane_affine(last)
        assert affine is not None and ex.evaluate_index(affine.stride, {}) == 1, e


GUARD_SCRIPT = r'''
import ctypes, mmap, sys
import numpy as np
sys.path.insert(0, {root!r})
from tests.passes import test_conv as t

libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PAGE = mmap.PAGESIZE
keep = []

def guarded(arr, at_end):
    nbytes = arr.nbytes
    body = (nbytes + PAGE - 1) // PAGE * PAGE
    mm = mmap.mmap(-1, body + 2 * PAGE)
    keep.append(mm)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc.mprotect(base, PAGE, 0)
    libc.mprotect(base + PAGE + body, PAGE, 0)
    offset = PAGE + (body - nbytes if at_end else 0)
    out = np.frombuffer(mm, dtype=arr.dtype, count=arr.size, offset=offset).reshape(arr.shape)
    out[...] = arr
    return out

for row in t.TABLE:
  for case in (t.ConvCase(*row[:-1], epilogue="res_tanh"), t.GradWeightCase(*row[:-1])):
    for machine in (t.AVX2, t.AVX512_2T):
        c = t.Compiled(case.text(), machine=machine)
        for at_end in (True, False):
            a = {{k: guarded(v, at_end) for k, v in case.arrays().items()}}
            expected = case.expected(a)
            out = guarded(np.zeros(expected.shape, np.float32), at_end)
            c({{**a, "out0": out}})
            np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-3)
print("GUARDS OK")
'''


def test_no_access_outside_buffers() -> None:
    """Every operand sits against an inaccessible page (after it, then before it); a read or
    write past either end would crash the child process."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TORCHBURN_CACHE_DIR="off")
    proc = subprocess.run([sys.executable, "-c", GUARD_SCRIPT.format(root=root)], capture_output=True,
                          text=True, env=env, timeout=1200, cwd=root)
    assert proc.returncode == 0 and "GUARDS OK" in proc.stdout, (proc.returncode, proc.stdout[-2000:],
                                                                 proc.stderr[-4000:])


def test_pointwise_layers_take_the_gemm_form() -> None:
    """An unpadded 1x1 convolution with at least 24 input and 16 output channels is a packed
    product (`conv_pointwise.py`): ResNet-50's 256-to-64 1x1 at 56x56 took 2.7 ms in the width
    form and 1.5 ms so (one thread, AVX2; eager 1.4-1.5). Few channels (a squeeze-excitation's
    reduction, EfficientNet's 16-channel expansion) keep the direct kernels; a weight larger than half of L2 (512-to-2048) keeps its
    micro-panel in L1 over the panels instead of running the panels outermost; blocks of
    positions come in a multiple of the threads."""
    from torchburn.ir import dtypes as dt
    from torchburn.passes.loopgen.conv import plan_conv
    from torchburn.passes.loopgen.matmul import CpuInfo

    avx2 = CpuInfo(vector_bits=256, l2_bytes=512 * 1024)
    squeeze = plan_conv(64, 1, 256, 1, 56, 56 * 56, 1, dt.f32, avx2, stride_one=True, pointwise=True)
    assert squeeze is not None and squeeze.form == "gemm" and squeeze.channels_inner
    assert (squeeze.cv, squeeze.pos * squeeze.lanes) == (6, 16) and squeeze.nc % 16 == 0
    assert squeeze.nc * 256 * 4 <= avx2.l2_bytes // 4
    assert "gemm" in squeeze.describe() and "nr=16" in squeeze.describe()
    wide = plan_conv(2048, 1, 512, 1, 7, 49, 1, dt.f32, CpuInfo(vector_bits=512), stride_one=True, pointwise=True)
    assert wide is not None and wide.form == "gemm" and not wide.channels_inner
    assert (wide.cv, wide.pos * wide.lanes) == (8, 32)
    few = plan_conv(8, 1, 32, 1, 1, 1, 1, dt.f32, avx2, stride_one=True, pointwise=True)
    assert few is not None and few.form != "gemm"
    # EfficientNet's 16-to-96 expansion at 112x112: 16 input channels keep the width form
    expansion = plan_conv(96, 1, 16, 1, 112, 112 * 112, 1, dt.f32, avx2, stride_one=True, pointwise=True)
    assert expansion is not None and expansion.form == "width"
    two = CpuInfo(vector_bits=256, l2_bytes=512 * 1024, threads=2)
    for positions in (56 * 56, 28 * 28, 14 * 14, 7 * 7):
        plan = plan_conv(256, 1, 256, 1, int(positions ** 0.5), positions, 1, dt.f32, two, pointwise=True)
        assert plan is not None and plan.form == "gemm" and plan.parallel
        assert -(-positions // plan.nc) % 2 == 0, (positions, plan.nc)


@pytest.mark.parametrize("epilogue", ["", "res_tanh"])
def test_reference_engine_runs_the_pointwise_gemm_kernel(epilogue: str) -> None:
    """The GEMM form (panels across rows of 7, a partial last micro-panel of channels and
    panel of positions, a strided input) through the NumPy reference interpreter."""
    from torchburn.ir.parser import parse_graph
    from torchburn.passes.base import PassManager
    from torchburn.passes.pipeline import Pipeline
    from torchburn.runtime.reference import run_arrays

    for stride in (1, 2):
        case = ConvCase(1, 24, 20, (7, 13), (1, 1), (stride, stride), (0, 0), (1, 1), 1, True, epilogue)
        program = PassManager(Pipeline.default().passes(), target=AVX2).run(parse_graph(case.text()))
        assert [dict(k.attrs)["conv"].split()[0] for k in program.kernels if "conv" in dict(k.attrs)] == ["gemm"]
        a = case.arrays()
        out = run_arrays(program, a)
        np.testing.assert_allclose(out["out0"], case.expected(a), rtol=1e-4, atol=1e-4 * np.sqrt(24))


def test_bottleneck_training_step_in_gemm_form() -> None:
    """A ResNet bottleneck (1x1 reduce, 3x3, 1x1 expand, a strided 1x1 projection, batch norm
    and ReLU) through `torch.compile`, one training step: the output and every gradient equal
    eager's, and the pointwise forward convolutions and input gradients ran in the GEMM form
    (their weight gradients are products of `_grad_weight_gemm`)."""
    from torchburn.llm.cli.profile import StepProfiler, capture_launchers

    torch.manual_seed(0)

    class Bottleneck(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.reduce = torch.nn.Conv2d(32, 24, 1, bias=False)
            self.bn1 = torch.nn.BatchNorm2d(24)
            self.mid = torch.nn.Conv2d(24, 24, 3, stride=2, padding=1, bias=False)
            self.bn2 = torch.nn.BatchNorm2d(24)
            self.expand = torch.nn.Conv2d(24, 48, 1, bias=False)
            self.bn3 = torch.nn.BatchNorm2d(48)
            self.project = torch.nn.Conv2d(32, 48, 1, stride=2, bias=True)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(self.bn1(self.reduce(x)))
            y = torch.relu(self.bn2(self.mid(y)))
            return torch.relu(self.bn3(self.expand(y)) + self.project(x))

    eager = Bottleneck().train()
    model = copy.deepcopy(eager)
    x = torch.randn(2, 32, 10, 9)
    x_eager = x.clone().requires_grad_(True)
    x_ours = x.clone().requires_grad_(True)
    torch._dynamo.reset()
    with capture_launchers() as launchers:
        out = torch.compile(model, backend="torchburn", dynamic=False)(x_ours)
        cot = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        out.backward(cot)
    expected = eager(x_eager)
    expected.backward(cot)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(x_ours.grad, x_eager.grad, rtol=1e-4, atol=1e-4)
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=lambda m: f"{name}: {m}")
    forms = [dict(k.attrs).get("conv", "").split(" ")[0] for launcher in launchers
             for k in StepProfiler(launcher, model).program.kernels]
    # forward: reduce, expand, the strided projection; backward: the input gradients of
    # expand and reduce (the projection's is a phase of a strided gradient: also pointwise)
    assert forms.count("gemm") >= 5, forms


@pytest.mark.parametrize("size", [(14, 14), (7, 7), (5, 3)])
def test_pointwise_epilogue_stores_whole_vectors_across_rows(size: tuple) -> None:  # type: ignore[type-arg]
    """A pointwise convolution over a map narrower than a vector (14x14, 7x7: EfficientNet's
    late 1x1 layers) stores its tile as one run of positions (the output's spatial dims are
    contiguous): the epilogue (residual, tanh) is a vector loop, where by row segments every
    position fell into a scalar tail (80-to-480 with SiLU at 14x14: 0.37 -> 0.16 ms)."""
    case = ConvCase(2, 24, 48, size, (1,) * len(size), (1,) * len(size), (0,) * len(size), (1,) * len(size), 1,
                    True, "res_tanh")
    compiled = case.run(AVX512_2T)  # checks the values against eager's (float64)
    assert ["gemm" in p for p in conv_plans(compiled)] == [True], conv_plans(compiled)
    from torchburn.ir.printer import print_program

    text = print_program(compiled.program)
    stores = [line for line in text.splitlines() if line.strip().startswith("%out")]
    assert any("ramp(" in line for line in stores), stores  # vector stores of the epilogue
