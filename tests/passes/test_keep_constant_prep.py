"""`keep-constant-prep` (passes/loop/keep_constant_prep.py): a kernel's work on constant inputs
alone runs under `if refresh != 0`, its temporaries kept across calls; `plan-memory` keeps
their bytes."""
from __future__ import annotations

import ctypes

import numpy as np

from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_program
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify_program
from torchburn.passes.loop.keep_constant_prep import KeepConstantPrep
from torchburn.passes.loop.memory_plan import PlanMemory
from torchburn.runtime.reference import ReferenceEntry

#: `out = x @ w` with `w` packed transposed into the scratch `%wp` first (as a conv packs its weight).
PROGRAM = """
program @f(%x: f32[4, 8] strides [8, 1], %w: f32[8, 4] strides [4, 1]) -> (%out0: f32[4, 4] strides [4, 1]) {
  temp %wp: f32[4, 8] strides [8, 1]
  temp %t: f32[4] strides [1]
  CONSTANT
  call @k0(%wp, %w, %x, %out0)
  call @k1(%out0, %t)
}
kernel @k0(%wp: f32[4, 8] strides [8, 1], %w: f32[8, 4] strides [4, 1], %x: f32[4, 8] strides [8, 1], %out0: f32[4, 4] strides [4, 1]) {
  for j in 0..4 {
    for k in 0..8 {
      %wp[j, k] = %w[k, j]
    }
  }
  for i in 0..4 {
    for j in 0..4 {
      %out0[i, j] = 0.0:f32
      for k in 0..8 {
        %out0[i, j] = %out0[i, j] + %x[i, k] * %wp[j, k]
      }
    }
  }
}
kernel @k1(%out0: f32[4, 4] strides [4, 1], %t: f32[4] strides [1]) {
  for i in 0..4 {
    %t[i] = %out0[i, 0]
  }
}
"""


def program(constant: str = "constant %w", text: str = PROGRAM) -> lp.Program:
    return parse_program(text.replace("CONSTANT", constant))


def test_packing_of_a_constant_input_is_guarded_and_kept() -> None:
    out = KeepConstantPrep().run(program())
    verify_program(out)
    assert out.kept == ("wp",) and out.kept_from == ("w",)
    assert [s.name for s in out.symbols] == [lp.REFRESH]
    k0 = out.kernel("k0")
    assert [s.name for s in k0.symbols] == [lp.REFRESH]
    first, second = k0.body.stmts  # type: ignore[attr-defined]
    assert isinstance(first, lp.If) and "refresh != 0" in print_ir(out)
    assert isinstance(second, lp.For)  # the product itself runs every call
    assert out.kernel("k1") == program().kernel("k1")
    assert parse_program(print_ir(out)) == out  # `kept ... from ...` round trips


def test_nothing_is_kept_without_a_constant_input() -> None:
    p = program(constant="")
    assert KeepConstantPrep().run(p) is p
    p = program(constant="constant %x")  # the packing reads %w, which is not constant
    assert KeepConstantPrep().run(p) is p


def test_a_statement_reading_a_variable_input_or_an_outer_variable_is_not_kept() -> None:
    reads_x = PROGRAM.replace("%wp[j, k] = %w[k, j]", "%wp[j, k] = %w[k, j] + %x[j, k]")
    assert KeepConstantPrep().run(program(text=reads_x)).kept == ()
    outer_let = PROGRAM.replace("  for j in 0..4 {\n    for k in 0..8 {\n      %wp[j, k] = %w[k, j]",
                                "  let z = 0\n  for j in 0..4 {\n    for k in 0..8 {\n      %wp[j, k + z] = %w[k, j]")
    assert outer_let != PROGRAM and KeepConstantPrep().run(program(text=outer_let)).kept == ()
    again = PROGRAM.replace("call @k1(%out0, %t)", "call @k1(%out0, %t)\n  call @k0(%wp2, %w, %x, %out0)").replace(
        "  temp %t:", "  temp %wp2: f32[4, 8] strides [8, 1]\n  temp %t:")
    kept = KeepConstantPrep().run(program(text=again))
    assert kept.kept == ("wp", "wp2")  # k0 called twice (merged layers), each call its own scratch...
    shared = again.replace("call @k0(%wp2,", "call @k0(%wp,")
    assert KeepConstantPrep().run(program(text=shared)).kept == ("wp",)  # or one scratch for both
    half = again.replace("call @k0(%wp2, %w,", "call @k0(%wp2, %x,")
    assert KeepConstantPrep().run(program(text=half)).kept == ()  # not when one call packs %x
    two_users = PROGRAM.replace("call @k1(%out0, %t)", "call @k1(%out0, %t)\n  call @k2(%wp, %t)").replace(
        "kernel @k1(", "kernel @k2(%wp: f32[4, 8] strides [8, 1], %t: f32[4] strides [1]) {\n"
        "  for i in 0..4 {\n    %t[i] = %wp[i, 0]\n  }\n}\nkernel @k1(")
    assert KeepConstantPrep().run(program(text=two_users)).kept == ("wp",)  # read by another kernel: still kept


