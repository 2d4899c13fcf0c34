"""The reference engine behind the native calling convention, and a NumPy-array front door.

`ReferenceEntry(program)` is called exactly as a compiled module's entry function is (see
`codegen/llvm/module.py`): `entry(buffers, symbols, workspace)` with an array of data pointers
(`program.inputs` then `program.outputs`), an array of i64 symbol values (`program.symbols`
order) and the workspace address. It wraps each buffer's bytes as a NumPy array, zero copy
(`(c_char * n).from_address(ptr)` + `np.frombuffer`), so the launcher that calls native code
calls it unchanged, and the results land in the torch tensors' own memory.

`run_arrays(program, inputs)` runs a program on NumPy arrays (command line, tests): symbols
are bound from the inputs' sizes, outputs are allocated with the program's strides.
"""
from __future__ import annotations

import ctypes
from typing import Any, Mapping, Optional, Sequence

import numpy as np

from ...ir import expr as ex
from ...ir import loop as lp
from .. import faults
from .interp import ExecutionError, program_code, span_elements
from .ops import DivisionByZero, IndexOutOfRange
from .values import bf16_to_f32, f32_to_bf16, storage_dtype


def _wrap(address: Optional[int], nbytes: int, dtype: np.dtype) -> np.ndarray:
    if nbytes == 0:
        return np.zeros(0, dtype)
    if not address:
        raise ExecutionError("a buffer of non-zero size has a null data pointer")
    raw = (ctypes.c_char * nbytes).from_address(address)
    return np.frombuffer(raw, dtype=dtype)


class ReferenceEntry:
    """A program run by the interpreter, callable as `entry(buffers, symbols, workspace)`."""

    def __init__(self, program: lp.Program) -> None:
        self.program = program
        self.code = program_code(program)
        self._offsets = dict(program.temp_offsets)

    def __call__(self, buffers: Sequence[Any], symbols: Sequence[int], workspace: Optional[int]) -> None:
        p = self.program
        env = {s.name: int(symbols[k]) for k, s in enumerate(p.symbols)}
        memory: dict[str, np.ndarray] = {}
        for k, b in enumerate((*p.inputs, *p.outputs)):
            memory[b.name] = _wrap(buffers[k], self._nbytes(b, env), storage_dtype(b.dtype))
        for b in p.temps:
            nbytes = self._nbytes(b, env)
            if b.name not in self._offsets:
                raise ExecutionError(f"temporary %{b.name} has no workspace offset (run plan-memory)")
            offset = ex.evaluate_index(self._offsets[b.name], env)
            memory[b.name] = _wrap((workspace or 0) + offset if nbytes else None, nbytes, storage_dtype(b.dtype))
        try:
            self.code.run(memory, env)
        except (DivisionByZero, IndexOutOfRange):
            # as native code does: count the fault, the launcher runs the call in PyTorch
            faults.record()

    @staticmethod
    def _nbytes(b: lp.Buffer, env: dict[str, int]) -> int:
        shape = [ex.evaluate_index(d, env) for d in b.shape]
        strides = [ex.evaluate_index(d, env) for d in b.strides]
        return span_elements(shape, strides) * b.dtype.itemsize


# ---- NumPy arrays in and out -------------------------------------------------------------------

def bind_symbols(program: lp.Program, inputs: Mapping[str, np.ndarray],
                 given: Optional[Mapping[str, int]] = None) -> dict[str, int]:
    """Symbol values from the inputs' sizes (a dimension or stride that is a bare symbol
    binds it; strides of inputs are taken row-major), plus any `given` ones; `refresh`
    (`Program.kept`) is 1 unless given."""
    env = dict(given or {})
    for b in program.inputs:
        if b.name not in inputs:
            raise ExecutionError(f"no value for input %{b.name}")
        arr = inputs[b.name]
        if arr.ndim != b.ndim:
            raise ExecutionError(f"input %{b.name} has {b.ndim} dimensions, the value given {arr.ndim}")
        for size, n in zip(b.shape, arr.shape):
            if isinstance(size, ex.Var):
                env.setdefault(size.name, int(n))
        row_major = [int(np.prod(arr.shape[d + 1:])) for d in range(arr.ndim)]
        for stride, value in zip(b.strides, row_major):
            if isinstance(stride, ex.Var):
                env.setdefault(stride.name, value)
    if program.kept:  # a run on fresh arrays: the kept temporaries are computed
        env.setdefault(lp.REFRESH, 1)
    missing = [s.name for s in program.symbols if s.name not in env]
    if missing:
        raise ExecutionError(f"cannot bind symbol(s) {', '.join(missing)} from the inputs' sizes; give them")
    return env


def _layout(b: lp.Buffer, env: dict[str, int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    return (tuple(ex.evaluate_index(d, env) for d in b.shape), tuple(ex.evaluate_index(d, env) for d in b.strides))


def _to_memory(arr: np.ndarray, b: lp.Buffer, env: dict[str, int]) -> np.ndarray:
    shape, strides = _layout(b, env)
    if tuple(arr.shape) != shape:
        raise ExecutionError(f"input %{b.name} should have shape {list(shape)}, the value given has {list(arr.shape)}")
    flat = np.zeros(span_elements(shape, strides), storage_dtype(b.dtype))
    if flat.size:
        values = f32_to_bf16(arr) if b.dtype.name == "bf16" else np.asarray(arr).astype(flat.dtype)
        _strided_view(flat, shape, strides)[...] = values
    return flat


def _strided_view(flat: np.ndarray, shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    item = flat.itemsize
    return np.lib.stride_tricks.as_strided(flat, shape, tuple(s * item for s in strides))


def _from_memory(flat: np.ndarray, b: lp.Buffer, env: dict[str, int]) -> np.ndarray:
    shape, strides = _layout(b, env)
    if not flat.size:
        out = np.zeros(shape, flat.dtype)
    else:
        out = np.array(_strided_view(flat, shape, strides))
    return np.asarray(bf16_to_f32(out), np.float32).reshape(shape) if b.dtype.name == "bf16" else out


def run_arrays(program: lp.Program, inputs: Mapping[str, np.ndarray],
               symbols: Optional[Mapping[str, int]] = None) -> dict[str, np.ndarray]:
    """Run `program` on NumPy arrays (by input buffer name); returns the outputs by name, and
    inputs returned as they are (`Program.results`). bf16 values are given and returned as
    float32 arrays."""
    env = bind_symbols(program, inputs, symbols)
    memory: dict[str, np.ndarray] = {}
    for b in program.inputs:
        memory[b.name] = _to_memory(np.asarray(inputs[b.name]), b, env)
    for b in (*program.outputs, *program.temps):
        shape, strides = _layout(b, env)
        memory[b.name] = np.zeros(span_elements(shape, strides), storage_dtype(b.dtype))
    program_code(program).run(memory, env)
    out = {}
    for name in program.result_names():
        b = program.buffer(name)
        out[name] = _from_memory(memory[name], b, env)
    return out
