"""Row fusion (`passes/tensor/row_fusion.py`, part of `fuse`) and the row kernels `lower-to-loops`
builds from it: IR text in, IR text out, then softmax and norms through the compiler against
eager (contiguous, strided, 3-D, symbolic rows, a reduction over a dim that is not last)."""
from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_graph, print_program
from torchburn.ir.verifier import verify
from torchburn.passes.tensor.fusion import Fuse
from torchburn.passes.lower_to_loops import LowerToLoops
from tests.helpers import assert_fully_compiled, run_compiled

SOFTMAX = """
    graph @main(%x: f32[8, 16]) {
      %0 = reduce_max(%x) {dims = [1], keepdim = true} : f32[8, 1]
      %1 = expand(%0) {shape = [8, 16]} : f32[8, 16]
      %2 = sub(%x, %1) : f32[8, 16]
      %3 = exp(%2) : f32[8, 16]
      %4 = reduce_sum(%3) {dims = [1], keepdim = true} : f32[8, 1]
      %5 = expand(%4) {shape = [8, 16]} : f32[8, 16]
      %6 = div(%3, %5) : f32[8, 16]
      return %6
    }
"""


def fuse(text: str, **options: object) -> str:
    g = parse_graph(textwrap.dedent(text))
    verify(g)
    out = Fuse(**options).run(g)  # type: ignore[arg-type]
    verify(out)
    return print_graph(out).strip()


def lower(text: str) -> str:
    g = Fuse().run(parse_graph(textwrap.dedent(text)))
    return print_program(LowerToLoops().run(g)).strip()


def attrs_of(printed: str) -> list[str]:
    """The fusion attribute of each op line, in order (`kernel = 0`, `fused_into = [0]`)."""
    out = []
    for line in printed.splitlines():
        if "kernel = " in line:
            out.append("kernel = " + line.split("kernel = ")[1].split("}")[0].split(",")[0])
        elif "fused_into = " in line:
            out.append("fused_into = " + line.split("fused_into = ")[1].split("]")[0] + "]")
    return out


def test_softmax_is_one_kernel() -> None:
    """The module docstring's example."""
    assert fuse(SOFTMAX) == textwrap.dedent("""
        graph @main(%x: f32[8, 16]) {
          %0 = reduce_max(%x) {dims = [1], keepdim = true, fused_into = [0]} : f32[8, 1]
          %1 = expand(%0) {shape = [8, 16], fused_into = [0]} : f32[8, 16]
          %2 = sub(%x, %1) {fused_into = [0]} : f32[8, 16]
          %3 = exp(%2) {fused_into = [0]} : f32[8, 16]
          %4 = reduce_sum(%3) {dims = [1], keepdim = true, fused_into = [0]} : f32[8, 1]
          %5 = expand(%4) {shape = [8, 16], fused_into = [0]} : f32[8, 16]
          %6 = div(%3, %5) {kernel = 0} : f32[8, 16]
          return %6
        }""").strip()


def test_off_keeps_the_plain_rules() -> None:
    assert attrs_of(fuse(SOFTMAX, row_reductions=False)) == [
        "kernel = 0", "fused_into = [1]", "fused_into = [1]", "kernel = 1", "kernel = 2",
        "fused_into = [3]", "kernel = 3"]


def test_sibling_reductions_and_norm_in_one_kernel() -> None:
    """A norm from sum(x) and sum(x * x): both reductions and the normalization, one kernel."""
    printed = fuse("""
        graph @main(%x: f32[4, 32], %w: f32[32]) {
          %0 = reduce_sum(%x) {dims = [1], keepdim = true} : f32[4, 1]
          %1 = mul(%x, %x) : f32[4, 32]
          %2 = reduce_sum(%1) {dims = [1], keepdim = true} : f32[4, 1]
          %3 = mul(%0, %0) : f32[4, 1]
          %4 = sub(%2, %3) : f32[4, 1]
          %5 = rsqrt(%4) : f32[4, 1]
          %6 = expand(%0) {shape = [4, 32]} : f32[4, 32]
          %7 = sub(%x, %6) : f32[4, 32]
          %8 = expand(%5) {shape = [4, 32]} : f32[4, 32]
          %9 = mul(%7, %8) : f32[4, 32]
          %10 = reshape(%w) {shape = [1, 32]} : f32[1, 32]
          %11 = expand(%10) {shape = [4, 32]} : f32[4, 32]
          %12 = mul(%9, %11) : f32[4, 32]
          return %12
        }""")
    assert attrs_of(printed)[-1] == "kernel = 0"
    assert all(a == "fused_into = [0]" for a in attrs_of(printed)[:-1])


