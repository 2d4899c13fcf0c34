"""The kernel cache (compiler/kernel_cache.py): repeated layers run the loop passes once, in
one graph and across graphs; anything that changes the code keeps kernels apart."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterator

import numpy as np
import pytest

from torchburn.codegen.target import named_target
from torchburn.compiler import driver, kernel_cache as kc
from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_graph, parse_kernel
from torchburn.passes.base import LoopPass, get_pass
from torchburn.passes.pipeline import Pipeline
from torchburn.runtime import config


def layers(n: int, width: int = 16, dtype: str = "f32") -> str:
    """A graph of `n` equal layers `h = tanh(h @ w_i)`: one kernel per layer."""
    params = ", ".join(f"%w{i}: {dtype}[{width}, {width}]" for i in range(n))
    lines = [f"graph @g(%x: {dtype}[8, {width}], {params}) {{"]
    h = "%x"
    for i in range(n):
        lines.append(f"  %m{i} = matmul({h}, %w{i}) : {dtype}[8, {width}]")
        lines.append(f"  %h{i} = tanh(%m{i}) : {dtype}[8, {width}]")
        h = f"%h{i}"
    lines += [f"  return {h}", "}"]
    return "\n".join(lines)


@pytest.fixture()
def fresh(monkeypatch: pytest.MonkeyPatch) -> Iterator[kc.KernelCache]:
    """Empty program and kernel caches, no disk cache."""
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    config.reload_config()
    monkeypatch.setattr(driver, "_cache", driver.ModuleCache(64))
    cache = kc.KernelCache(1024)
    monkeypatch.setattr(kc, "_cache", cache)
    yield cache
    monkeypatch.undo()
    config.reload_config()


def run(compiled: driver.CompiledProgram, n: int, width: int = 16) -> np.ndarray:
    """Call the compiled graph of `layers(n)` on fixed inputs; compare with numpy."""
    import ctypes

    import torch

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, width)).astype(np.float32)
    ws = [rng.standard_normal((width, width)).astype(np.float32) * 0.3 for _ in range(n)]
    out = np.empty((8, width), np.float32)
    arrays = [x, *ws, out]
    buffers = (ctypes.c_void_p * len(arrays))(*[a.ctypes.data for a in arrays])
    program = compiled.signature()
    assert not program.symbols
    workspace = np.zeros(max(int(program.workspace_bytes.value), 8), np.uint8)  # type: ignore[attr-defined]
    compiled.entry(buffers, None, workspace.ctypes.data)
    want = x
    for w in ws:
        want = np.tanh(want @ w)
    torch.testing.assert_close(torch.from_numpy(out), torch.from_numpy(want), rtol=1e-5, atol=1e-5)
    return out


def test_repeated_layers_run_the_loop_passes_once(fresh: kc.KernelCache) -> None:
    compiled, hit = driver.compile_graph(parse_graph(layers(6)))
    assert not hit
    program = compiled.signature()
    assert len(program.calls) == 6
    assert len(program.kernels) == 1 and {c.kernel for c in program.calls} == {program.kernels[0].name}
    assert fresh.stats.compiled == 1
    run(compiled, 6)


def test_kernels_are_reused_across_graphs(fresh: kc.KernelCache) -> None:
    driver.compile_graph(parse_graph(layers(2)))
    assert (fresh.stats.compiled, fresh.stats.hits) == (1, 0)
    compiled, hit = driver.compile_graph(parse_graph(layers(5)))  # another graph, the same layer
    assert not hit
    assert (fresh.stats.compiled, fresh.stats.hits) == (1, 1)
    run(compiled, 5)


def test_a_new_shape_or_dtype_compiles_again(fresh: kc.KernelCache) -> None:
    driver.compile_graph(parse_graph(layers(2)))
    driver.compile_graph(parse_graph(layers(2, width=24)))
    driver.compile_graph(parse_graph(layers(2, dtype="f64")))
    assert (fresh.stats.compiled, fresh.stats.hits) == (3, 0)


def test_pass_options_join_the_key(fresh: kc.KernelCache) -> None:
    graph = layers(2)
    driver.compile_graph(parse_graph(graph))
    tiled = Pipeline.default()
    tiled.loop = [replace(p, size=8) if p.name == "tile" else p for p in tiled.loop]
    driver.compile_graph(parse_graph(graph), pipeline=tiled)
    assert (fresh.stats.compiled, fresh.stats.hits) == (2, 0)


KERNEL = """kernel @k(%a: f32[64] strides [1], %b: f32[64] strides [1]) {
  for i0 in 0..64 {
    %b[i0] = exp(%a[i0])
  }
}"""


def test_kernel_key_sees_target_options_and_structure() -> None:
    k = parse_kernel(KERNEL)
    passes = Pipeline.default().loop
    avx2, avx512 = named_target("avx2"), named_target("avx512")
    base = kc.kernel_key(k, kc.loop_phase_key(passes, avx2))
    assert kc.kernel_key(replace(k, name="other"), kc.loop_phase_key(passes, avx2)) == base  # names: no
    assert kc.kernel_key(k, kc.loop_phase_key(passes, avx512)) != base                       # target
    assert kc.kernel_key(k, kc.loop_phase_key(passes, replace(avx2, threads=avx2.threads + 3))) != base
    assert kc.kernel_key(k, kc.loop_phase_key(passes, replace(avx2, l2_bytes=1 << 16))) != base
    assert kc.kernel_key(k, kc.loop_phase_key(passes, replace(avx2, name="renamed"))) == base  # a label
    assert kc.kernel_key(k, kc.loop_phase_key(passes[:-1], avx2)) != base                    # pipeline
    vec8 = [get_pass("vectorize")(width=8) if p.name == "vectorize" else p for p in passes]
    assert kc.kernel_key(k, kc.loop_phase_key(vec8, avx2)) != base                            # options
    for change in (("f32[64] strides [1], %b", "f16[64] strides [1], %b"), ("0..64", "0..32"),
                   ("strides [1], %b", "strides [2], %b"), ("exp(", "tanh(")):
        other = parse_kernel(KERNEL.replace(*change))
        assert kc.kernel_key(other, kc.loop_phase_key(passes, avx2)) != base, change


@dataclass(frozen=True)
class Halve(LoopPass):
    """A user pass (per kernel): its uuid carries its source, so it joins the key."""

    name = "test-halve"
    per_kernel = True
    factor: int = 2

    def run(self, program: lp.Program) -> lp.Program:
        return program


def test_user_pass_uuid_joins_the_key(fresh: kc.KernelCache) -> None:
    k = parse_kernel(KERNEL)
    target = named_target("avx2")
    plain = kc.kernel_key(k, kc.loop_phase_key([Halve()], target))
    assert kc.kernel_key(k, kc.loop_phase_key([Halve(factor=3)], target)) != plain
    driver.compile_graph(parse_graph(layers(2)), pipeline=Pipeline.default({"before-codegen": [Halve()]}))
    driver.compile_graph(parse_graph(layers(2)), pipeline=Pipeline.default({"before-codegen": [Halve(factor=3)]}))
    assert (fresh.stats.compiled, fresh.stats.hits) == (2, 0)


@dataclass(frozen=True)
class CountCalls(LoopPass):
    """A user pass that reads the calls (not per kernel): the loop passes run whole, uncached."""

    name = "test-count-calls"
    seen: tuple = ()

    def run(self, program: lp.Program) -> lp.Program:
        SEEN.append(len(program.calls))
        return program


SEEN: list[int] = []


def test_a_pass_that_is_not_per_kernel_sees_the_whole_program(fresh: kc.KernelCache) -> None:
    SEEN.clear()
    pipeline = Pipeline.default({"loop-start": [CountCalls()]})
    for n in (3, 4):
        driver.compile_graph(parse_graph(layers(n)), pipeline=pipeline)
    assert SEEN == [3, 4]
    assert fresh.stats.hits == 0


def mixed_layers() -> str:
    """Three layers of two widths: three distinct kernels."""
    return """graph @g(%x: f32[8, 16], %w0: f32[16, 16], %w1: f32[16, 24], %w2: f32[24, 24]) {
  %m0 = matmul(%x, %w0) : f32[8, 16]
  %h0 = tanh(%m0) : f32[8, 16]
  %m1 = matmul(%h0, %w1) : f32[8, 24]
  %h1 = tanh(%m1) : f32[8, 24]
  %m2 = matmul(%h1, %w2) : f32[8, 24]
  %h2 = tanh(%m2) : f32[8, 24]
  return %h2
}"""


class _Events:
    """Instrument and `on_kernel` at once: what ran, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[str, ...]]] = []

    def before_pass(self, p: object, ir: lp.Program) -> None:
        self.events.append((p.name, tuple(k.name for k in ir.kernels)))  # type: ignore[attr-defined]

    def after_pass(self, p: object, ir: lp.Program, seconds: float) -> None:
        pass

    def kernel(self, k: lp.Kernel) -> None:
        self.events.append(("on_kernel", (k.name,)))