def test_a_temporary_also_written_outside_the_preparation_is_not_kept() -> None:
    rewritten = PROGRAM.replace("      %out0[i, j] = 0.0:f32\n", "      %out0[i, j] = 0.0:f32\n      %wp[j, 0] = 1.0:f32\n")
    assert KeepConstantPrep().run(program(text=rewritten)).kept == ()


def test_kept_temporaries_come_first_and_are_never_shared() -> None:
    planned = PlanMemory().run(KeepConstantPrep().run(program()))
    offsets = dict(planned.temp_offsets)
    assert int(offsets["wp"].value) == 0  # type: ignore[attr-defined]
    assert int(offsets["t"].value) >= 4 * 8 * 4  # %t lives after %wp's 128 bytes, though %wp is dead by @k1
    unkept = PlanMemory().run(program())
    assert int(dict(unkept.temp_offsets)["t"].value) == 0  # without the mark %t reuses %wp's bytes


def _run(entry: ReferenceEntry, x: np.ndarray, w: np.ndarray, out: np.ndarray, ws: np.ndarray, refresh: int) -> None:
    ptrs = [a.ctypes.data for a in (x, w, out)]
    entry(ptrs, (ctypes.c_int64 * 1)(refresh), ws.ctypes.data)


def test_the_reference_engine_keeps_the_packed_copy_between_calls() -> None:
    planned = PlanMemory().run(KeepConstantPrep().run(program()))
    entry = ReferenceEntry(planned)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    out = np.zeros((4, 4), np.float32)
    ws = np.zeros(int(planned.workspace_bytes.value), np.uint8)  # type: ignore[attr-defined]
    _run(entry, x, w, out, ws, refresh=1)
    np.testing.assert_allclose(out, x @ w, rtol=1e-5)
    old = w.copy()
    w *= 2
    _run(entry, x, w, out, ws, refresh=0)  # the packed copy of the old weight is what it reads
    np.testing.assert_allclose(out, x @ old, rtol=1e-5)
    _run(entry, x, w, out, ws, refresh=1)
    np.testing.assert_allclose(out, x @ w, rtol=1e-5)


def test_a_kernel_computing_from_constants_alone_is_kept_with_the_packing_that_reads_it() -> None:
    folded = PROGRAM.replace("  call @k0(%wp, %w, %x, %out0)", "  call @k2(%w, %wf)\n  call @k0(%wp, %wf, %x, %out0)").replace(
        "  temp %t:", "  temp %wf: f32[8, 4] strides [4, 1]\n  temp %t:").replace(
        "kernel @k1(", "kernel @k2(%w: f32[8, 4] strides [4, 1], %wf: f32[8, 4] strides [4, 1]) {\n"
        "  for i in 0..8 {\n    for j in 0..4 {\n      %wf[i, j] = %w[i, j] * 2.0:f32\n    }\n  }\n}\nkernel @k1(")
    out = KeepConstantPrep().run(program(text=folded))
    verify_program(out)
    # %wf, read only by the packing, need not outlive the call: only the packed %wp is kept
    assert out.kept == ("wp",) and out.kept_from == ("w",)
    assert isinstance(out.kernel("k2").body, lp.If)  # the folding runs only when refreshing
    planned = PlanMemory().run(out)
    offsets = dict(planned.temp_offsets)
    assert int(offsets["wp"].value) == 0 and int(offsets["t"].value) == 128  # type: ignore[attr-defined]
    assert int(offsets["wf"].value) == 128  # type: ignore[attr-defined]  # %t reuses the folded weight's bytes
    entry = ReferenceEntry(planned)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    out0 = np.zeros((4, 4), np.float32)
    ws = np.zeros(int(planned.workspace_bytes.value), np.uint8)  # type: ignore[attr-defined]
    for refresh in (1, 0, 0):
        _run(entry, x, w, out0, ws, refresh)
        np.testing.assert_allclose(out0, x @ (2 * w), rtol=1e-5)