def test_a_reduction_read_elsewhere_keeps_its_kernel() -> None:
    """The row max is also an output: it is computed once, in its own kernel."""
    printed = fuse("""
        graph @main(%x: f32[8, 16]) {
          %0 = reduce_max(%x) {dims = [1], keepdim = true} : f32[8, 1]
          %1 = expand(%0) {shape = [8, 16]} : f32[8, 16]
          %2 = sub(%x, %1) : f32[8, 16]
          return %2, %0
        }""")
    assert attrs_of(printed) == ["kernel = 0", "fused_into = [1]", "kernel = 1"]


def test_column_reduction_is_not_joined() -> None:
    """A reduction over the first dim would be indexed by the inner loop: it stays alone."""
    printed = fuse("""
        graph @main(%x: f32[8, 16]) {
          %0 = reduce_sum(%x) {dims = [0], keepdim = true} : f32[1, 16]
          %1 = expand(%0) {shape = [8, 16]} : f32[8, 16]
          %2 = div(%x, %1) : f32[8, 16]
          return %2
        }""")
    assert attrs_of(printed) == ["kernel = 0", "fused_into = [1]", "kernel = 1"]


def test_row_kernel_loops() -> None:
    """Each reduction once per row, before the row's element loop; the sum's loop keeps
    `exp(x - max)` in the output row (`loopgen/row_cache.py`), so the element loop loads it
    instead of computing it again; the division by the row sum becomes one reciprocal per row."""
    got = lower(SOFTMAX)
    want = textwrap.dedent("""
        program @main(%x: f32[8, 16] strides [16, 1]) -> (%out0: f32[8, 16] strides [16, 1]) {
          call @k0(%x, %out0)
        }
        kernel @k0(%x: f32[8, 16] strides [16, 1], %out0: f32[8, 16] strides [16, 1]) {
          for i0 in 0..8 {
            alloc %acc3: f32[1] strides [1] local
            %acc3[0] = 0.0:f32
            alloc %acc6: f32[1] strides [1] local
            %acc6[0] = -inf:f32
            for r5 in 0..16 {
              let x7 = %x[i0, r5]
              %acc6[0] = max(%acc6[0], x7)
            }
            let t8 = %acc6[0]
            for r2 in 0..16 {
              let x4 = %x[i0, r2]
              let t9 = x4 - t8
              let t10 = exp(t9)
              %acc3[0] = %acc3[0] + t10
              %out0[i0, r2] = t10
            }
            let t11 = %acc3[0]
            let t13 = 1.0:f32 / t11
            for i1 in 0..16 {
              let c12 = %out0[i0, i1]
              let t14 = c12 * t13
              %out0[i0, i1] = t14
            }
          }
        }""").strip()
    assert got == want, got


def test_cheap_operand_is_recomputed() -> None:
    """`x - max` costs what a store and a load would: the element loop computes it again and
    nothing is stored into the output before the element loop."""
    got = lower("""
        graph @main(%x: f32[8, 16]) {
          %0 = reduce_max(%x) {dims = [1], keepdim = true} : f32[8, 1]
          %1 = expand(%0) {shape = [8, 16]} : f32[8, 16]
          %2 = sub(%x, %1) : f32[8, 16]
          %3 = reduce_sum(%2) {dims = [1], keepdim = true} : f32[8, 1]
          %4 = expand(%3) {shape = [8, 16]} : f32[8, 16]
          %5 = mul(%2, %4) : f32[8, 16]
          return %5
        }""")
    assert got.count("%out0[") == 1, got