def _front(text: str) -> lp.Program:
    from torchburn.passes.base import PassManager
    from torchburn.passes.loop.dedup_kernels import DedupKernels

    pipeline = Pipeline.default()
    return PassManager([*pipeline.tensor, pipeline.lowering, DedupKernels()], target=driver.configured_target()).run(
        parse_graph(text))  # type: ignore[return-value]


def test_kernels_handed_over_as_their_passes_finish(fresh: kc.KernelCache) -> None:
    """With `on_kernel`, every loop pass runs on one kernel before the next kernel starts,
    each kernel is handed over right after its last pass, and the program is the same."""
    from torchburn.ir.printer import print_ir

    program = _front(mixed_layers())
    names = [k.name for k in program.kernels]
    assert len(names) == 3
    passes = Pipeline.default().loop
    target = driver.configured_target()
    whole = kc.run_loop_phase(program, passes, [], target, use_cache=False)
    seen = _Events()
    streamed = kc.run_loop_phase(program, passes, [seen], target, True, seen.kernel)
    assert print_ir(streamed) == print_ir(whole)
    expected = [event for n in names for event in [*((p.name, (n,)) for p in passes), ("on_kernel", (n,))]]
    assert seen.events == expected
    # from the cache the second time: handed over at once, no pass runs
    again = _Events()
    kc.run_loop_phase(program, passes, [again], target, True, again.kernel)
    assert again.events == [("on_kernel", (n,)) for n in names]


def test_compile_streams_kernels_to_llvm(fresh: kc.KernelCache) -> None:
    """`compile_graph` hands each kernel to LLVM's thread as its passes finish: the LLVM IR is
    `emit_program_parts`' of the final program, the pass times one entry per pass."""
    from torchburn.codegen.llvm.module import emit_program_parts
    from torchburn.runtime import jit

    compiled, _ = driver.compile_graph(parse_graph(mixed_layers()))
    program = compiled.program
    assert program is not None and len(program.kernels) == 3
    assert compiled.llvm_ir == jit.join_modules(list(emit_program_parts(program, driver.configured_target())))
    pipeline = Pipeline.default()
    assert [name for name, _ in compiled.pass_times] == [p.spelling() for p in (*pipeline.tensor, pipeline.lowering)] + [
        "dedup-kernels", "keep-constant-prep"] + [p.spelling() for p in (*pipeline.loop, *pipeline.final)]
