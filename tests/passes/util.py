"""Helpers for pass tests: parse kernels from IR text, run passes, compare printed IR, and
execute kernels through the LLVM codegen on numpy arrays."""
from __future__ import annotations

import ctypes
import textwrap
from typing import Mapping, Sequence

import numpy as np

from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_kernel
from torchburn.ir.printer import print_kernel
from torchburn.ir.verifier import verify
from torchburn.passes.base import LoopPass

NUMPY_DTYPES = {"bool": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
                "u8": np.uint8, "f16": np.float16, "f32": np.float32, "f64": np.float64}


def kernel(text: str) -> lp.Kernel:
    """Parse one kernel from (indented) IR text."""
    return parse_kernel(textwrap.dedent(text))


def as_program(k: lp.Kernel, outputs: Sequence[str] = ("out",)) -> lp.Program:
    """A program that calls `k` once; parameters named in `outputs` are its outputs."""
    ins = tuple(b for b in k.params if b.name not in outputs)
    outs = tuple(b for b in k.params if b.name in outputs)
    call = lp.KernelCall(k.name, tuple(b.name for b in k.params))
    return lp.Program("p", ins, outs, (), k.symbols, (call,), (k,))


def run_pass(p: LoopPass, k: lp.Kernel) -> lp.Kernel:
    """Run a loop pass on a one-kernel program, verify the result and return the kernel."""
    out = p.run(as_program(k)).kernels[0]
    verify(out)
    return out


def assert_ir(k: lp.Kernel, expected: str) -> None:
    """The kernel prints as `expected` (dedented, surrounding blank lines ignored)."""
    got = print_kernel(k).strip()
    want = textwrap.dedent(expected).strip()
    assert got == want, f"IR differs.\n--- got ---\n{got}\n--- expected ---\n{want}"


def compile_kernel(k: lp.Kernel, outputs: Sequence[str] = ("out",)):  # type: ignore[no-untyped-def]
    """Compile a kernel through the LLVM codegen; returns `run(arrays, symbols)`."""
    from torchburn.codegen import Target, emit_program, entry_name, host_target
    from torchburn.runtime import jit

    prog = as_program(k, outputs)
    target = host_target()
    native = jit.load_object(jit.compile_llvm_ir(emit_program(prog, target), target))
    entry = native.entry(entry_name(prog))
    order = [b.name for b in (*prog.inputs, *prog.outputs)]

    def run(arrays: Mapping[str, np.ndarray], symbols: Mapping[str, int] = {}) -> None:
        ptrs = (ctypes.c_void_p * len(order))(*[arrays[n].ctypes.data for n in order])
        syms = (ctypes.c_int64 * max(1, len(prog.symbols)))(*[symbols[s.name] for s in prog.symbols])
        entry(ctypes.addressof(ptrs), ctypes.addressof(syms), None)
        run.native = native  # keep the code alive as long as `run`

    return run


def execute(k: lp.Kernel, arrays: Mapping[str, np.ndarray], symbols: Mapping[str, int] = {},
            outputs: Sequence[str] = ("out",)) -> dict[str, np.ndarray]:
    """Run a kernel on copies of `arrays`; returns every buffer after the call."""
    bufs = {n: np.ascontiguousarray(a).copy() for n, a in arrays.items()}
    compile_kernel(k, outputs)(bufs, symbols)
    return bufs


def matmul_kernel_text(m: int, n: int, k: int = 64) -> str:
    """The loop IR `lower-to-loops-gpu` gives `a @ b` for static `m x k` and `k x n` operands."""
    return f"""
    kernel @k0(%a: f32[{m}, {k}] strides [{k}, 1], %b: f32[{k}, {n}] strides [{n}, 1], %out: f32[{m}, {n}] strides [{n}, 1]) {{
      for i0 in 0..{m} {{
        for i1 in 0..{n} {{
          alloc %acc2: f32[1] strides [1] local
          %acc2[0] = 0.0:f32
          for k3 in 0..{k} {{
            let x4 = %a[i0, k3]
            let x5 = %b[k3, i1]
            let t6 = x4 * x5
            %acc2[0] = %acc2[0] + t6
          }}
          let x7 = %acc2[0]
          %out[i0, i1] = x7
        }}
      }}
    }}
"""
