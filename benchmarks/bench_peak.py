"""The machine's multiply-accumulate peak, measured by generated loops: int8 (`dot4_u8i8_acc`:
`vpdpbusd` with AVX512-VNNI, 4 byte products per i32 lane) and f32 (`fma`), so kernels can
be stated as a share of what the cores can do.

    python benchmarks/bench_peak.py                   # one thread, then all threads
    python benchmarks/bench_peak.py --threads 2

Each loop keeps `ACCUMULATORS` independent vector accumulators (enough to cover the latency
of the instruction on every x86 core we know: 4-5 cycles, two ports) over operands loaded
once, and runs `ITERATIONS` steps; the loop is written in our loop IR and compiled by our
codegen like any kernel. With several threads, each
runs the same kernel from a thread of its own (ctypes releases the GIL), and the figure is
the sum. Best of `--rounds`, wall time; int8 counts 2 ops per byte product, f32 2 per fma.
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

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


def build(kind: str, lanes: int):  # type: ignore[no-untyped-def]
    from torchburn.codegen import emit_program, entry_name, host_target
    from torchburn.ir.parser import parse_program
    from torchburn.ir.verifier import verify
    from torchburn.runtime import jit

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


def measure(kind: str, lanes: int, threads: int, rounds: int) -> float:
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    from torchburn.codegen import host_target

    target = host_target()
    lanes = max(4, target.vector_bits // 32)
    print(f"host {target.cpu}, {target.vector_bits}-bit vectors, VNNI "
          f"{'yes' if target.has_feature('avx512vnni') else 'no'}; load average {os.getloadavg()[0]:.1f}")
    print("| loop | threads | G ops/s |")
    print("|---|---:|---:|")
    for kind in ("int8", "f32"):
        for threads in sorted({1, args.threads}):
            print(f"| {kind} ({'dot4_u8i8_acc' if kind == 'int8' else 'fma'}, {lanes} lanes) | {threads} | "
                  f"{measure(kind, lanes, threads, args.rounds):.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
