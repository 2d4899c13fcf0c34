"""GEMM kernels (`passes/loopgen/matmul.py`) and epilogue fusion (`fuse`).

Results against torch/numpy for many shapes, layouts and dtypes; every blocking path forced
through small cache sizes, both operand roles (`swap`), serial and parallel splits; the
fused epilogue seen in the IR (one kernel per linear layer); and no access outside any
buffer, checked with guard pages around every operand.
"""
from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from typing import Any, Optional, Sequence

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from tests.helpers import assert_fully_compiled, check, run_compiled
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify
from torchburn.passes.base import PASSES, PassManager, get_pass
from torchburn.passes.tensor.fusion import Fuse
from torchburn.ir.target import Target
from torchburn.passes.loopgen.matmul import CpuInfo, plan_gemm
from torchburn.passes.pipeline import DEFAULT_LOOP, Pipeline

NUMPY = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i64": np.int64}

# The whole loop pipeline, where its passes exist in this tree (they run on GEMM kernels too).
LOOP_MODULES = ("simplify", "parallelize", "vectorize", "expand_math", "unroll")


def _loop_passes() -> list[Any]:
    import importlib

    for m in LOOP_MODULES:
        importlib.import_module("torchburn.passes.loop." + m)
    return [get_pass(n)() for n in DEFAULT_LOOP if n in PASSES]


