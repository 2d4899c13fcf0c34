"""Build small loop-IR programs by hand, compile them, and run them on torch tensors.

Tests here do not use the IR parser: they construct dataclasses directly, so codegen tests
stay independent of the text form.
"""
from __future__ import annotations

import ctypes
from typing import Optional, Sequence, Union

import torch

from torchburn.codegen import Target, emit_program, entry_name, host_target
from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.dtypes import DType
from torchburn.ir.expr import Const, Expr, ScalarType, Var
from torchburn.runtime import jit

TARGET = host_target()

TORCH_DTYPES: dict[DType, torch.dtype] = {
    dt.bool_: torch.bool, dt.i8: torch.int8, dt.i16: torch.int16, dt.i32: torch.int32,
    dt.i64: torch.int64, dt.u8: torch.uint8, dt.f16: torch.float16, dt.bf16: torch.bfloat16,
    dt.f32: torch.float32, dt.f64: torch.float64,
}

Dim = Union[int, Expr]


def st(dtype: DType, lanes: int = 1) -> ScalarType:
    return ScalarType(dtype, lanes)


def buf(name: str, dtype: DType, shape: Sequence[Dim], strides: Optional[Sequence[Dim]] = None,
        scope: str = "global") -> lp.Buffer:
    """A buffer; strides default to row-major."""
    shape_e = tuple(ex.as_expr(d) for d in shape)
    strides_e = lp.contiguous_strides(shape_e) if strides is None else tuple(ex.as_expr(s) for s in strides)
    return lp.Buffer(name, dtype, shape_e, strides_e, scope)


def load(b: lp.Buffer, *index: Expr, lanes: int = 1) -> ex.Load:
    return ex.Load(b.name, tuple(index), ScalarType(b.dtype, lanes))


def store(b: lp.Buffer, index: Sequence[Expr], value: Expr) -> lp.Store:
    return lp.Store(b.name, tuple(index), value)


def loop(var: Var, extent: Dim, body: lp.Stmt, kind: str = "serial", start: Dim = 0) -> lp.For:
    return lp.For(var, ex.as_expr(start), ex.as_expr(extent), kind, body)


def program(body: lp.Stmt, inputs: Sequence[lp.Buffer], outputs: Sequence[lp.Buffer],
            symbols: Sequence[Var] = (), attrs: tuple[tuple[str, str], ...] = ()) -> lp.Program:
    """A one-kernel program whose kernel takes the inputs then the outputs."""
    params = (*inputs, *outputs)
    kernel = lp.Kernel("k", params, tuple(symbols), body, attrs)
    call = lp.KernelCall("k", tuple(b.name for b in params))
    return lp.Program("p", tuple(inputs), tuple(outputs), (), tuple(symbols), (call,), (kernel,))


class Compiled:
    """A compiled program callable on tensors: `compiled(*inputs_then_outputs, symbols=...)`."""

    def __init__(self, prog: lp.Program, target: Optional[Target] = None) -> None:
        self.program = prog
        target = target or TARGET
        self.llvm_ir = emit_program(prog, target)
        self.native = jit.load_object(jit.compile_llvm_ir(self.llvm_ir, target))
        self.entry = self.native.entry(entry_name(prog))

    def __call__(self, *tensors: torch.Tensor, symbols: Sequence[int] = (),
                 workspace: Optional[torch.Tensor] = None) -> None:
        ptrs = (ctypes.c_void_p * max(1, len(tensors)))(*[t.data_ptr() for t in tensors])
        syms = (ctypes.c_int64 * max(1, len(symbols)))(*symbols)
        ws = None if workspace is None else workspace.data_ptr()
        self.entry(ctypes.addressof(ptrs), ctypes.addressof(syms), ws)


def compile_program(prog: lp.Program) -> Compiled:
    return Compiled(prog)


def elementwise(fn, in_dtype: DType, out_dtype: DType, n: int = 64, lanes: int = 1,
                n_inputs: int = 1) -> Compiled:
    """`out[i] = fn(x0[i], x1[i], ...)` over a 1-d symbolic size `s0`; with `lanes > 1` the loop
    steps by `lanes` and uses ramp indices (n must be a multiple)."""
    s0 = Var("s0")
    ins = [buf(f"x{k}", in_dtype, (s0,)) for k in range(n_inputs)]
    out = buf("out", out_dtype, (s0,))
    i = Var("i")
    if lanes == 1:
        idx: Expr = i
        body = store(out, (idx,), fn(*(load(b, idx) for b in ins)))
        return Compiled(program(loop(i, s0, body), ins, [out], [s0]))
    idx = ex.Ramp(ex.mul(i, lanes), Const(1), ScalarType(dt.index, lanes))
    body = store(out, (idx,), fn(*(load(b, idx, lanes=lanes) for b in ins)))
    return Compiled(program(loop(i, ex.floordiv(s0, lanes), body), ins, [out], [s0]))


def const(v: Union[int, float, bool], dtype: DType, lanes: int = 1) -> Expr:
    return ex.const(v, dtype, lanes)


__all__ = ["TARGET", "TORCH_DTYPES", "st", "buf", "load", "store", "loop", "program", "Compiled",
           "compile_program", "elementwise", "const", "Var", "Const", "ex", "lp", "dt"]
