"""`gpu-split-phases` and `gpu-chunk-serial`: a kernel of several top-level loops runs as a
kernel per phase, and what one GPU invocation loops stays within the device's limit (Mesa's
llvmpipe ends every loop of an invocation after 65,535 iterations: a scatter past that lost
its last updates, silently)."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from torchburn.codegen.target import gpu_target
from torchburn.codegen.wgsl import Caps, WgslUnsupported
from torchburn.codegen.wgsl.program import emit_kernel
from torchburn.ir import expr as ex
from torchburn.ir.expr import Const
from torchburn.ir.loop import ITERATIONS_ATTR
from torchburn.ir.parser import parse_program
from torchburn.ir.printer import print_program
from torchburn.passes.base import PassError, PassManager
from torchburn.passes.gpu.map import GpuMap
from torchburn.passes.gpu.serial import GpuChunkSerial, GpuSplitPhases, kernel_iterations
from torchburn.runtime.reference.entry import run_arrays

from tests.gpu.conftest import check_gpu, engines, gpu  # noqa: F401  (the fixture)
from tests.helpers import run_compiled

SCATTER = """program @f(%x: f32[{n}] strides [1], %i: i64[{m}] strides [1], %s: f32[{m}] strides [1]) -> (%out0: f32[{n}] strides [1]) {{
  call @k0(%x, %i, %s, %out0)
}}
kernel @k0(%x: f32[{n}] strides [1], %i: i64[{m}] strides [1], %s: f32[{m}] strides [1], %out0: f32[{n}] strides [1]) attrs {{origin = "aten.scatter_add.default"}} {{
  let h = %x[0] * 0.0:f32
  for i0 in 0..{n} attrs {{origin = "aten.scatter_add.default"}} {{
    %out0[i0] = %x[i0] + h
  }}
  for j1 in 0..{m} {{
    let t2 = checked_index(%i[j1], {n})
    for r3 in 0..2 {{
      %out0[t2] = %out0[t2] + %s[j1] * 0.5:f32
    }}
  }}
}}
"""


def scatter(n: int, m: int):  # type: ignore[no-untyped-def]
    return parse_program(SCATTER.format(n=n, m=m), "scatter")


def run(program, n: int, m: int, seed: int = 0) -> np.ndarray:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    inputs = {"x": rng.standard_normal(n).astype(np.float32), "i": rng.integers(0, n, m),
              "s": rng.standard_normal(m).astype(np.float32)}
    return run_arrays(program, inputs)["out0"]


def test_a_scatter_splits_into_its_copy_and_its_updates() -> None:
    p = scatter(64, 10)
    out = GpuSplitPhases().run(p)
    assert [k.name for k in out.kernels] == ["k0_p0", "k0_p1"]
    # each phase binds what it uses; the leading let that reads an unwritten input comes along
    assert [p.name for p in out.kernels[0].params] == ["x", "out0"]
    assert [p.name for p in out.kernels[1].params] == ["i", "s", "out0"]
    assert [c.args for c in out.calls] == [("x", "out0"), ("i", "s", "out0")]
    assert "let h = " in print_program(out).split("kernel @k0_p1")[0]
    np.testing.assert_array_equal(run(out, 64, 10), run(p, 64, 10))
    # gpu-map then gives the copy a grid; the updates stay one invocation
    mapped = GpuMap().run(out)
    assert mapped.kernels[0].body.annotation("gpu") == "grid"
    # each of the 10 iterations: itself, and the inner loop's 2 and its entry; then the entry
    assert kernel_iterations(mapped.kernels[1]) == Const(10 * (1 + 2 + 1) + 1)


def test_phases_that_share_a_local_stay_together() -> None:
    text = """kernel @k0(%x: f32[8] strides [1], %out0: f32[8] strides [1]) {
  alloc %acc: f32[1] strides [1] local
  %acc[0] = 0.0:f32
  for r0 in 0..8 {
    %acc[0] = %acc[0] + %x[r0]
  }
  for i1 in 0..8 {
    %out0[i1] = %x[i1] - %acc[0]
  }
}
"""
    p = parse_program("program @f(%x: f32[8] strides [1]) -> (%out0: f32[8] strides [1]) {\n"
                      "  call @k0(%x, %out0)\n}\n" + text, "shared")
    assert GpuSplitPhases().run(p) is p


def test_a_serial_loop_past_the_limit_becomes_chunks_within_it() -> None:
    p = GpuMap().run(GpuSplitPhases().run(scatter(50, 1000)))
    out = GpuChunkSerial(max_iterations=1401).run(p)
    # 4 iterations a step (the loop's own, r3's two and r3's entry), 1 for the chunk loop's
    # entry: (1401 - 64 - 1) // 4 = 334 steps a chunk
    names = [k.name for k in out.kernels]
    assert names == ["k0_p0", "k0_p1_0", "k0_p1_1", "k0_p1_2"], names
    for k in out.kernels[1:]:
        n = kernel_iterations(k)
        assert isinstance(n, Const) and int(n.value) <= 1401 - 64
    np.testing.assert_array_equal(run(out, 50, 1000), run(p, 50, 1000))
    # within the limit, or without one, nothing changes
    assert GpuChunkSerial(max_iterations=5000).run(p) is p
    assert GpuChunkSerial().run(p) is p  # the generic target has no limit
    assert PassManager([GpuChunkSerial()], target=gpu_target(loop_iterations=1401)).run(p).kernels == out.kernels


def test_what_cannot_be_chunked_carries_its_count_and_codegen_refuses_it() -> None:
    """A grid kernel whose invocations loop 100,000 times each (an argmax's row), and one whose
    count depends on a size: the count is the kernel's attribute; a constant past the device's
    limit is refused (the CPU engine runs it), a symbolic one is the launcher's to check."""
    text = """program @f(%x: f32[2, {n}] strides [{n}, 1]) -> (%out0: f32[2] strides [1]){syms} {{
  call @k0(%x, %out0)
}}
kernel @k0(%x: f32[2, {n}] strides [{n}, 1], %out0: f32[2] strides [1]){syms} {{
  for i0 in 0..2 {{
    alloc %m: f32[1] strides [1] local
    %m[0] = -inf:f32
    for r1 in 0..{n} {{
      let v = %x[i0, r1]
      %m[0] = select(v > %m[0], v * 2.0:f32, %m[0])
    }}
    %out0[i0] = %m[0]
  }}
}}
"""
    static = GpuMap().run(parse_program(text.format(n=100000, syms=""), "rows"))
    assert static.kernels[0].body.annotation("gpu") == "grid"
    out = GpuChunkSerial(max_iterations=65535).run(static)
    assert dict(out.kernels[0].attrs)[ITERATIONS_ATTR] == "100001"  # the row loop and its entry
    with pytest.raises(WgslUnsupported, match="100,001 loop iterations"):
        emit_kernel(out.kernels[0], out.symbols, Caps(loop_iterations=65535))
    assert emit_kernel(out.kernels[0], out.symbols, Caps()).iterations is None  # no limit: nothing to refuse

    dynamic = GpuMap().run(parse_program(text.format(n="s0", syms=" symbols(s0)"), "rows"))
    out = GpuChunkSerial(max_iterations=65535).run(dynamic)
    count = emit_kernel(out.kernels[0], out.symbols, Caps(loop_iterations=65535)).iterations
    assert count is not None
    assert [ex.evaluate_index(count, {"s0": n}) for n in (10, 70000)] == [11, 70001]


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(PassError, match="at least 0"):
        GpuChunkSerial(max_iterations=-1).run(scatter(4, 4))


# ---- on the GPU engine (CI: llvmpipe, whose loop limit this is) ------------------------------

@pytest.mark.parametrize("n", [50_000, 65_536, 200_000])
def test_scatter_add_past_65536_elements_is_right(gpu, n: int) -> None:  # noqa: F811
    torch.manual_seed(n)
    z, s = torch.randn(n), torch.randn(3000)
    i = torch.randint(0, n, (3000,))
    check_gpu(lambda z, i, s: z.scatter_add(0, i, s), z, i, s)


def test_index_put_of_many_updates_is_right(gpu) -> None:  # noqa: F811
    """70,000 accumulated updates into 10 slots: the update loop runs as chunks within the
    limit, in order (each chunk a dispatch after the previous)."""
    torch.manual_seed(0)
    z, v = torch.zeros(10), torch.randn(70_000)
    i = torch.randint(0, 10, (70_000,))
    check_gpu(lambda z, i, v: z.index_put((i,), v, accumulate=True), z, i, v, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("m, k", [(1596, 40), (255, 256), (5000, 40)])
def test_updates_of_whole_rows_near_and_past_the_limit(gpu, m: int, k: int) -> None:  # noqa: F811
    """Nested loops: each update adds a row of k elements, every update to row 0. Counted as
    m * (k + 1) before, llvmpipe's limiter counts m * (k + 2) (an inner loop's entry is one
    more): 1596 x 40 was accepted whole and lost 36 updates, chunks of 5000 x 40 lost 36 each."""
    z, v = torch.zeros(10, k), torch.ones(m, k)
    i = torch.zeros(m, dtype=torch.int64)
    check_gpu(lambda z, i, v: z.index_put((i,), v, accumulate=True), z, i, v)


def test_a_phase_with_leading_lets_is_chunked_too() -> None:
    """`gpu-split-phases` copies the leading let `h` into the update phase; the update loop
    is still cut into chunks (the let recomputed inside), not left whole and refused."""
    p = GpuMap().run(GpuSplitPhases().run(scatter(50, 3000).with_kernels(tuple(
        replace(k, body=parse_body(k)) for k in scatter(50, 3000).kernels))))
    out = GpuChunkSerial(max_iterations=1000).run(p)
    assert len(out.kernels) > 2 and not any(ITERATIONS_ATTR in dict(k.attrs) for k in out.kernels)
    np.testing.assert_array_equal(run(out, 50, 3000), run(p, 50, 3000))


def parse_body(k):  # type: ignore[no-untyped-def]
    """The scatter's body with the updates reading the leading let `h`."""
    from torchburn.ir.parser import parse_stmt

    text = print_program(scatter(50, 3000)).split("attrs {origin = \"aten.scatter_add.default\"} {\n", 1)[1]
    text = text.rsplit("}", 1)[0].replace("%s[j1] * 0.5:f32", "%s[j1] * 0.5:f32 + h")
    return parse_stmt(text, buffers={b.name: b for b in k.params})


def test_a_count_that_depends_on_the_sizes_is_checked_per_call(gpu) -> None:  # noqa: F811
    """Dynamic shapes: the update loop's count is `s0`; a call whose `s0` is past the limit runs
    in PyTorch (the launcher logs why), the others on the GPU, every one right."""
    fn = torch.compile(lambda z, i, v: z.index_put((i,), v, accumulate=True), backend="torchburn", dynamic=True)
    torch._dynamo.reset()
    for m in (1000, 70_000, 2000):
        torch.manual_seed(m)
        z, v = torch.zeros(10), torch.randn(m)
        i = torch.randint(0, 10, (m,))
        torch.testing.assert_close(fn(z, i, v), z.index_put((i,), v, accumulate=True), rtol=1e-4, atol=1e-3)


def test_a_row_loop_past_the_limit_runs_on_the_cpu_engine_and_says_so(gpu) -> None:  # noqa: F811
    limit = gpu.get_device().caps.loop_iterations
    if not limit:
        pytest.skip("the adapter does not limit loop iterations")
    x = torch.randn(2, 100_000)
    with torch.no_grad():
        out, reports = run_compiled(lambda x: x.argmax(-1), x)
    torch.testing.assert_close(out, x.argmax(-1))
    notes = [note for engine, note in engines(reports) if engine != "wgpu"]
    assert notes and "loop iterations in one invocation" in notes[0], engines(reports)


def test_the_device_limit_reaches_the_target(gpu) -> None:  # noqa: F811
    from unittest import mock

    from torchburn.backend import gpu_launcher

    dev = gpu.get_device()
    info = dev.adapter.info
    expected = 65535 if "llvmpipe" in f"{info.get('device', '')} {info.get('description', '')}".lower() else 0
    assert dev.caps.loop_iterations == expected
    with mock.patch.object(gpu_launcher, "compile_graph", return_value=("compiled", False)) as cg:
        gpu_launcher.compile_graph_gpu(object())  # type: ignore[arg-type]
    assert cg.call_args.kwargs["target"].gpu_loop_iterations == expected
