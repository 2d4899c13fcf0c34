"""Whole programs: several kernels, workspace temporaries, the entry ABI, parameter attributes."""
from __future__ import annotations

import ctypes
import re
from dataclasses import replace

import pytest
import torch

from torchburn.codegen import CodegenError, emit_program, entry_name
from torchburn.ir import loop as lp

from .util import TARGET, Compiled, Const, Var, buf, dt, ex, load, loop, store


def two_kernel_program() -> lp.Program:
    """t = exp(x) (kernel a, into a workspace temporary); out = t + y (kernel b)."""
    s0 = Var("s0")
    x, y, out = buf("x", dt.f32, (s0,)), buf("y", dt.f32, (s0,)), buf("out", dt.f32, (s0,))
    t = buf("t", dt.f32, (s0,))
    i = Var("i")
    ka = lp.Kernel("a", (x, t), (s0,), loop(i, s0, store(t, (i,), ex.call("exp", load(x, i)))))
    kb = lp.Kernel("b", (t, y, out), (s0,), loop(i, s0, store(out, (i,), ex.add(load(t, i), load(y, i)))))
    return lp.Program(
        "two", (x, y), (out,), (t,), (s0,),
        (lp.KernelCall("a", ("x", "t")), lp.KernelCall("b", ("t", "y", "out"))),
        (ka, kb),
        temp_offsets=(("t", ex.mul(s0, 0) + 64),),  # offset 64 bytes: the code must honour it
        workspace_bytes=ex.add(ex.mul(s0, 4), 64),
    )


def test_two_kernels_with_workspace_temporary() -> None:
    prog = two_kernel_program()
    k = Compiled(prog)
    n = 100
    x, y, out = torch.randn(n), torch.randn(n), torch.empty(n)
    ws = torch.zeros(64 + 4 * n, dtype=torch.uint8)
    k(x, y, out, symbols=[n], workspace=ws)
    torch.testing.assert_close(out, torch.exp(x) + y)
    assert torch.equal(ws[:64], torch.zeros(64, dtype=torch.uint8))
    torch.testing.assert_close(ws[64:].view(torch.float32), torch.exp(x))


def test_entry_name_and_signature() -> None:
    prog = two_kernel_program()
    text = emit_program(prog, TARGET)
    assert entry_name(prog) == "torchburn_two"
    assert re.search(r'define void @"torchburn_two"\(ptr %"buffers", ptr %"symbols", ptr %"workspace"\)', text)
    assert 'define internal void @"two.a"' in text


def test_parameter_attributes() -> None:
    text = emit_program(two_kernel_program(), TARGET)
    head_a = next(line for line in text.splitlines() if line.startswith('define internal void @"two.a"'))
    assert 'ptr noalias readonly %"x"' in head_a
    assert 'ptr noalias %"t"' in head_a


def test_in_place_call_drops_noalias() -> None:
    """call @k(%x, %x) where the kernel reads one parameter and writes the other."""
    s0 = Var("s0")
    a, b = buf("a", dt.f32, (s0,)), buf("b", dt.f32, (s0,))
    i = Var("i")
    k = lp.Kernel("k", (a, b), (s0,), loop(i, s0, store(b, (i,), ex.mul(load(a, i), load(a, i)))))
    prog = lp.Program("inplace", (), (a,), (), (s0,), (lp.KernelCall("k", ("a", "a")),), (k,))
    c = Compiled(prog)
    assert "noalias" not in next(l for l in c.llvm_ir.splitlines() if "define internal" in l)
    x = torch.arange(6, dtype=torch.float32)
    c(x, symbols=[6])
    assert torch.equal(x, torch.arange(6, dtype=torch.float32) ** 2)


def test_program_without_symbols_or_temps() -> None:
    x, out = buf("x", dt.i32, (3,)), buf("out", dt.i32, (3,))
    i = Var("i")
    k = lp.Kernel("k", (x, out), (), loop(i, 3, store(out, (i,), ex.add(load(x, i), ex.const(1, dt.i32)))))
    prog = lp.Program("nosym", (x,), (out,), (), (), (lp.KernelCall("k", ("x", "out")),), (k,))
    c = Compiled(prog)
    xv, res = torch.tensor([1, 2, 3], dtype=torch.int32), torch.zeros(3, dtype=torch.int32)
    c(xv, res)
    assert res.tolist() == [2, 3, 4]


def test_errors_name_the_problem() -> None:
    prog = two_kernel_program()
    bad_arity = lp.Program(prog.name, prog.inputs, prog.outputs, prog.temps, prog.symbols,
                           (lp.KernelCall("a", ("x",)),), prog.kernels, prog.temp_offsets, prog.workspace_bytes)
    with pytest.raises(CodegenError, match="passes 1 buffers to 2 parameters"):
        emit_program(bad_arity, TARGET)
    no_sym = lp.Program(prog.name, prog.inputs, prog.outputs, prog.temps, (), prog.calls, prog.kernels,
                        prog.temp_offsets, prog.workspace_bytes)
    with pytest.raises(CodegenError, match="symbol s0"):
        emit_program(no_sym, TARGET)
    no_offset = lp.Program(prog.name, prog.inputs, prog.outputs, prog.temps, prog.symbols, prog.calls,
                           prog.kernels)
    with pytest.raises(CodegenError, match="no workspace offset"):
        emit_program(no_offset, TARGET)


