"""Kernels linked into a shared library and loaded without LLVM (`runtime/shared_lib.py`) compute
what the MCJIT-loaded object computes; a library that cannot load fails at load, not at a call."""
from __future__ import annotations

import dataclasses
import gc
import hashlib
import os
import shutil
import struct

import pytest
import torch

from tests.runtime.test_jit import TARGET, call, small_program
from torchburn.codegen import emit_program, entry_name
from torchburn.runtime import jit, shared_lib

needs_linker = pytest.mark.skipif(shutil.which("ld") is None, reason="no system linker (ld)")


@needs_linker
@pytest.mark.parametrize("kind", ["serial", "parallel"])
def test_shared_library_matches_the_object(kind: str) -> None:
    prog = small_program(kind)
    obj = jit.compile_llvm_ir(emit_program(prog, TARGET), TARGET, shared=True)
    assert obj.shared[:4] == b"\x7fELF" and obj.uses_openmp == (kind == "parallel")
    lib = shared_lib.load_shared(obj)
    native = jit.load_object(obj)
    x = torch.randn(1000)
    out_lib, out_obj = torch.empty(1000), torch.empty(1000)
    call(lib, entry_name(prog), x, out_lib, symbols=[1000])  # type: ignore[arg-type]
    call(native, entry_name(prog), x, out_obj, symbols=[1000])
    torch.testing.assert_close(out_lib, torch.exp(x) + 1)
    assert torch.equal(out_lib, out_obj)
    with pytest.raises(KeyError, match="no function"):
        lib.address("nope")


def test_without_shared_request_or_library_nothing_is_linked() -> None:
    prog = small_program()
    obj = jit.compile_llvm_ir(emit_program(prog, TARGET), TARGET)
    assert obj.shared == b""
    with pytest.raises(OSError, match="no shared library"):
        shared_lib.load_shared(obj)


@needs_linker
def test_unresolved_symbol_fails_at_load() -> None:
    text = ('declare float @torchburn_no_such_function(float)\n'
            'define void @f(ptr %a, ptr %b, ptr %c) {\n'
            '  %x = call float @torchburn_no_such_function(float 1.0)\n  ret void\n}\n')
    pic = jit._pic_target_machine(TARGET, 3)
    import llvmlite.binding as llvm

    mod = llvm.parse_assembly(text)
    mod.triple = TARGET.triple
    library = jit._link_shared([bytes(pic.emit_object(mod))])
    assert library[:4] == b"\x7fELF"
    obj = dataclasses.replace(jit.ObjectCode(b"", TARGET.triple, TARGET.cpu, TARGET.features), shared=library)
    with pytest.raises(OSError):
        shared_lib.load_shared(obj)


@needs_linker
def test_two_libraries_in_one_process_stay_apart() -> None:
    """The dynamic loader reuses a loaded library of the same file name: each library must get
    its own name, or the second program would run the first one's code."""
    def build(body: str) -> "jit.ObjectCode":
        text = ('define void @torchburn_entry(ptr %a, ptr %b, ptr %c) {\n'
                f'  store float {body}, ptr %a\n  ret void\n}}\n')
        return jit.compile_llvm_ir(text, TARGET, shared=True)

    one, two = build("1.0"), build("2.0")
    out = torch.zeros(1)
    for obj, expected in ((one, 1.0), (two, 2.0), (one, 1.0)):
        lib = shared_lib.load_shared(obj)
        lib.entry("torchburn_entry")(out.data_ptr(), None, None)
        assert out.item() == expected


def _relocation_types(elf: bytes) -> set[int]:
    """The relocation types an ELF64 little-endian relocatable object uses (its RELA sections)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    types = set()
    for i in range(shnum):
        sh_type, = struct.unpack_from("<I", elf, shoff + i * shentsize + 4)
        offset, size = struct.unpack_from("<QQ", elf, shoff + i * shentsize + 0x18)
        if sh_type == 4:  # SHT_RELA: entries of 24 bytes, the type in r_info's low 32 bits
            types |= {struct.unpack_from("<Q", elf, offset + j + 8)[0] & 0xFFFFFFFF for j in range(0, size, 24)}
    return types


@needs_linker
@pytest.mark.parametrize("parts", [False, True])
def test_mcjit_never_links_a_position_independent_object(parts: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """An object emitted for a shared library reaches its constants by 32-bit offsets; MCJIT
    maps code and data apart, in a process with gigabytes mapped possibly more than 2 GB apart
    (a server aborted in LLVM's `isInt<32>(RealOffset)` assertion). So this process runs the
    library (`load_native`), and where the library does not link, the object MCJIT gets is
    the JIT's own emission (large code model: the same relocations)."""
    prog = small_program("parallel")
    text = emit_program(prog, TARGET)

    def compile_(shared: bool) -> "jit.ObjectCode":
        if not parts:
            return jit.compile_llvm_ir(text, TARGET, shared=shared)
        modules = jit.ModuleParts(TARGET, shared=shared)
        try:
            modules.add(text)
            return modules.finish()
        finally:
            modules.close()

    linked, plain = compile_(True), compile_(False)
    assert isinstance(jit.load_native(linked), shared_lib.SharedModule)
    assert not isinstance(jit.load_native(plain), shared_lib.SharedModule)
    assert linked.data != plain.data  # position independent, small code model
    monkeypatch.setattr(jit, "_link_shared", lambda objects: b"")
    unlinked = compile_(True)
    assert unlinked.shared == b""
    assert _relocation_types(unlinked.data) == _relocation_types(plain.data) != _relocation_types(linked.data)
    x, out = torch.randn(1000), torch.empty(1000)
    call(jit.load_native(unlinked), entry_name(prog), x, out, symbols=[1000])
    torch.testing.assert_close(out, torch.exp(x) + 1)


@needs_linker
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads /proc/self/maps")
def test_a_library_is_unloaded_with_its_module() -> None:
    """Libraries go with their modules (as MCJIT's code goes with its engine): a process that
    compiles many programs, as the tuner does, does not keep every one mapped."""
    def mapped(obj: "jit.ObjectCode") -> bool:
        name = hashlib.sha256(obj.shared).hexdigest() + ".so"
        with open("/proc/self/maps") as maps:
            return any(name in line for line in maps)

    objects, entries = [], []
    for i in range(3):
        text = ('define void @torchburn_entry(ptr %a, ptr %b, ptr %c) {\n'
                f'  store float {i}.0, ptr %a\n  ret void\n}}\n')
        obj = jit.compile_llvm_ir(text, TARGET, shared=True)
        module = jit.load_native(obj)
        out = torch.zeros(1)
        entries.append(module.entry("torchburn_entry"))
        del module  # the entry holds it
        entries[-1](out.data_ptr(), None, None)
        assert out.item() == i and mapped(obj)
        objects.append(obj)
    del entries
    gc.collect()  # (an entry and its module refer to each other)
    assert not any(mapped(obj) for obj in objects)