@pytest.fixture(autouse=True)
def _no_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compiled programs stay in this process: the tests compare plans, not the disk cache."""
    from torchburn.compiler import driver

    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    driver.memory_cache().clear()


# ---- compiling tensor IR directly ------------------------------------------------------------

def matmul_graph(m: Any, n: Any, k: Any, dtype: str = "f32", b_transposed: bool = False,
                 batch: Sequence[Any] = (), epilogue: str = "") -> str:
    """`out = epilogue(a @ b)`; with `b_transposed` B is given as `w: [n, k]` (a Linear)."""
    bt = ", ".join(str(d) for d in batch) + (", " if batch else "")
    rank = len(batch) + 2
    perm = list(range(len(batch))) + [rank - 1, rank - 2]
    lines = [f"graph @g(%a: {dtype}[{bt}{m}, {k}], %w: {dtype}[{bt}{n if b_transposed else k}, "
             f"{k if b_transposed else n}], %bias: {dtype}[{n}]) {{"]
    if b_transposed:
        lines.append(f"  %0 = permute(%w) {{dims = {perm}}} : {dtype}[{bt}{k}, {n}]")
        lines.append(f"  %1 = matmul(%a, %0) : {dtype}[{bt}{m}, {n}]")
    else:
        lines.append(f"  %1 = matmul(%a, %w) : {dtype}[{bt}{m}, {n}]")
    last = "%1"
    if epilogue:
        lines.append(f"  %2 = expand(%bias) {{shape = [{bt}{m}, {n}]}} : {dtype}[{bt}{m}, {n}]")
        lines.append(f"  %3 = add(%1, %2) : {dtype}[{bt}{m}, {n}]")
        lines.append(f"  %4 = {epilogue}(%3) : {dtype}[{bt}{m}, {n}]")
        last = "%4"
    lines += [f"  return {last}", "}"]
    return "\n".join(lines)


class Compiled:
    """A tensor graph compiled through the pipeline, callable on numpy arrays."""

    def __init__(self, text: str, full_pipeline: bool = True, machine: Optional[Target] = None,
                 swap: Optional[bool] = None, lowering: Optional[LowerToLoops] = None) -> None:
        """`machine` is the target the passes plan for (the host by default; code is always
        for the host); `swap` forces the GEMM plan's roles (`lower-to-loops{gemm_swap=...}`);
        `lowering` replaces the lowering pass (its options)."""
        from torchburn.codegen import emit_program, entry_name, host_target
        from torchburn.passes.lower_to_loops import LowerToLoops
        from torchburn.runtime import jit

        graph = parse_graph(text)
        pipeline = Pipeline.default()
        if swap is not None:
            pipeline.lowering = LowerToLoops(gemm_swap="always" if swap else "never")
        if lowering is not None:
            pipeline.lowering = lowering
        if full_pipeline:
            pipeline.loop = _loop_passes()
        target = host_target()
        self.program = PassManager(pipeline.passes(), target=machine or target).run(graph)
        verify(self.program)
        self.native = jit.load_object(jit.compile_llvm_ir(emit_program(self.program, target), target))
        self.entry = self.native.entry(entry_name(self.program))

    def __call__(self, arrays: dict[str, np.ndarray], symbols: Sequence[int] = ()) -> None:
        names = [b.name for b in (*self.program.inputs, *self.program.outputs)]
        ptrs = (ctypes.c_void_p * len(names))(*[arrays[n].ctypes.data for n in names])
        syms = (ctypes.c_int64 * max(1, len(symbols)))(*symbols)
        ws = None
        size = int(getattr(self.program.workspace_bytes, "value", 0))
        if size:
            self._ws = np.zeros(size + 64, np.uint8)
            ws = self._ws.ctypes.data
        self.entry(ctypes.addressof(ptrs), ctypes.addressof(syms), ws)

    @property
    def plans(self) -> list[str]:
        return [p for k in self.program.kernels for p in dict(k.attrs).get("gemm", "").split(" | ") if p]


def reference(a: np.ndarray, w: np.ndarray, bias: np.ndarray, b_transposed: bool, epilogue: str) -> np.ndarray:
    b = np.swapaxes(w, -1, -2) if b_transposed else w
    out = np.matmul(a.astype(np.float64), b.astype(np.float64))
    if epilogue:
        out = out + bias
        out = {"tanh": np.tanh, "exp": np.exp, "neg": np.negative}[epilogue](out)
    return out


def run_case(m: int, n: int, k: int, *, dtype: str = "f32", b_transposed: bool = False, batch: Sequence[int] = (),
             epilogue: str = "", full_pipeline: bool = True, seed: int = 0, machine: Optional[Target] = None,
             swap: Optional[bool] = None) -> Compiled:
    compiled = Compiled(matmul_graph(m, n, k, dtype, b_transposed, batch, epilogue), full_pipeline, machine, swap)
    rng = np.random.default_rng(seed)
    np_t = NUMPY[dtype]
    a = rng.integers(-3, 4, (*batch, m, k)).astype(np_t) if dtype == "i64" else rng.standard_normal((*batch, m, k)).astype(np_t)
    wshape = (*batch, n, k) if b_transposed else (*batch, k, n)
    w = rng.integers(-3, 4, wshape).astype(np_t) if dtype == "i64" else rng.standard_normal(wshape).astype(np_t)
    bias = rng.standard_normal(n).astype(np_t)
    out = np.full((*batch, m, n), np.nan if dtype != "i64" else -7, np_t)
    compiled({"a": a, "w": w, "bias": bias, "out0": out})
    expected = reference(a, w, bias, b_transposed, epilogue)
    if dtype == "i64":
        np.testing.assert_array_equal(out, expected.astype(np.int64))
    else:
        tol = 1e-4 if dtype == "f32" else 1e-10
        np.testing.assert_allclose(out, expected, rtol=tol, atol=tol * max(1.0, np.sqrt(k)))
    return compiled


def tiny_cpu(threads: int = 2, l2: int = 64 * 1024, bits: int = 512) -> Target:
    """A machine with a small L2: K > 256 takes the partial-sum path (k blocks of 128)."""
    return Target(vector_bits=bits, l1_bytes=32 * 1024, l2_bytes=l2, threads=threads, name="tiny")


# ---- plans ---------------------------------------------------------------------------------------

def test_plan_avx512_f32() -> None:
    cpu = CpuInfo(vector_bits=512, l2_bytes=1 << 20, threads=2)
    p = plan_gemm(1024, 1024, 1024, 1, gemm_dtype("f32"), cpu)
    assert (p.lanes, p.mr, p.nr, p.kc, p.parallel) == (16, 8, 32, 0, "columns")
    assert p.nc * 1024 * 4 <= (1 << 19) and 1024 // p.nc % 2 == 0  # B block in half of L2; even split
    big_k = plan_gemm(1024, 1024, 8192, 1, gemm_dtype("f32"), cpu)
    assert big_k.kc == 512 and big_k.mc % big_k.mr == 0
    assert plan_gemm(8, 8, 8, 1, gemm_dtype("f32"), cpu).parallel == ""  # too small to share
    assert plan_gemm(4096, 16, 512, 1, gemm_dtype("f32"), cpu).parallel == "rows"  # one column panel
    f64 = plan_gemm(64, 64, 64, 1, gemm_dtype("f64"), cpu)
    assert (f64.lanes, f64.nr) == (8, 16)


#: Named targets with the micro-tile each must get: (MR, NR) in f32 elements.
TARGET_TILES = {"avx2": (6, 16), "avx512": (8, 32), "neon": (8, 8),
                "x86_64-unknown-linux-gnu:x86-64:+sse,+sse2": (6, 8)}


def _tile_of(plan: str) -> tuple[int, int]:
    fields = dict(f.split("=") for f in plan.split() if "=" in f)
    return int(fields["mr"]), int(fields["nr"])


@pytest.mark.parametrize("name", sorted(TARGET_TILES))
def test_micro_tile_fits_the_targets_registers(name: str) -> None:
    """`lower-to-loops` under each target's `PassContext` picks a micro-tile whose
    accumulators, B vectors, broadcast of A (unless the fma takes it from memory) and, without
    FMA, the product before its add, fit the target's SIMD registers: 16 ymm on AVX2 (a tile of
    8 x 16 there spilled every accumulator once per k step)."""
    from torchburn.codegen.target import named_target
    from torchburn.ir import dtypes as dt

    target = named_target(name)
    graph = parse_graph(matmul_graph(96, 96, 64))
    program = PassManager([Fuse(), get_pass("lower-to-loops")()], target=target).run(graph)
    (plan,) = [p for k in program.kernels for p in dict(k.attrs)["gemm"].split(" | ")]
    mr, nr = _tile_of(plan)
    assert (mr, nr) == TARGET_TILES[name], plan
    nvec = nr // target.lanes(dt.f32)
    extra = (0 if target.fma_broadcast_operand() else 1) + (0 if target.has_fma() else 1)
    assert mr * nvec + nvec + extra <= target.vector_registers()
    assert ("mul-add" in plan) == (not target.has_fma())


def test_micro_tile_rule() -> None:
    """`micro_tile`: the most accumulators that fit, ties to more B vectors, at most 8 rows."""
    from torchburn.passes.loopgen.matmul import micro_tile

    assert micro_tile(CpuInfo(vector_bits=256)) == (6, 2)
    assert micro_tile(CpuInfo(vector_bits=256), max_vectors=1) == (8, 1)
    assert micro_tile(CpuInfo(vector_bits=512)) == (8, 2)
    assert micro_tile(CpuInfo(vector_bits=128, registers=32, broadcast_operand=False)) == (8, 2)
    assert micro_tile(CpuInfo(vector_bits=128, registers=8, fma=False)) == (5, 1)
    assert micro_tile(CpuInfo(vector_bits=256, registers=4)) == (2, 1)
    # 16 f16 lanes accumulating in f32 take two ymm registers per vector
    assert micro_tile(CpuInfo(vector_bits=256), per_vector=2) == (6, 1)
    half = plan_gemm(64, 64, 64, 1, gemm_dtype("f16"), CpuInfo(vector_bits=256))
    assert (half.mr, half.nr) == (6, 16)


def _loops(asm: str) -> list[list[str]]:
    """The bodies of the innermost loops of x86 assembly: from a label to a jump back to it."""
    lines = asm.splitlines()
    where: dict[str, int] = {}
    bodies = []
    for i, line in enumerate(lines):
        text = line.strip()
        if text.endswith(":") and text.startswith(".LBB"):
            where[text[:-1]] = i
        elif text.startswith("j") and text.split()[-1] in where:
            bodies.append(lines[where[text.split()[-1]] + 1:i])
    return [b for b in bodies if not any(x.strip().startswith(".LBB") for x in b)]


@pytest.mark.parametrize("m,fmas", [(96, 12), (2, 12), (3, 12), (4, 8)])
def test_avx2_micro_kernel_keeps_its_accumulators_in_registers(m: int, fmas: int) -> None:
    """The AVX2 k loop (assembly for x86-64-v3) of the tiled form (6 x 16: 12 ymm fmas per k
    step) and of the dot form for 2 to 4 rows: no load or store of the stack among the fmas."""
    from torchburn.codegen.target import named_target
    from torchburn.compiler import driver

    graph = parse_graph(matmul_graph(m, 96, 64 if m > 4 else 512, b_transposed=m <= 4))
    compiled, _ = driver.compile_graph(graph, target=named_target("avx2"))
    kernels = [b for b in _loops(compiled.assembly()) if sum("vfmadd" in x for x in b) >= fmas]
    assert kernels, "no loop of fmas in the AVX2 assembly"
    for body in kernels:
        assert all("ymm" in x for x in body if "vfmadd" in x)
        assert not [x for x in body if "(%rsp)" in x], "\n".join(body)


#: Odd sizes on AVX2's 6 x 16 tile: edge panels of every width, single rows and columns.
ODD_SHAPES = [(1, 1023, 17), (7, 255, 1023), (17, 7, 255), (255, 17, 7), (1023, 1, 255),
              (1023, 255, 17), (255, 1023, 1), (7, 17, 1), (1, 1, 1023), (255, 255, 255)]


@pytest.mark.parametrize("m,n,k", ODD_SHAPES)
@pytest.mark.parametrize("b_transposed", [False, True])
def test_odd_sizes_on_avx2(m: int, n: int, k: int, b_transposed: bool) -> None:
    from torchburn.codegen.target import named_target

    target = named_target("avx2")
    if not runs_here_on(target):
        pytest.skip("AVX2 code does not run on this machine")
    c = run_case(m, n, k, b_transposed=b_transposed, epilogue="tanh" if (m + n) % 2 else "", machine=target)
    assert all(_tile_of(p)[1] in (8, 16) for p in c.plans if not p.startswith("dot"))


def runs_here_on(target: Target) -> bool:
    from torchburn.codegen.target import runs_here

    return runs_here(target)


def gemm_dtype(name: str) -> Any:
    from torchburn.ir import dtypes as dt

    return getattr(dt, name)


# ---- results ---------------------------------------------------------------------------------------

SHAPES = [(1, 1, 1), (1, 7, 3), (5, 1, 9), (8, 32, 1), (17, 33, 65), (64, 96, 40), (3, 100, 5),
          (33, 70, 700), (100, 20, 300), (129, 257, 31)]


@pytest.mark.parametrize("m,n,k", SHAPES)
@pytest.mark.parametrize("b_transposed", [False, True])
def test_shapes_default_plans(m: int, n: int, k: int, b_transposed: bool) -> None:
    run_case(m, n, k, b_transposed=b_transposed)


@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("m,n,k", [(37, 70, 600), (8, 40, 257), (70, 37, 513), (1, 33, 300)])
@pytest.mark.parametrize("b_transposed", [False, True])
def test_partial_sums_edges_and_roles(swap: bool, m: int, n: int, k: int, b_transposed: bool) -> None:
    """Small L2 (k blocks of 128 with partial sums), two threads, both operand roles, edge
    tiles in every direction, and a bias + tanh epilogue applied only after the last k block."""
    c = run_case(m, n, k, b_transposed=b_transposed, epilogue="tanh", machine=tiny_cpu(), swap=swap)
    assert all("kc=K" not in p for p in c.plans) and all(("swap" in p) == swap for p in c.plans)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("swap", [False, True])
def test_parallel_splits(threads: int, swap: bool) -> None:
    for m, n, k in ((300, 40, 64), (64, 1000, 64), (45, 300, 70)):
        run_case(m, n, k, b_transposed=True, epilogue="neg", machine=tiny_cpu(threads=threads, l2=1 << 20), swap=swap)


@pytest.mark.parametrize("m", [1, 2, 3, 4])
def test_dot_form_for_few_rows(m: int) -> None:
    """A few rows times a weight: vectors along k, a scalar tail for K % W, lanes summed."""
    machine = tiny_cpu(threads=2, l2=1 << 20)
    for n, k in ((1, 1), (9, 15), (70, 16), (33, 300)):
        c = run_case(m, n, k, b_transposed=True, epilogue="tanh" if n % 2 else "", machine=machine)
        assert all(p.startswith("dot") for p in c.plans)
    run_case(m, 1000, 700, b_transposed=True, machine=machine)  # parallel over column blocks
    run_case(m, 40, 33, batch=(3,), b_transposed=True, epilogue="neg", machine=machine)
    assert not any(p.startswith("dot") for p in run_case(m, 40, 33, machine=machine).plans)  # B runs along n


def test_gemm_options_are_pass_options_in_the_cache_key() -> None:
    """`lower-to-loops{gemm_swap=always,gemm_dot=false}` parses, spells back, changes the
    pass's `uuid()` (so the cache key), and forces the plans it names."""
    from torchburn.passes.base import PassError, parse_pipeline
    from torchburn.passes.lower_to_loops import LowerToLoops

    (p,) = parse_pipeline("lower-to-loops{gemm_swap=always,gemm_dot=false,gemm_direct_b=false}")
    assert p == LowerToLoops(gemm_swap="always", gemm_direct_b=False, gemm_dot=False)
    assert p.spelling() == "lower-to-loops{gemm_swap=always,gemm_direct_b=false,gemm_dot=false}"
    assert len({p.uuid(), LowerToLoops().uuid(), LowerToLoops(gemm_dot=False).uuid()}) == 3
    with pytest.raises(PassError, match="gemm_swap"):
        parse_pipeline("lower-to-loops{gemm_swap=sometimes}")
    machine = tiny_cpu(threads=2, l2=1 << 20)
    assert all(p.startswith("dot") for p in run_case(2, 33, 300, b_transposed=True, machine=machine).plans)
    # gemm_dot=false (through the pipeline string) and a forced swap: the swapped tiled form
    graph = parse_graph(matmul_graph(2, 33, 300, b_transposed=True))
    pipeline = Pipeline.default()
    pipeline.lowering = p
    program = PassManager(pipeline.passes(), target=machine).run(graph)
    plans = [dict(k.attrs).get("gemm", "") for k in program.kernels]
    assert plans and all("swap" in x and not x.startswith("dot") for x in plans)