def test_type_errors_are_codegen_errors() -> None:
    x, out = buf("x", dt.f32, (3,)), buf("out", dt.i32, (3,))
    i = Var("i")
    body = loop(i, 3, store(out, (i,), load(x, i)))
    k = lp.Kernel("k", (x, out), (), body)
    prog = lp.Program("bad", (x,), (out,), (), (), (lp.KernelCall("k", ("x", "out")),), (k,))
    with pytest.raises(CodegenError, match="store of a f32 value into %out"):
        emit_program(prog, TARGET)
    body2 = loop(i, 3, store(out, (i, Const(0)), ex.const(1, dt.i32)))
    prog2 = lp.Program("bad", (x,), (out,), (), (), (lp.KernelCall("k", ("x", "out")),),
                       (lp.Kernel("k", (x, out), (), body2),))
    with pytest.raises(CodegenError, match="indexed with 2"):
        emit_program(prog2, TARGET)


def test_contract_fastmath_attr() -> None:
    s0 = Var("s0")
    x, out = buf("x", dt.f32, (s0,)), buf("out", dt.f32, (s0,))
    i = Var("i")
    body = loop(i, s0, store(out, (i,), ex.add(ex.mul(load(x, i), load(x, i)), load(x, i))))
    k = lp.Kernel("k", (x, out), (s0,), body, attrs=(("fastmath", "contract"),))
    prog = lp.Program("fm", (x,), (out,), (), (s0,), (lp.KernelCall("k", ("x", "out")),), (k,))
    text = emit_program(prog, TARGET)
    assert "fmul contract" in text and "fadd contract" in text


