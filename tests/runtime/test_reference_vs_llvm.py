"""Random expressions (`tests/ir/strategies.py`) run by the reference engine and by LLVM code:
the same values. Inputs come from memory (so LLVM cannot fold them); examples whose meaning is
undefined (integer division by zero, float -> int out of range, the bits of a NaN) are skipped."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tests.ir.strategies import expressions
from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir import semantics
from torchburn.runtime import faults
from torchburn.runtime.reference import ReferenceEntry
from torchburn.runtime.reference.values import storage_dtype

pytest.importorskip("llvmlite")
from tests.codegen.util import Compiled  # noqa: E402  (needs llvmlite)

#: Functions whose LLVM form is an approximation (libm or polynomial), compared with a tolerance.
APPROXIMATE = {"exp", "log", "tanh", "sigmoid", "erf", "sin", "pow", "sqrt", "rsqrt", "atan2", "hypot", "fmod"}


def _index(lanes: int) -> ex.Expr:
    return ex.Ramp(ex.Const(0), ex.Const(1), ex.ScalarType(dt.index, lanes)) if lanes > 1 else ex.Const(0)


def _random(d: dt.DType, lanes: int, rng: np.random.Generator) -> np.ndarray:
    if d.is_bool:
        return rng.random(lanes) > 0.5
    if d.is_float:
        v = rng.standard_normal(lanes) * 4
        v[rng.random(lanes) < 0.1] = np.nan
        return np.asarray(semantics.to_array(v, d))
    info = np.iinfo(semantics.storage(d))
    small = rng.integers(-20, 20, lanes) if d.kind == "i" else rng.integers(0, 20, lanes)
    wide = rng.integers(info.min, info.max, lanes, endpoint=True)
    return np.where(rng.random(lanes) < 0.8, small, wide).astype(semantics.storage(d))


def _program(e: ex.Expr, var_types: dict[str, ex.ScalarType]) -> lp.Program:
    ins, lets = [], []
    for name, t in sorted(var_types.items()):
        if t == ex.INDEX and name in ("s0", "s1"):
            continue
        b = lp.Buffer(f"in_{name}", t.dtype, (ex.Const(t.lanes),), (ex.Const(1),))
        ins.append(b)
        lets.append(lp.Let(ex.Var(name, t), ex.Load(b.name, (_index(t.lanes),), t)))
    out = lp.Buffer("out", e.dtype, (ex.Const(e.lanes),), (ex.Const(1),))
    body = lp.block(*lets, lp.Store(out.name, (_index(e.lanes),), e))
    syms = (ex.Var("s0"), ex.Var("s1"))
    params = (*ins, out)
    kernel = lp.Kernel("k", params, syms, body)
    return lp.Program("p", tuple(ins), (out,), (), syms, (lp.KernelCall("k", tuple(b.name for b in params)),), (kernel,))


def _undefined(e: ex.Expr) -> bool:
    for node in ex.walk(e):
        if isinstance(node, ex.Cast) and node.value.dtype.is_float and node.dtype.is_int:
            return True  # LLVM's fptosi of an out-of-range value is poison
        if isinstance(node, ex.Bitcast) and node.value.dtype.is_float:
            return True  # the bits of a NaN (sign, payload) are not fixed by IEEE
        if isinstance(node, ex.Load):
            return True
        if isinstance(node, ex.Binary) and node.op == "copysign" and not _plain_number(node.b):
            return True  # the sign of a NaN an operation makes (0 * inf) is not fixed either
    return False


def _plain_number(e: ex.Expr) -> bool:
    """A constant that is not NaN, or a broadcast of one: never a NaN of unknown sign."""
    if isinstance(e, ex.Broadcast):
        return _plain_number(e.value)
    return isinstance(e, ex.Const) and e.value == e.value


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=expressions(max_depth=3), seed=st.integers(0, 2 ** 16))
def test_random_expressions_agree_with_llvm(case: tuple[ex.Expr, object], seed: int) -> None:
    e, env = case
    assume(not _undefined(e))
    types = {n: t for n, t in env.vars.items() if n in ex.free_vars(e)}  # type: ignore[attr-defined]
    program = _program(e, types)
    rng = np.random.default_rng(seed)
    values = {b.name: _random(b.dtype, int(b.shape[0].value), rng) for b in program.inputs}
    symbols = [int(rng.integers(-8, 64)), int(rng.integers(-8, 64))]
    arrays = [np.ascontiguousarray(values[b.name]).view(storage_dtype(b.dtype)) if b.dtype != dt.bf16
              else np.asarray(semantics.bitcast_value(values[b.name], dt.bf16, dt.i16)).view(np.uint16)
              for b in program.inputs]
    sd = storage_dtype(e.dtype)
    golden, native = np.zeros(e.lanes, sd), np.zeros(e.lanes, sd)
    syms = (ctypes.c_int64 * 2)(*symbols)
    before = faults.counter.value
    try:
        ReferenceEntry(program)((ctypes.c_void_p * (len(arrays) + 1))(*[a.ctypes.data for a in arrays], golden.ctypes.data),
                                syms, None)
    except (semantics.DivisionByZero, semantics.UndefinedOp):
        assume(False)
    faulted = faults.counter.value != before
    before = faults.counter.value
    # the pointer array is named: `addressof` of a temporary would point at freed memory by the
    # time the call reads it (what made this test segfault now and then)
    pointers = (ctypes.c_void_p * (len(arrays) + 1))(*[a.ctypes.data for a in arrays], native.ctypes.data)
    Compiled(program).entry(ctypes.addressof(pointers), ctypes.addressof(syms), None)
    # a division by zero is a fault in both engines (the reference stops, native code carries on
    # with a defined value; the launcher then runs the call in PyTorch): outputs not compared
    assert (faults.counter.value != before) == faulted, f"fault in one engine only: {e}"
    if faulted:
        return
    if e.dtype == dt.bf16:
        golden, native = (np.asarray(semantics.bitcast_value(x.view(np.int16), dt.i16, dt.bf16)) for x in (golden, native))
    if e.dtype.is_float:
        approx = any(isinstance(n, (ex.Call, ex.Binary)) and getattr(n, "name", getattr(n, "op", "")) in APPROXIMATE
                     for n in ex.walk(e))
        tol = {16: 1e-2, 32: 1e-4, 64: 1e-9}[e.dtype.bits] if approx else 0
        np.testing.assert_allclose(native.astype(np.float64), golden.astype(np.float64), rtol=tol, atol=tol,
                                   equal_nan=True, err_msg=str(e))
    else:
        np.testing.assert_array_equal(native, golden, err_msg=str(e))


@pytest.mark.parametrize("op,lanes", [("add", 4), ("mul", 4), ("add", 8), ("add", 16), ("mul", 16)])
def test_vector_reduce_order_is_the_same_tree_in_both_engines(op: str, lanes: int) -> None:
    """Float `vreduce_add`/`vreduce_mul` combine lanes as a halving tree in both engines (the
    sequential order rounds otherwise: 305^4 as ((305*305)*305)*305 is 8653649920 in f32, as
    (305*305)*(305*305) 8653650944; 1e8 + 1 - 1e8 + 1 is 1 lane by lane, 2 as a tree)."""
    t = ex.ScalarType(dt.f32, lanes)
    e = ex.VectorReduce(op, ex.Var("v", t), ex.ScalarType(dt.f32))
    program = _program(e, {"v": t})
    if op == "mul":
        x = np.full(lanes, 305.0, np.float32)
        x[lanes // 2:] = np.linspace(1.5, 2.5, lanes - lanes // 2)
        x[: min(4, lanes)] = 305.0
    else:
        x = np.ones(lanes, np.float32)
        x[0], x[lanes // 2] = 1e8, -1e8
    golden, native = np.zeros(1, np.float32), np.zeros(1, np.float32)
    syms = (ctypes.c_int64 * 2)(0, 0)
    ReferenceEntry(program)((ctypes.c_void_p * 2)(x.ctypes.data, golden.ctypes.data), syms, None)
    pointers = (ctypes.c_void_p * 2)(x.ctypes.data, native.ctypes.data)  # named: kept alive for the call
    Compiled(program).entry(ctypes.addressof(pointers), ctypes.addressof(syms), None)
    sequential = np.float32(x[0])
    for value in x[1:]:
        sequential = np.float32(sequential + value if op == "add" else sequential * value)
    assert native[0] == golden[0], (native, golden)
    assert golden[0] != sequential, "the example does not tell the orders apart"