@pytest.mark.parametrize("bits", [128, 256])
def test_narrower_vectors(bits: int) -> None:
    run_case(21, 45, 300, b_transposed=True, epilogue="tanh", machine=tiny_cpu(bits=bits))
    run_case(21, 45, 30, machine=tiny_cpu(bits=bits))


def test_without_loop_passes() -> None:
    """The kernel is correct as lower-to-loops builds it (no vectorize, no simplify)."""
    run_case(37, 70, 50, b_transposed=True, epilogue="tanh", full_pipeline=False)
    run_case(70, 37, 50, epilogue="exp", full_pipeline=False)


@pytest.mark.parametrize("dtype", ["f64", "i64"])
def test_other_dtypes(dtype: str) -> None:
    run_case(19, 35, 23, dtype=dtype)
    run_case(19, 35, 23, dtype=dtype, b_transposed=True)


def test_batched() -> None:
    run_case(9, 40, 33, batch=(3,))
    run_case(9, 40, 33, batch=(2, 3), b_transposed=True, epilogue="tanh")


def test_empty_dims() -> None:
    for m, n, k in ((0, 5, 4), (4, 0, 5), (4, 5, 0)):
        run_case(m, n, k, b_transposed=True)
    c = Compiled(matmul_graph(6, 5, 0, epilogue="exp"))
    out = np.zeros((6, 5), np.float32)
    bias = np.arange(5, dtype=np.float32)
    c({"a": np.zeros((6, 0), np.float32), "w": np.zeros((0, 5), np.float32), "bias": bias, "out0": out})
    np.testing.assert_allclose(out, np.exp(np.broadcast_to(bias, (6, 5))), rtol=1e-6)


