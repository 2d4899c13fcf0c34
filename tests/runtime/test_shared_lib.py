"""Kernels linked into a shared library and loaded without LLVM (`runtime/shared_lib.py`) compute
what the MCJIT-loaded object computes; a library that cannot load fails at load, not at a call."""
from __future__ import annotations

import dataclasses
import shutil

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