def test_output_of_another_dtype_is_not_a_cache() -> None:
    """A softmax whose result is rounded to f16: `exp` kept in f16 would lose bits, so the
    element loop computes it again."""
    got = lower(SOFTMAX.replace("%6 = div(%3, %5) : f32[8, 16]",
                                "%6 = div(%3, %5) : f32[8, 16]\n      %7 = cast(%6) {dtype = f16} : f16[8, 16]")
                .replace("return %6", "return %7"))
    assert got.count("exp(") == 2 and got.count("%out0[") == 1, got


def _rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


CASES = {
    "softmax": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(37, 100) * 5,)),
    "softmax_3d": (lambda x: torch.softmax(x, -1), lambda: (torch.randn(3, 5, 33),)),
    "softmax_dim0": (lambda x: torch.softmax(x, 0), lambda: (torch.randn(19, 21),)),
    "softmax_strided": (lambda x: torch.softmax(x.t(), -1), lambda: (torch.randn(40, 24),)),
    "log_softmax": (lambda x: F.log_softmax(x, -1), lambda: (torch.randn(16, 70),)),
    "softmax_inf_rows": (lambda x: torch.softmax(x, -1),
                         lambda: (torch.tensor([[float("-inf"), 0.0, 1.0], [5.0, float("-inf"), -2.0]]),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
                   lambda: (torch.randn(33, 130) * 3 + 1, torch.randn(130), torch.randn(130))),
    "layer_norm_2d": (lambda x: F.layer_norm(x, x.shape[-2:]), lambda: (torch.randn(4, 6, 20),)),
    "rms_norm": (_rms, lambda: (torch.randn(2, 9, 64), torch.randn(64))),
    "norm_then_linear": (lambda x, w: F.linear(_rms(x, w[0]), w), lambda: (torch.randn(8, 48), torch.randn(48, 48))),
}


@pytest.mark.parametrize("name", list(CASES))
def test_matches_eager(name: str) -> None:
    fn, make = CASES[name]
    args = make()
    with torch.no_grad():
        got, records = run_compiled(fn, *args)
        torch.testing.assert_close(got, fn(*args), rtol=1e-5, atol=1e-5)
    assert_fully_compiled(records)


def test_softmax_symbolic_rows_matches_eager() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.softmax(x, -1), backend="torchburn", dynamic=True)
    for n in (3, 17, 1):
        x = torch.randn(n, 40)
        torch.testing.assert_close(f(x), torch.softmax(x, -1))


@pytest.mark.parametrize("name", ["softmax", "layer_norm", "rms_norm"])
def test_one_kernel_through_the_compiler(name: str) -> None:
    fn, make = CASES[name]
    with torch.no_grad():
        _, records = run_compiled(fn, *make())
    assert_fully_compiled(records)
    kernels = [k for r in records for s in r.subgraphs for k in s.kernels]
    assert len(kernels) == 1, kernels