@pytest.mark.parametrize("swap", [None, False, True])
@pytest.mark.parametrize("constant", ["a", "b"])
def test_constant_operand(constant: str, swap: Optional[bool]) -> None:
    """One operand a `full` fused into the GEMM (an RNN's zero initial state times its weight):
    probing that operand emits no statement, and the scope it closes must still be closed (the
    kernel builder once left its statement list open, and the pack loop's lets landed outside
    their loop: 'variable j4 is not bound')."""
    m, n, k = 6, 40, 9
    const = f"f32[{m}, {k}]" if constant == "a" else f"f32[{k}, {n}]"
    other = f"%x: f32[{k}, {n}]" if constant == "a" else f"%x: f32[{m}, {k}]"
    operands = "%2, %x" if constant == "a" else "%x, %2"
    text = textwrap.dedent(f"""\
        graph @g({other}, %bias: f32[{n}]) {{
          %0 = full() {{shape = [], value = 1.5, dtype = f32}} : f32[]
          %1 = reshape(%0) {{shape = [1, 1]}} : f32[1, 1]
          %2 = expand(%1) {{shape = [{const[4:-1]}]}} : {const}
          %3 = matmul({operands}) : f32[{m}, {n}]
          %4 = expand(%bias) {{shape = [{m}, {n}]}} : f32[{m}, {n}]
          %5 = add(%3, %4) : f32[{m}, {n}]
          %6 = tanh(%5) : f32[{m}, {n}]
          return %6
        }}""")
    c = Compiled(text, swap=swap)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((k, n) if constant == "a" else (m, k)).astype(np.float32)
    bias = rng.standard_normal(n).astype(np.float32)
    out = np.full((m, n), np.nan, np.float32)
    c({"x": x, "bias": bias, "out0": out})
    full = np.full((m, k) if constant == "a" else (k, n), 1.5)
    product = full @ x if constant == "a" else x @ full
    np.testing.assert_allclose(out, np.tanh(product + bias), rtol=1e-5, atol=1e-5)


