"""The JIT: compile, load, call; OpenMP; compile time of a small program."""
from __future__ import annotations

import ctypes
import time

import pytest
import torch

from tests.codegen.util import Var, buf, dt, ex, load, loop, program, store
from torchburn.codegen import Target, emit_program, entry_name, host_target
from torchburn.runtime import jit

TARGET = host_target()


def small_program(kind: str = "serial"):
    s0 = Var("s0")
    x, out = buf("x", dt.f32, (s0,)), buf("out", dt.f32, (s0,))
    i = Var("i")
    body = loop(i, s0, store(out, (i,), ex.add(ex.call("exp", load(x, i)), ex.const(1.0, dt.f32))), kind=kind)
    return program(body, [x], [out], [s0])


def call(native: jit.NativeModule, name: str, *tensors: torch.Tensor, symbols=()) -> None:
    ptrs = (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])
    syms = (ctypes.c_int64 * max(1, len(symbols)))(*symbols)
    native.entry(name)(ctypes.addressof(ptrs), ctypes.addressof(syms), None)


def test_compile_load_call() -> None:
    prog = small_program()
    obj = jit.compile_llvm_ir(emit_program(prog, TARGET), TARGET)
    assert isinstance(obj.data, bytes) and obj.data[:4] == b"\x7fELF"
    assert not obj.uses_openmp
    native = jit.load_object(obj)
    x, out = torch.randn(10), torch.empty(10)
    call(native, entry_name(prog), x, out, symbols=[10])
    torch.testing.assert_close(out, torch.exp(x) + 1)


def test_load_plain_bytes_and_missing_symbol() -> None:
    prog = small_program()
    obj = jit.compile_llvm_ir(emit_program(prog, TARGET), TARGET)
    native = jit.load_object(obj.data)
    assert native.address(entry_name(prog)) != 0
    with pytest.raises(KeyError, match="no function"):
        native.address("nope")


def test_parallel_object_uses_openmp() -> None:
    prog = small_program("parallel")
    obj = jit.compile_llvm_ir(emit_program(prog, TARGET), TARGET)
    assert obj.uses_openmp
    native = jit.load_object(obj)
    x, out = torch.randn(1000), torch.empty(1000)
    call(native, entry_name(prog), x, out, symbols=[1000])
    torch.testing.assert_close(out, torch.exp(x) + 1)


def test_libgomp_found_and_thread_count() -> None:
    assert jit.find_libgomp() is not None
    before = jit.get_num_threads()
    try:
        jit.set_num_threads(1)
        assert jit.get_num_threads() == 1
        assert torch.get_num_threads() == 1  # one OpenMP runtime shared with torch
    finally:
        jit.set_num_threads(before)
    with pytest.raises(ValueError):
        jit.set_num_threads(0)


def test_assembly_and_optimized_ir() -> None:
    text = emit_program(small_program(), TARGET)
    asm = jit.assembly(text, TARGET)
    assert "torchburn_p" in asm
    opt = jit.optimized_ir(text, TARGET)
    assert "define void @torchburn_p" in opt


def test_invalid_ir_is_a_jit_error() -> None:
    with pytest.raises(jit.JITError, match="rejected"):
        jit.compile_llvm_ir("define void @f() { ret i32 0 }", TARGET)


def test_unresolvable_function_is_reported() -> None:
    text = "declare void @torchburn_no_such_fn()\ndefine void @f() {\n call void @torchburn_no_such_fn()\n ret void\n}"
    with pytest.raises(jit.JITError, match="torchburn_no_such_fn"):
        jit.compile_llvm_ir(text, TARGET)


def test_program_compiles_and_loads_repeatedly() -> None:
    """Compiling the same program again gives a fresh, working module each time (compile speed
    is measured by benchmarks/bench_compile.py, not asserted here)."""
    prog = small_program("parallel")
    for _ in range(3):
        native = jit.load_object(jit.compile_llvm_ir(emit_program(prog, TARGET), TARGET))
        assert native.entry(entry_name(prog)) is not None