# A softmax masked by a gather at computed indices (the causal mask of transformers' Llama):
# the gather's clamped index is a `let` inside the row loops, so the gather's load must stay
# below it (it was hoisted above every loop: "variable 't18' is not bound here").
GATHER_MASKED_SOFTMAX = """
    graph @main(%pos: i64[2, 8], %x: f32[2, 4, 8, 8]) {
      %0 = iota() {shape = [2], dim = 0, start = 0, step = 1, dtype = i64} : i64[2]
      %1 = reshape(%0) {shape = [2, 1]} : i64[2, 1]
      %2 = iota() {shape = [8], dim = 0, start = 0, step = 1, dtype = i64} : i64[8]
      %3 = reshape(%2) {shape = [1, 8]} : i64[1, 8]
      %4 = expand(%1) {shape = [2, 8]} : i64[2, 8]
      %5 = expand(%3) {shape = [2, 8]} : i64[2, 8]
      %6 = index(%pos, %4, %5) {dims = [0, 1], pos = 0} : i64[2, 8]
      %7 = reshape(%3) {shape = [1, 1, 8]} : i64[1, 1, 8]
      %8 = reshape(%6) {shape = [2, 8, 1]} : i64[2, 8, 1]
      %9 = expand(%7) {shape = [2, 8, 8]} : i64[2, 8, 8]
      %10 = expand(%8) {shape = [2, 8, 8]} : i64[2, 8, 8]
      %11 = le(%9, %10) : bool[2, 8, 8]
      %12 = reshape(%11) {shape = [2, 1, 8, 8]} : bool[2, 1, 8, 8]
      %13 = full() {shape = [], value = -inf, dtype = f32} : f32[]
      %14 = expand(%12) {shape = [2, 4, 8, 8]} : bool[2, 4, 8, 8]
      %15 = reshape(%13) {shape = [1, 1, 1, 1]} : f32[1, 1, 1, 1]
      %16 = expand(%15) {shape = [2, 4, 8, 8]} : f32[2, 4, 8, 8]
      %17 = where(%14, %x, %16) : f32[2, 4, 8, 8]
      %18 = reduce_max(%17) {dims = [3], keepdim = true} : f32[2, 4, 8, 1]
      %19 = expand(%18) {shape = [2, 4, 8, 8]} : f32[2, 4, 8, 8]
      %20 = sub(%17, %19) : f32[2, 4, 8, 8]
      %21 = exp(%20) : f32[2, 4, 8, 8]
      %22 = reduce_sum(%21) {dims = [3], keepdim = true} : f32[2, 4, 8, 1]
      %23 = expand(%22) {shape = [2, 4, 8, 8]} : f32[2, 4, 8, 8]
      %24 = div(%21, %23) : f32[2, 4, 8, 8]
      return %24
    }
"""


def test_gather_in_a_row_kernel_loads_where_its_index_is_bound() -> None:
    program = LowerToLoops().run(Fuse().run(parse_graph(textwrap.dedent(GATHER_MASKED_SOFTMAX))))
    verify(program)  # every variable bound before use
    text = print_program(program)
    load = next(line for line in text.splitlines() if "%pos[" in line)
    assert not load.startswith("  let"), f"the gather's load sits outside every loop:\n{text}"


def test_gather_masked_softmax_compiles_and_matches_eager() -> None:
    def fn(x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        p = pos[torch.arange(2)[:, None], torch.arange(32)[None, :]]
        mask = torch.arange(32)[None, None, :] <= p[:, :, None]
        return torch.where(mask[:, None], x, float("-inf")).softmax(-1)

    x, pos = torch.randn(2, 4, 32, 32), torch.randint(0, 32, (2, 32))
    out, reports = run_compiled(fn, x, pos)
    torch.testing.assert_close(out, fn(x, pos))
    assert_fully_compiled(reports)


def test_a_reduction_behind_a_value_inlined_elsewhere_keeps_its_kernel() -> None:
    """`%2 = x - sum(x)` is cheap, so the plain rules inline it into both of its readers (the
    row kernel of `%3` and the kernel of `%4`, a permuted copy). Joined into `%3`'s kernel, the
    row sum would also be computed inside `%4`'s, once per element (a layer norm's backward
    seen by a convolution's epilogue in ConvNeXt-T: 384 channels summed per element): it keeps
    its own kernel."""
    printed = fuse("""
        graph @main(%x: f32[8, 16]) {
          %0 = reduce_sum(%x) {dims = [1], keepdim = true} : f32[8, 1]
          %1 = expand(%0) {shape = [8, 16]} : f32[8, 16]
          %2 = sub(%x, %1) : f32[8, 16]
          %3 = exp(%2) : f32[8, 16]
          %4 = permute(%2) {dims = [1, 0]} : f32[16, 8]
          %5 = neg(%4) : f32[16, 8]
          return %3, %5
        }""")
    lines = [line for line in printed.splitlines() if "reduce_sum" in line]
    assert len(lines) == 1 and "kernel = " in lines[0], printed