def test_symbolic_sizes() -> None:
    """Symbolic M, N and K: run-time blocking, both plans behind a test of M."""
    c = Compiled(matmul_graph("s0", 70, 40, b_transposed=True, epilogue="tanh"))
    assert len(c.plans) == 2
    rng = np.random.default_rng(1)
    w = rng.standard_normal((70, 40)).astype(np.float32)
    bias = rng.standard_normal(70).astype(np.float32)
    for m in (1, 7, 600, 1300):
        a = rng.standard_normal((m, 40)).astype(np.float32)
        out = np.zeros((m, 70), np.float32)
        c({"a": a, "w": w, "bias": bias, "out0": out}, [m])
        np.testing.assert_allclose(out, reference(a, w, bias, True, "tanh"), rtol=1e-4, atol=1e-4)
    c = Compiled(matmul_graph("s0", "s1", "s2"))
    for m, n, k in ((3, 5, 7), (40, 70, 1100), (1, 1, 1)):
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        out = np.zeros((m, n), np.float32)
        c({"a": a, "w": b, "bias": np.zeros(n, np.float32), "out0": out}, [m, k, n])
        np.testing.assert_allclose(out, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-3)


# ---- through torch.compile ----------------------------------------------------------------------------

def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a @ b


def test_layouts_through_torch_compile() -> None:
    torch.manual_seed(0)
    a = torch.randn(37, 50)
    b = torch.randn(50, 70)
    check(mm, a, b)
    check(mm, a, torch.randn(70, 50).t())                      # B transposed (a Linear)
    check(mm, torch.randn(50, 37).t(), b)                      # A transposed
    check(mm, torch.randn(37, 100)[:, ::2], torch.randn(50, 140)[:, 1::2])  # strided slices
    check(mm, a, torch.randn(50, 1).expand(50, 70))            # a broadcast operand
    check(lambda x, y: torch.bmm(x, y), torch.randn(3, 9, 33), torch.randn(3, 33, 17))
    check(lambda x, y: x @ y, torch.randn(2, 3, 9, 33), torch.randn(33, 17))


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_dtypes_through_torch_compile(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x, w, b = torch.randn(37, 50, dtype=dtype), torch.randn(70, 50, dtype=dtype), torch.randn(70, dtype=dtype)
    check(lambda x, w, b: F.gelu(F.linear(x, w, b)), x, w, b)


def test_large_k_through_torch_compile() -> None:
    torch.manual_seed(0)
    check(mm, torch.randn(33, 2100), torch.randn(2100, 45), rtol=1e-4, atol=1e-3)


def test_dynamic_batch_through_torch_compile() -> None:
    torch.manual_seed(0)
    w, b = torch.randn(300, 70), torch.randn(300)

    def fn(x: torch.Tensor) -> torch.Tensor:
        return F.gelu(F.linear(x, w, b))

    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="torchburn", dynamic=True)
    for m in (2, 5, 17, 700, 40):
        x = torch.randn(m, 70)
        torch.testing.assert_close(compiled(x), fn(x), rtol=1e-4, atol=1e-5)