@pytest.mark.parametrize("ahead", [64, 4096])
def test_prefetch_attr_prefetches_the_streamed_buffer_ahead_within_it(ahead: int) -> None:
    """Kernel attribute `prefetch = "x:BYTES"`: each vector load of %x also prefetches BYTES
    further on, the address clamped to %x's last element (4096 bytes ahead of a 1 KiB buffer
    stays inside it); the results are the loads' own; a malformed attribute is refused."""
    n = 256
    x, out = buf("x", dt.f32, (n,)), buf("out", dt.f32, (n,))
    i = Var("i")
    lanes = ex.Ramp(ex.mul(i, Const(16)), Const(1), ex.ScalarType(dt.index, 16))
    value = ex.add(ex.Load("x", (lanes,), ex.ScalarType(dt.f32, 16)), ex.const(1.0, dt.f32, 16))
    body = loop(i, n // 16, lp.Store("out", (lanes,), value))
    k = lp.Kernel("k", (x, out), (), body, attrs=(("prefetch", f"x:{ahead}"),))
    prog = lp.Program("pf", (x,), (out,), (), (), (lp.KernelCall("k", ("x", "out")),), (k,))
    text = emit_program(prog, TARGET)
    assert text.count("call void @\"llvm.prefetch.p0\"") == 1
    assert re.search(r"icmp slt i64 .*, 255", text)  # clamped to the last element
    c = Compiled(prog)
    xs, got = torch.randn(n), torch.empty(n)
    c(xs, got)
    assert torch.equal(got, xs + 1)
    bad = replace(prog, kernels=(replace(k, attrs=(("prefetch", "x"),)),))
    with pytest.raises(CodegenError, match="prefetch"):
        emit_program(bad, TARGET)


def test_program_in_parts_links_kernels_and_loader_globals() -> None:
    """`emit_program_parts`: a module per kernel, each optimized on its own in LLVM's thread
    (`jit.ModuleParts`), then the entry's, then linked. Two kernels using the globals the
    loader repoints (a parallel loop's thread count, an integer division's fault counter)
    define them once, in the entry's module; the linked program runs and reports the fault."""
    from torchburn.codegen.llvm.module import emit_program_parts
    from torchburn.runtime import faults, jit

    s0 = Var("s0")
    x, d, t, out = (buf(n, dt.i64, (s0,)) for n in ("x", "d", "t", "out"))
    i = Var("i")
    ka = lp.Kernel("a", (x, d, t), (s0,), loop(i, s0, store(t, (i,), ex.floordiv(load(x, i), load(d, i))), kind="parallel"))
    kb = lp.Kernel("b", (t, d, out), (s0,), loop(i, s0, store(out, (i,), ex.add(ex.floordiv(load(t, i), load(d, i)), ex.const(1, dt.i64))), kind="parallel"))
    prog = lp.Program("parts", (x, d), (out,), (t,), (s0,),
                      (lp.KernelCall("a", ("x", "d", "t")), lp.KernelCall("b", ("t", "d", "out"))), (ka, kb),
                      temp_offsets=(("t", Const(0)),), workspace_bytes=ex.mul(s0, 8))
    texts = list(emit_program_parts(prog, TARGET))
    assert len(texts) == 3
    for kernel_text in texts[:2]:
        assert re.search(r'define hidden void @"parts\.[ab]"', kernel_text)
        assert '@"torchburn_fault" = external global ptr' in kernel_text
    assert re.search(r'@"torchburn_fault" = global ptr', texts[2])
    assert re.search(r'declare hidden void @"parts\.a"', texts[2])
    parts = jit.ModuleParts(TARGET, shared=True)
    try:
        for text in texts:
            parts.add(text)
        native = jit.load_native(parts.finish())
    finally:
        parts.close()
    n = 1000
    xs, ds = torch.randint(-50, 50, (n,)), torch.randint(1, 5, (n,))
    ds[7] = 0
    out, ws = torch.empty(n, dtype=torch.int64), torch.empty(8 * n, dtype=torch.uint8)
    ptrs = (ctypes.c_void_p * 3)(xs.data_ptr(), ds.data_ptr(), out.data_ptr())
    syms = (ctypes.c_int64 * 1)(n)
    before = faults.counter.value
    native.entry(entry_name(prog))(ctypes.addressof(ptrs), ctypes.addressof(syms), ws.data_ptr())
    assert faults.counter.value > before
    ok = ds != 0
    xo, do = xs[ok], ds[ok]
    torch.testing.assert_close(out[ok], torch.div(torch.div(xo, do, rounding_mode="floor"), do, rounding_mode="floor") + 1)


def test_parts_calling_a_function_no_part_defines_are_refused() -> None:
    """A part may call what another part defines; a call nothing defines (neither a part nor
    the process) is refused with its name when the parts are joined, never bound to address 0."""
    from torchburn.runtime import jit

    callee = "define hidden void @g() {\n  ret void\n}\n"
    caller = ("declare hidden void @g()\ndeclare void @torchburn_no_such_function()\n"
              "define void @f() {\n  call void @g()\n  call void @torchburn_no_such_function()\n  ret void\n}\n")
    parts = jit.ModuleParts(TARGET)
    try:
        parts.add(callee)
        parts.add(caller)
        with pytest.raises(jit.JITError, match="torchburn_no_such_function") as err:
            parts.finish()
        assert "'g'" not in str(err.value)
    finally:
        parts.close()


def test_a_part_llvm_rejects_is_reported_when_finishing() -> None:
    from torchburn.runtime import jit

    parts = jit.ModuleParts(TARGET)
    try:
        parts.add("define void @f() {\n ret i32 0\n}")
        with pytest.raises(jit.JITError, match="rejected"):
            parts.finish()
    finally:
        parts.close()


def test_parts_one_kernel_at_a_time_share_functions_where_aliasing_allows() -> None:
    """`PartEmitter`: a kernel equal to one emitted before calls its function, unless its own
    call passes one buffer to a written parameter and another (then it needs its own function,
    without `noalias` there); the entry declares what each kernel calls."""
    from torchburn.codegen.llvm.module import PartEmitter

    x, y = buf("x", dt.f32, (16,)), buf("y", dt.f32, (16,))
    i = Var("i")

    def kernel(name: str) -> lp.Kernel:
        return lp.Kernel(name, (x, y), (), loop(i, Const(16), store(y, (i,), ex.add(load(x, i), ex.const(1.0, dt.f32)))))

    a, b, c = buf("a", dt.f32, (16,)), buf("b", dt.f32, (16,)), buf("c", dt.f32, (16,))
    calls = (lp.KernelCall("k0", ("a", "b")), lp.KernelCall("k1", ("b", "b")), lp.KernelCall("k2", ("b", "c")))
    prog = lp.Program("p", (a,), (c,), (b,), (), calls, (kernel("k0"), kernel("k1"), kernel("k2")),
                      temp_offsets=(("b", Const(0)),), workspace_bytes=Const(64))
    parts = PartEmitter(prog, TARGET)
    first = parts.kernel(prog.kernels[0])
    assert first is not None and 'ptr noalias readonly %"x"' in first
    own = parts.kernel(prog.kernels[1])  # in place: %y and %x are the same buffer
    assert own is not None
    params = re.search(r'define hidden void @"p\.k1"\((.*)\)', own)
    assert params is not None and "noalias" not in params.group(1)
    assert parts.kernel(prog.kernels[2]) is None  # shares k0's function
    assert not parts.covers(replace(prog, kernels=prog.kernels[:2]))
    entry = parts.entry(prog)
    assert len(entry) == 1
    assert entry[0].count("declare hidden void") == 2
