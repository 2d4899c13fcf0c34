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


_ROUND_TO_BF16 = """
define void @round(ptr %src, ptr %dst, i64 %n) {
entry:
  br label %loop
loop:
  %i = phi i64 [ 0, %entry ], [ %next, %loop ]
  %p = getelementptr inbounds float, ptr %src, i64 %i
  %x = load float, ptr %p, align 4
  %y = fptrunc float %x to bfloat
  %q = getelementptr inbounds bfloat, ptr %dst, i64 %i
  store bfloat %y, ptr %q, align 2
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, %n
  br i1 %done, label %exit, label %loop
exit:
  ret void
}
"""


def _converts_to_bf16_itself() -> bool:
    """Whether LLVM lowers f32 -> bf16 to instructions here (AVX512-BF16, AVX-NE-CONVERT), or
    the host is not x86 (where the libcall was seen)."""
    features = set(TARGET.features.split(","))
    return not TARGET.triple.startswith("x86_64") or bool({"+avx512bf16", "+avxneconvert"} & features)


def test_call_the_code_generator_adds_is_refused_by_name() -> None:
    """An `fptrunc` to bf16 on a CPU without bf16 instructions becomes a call to compiler-rt's
    `__truncsfbf2` during instruction selection (the IR never declared it); this process has
    no such function, so loading must fail with its name, not bind it to address 0."""
    if _converts_to_bf16_itself():
        pytest.skip("the CPU converts to bf16 itself")
    obj = jit.compile_llvm_ir(_ROUND_TO_BF16, TARGET)
    assert "__truncsfbf2" in jit.undefined_symbols(obj.data)
    with pytest.raises(jit.JITError, match="__truncsfbf2"):
        jit.load_object(obj)


def test_generated_modules_define_the_bf16_rounding_helper() -> None:
    """Every module with `bfloat` values defines `__truncsfbf2` itself (integer operations,
    torch's rounding): the same code then loads and rounds to nearest even, NaN to 0x7FC0.
    A CPU with bf16 conversion instructions (AVX512-BF16) rounds the same but keeps a NaN's
    sign and quiet payload (0xFFFFFFFF -> 0xFFFF), as its instruction does: still a NaN."""
    from torchburn.codegen.llvm.module import _BF16_RUNTIME

    obj = jit.compile_llvm_ir(_ROUND_TO_BF16 + _BF16_RUNTIME, TARGET)
    assert "__truncsfbf2" not in jit.undefined_symbols(obj.data)
    native = jit.load_object(obj)
    bits = torch.tensor([0x3F808000, 0x3F818000, 0x3F80FFFF, 0x7F7FFFFF, 0xFF800000, 0x00000001,
                         0x80000000, 0x7FC00001, 0xFFFFFFFF], dtype=torch.int64).to(torch.int32)
    x = torch.cat([bits.view(torch.float32), torch.randn(100) * 1e3])
    out = torch.empty(x.shape, dtype=torch.bfloat16)
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(native.address("round"))
    fn(x.data_ptr(), out.data_ptr(), x.numel())
    expected = x.to(torch.bfloat16)
    nan = expected.isnan()
    assert torch.equal(out.view(torch.int16)[~nan], expected.view(torch.int16)[~nan])
    assert out[nan].isnan().all()
    if not _converts_to_bf16_itself():
        assert (out.view(torch.int16)[nan] == 0x7FC0).all()


def test_undefined_symbols_of_non_elf_data_is_unknown() -> None:
    assert jit.undefined_symbols(b"\xcf\xfa\xed\xfe" + bytes(60)) is None  # Mach-O magic
    assert jit.undefined_symbols(b"\x7fELF" + bytes(10)) is None  # truncated


def test_micro_kernel_mark_agrees_with_codegen() -> None:
    """jit.py spells the mark again (the warm path does not import codegen)."""
    from torchburn.codegen.llvm import module

    assert jit.MICRO_KERNEL_MARK == module.MICRO_KERNEL_MARK
    assert jit.part_opt_level(module.MICRO_KERNEL_MARK + "", 2) == jit.MICRO_KERNEL_OPT_LEVEL
    assert jit.part_opt_level("; ModuleID", 2) == 2
    assert jit.part_opt_level(module.MICRO_KERNEL_MARK, 0) == 0


