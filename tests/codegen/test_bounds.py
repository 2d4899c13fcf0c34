"""Bounds mode (`TORCHBURN_DEBUG=bounds`, `codegen/llvm/bounds.py`): generated code checks every
load and store against its buffer; an access out of range is not made and raises `OutOfBounds`
naming the kernel, the buffer and the index. Correct programs run unchanged in the mode.

The whole property suite passes in the mode too (`TORCHBURN_DEBUG=bounds pytest
tests/frontend/test_properties.py`, about 2.5 minutes here); CI runs the subset below."""
from __future__ import annotations

import ctypes
import dataclasses
from typing import Any, Callable, ClassVar, Iterator

import pytest
import torch

from torchburn.codegen import entry_name
from torchburn.codegen.llvm.module import emit_program
from torchburn.compiler import driver
from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.expr import Const, Var
from torchburn.passes.base import LoopPass
from torchburn.runtime import faults, jit
from torchburn.runtime.config import Config, reload_config
from tests.codegen.util import TARGET, buf, load, loop, program, store
from tests.helpers import check


@pytest.fixture
def bounds_mode(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("TORCHBURN_DEBUG", "bounds")
    reload_config()
    torch._dynamo.reset()
    yield
    monkeypatch.undo()
    reload_config()
    torch._dynamo.reset()


def test_the_mode_is_a_word_of_torchburn_debug() -> None:
    assert Config.from_env({"TORCHBURN_DEBUG": "bounds"}).bounds_check
    assert not Config.from_env({"TORCHBURN_DEBUG": "bounds"}).debug
    both = Config.from_env({"TORCHBURN_DEBUG": "1,bounds"})
    assert both.bounds_check and both.debug
    assert not Config.from_env({"TORCHBURN_DEBUG": "1"}).bounds_check


@dataclasses.dataclass(frozen=True)
class Overrun(LoopPass):
    """A deliberately wrong user pass: every top-level loop runs `extra` iterations too far."""

    name: ClassVar[str] = "test-overrun"
    extra: int = 3

    def run(self, program: lp.Program) -> lp.Program:
        kernels = []
        for k in program.kernels:
            stmts = k.body.stmts if isinstance(k.body, lp.Block) else (k.body,)
            longer = tuple(dataclasses.replace(s, extent=ex.add(s.extent, Const(self.extra)))
                           if isinstance(s, lp.For) else s for s in stmts)
            kernels.append(dataclasses.replace(k, body=lp.Block(longer)))
        return dataclasses.replace(program, kernels=tuple(kernels))


def test_an_access_out_of_range_raises_naming_kernel_buffer_and_index(bounds_mode: None) -> None:
    """Through the public API (a user loop pass): the vectorized loop over 64 x 16 floats runs
    3 vectors too far; the first access out of range is element 1024 of the input."""
    fn = torch.compile(lambda x: x * 2 + 1, backend="torchburn", options={"passes": {"loop-start": [Overrun()]}})
    x = torch.randn(64, 16)
    with pytest.raises(faults.OutOfBounds, match=r"kernel @\w+\.k0: buffer %arg0_1: element 1024 is out of range "
                                                 r"\(the buffer spans 1024 elements"):
        fn(x)
    assert faults.take_out_of_bounds() is None  # the launcher took the record


def test_gathers_and_stores_out_of_range_are_caught_and_not_made() -> None:
    """A hand-written kernel: `out[i] = x[idx[i]]` with one index past the end, and a store
    whose index comes from data. Nothing outside the buffers is touched (the guard bytes
    around `out` stay), and the record names the buffer."""
    i = Var("i", ex.INDEX)
    x, idx, out = buf("x", dt.f32, [8]), buf("idx", dt.i64, [8]), buf("out", dt.f32, [8])
    gathered = ex.Load("x", (load(idx, i),), ex.ScalarType(dt.f32))
    body = loop(i, 8, store(out, [load(idx, i)], gathered))
    prog = program(body, [x, idx], [out])
    llvm_ir = emit_program(prog, TARGET, bounds_check=True)
    native = jit.load_object(jit.compile_llvm_ir(llvm_ir, TARGET))
    entry = native.entry(entry_name(prog))
    xs = torch.arange(8, dtype=torch.float32)
    index = torch.tensor([0, 1, 2, 3, 4, 5, 6, 1000])
    guarded = torch.full((24,), -7.0)
    o = guarded[8:16]
    ptrs = (ctypes.c_void_p * 3)(xs.data_ptr(), index.data_ptr(), o.data_ptr())
    before = faults.counter.value
    syms = (ctypes.c_int64 * 1)()  # named: `addressof` of a temporary would dangle
    entry(ctypes.addressof(ptrs), ctypes.addressof(syms), None)
    assert faults.counter.value > before
    err = faults.take_out_of_bounds()
    assert err is not None and "buffer %x: element 1000" in str(err) and "spans 8 elements" in str(err)
    assert o[:7].tolist() == list(range(7)) and (guarded[:8] == -7).all() and (guarded[16:] == -7).all()


CASES: list[tuple[str, Callable[..., Any], tuple[Any, ...]]] = [
    ("broadcast", lambda a, b: a * b + a, (torch.randn(5, 1, 7), torch.randn(3, 1))),
    ("transposed", lambda a: torch.tanh(a.t()) - 1, (torch.randn(9, 33),)),
    ("strided", lambda a, b: a[:, ::3] + b, (torch.randn(4, 30), torch.randn(10))),
    # strided vector loads read their span whole (`memory.strided_pattern`): at these widths
    # the last row's last vector ends on the buffer's last element
    ("strided_span_2", lambda a: a[:, ::2] * 2, (torch.randn(5, 31),)),
    ("strided_span_3", lambda a: a[:, ::3] + 1, (torch.randn(5, 94),)),
    ("empty", lambda a: a * 2, (torch.randn(0, 5),)),
    ("reductions", lambda a: (a.sum(0), a.amax(1), a.mean((0, 1), keepdim=True)), (torch.randn(17, 40),)),
    ("softmax", lambda a: torch.softmax(a, -1), (torch.randn(6, 130),)),
    ("matmul", lambda a, b, c: torch.addmm(c, a, b), (torch.randn(7, 19), torch.randn(19, 11), torch.randn(11))),
    ("gather", lambda a, i: a[i] + torch.cat([a, a])[: len(i)], (torch.randn(12), torch.tensor([0, 11, 3, 3, 5]))),
    ("int_division", lambda a, b: (a // b, a % b), (torch.arange(-40, 40), torch.arange(1, 81))),
    ("parallel", lambda a: (a * 3).sum(1), (torch.randn(512, 600),)),
]


@pytest.mark.parametrize("name, fn, args", CASES, ids=[c[0] for c in CASES])
def test_correct_programs_run_unchanged_in_bounds_mode(bounds_mode: None, name: str, fn: Callable[..., Any],
                                                       args: tuple[Any, ...]) -> None:
    driver.memory_cache().clear()
    # a 600-term sum in another order than eager's: f32 rounding of the order, not of the mode
    tol = {"rtol": 1e-5, "atol": 1e-4} if name == "parallel" else {}
    check(fn, *args, **tol)
    modules = list(driver.memory_cache().entries.values())
    stores = [m for m in modules if any(isinstance(s, lp.Store) for k in m.program.kernels for s in lp.walk_stmts(k.body))]
    assert all("torchburn.bounds.check" in m.llvm_ir for m in stores)
    assert stores or name == "empty"