# ---- epilogue fusion ---------------------------------------------------------------------------------

def fused(text: str) -> Any:
    g = parse_graph(textwrap.dedent(text))
    Fuse().run(g)
    return {op.result.name: (op.attrs.get("kernel"), op.attrs.get("fused_into")) for op in g.ops}


def test_fuse_docstring_example() -> None:
    attrs = fused("""
        graph @main(%x: f32[32, 512], %w: f32[1024, 512], %b: f32[1024]) {
          %0 = permute(%w) {dims = [1, 0]} : f32[512, 1024]
          %1 = matmul(%x, %0) : f32[32, 1024]
          %2 = expand(%b) {shape = [32, 1024]} : f32[32, 1024]
          %3 = add(%1, %2) : f32[32, 1024]
          %4 = tanh(%3) : f32[32, 1024]
          return %4
        }
    """)
    assert attrs == {"0": (None, (0,)), "1": (None, (0,)), "2": (None, (0,)), "3": (None, (0,)), "4": (0, None)}


def test_fuse_keeps_matmul_alone_when_it_must() -> None:
    # Returned: the product itself is an output.
    assert fused("""
        graph @g(%x: f32[4, 8], %y: f32[8, 5]) {
          %0 = matmul(%x, %y) : f32[4, 5]
          %1 = exp(%0) : f32[4, 5]
          return %0, %1
        }
    """)["0"] == (0, None)
    # Read by two kernels.
    assert fused("""
        graph @g(%x: f32[4, 8], %y: f32[8, 5]) {
          %0 = matmul(%x, %y) : f32[4, 5]
          %1 = exp(%0) : f32[4, 5]
          %2 = neg(%0) : f32[4, 5]
          return %1, %2
        }
    """)["0"] == (0, None)
    # Read through a view (another index) or by a reduction.
    assert fused("""
        graph @g(%x: f32[4, 8], %y: f32[8, 4]) {
          %0 = matmul(%x, %y) : f32[4, 4]
          %1 = permute(%0) {dims = [1, 0]} : f32[4, 4]
          %2 = add(%0, %1) : f32[4, 4]
          return %2
        }
    """)["0"] == (0, None)
    assert fused("""
        graph @g(%x: f32[4, 8], %y: f32[8, 5]) {
          %0 = matmul(%x, %y) : f32[4, 5]
          %1 = reduce_sum(%0) {dims = [1], keepdim = false} : f32[4]
          return %1
        }
    """)["0"] == (0, None)


def test_fuse_one_matmul_per_kernel() -> None:
    attrs = fused("""
        graph @g(%x: f32[4, 8], %y: f32[8, 5], %z: f32[8, 5]) {
          %0 = matmul(%x, %y) : f32[4, 5]
          %1 = matmul(%x, %z) : f32[4, 5]
          %2 = add(%0, %1) : f32[4, 5]
          return %2
        }
    """)
    assert attrs["0"] == (None, (1,)) and attrs["1"] == (0, None) and attrs["2"] == (1, None)
    c = Compiled("""graph @g(%x: f32[4, 8], %y: f32[8, 5], %z: f32[8, 5]) {
  %0 = matmul(%x, %y) : f32[4, 5]
  %1 = matmul(%x, %z) : f32[4, 5]
  %2 = add(%0, %1) : f32[4, 5]
  return %2
}""")
    rng = np.random.default_rng(0)
    x, y, z = (rng.standard_normal(s).astype(np.float32) for s in ((4, 8), (8, 5), (8, 5)))
    out = np.zeros((4, 5), np.float32)
    c({"x": x, "y": y, "z": z, "out0": out})
    np.testing.assert_allclose(out, x @ y + x @ z, rtol=1e-5, atol=1e-5)



