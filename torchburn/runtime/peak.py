"""The machine's multiply-accumulate peak, measured by generated loops, so kernels can be
stated as a share of what the cores can do: int8 (`dot4_u8i8_acc`: `vpdpbusd` with
AVX512-VNNI, four byte products per i32 lane) and f32 (`fma`).

Each loop keeps `ACCUMULATORS` independent vector accumulators (enough to cover the latency
of the instruction on every x86 core we know: 4-5 cycles, two ports) over operands loaded
once and runs `ITERATIONS` steps; it is written in our loop IR and compiled by our codegen
like any kernel:

    for it in 0..4000000 {
      %acc[0, ramp(0, 1, 16)] = dot4_u8i8_acc(%acc[0, ramp(0, 1, 16)], wv, xv)
      ...                                                  (12 accumulators)
    }

With several threads each runs the same kernel from a thread of its own (ctypes releases the
GIL) and the figure is the sum. int8 counts 2 ops per byte product, f32 2 per fma.
"""
from __future__ import annotations

import ctypes
import threading
import time
from typing import Callable

import numpy as np

ACCUMULATORS = 12
ITERATIONS = 4_000_000


def _kernel_text(kind: str, lanes: int) -> str:
    """The peak loop as loop-IR text: `kind` "int8" or "f32", `lanes` i32/f32 lanes a vector."""
    acc_t, n = ("i32", ACCUMULATORS * lanes)
    if kind == "int8":
        ins = f"%w: u8[{4 * lanes}] strides [1], %x: i8[{4 * lanes}] strides [1]"
        operands = f"  let wv = %w[ramp(0, 1, {4 * lanes})]\n  let xv = %x[ramp(0, 1, {4 * lanes})]\n"
        zero = f"broadcast(0:i32, {lanes})"

        def step(a: str) -> str:
            return f"dot4_u8i8_acc({a}, wv, xv)"
    else:
        acc_t = "f32"
        ins = f"%w: f32[{lanes}] strides [1], %x: f32[{lanes}] strides [1]"
        operands = f"  let wv = %w[ramp(0, 1, {lanes})]\n  let xv = %x[ramp(0, 1, {lanes})]\n"
        zero = f"broadcast(0.0:f32, {lanes})"

        def step(a: str) -> str:
            return f"fma(wv, xv, {a})"
    out = f"%out0: {acc_t}[{n}] strides [1]"
    body = [f"  alloc %acc: {acc_t}[{ACCUMULATORS}, {lanes}] strides [{lanes}, 1] local"]
    body += [f"  %acc[{a}, ramp(0, 1, {lanes})] = {zero}" for a in range(ACCUMULATORS)]
    body.append(operands.rstrip("\n"))
    body.append(f"  for it in 0..{ITERATIONS} {{")
    for a in range(ACCUMULATORS):
        ref = f"%acc[{a}, ramp(0, 1, {lanes})]"
        body.append(f"    {ref} = {step(ref)}")
    body.append("  }")
    body += [f"  %out0[ramp({a * lanes}, 1, {lanes})] = %acc[{a}, ramp(0, 1, {lanes})]" for a in range(ACCUMULATORS)]
    params = f"{ins}, {out}"
    return (f"program @main({ins}) -> ({out}) {{\n  call @k0(%w, %x, %out0)\n}}\n"
            f"kernel @k0({params}) {{\n" + "\n".join(body) + "\n}\n")


def build(kind: str, lanes: int) -> tuple[Callable[[], None], float, np.ndarray]:
    """The compiled loop as a runner, its op count, and its output (checked after a run)."""
    from ..codegen import emit_program, entry_name, host_target
    from ..ir.parser import parse_program
    from ..ir.verifier import verify
    from . import jit

    program = parse_program(_kernel_text(kind, lanes))
    verify(program)
    target = host_target()
    llvm_ir = emit_program(program, target)
    native = jit.load_object(jit.compile_llvm_ir(llvm_ir, target))
    entry = native.entry(entry_name(program))
    dtype = (np.uint8, np.int8) if kind == "int8" else (np.float32, np.float32)
    w = np.ones(4 * lanes if kind == "int8" else lanes, dtype[0])
    x = np.ones(w.size, dtype[1])
    out = np.zeros(ACCUMULATORS * lanes, np.int32 if kind == "int8" else np.float32)
    ptrs = (ctypes.c_void_p * 3)(w.ctypes.data, x.ctypes.data, out.ctypes.data)
    syms = (ctypes.c_int64 * 1)()
    keep = (native, w, x, out, ptrs, syms)
    ops = 2.0 * ITERATIONS * ACCUMULATORS * lanes * (4 if kind == "int8" else 1)

    def run() -> None:
        assert keep  # the arrays and the loaded code live as long as the runner
        entry(ctypes.addressof(ptrs), ctypes.addressof(syms), None)

    return run, ops, out


def measure(kind: str, lanes: int, threads: int, rounds: int = 3) -> float:
    """G ops/s of `threads` copies of the loop running at once (best of `rounds`)."""
    runners = [build(kind, lanes) for _ in range(threads)]
    best = float("inf")
    for _ in range(rounds):
        workers = [threading.Thread(target=r[0]) for r in runners]
        t0 = time.perf_counter()
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        best = min(best, time.perf_counter() - t0)
    total = sum(r[1] for r in runners)
    expected = ITERATIONS * (4 if kind == "int8" else 1)
    for _, _, out in runners:
        assert np.all(out == expected), "the loop did not run as written"
    return total / best / 1e9




def host_lanes() -> int:
    """i32 (and f32) lanes of the host's vectors."""
    from ..codegen import host_target

    return max(4, host_target().vector_bits // 32)


def int8_peak(threads: int, rounds: int = 3) -> float:
    """G ops/s of the host's byte dot products with `threads` threads."""
    return measure("int8", host_lanes(), threads, rounds)
