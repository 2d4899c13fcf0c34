"""A program's kernels -> WGSL shaders: each kernel to the emitter of its mapping (`kernel.py`
for grid, block, GEMM and single-invocation kernels, `rows.py` for row kernels), and the
program-level checks.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

from ...ir import loop as lp
from ...ir.expr import Const, Expr, Var
from ...ir.loop import ITERATIONS_ATTR
from ...ir.parser import parse_expr
from .kernel import KernelEmitter
from .rows import RowsEmitter
from .shader import KernelShader
from .types import PACKABLE, Caps, WgslUnsupported, storage_type


def program_caps(program: lp.Program, caps: Caps) -> Caps:
    """The device's caps as this program's buffers use them: `packed_bytes` (u8/i8 buffers four
    to a word, `types.py`) where no kernel stores to an 8-bit buffer. Four invocations writing
    the bytes of one word would race, and a buffer's storage must be the same for every kernel
    that binds it (a deduplicated kernel is called with several), so the choice is the
    program's. Quantized weights are such buffers: read, never written."""
    for k in program.kernels:
        params = {b.name: b for b in k.params}
        for s in lp.walk_stmts(k.body):
            if isinstance(s, lp.Store) and s.buffer in params and params[s.buffer].dtype in PACKABLE:
                return caps
    return dataclasses.replace(caps, packed_bytes=True)


def emit_kernel(kernel: lp.Kernel, program_symbols: tuple[Var, ...], caps: Caps) -> KernelShader:
    """One kernel as a WGSL compute shader (raises `WgslUnsupported`)."""
    iterations = loop_iterations(kernel, caps)
    if any(isinstance(s, lp.For) and s.annotation("gpu") == "rows" for s in lp.walk_stmts(kernel.body)):
        shader = RowsEmitter(kernel, program_symbols, caps).emit()
    else:
        shader = KernelEmitter(kernel, program_symbols, caps).emit()
    return shader if iterations is None else dataclasses.replace(shader, iterations=iterations)


def loop_iterations(kernel: lp.Kernel, caps: Caps) -> Optional[Expr]:
    """The count of loop iterations per invocation `gpu-chunk-serial` left on `kernel` (its
    `gpu_iterations` attribute) where the device limits them; raises `WgslUnsupported` when
    the count is a constant past the limit (the CPU engine runs the program)."""
    text = dict(kernel.attrs).get(ITERATIONS_ATTR)
    if text is None or not caps.loop_iterations:
        return None
    n = parse_expr(text)
    if isinstance(n, Const):
        if int(n.value) <= caps.loop_iterations:
            return None
        raise WgslUnsupported(
            f"kernel @{kernel.name} runs up to {int(n.value):,} loop iterations in one invocation; this adapter "
            f"(llvmpipe) ends an invocation's loops after {caps.loop_iterations:,}, which would give wrong results")
    return n


def emit_program(program: lp.Program, caps: Caps) -> list[KernelShader]:
    """Every kernel of a program, in program order (the calls say which runs when), for the
    program's caps (`program_caps`)."""
    caps = program_caps(program, caps)
    for b in (*program.inputs, *program.outputs, *program.temps):
        storage_type(b.dtype, caps)
    return [emit_kernel(k, program.symbols, caps) for k in program.kernels]


def refuse_data_divisors(program: lp.Program) -> None:
    """Raise `WgslUnsupported` when the program divides integers by tensor values.

    WGSL defines integer `x / 0` as `x` and `INT_MIN / -1` as INT_MIN, so a shader never
    faults: the helpers of `ops.py` then give floordiv `x` (`x - 1` for negative `x`),
    fmod and remainder `x`. A shader has no way to tell the launcher a divisor was 0, where
    eager PyTorch raises `ZeroDivisionError`, so the GPU engine (`compiler/engines.py`) sends
    such programs to the CPU engine, which checks (`codegen/llvm/faults.py`). Divisions in
    index arithmetic (i64 in the IR: by constants and sizes) stay on the GPU."""
    for k in program.kernels:
        for divisor in lp.integer_divisors(k.body):
            if divisor.dtype.bits != 64 and not (isinstance(divisor, Const) and int(divisor.value) != 0):
                raise WgslUnsupported(
                    f"kernel @{k.name}: integer division of {divisor.dtype} tensor values: WGSL gives "
                    f"x / 0 = x where eager raises ZeroDivisionError; the CPU engine checks divisors")