def test_epilogue_through_a_reshape_of_rows() -> None:
    """A linear layer on `[batch, seq, features]` multiplies `[batch * seq, features]` and
    reshapes back; activations and residual adds after the reshape still join the GEMM."""
    from torchburn.compiler import driver

    torch.manual_seed(0)
    w, b = torch.randn(70, 50), torch.randn(70)
    cases = [
        (lambda x: F.gelu(F.linear(x, w, b)), torch.randn(3, 37, 50)),
        (lambda x: F.gelu(F.linear(x, w, b)), torch.randn(3, 2, 50)),            # swapped roles
        (lambda x: F.gelu(F.linear(x, w, b)), torch.randn(2, 1, 50)),            # dot form
        (lambda x: torch.tanh(x @ w.t()) * 2 + x.sum(-1, keepdim=True), torch.randn(2, 5, 7, 50)),
    ]
    for fn, x in cases:
        driver.memory_cache().clear()
        check(fn, x)
        gemm_kernels = [k for c in driver.memory_cache().entries.values() for k in c.program.kernels
                        if "gemm" in dict(k.attrs)]
        assert len(gemm_kernels) == 1 and ("erf" in print_ir(gemm_kernels[0]) or "tanh" in print_ir(gemm_kernels[0]))
    attrs = fused("""
        graph @g(%x: f32[6, 8], %y: f32[8, 5]) {
          %0 = matmul(%x, %y) : f32[6, 5]
          %1 = reshape(%0) {shape = [2, 3, 5]} : f32[2, 3, 5]
          %2 = exp(%1) : f32[2, 3, 5]
          return %2
        }
    """)
    assert attrs["0"] == (None, (0,)) and attrs["2"] == (0, None)
    # A reshape that moves elements across columns is another index: no fusion.
    assert fused("""
        graph @g(%x: f32[6, 8], %y: f32[8, 4]) {
          %0 = matmul(%x, %y) : f32[6, 4]
          %1 = reshape(%0) {shape = [12, 2]} : f32[12, 2]
          %2 = exp(%1) : f32[12, 2]
          return %2
        }
    """)["0"] == (0, None)


def test_linear_bias_gelu_is_one_gemm_kernel() -> None:
    """Bias and GELU are computed inside the GEMM kernel: one kernel per linear layer."""
    from torchburn.compiler import driver

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 40)).eval()
    x = torch.randn(24, 64)
    with torch.no_grad():
        out, reports = run_compiled(model, x)
        torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-5)
    assert_fully_compiled(reports)
    programs = [c.program for c in driver.memory_cache().entries.values()]
    assert len(programs) == 1
    program = programs[0]
    assert len(program.kernels) == 2
    first, second = (print_ir(k) for k in program.kernels)
    for k in program.kernels:
        assert "gemm" in dict(k.attrs)
    for text in (first, second):
        assert "fma(" in text
    assert "erf" in first and "%arg" in first  # GELU (erf form) and the bias in the first GEMM
    assert "erf" not in second


# ---- no access outside any buffer ----------------------------------------------------------------------

