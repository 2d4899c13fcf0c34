"""Every interpretation of the IR (the LLVM emitter, the WGSL renderer, and any other that
registers with `ir/semantics.py`) has an entry for every scalar op on every dtype the
semantics define it on. Adding an op to `ir/semantics.py` without a handler fails here."""
from __future__ import annotations

import importlib

import pytest

from torchburn.ir import dtypes as dt
from torchburn.ir import semantics as sem

#: Modules that register an interpretation on import.
MODULES = ["torchburn.codegen.llvm", "torchburn.codegen.wgsl.expr", "torchburn.runtime.reference.ops"]
#: Interpretations that must be registered once those modules are imported.
EXPECTED = {"llvm", "wgsl", "reference"}


def _registered() -> dict[str, sem.Handles]:
    for name in MODULES:
        importlib.import_module(name)
    return sem.interpretations()


def test_expected_interpretations_register() -> None:
    assert EXPECTED <= set(_registered())


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_interpretation_covers_every_op(name: str) -> None:
    handles = _registered()[name]
    missing = sem.missing(handles)
    assert not missing, f"{name} lacks {sorted((op, str(d)) for op, d in missing)}"
    assert not sem.missing_ops(op for op in sem.SCALAR_OPS
                               if any(handles(op, d) for d in dt.ALL_DTYPES if sem.defined(op, d)))


def test_a_missing_entry_is_reported() -> None:
    llvm = _registered()["llvm"]

    def without_fma_on_f16(op: str, d: dt.DType) -> bool:
        return not (op == "fma" and d == dt.f16) and llvm(op, d)

    assert sem.missing(without_fma_on_f16) == {("fma", dt.f16)}


def test_every_semantic_op_is_defined_somewhere() -> None:
    """No name in SCALAR_OPS is defined on no dtype (it would be covered vacuously)."""
    for op in sem.SCALAR_OPS:
        assert any(sem.defined(op, d) for d in dt.ALL_DTYPES), op


def test_llvm_tables_hold_exactly_the_semantics_ops() -> None:
    """The LLVM per-kind tables have no op the semantics do not define (no stray handler)."""
    from torchburn.codegen.llvm import binary, mathfuncs

    for kind, table in {**binary.TABLES}.items():
        for op in table:
            assert op in sem.TABLES[kind], (op, kind)
    for kind, table in mathfuncs.UNARY_TABLES.items():
        for op in table:
            assert op in sem.TABLES[kind], (op, kind)


def test_wgsl_unsupported_entries_say_why() -> None:
    from torchburn.codegen.wgsl import ops
    from torchburn.codegen.wgsl.expr import ExprRenderer, Helpers
    from torchburn.codegen.wgsl.types import Caps, WgslUnsupported
    from torchburn.ir import expr as ex

    r = ExprRenderer(Caps(), Helpers(), load=lambda e: ("x", 1), var=lambda v: (v.name, 1))
    x = ex.Var("x", ex.ScalarType(dt.f32))
    with pytest.raises(WgslUnsupported, match="lgamma.*no built-in"):
        r.render(ex.Call("lgamma", (x,), x.type))
    y = ex.Var("y", ex.ScalarType(dt.f64))
    with pytest.raises(WgslUnsupported, match="64-bit floats"):
        r.render(ex.Binary("add", y, y, y.type))
    assert all(reason for reason in ops.UNSUPPORTED.values())