def test_llvm_worker_thread_has_its_own_stack() -> None:
    """`ModuleParts` runs LLVM on a thread with `LLVM_THREAD_STACK` bytes of stack, whatever the
    process default is (2 MiB under `ulimit -s unlimited`), and leaves the default as it was."""
    import sys
    import threading

    if not sys.platform.startswith("linux"):
        pytest.skip("reads the stack size with glibc's pthread_getattr_np")

    before = threading.stack_size()
    parts = jit.ModuleParts(TARGET)
    seen: list[int] = []
    try:
        parts._optimize = lambda text: seen.append(_own_stack_bytes())  # type: ignore[method-assign]
        parts.add("")
        parts._futures[0].result()
    finally:
        parts.close()
    assert threading.stack_size() == before
    assert seen and seen[0] >= jit.LLVM_THREAD_STACK


def _own_stack_bytes() -> int:
    """This thread's stack size (glibc's pthread_getattr_np)."""
    libc = ctypes.CDLL(None)
    libc.pthread_self.restype = ctypes.c_ulong
    libc.pthread_getattr_np.argtypes = [ctypes.c_ulong, ctypes.c_void_p]
    attr = ctypes.create_string_buffer(128)
    libc.pthread_getattr_np(libc.pthread_self(), attr)
    addr, size = ctypes.c_void_p(), ctypes.c_size_t()
    libc.pthread_attr_getstack(attr, ctypes.byref(addr), ctypes.byref(size))
    libc.pthread_attr_destroy(attr)
    return size.value


@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("busy", [False, True])
def test_parts_are_objects_of_their_own_each_with_its_own_constants(shared: bool, busy: bool) -> None:
    """`ModuleParts` emits a part's object as soon as it is optimized when no other part waits
    behind it, and links the others and emits them together in `finish`; `load_object` loads
    the objects one by one. Every part's constant pool starts at `.LCPI0_0`, and each function
    still reads its own constant (joined into one relocatable object, they all read one
    part's: f0(1.0) was 2.6). Calls between objects are bound, and the shared library linked
    from them (when there is a linker) gives the same answers."""
    import shutil

    from torchburn.runtime.shared_lib import load_shared

    f0 = "define double @f0(double %x) {\n  %y = fadd double %x, 0.6\n  ret double %y\n}\n"
    f1 = ("declare double @f0(double)\n"
          "define double @f1(double %x) {\n  %y = fmul double %x, 1.7\n"
          "  %z = call double @f0(double %y)\n  ret double %z\n}\n")
    f2 = ("declare double @f1(double)\n"
          "define double @f2(double %x) {\n  %y = fadd double %x, 2.9\n"
          "  %z = call double @f1(double %y)\n  ret double %z\n}\n")
    parts = jit.ModuleParts(TARGET, shared=shared)
    try:
        if busy:  # LLVM's lock held: f1 waits behind f0 and f2 behind f1, only f2 finds time
            with jit._lock:
                for text in (f0, f1, f2):
                    parts.add(text)
        else:  # each part done before the next comes: each is its own object
            for text in (f0, f1, f2):
                parts.add(text)
                parts._futures[-1].result()
        obj = parts.finish()
    finally:
        parts.close()
    assert len(obj.part_sizes) == (2 if busy else 3) and len(obj.objects) == len(obj.part_sizes)
    assert all(o[:4] == b"\x7fELF" for o in obj.objects) and b"".join(obj.objects) == obj.data
    fn_type = ctypes.CFUNCTYPE(ctypes.c_double, ctypes.c_double)
    modules = [jit.load_object(obj)]
    if shared and shutil.which("ld"):
        assert obj.shared
        modules.append(load_shared(obj))
    for native in modules:
        assert fn_type(native.address("f0"))(1.0) == pytest.approx(1.6)
        assert fn_type(native.address("f1"))(1.0) == pytest.approx(2.3)
        assert fn_type(native.address("f2"))(1.0) == pytest.approx(3.9 * 1.7 + 0.6)


def test_object_code_parts_must_add_up() -> None:
    with pytest.raises(ValueError, match="parts"):
        jit.ObjectCode(b"x" * 10, "t", "c", "f", b"", (4, 5))
    assert jit.ObjectCode(b"abcdef", "t", "c", "f", b"", (2, 4)).objects == (b"ab", b"cdef")
    assert jit.ObjectCode(b"abcdef", "t", "c", "f").objects == (b"abcdef",)