GUARD_SCRIPT = r'''
import ctypes, mmap, sys
import numpy as np
sys.path.insert(0, {root!r})
from tests.passes import test_matmul as t

libc = ctypes.CDLL(None)
libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
PAGE = mmap.PAGESIZE
keep = []

def guarded(shape, dtype, at_end):
    """An array with a PROT_NONE page right after (at_end) or right before its data."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    body = (nbytes + PAGE - 1) // PAGE * PAGE
    mm = mmap.mmap(-1, body + 2 * PAGE)
    keep.append(mm)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    libc.mprotect(base, PAGE, 0)
    libc.mprotect(base + PAGE + body, PAGE, 0)
    offset = PAGE + (body - nbytes if at_end else 0)
    arr = np.frombuffer(mm, dtype=dtype, count=int(np.prod(shape)), offset=offset).reshape(shape)
    return arr

def case(m, n, k, bt, epi, swap, cpu):
    c = t.Compiled(t.matmul_graph(m, n, k, "f32", bt, (), epi), machine=cpu, swap=swap)
    rng = np.random.default_rng(0)
    for at_end in (True, False):
        a = guarded((m, k), np.float32, at_end); a[...] = rng.standard_normal((m, k))
        wshape = (n, k) if bt else (k, n)
        w = guarded(wshape, np.float32, at_end); w[...] = rng.standard_normal(wshape)
        bias = guarded((n,), np.float32, at_end); bias[...] = rng.standard_normal(n)
        out = guarded((m, n), np.float32, at_end)
        c({{"a": a, "w": w, "bias": bias, "out0": out}})
        np.testing.assert_allclose(out, t.reference(a, w, bias, bt, epi), rtol=1e-4, atol=1e-3)

big = t.Target(vector_bits=512, l2_bytes=1 << 20, threads=2)
small = t.tiny_cpu()
avx2 = t.Target(vector_bits=256, l2_bytes=1 << 20, threads=2)
for cpu in (big, small, avx2):
    for swap in (False, True):
        for (m, n, k) in ((1, 1, 1), (9, 33, 17), (37, 70, 300), (17, 5, 513)):
            for bt in (False, True):
                case(m, n, k, bt, "tanh" if m % 2 else "", swap, cpu)
    for (m, n, k) in ((1, 40, 33), (3, 9, 100), (4, 33, 16)):  # the dot form
        case(m, n, k, True, "tanh", None, cpu)
# Symbolic M: both plans, chosen at run time.
c = t.Compiled(t.matmul_graph("s0", 70, 40, "f32", True, (), "tanh"), machine=big)
rng = np.random.default_rng(1)
for at_end in (True, False):
    w = guarded((70, 40), np.float32, at_end); w[...] = rng.standard_normal((70, 40))
    bias = guarded((70,), np.float32, at_end); bias[...] = rng.standard_normal(70)
    for m in (1, 7, 600, 1300):
        a = guarded((m, 40), np.float32, at_end); a[...] = rng.standard_normal((m, 40))
        out = guarded((m, 70), np.float32, at_end)
        c({{"a": a, "w": w, "bias": bias, "out0": out}}, [m])
        np.testing.assert_allclose(out, t.reference(a, w, bias, True, "tanh"), rtol=1e-4, atol=1e-3)
print("GUARDS OK")
'''


def test_no_access_outside_buffers() -> None:
    """Every operand sits against an inaccessible page (after it, then before it); a read or
    write past either end would crash the child process."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, TORCHBURN_CACHE_DIR="off")
    proc = subprocess.run([sys.executable, "-c", GUARD_SCRIPT.format(root=root)], capture_output=True,
                          text=True, env=env, timeout=900, cwd=root)
    assert proc.returncode == 0 and "GUARDS OK" in proc.stdout, (proc.returncode, proc.stdout[-2000:],
                                                                 proc.stderr[-4000:])


def test_half_precision_product_accumulates_in_f32() -> None:
    """An f16 matmul in the IR (the frontend casts first, but IR can say so directly) adds in
    f32 and rounds once: a sum of 2048 products that f16 accumulation would get wrong."""
    c = Compiled(matmul_graph(3, 40, 2048, "f16", b_transposed=True, epilogue="neg"))
    a = np.full((3, 2048), 0.5, np.float16)
    w = np.full((40, 2048), 0.25, np.float16)
    w[:, 0] = 1.0
    bias = np.zeros(40, np.float16)
    out = np.zeros((3, 40), np.float16)
    c({"a": a, "w": w, "bias": bias, "out0": out})
    expected = -(0.5 * 1.0 + 2047 * 0.125)
    np.testing.assert_allclose(out.astype(np.float64), np.full((3, 40), expected), rtol=1e-3)


@pytest.mark.parametrize("k", [64, 37])
def test_transposing_pack_is_a_rolled_k_loop(k: int) -> None:
    """A Linear's weight (unit stride along k) is packed by a short k loop kept rolled
    (`lp.KEEP_ROLLED`) around one store per column of a group: after every loop pass the pack
    is PACK_GROUP scalar stores, not PACK_BLOCK x PACK_GROUP copies; results are exact either way."""
    from torchburn.ir import loop as lp
    from torchburn.passes.loopgen.matmul import PACK_BLOCK, PACK_GROUP

    compiled = run_case(64, 64, k, b_transposed=True, swap=False)
    (kernel,) = [kn for kn in compiled.program.kernels if dict(kn.attrs).get("gemm")]
    rolled = [s for s in lp.walk_stmts(kernel.body) if isinstance(s, lp.For) and lp.KEEP_ROLLED in s.annotations]
    assert len(rolled) == 1 and rolled[0].kind == "serial"
    in_loop = [s for s in lp.walk_stmts(rolled[0].body) if isinstance(s, lp.Store)]
    assert len(in_loop) == PACK_GROUP and all(s.buffer.startswith("pb") and s.value.lanes == 1 for s in in_loop)
    packs = [s for s in lp.walk_stmts(kernel.body) if isinstance(s, lp.Store) and s.buffer.startswith("pb")]
    assert len(packs) < PACK_BLOCK * PACK_GROUP
