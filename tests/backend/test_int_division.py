"""Integer division as eager PyTorch does it (issue 16): a zero divisor raises eager's error
from inside the compiled call, the process lives on, and INT_MIN / -1 gives eager's value.

Generated code counts a zero divisor as a fault instead of dividing (`codegen/llvm/faults.py`);
the launcher sees the fault counter move and runs the call in PyTorch, which raises
(`backend/launcher_gen.py`). Every test here runs in this process: a SIGFPE would kill pytest.
"""
from __future__ import annotations

import threading
from typing import Any, Callable

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from torchburn.runtime import faults
from tests.helpers import assert_fully_compiled, engine, run_compiled

INT_DTYPES = [torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8]

DIVIDING: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "floordiv": lambda a, b: a // b,
    "div_trunc": lambda a, b: torch.div(a, b, rounding_mode="trunc"),
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "remainder": torch.remainder,
    "fmod": torch.fmod,
}


def eager_error(fn: Callable[..., Any], *args: Any) -> BaseException:
    try:
        fn(*args)
    except Exception as err:  # noqa: BLE001 - the error eager raises is what we compare with
        return err
    raise AssertionError("eager did not raise")


def operands(dtype: torch.dtype, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """n dividends and nonzero divisors spanning the dtype, INT_MIN / -1 first when signed."""
    info = torch.iinfo(dtype)
    g = torch.Generator().manual_seed(n)
    a = torch.randint(info.min, info.max, (n,), dtype=dtype, generator=g)
    b = torch.randint(info.min, info.max, (n,), dtype=dtype, generator=g)
    b[b == 0] = 3
    if dtype.is_signed:
        a[:2], b[:2] = info.min, -1
    return a, b


@pytest.fixture(autouse=True)
def fresh_dynamo() -> None:
    torch._dynamo.reset()  # one function per op is compiled for every dtype


def _each_division(a: torch.Tensor, *divisors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every dividing op, each with its own divisor (a 0 in one faults only that op)."""
    return tuple(fn(a, b) for fn, b in zip(DIVIDING.values(), divisors))


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_zero_divisor_raises_eagers_error_and_int_min_by_minus_one_is_eagers(dtype: torch.dtype) -> None:
    """101 elements: the vector loop and the scalar tail both divide; a 0 in either raises."""
    a, b = operands(dtype, 101)
    divisors = [b.clone() for _ in DIVIDING]
    trunc = list(DIVIDING).index("div_trunc")
    if dtype in (torch.int32, torch.int64):
        # eager itself dies of SIGFPE on INT_MIN / -1 here; the semantics wrap (ir/semantics.py)
        divisors[trunc][:2] = 1
    compiled = torch.compile(_each_division, backend="torchburn", dynamic=False, fullgraph=True)
    got = compiled(a, *divisors)
    torch.testing.assert_close(got, _each_division(a, *divisors), rtol=0, atol=0)
    assert got[trunc].dtype == dtype
    for k, name in enumerate(DIVIDING):
        for where in (0, 50, len(b) - 1):  # vector body and tail
            zeros = list(divisors)
            zeros[k] = divisors[k].clone()
            zeros[k][where] = 0
            expected = eager_error(_each_division, a, *zeros)
            with pytest.raises(type(expected), match=f"^{expected}$"):
                compiled(a, *zeros)
    torch.testing.assert_close(compiled(a, *divisors), _each_division(a, *divisors), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_int_min_trunc_divided_by_minus_one_wraps(dtype: torch.dtype) -> None:
    """Where eager traps (SIGFPE), the compiled call gives the semantics' wrapped INT_MIN."""
    lo = torch.iinfo(dtype).min
    a = torch.tensor([lo, lo, 7, -7] * 5, dtype=dtype)
    b = torch.tensor([-1, 1, -1, 2] * 5, dtype=dtype)
    got = torch.compile(DIVIDING["div_trunc"], backend="torchburn", dynamic=False)(a, b)
    assert got.tolist() == [lo, lo, -7, -3] * 5


def test_constant_zero_divisor_raises_and_a_constant_divisor_costs_no_check() -> None:
    x = torch.arange(-50, 50, dtype=torch.int32)
    expected = eager_error(lambda t: t // 0, x)
    with pytest.raises(type(expected), match=str(expected)):
        torch.compile(lambda t: t // 0, backend="torchburn")(x)
    before = faults.counter.value
    torch.testing.assert_close(torch.compile(lambda t: (t // -1, t % 7), backend="torchburn")(x), (x // -1, x % 7))
    assert faults.counter.value == before


def test_parallel_kernel_with_a_zero_divisor_raises() -> None:
    """Large enough for a parallel loop: the fault is counted from an OpenMP thread."""
    a, b = operands(torch.int32, 1 << 18)
    fn = DIVIDING["floordiv"]
    compiled = torch.compile(fn, backend="torchburn", dynamic=False)
    torch.testing.assert_close(compiled(a, b), fn(a, b), rtol=0, atol=0)
    b[-3] = 0
    with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
        compiled(a, b)


def test_reference_engine_agrees() -> None:
    a, b = operands(torch.int16, 40)
    fn = lambda x, y: (x // y, torch.fmod(x, y), torch.remainder(x, y))  # noqa: E731
    with engine("reference"):
        got, reports = run_compiled(fn, a, b)
        assert {s.engine for r in reports for s in r.subgraphs if s.compiled} == {"reference"}
        torch.testing.assert_close(got, fn(a, b), rtol=0, atol=0)
        b[7] = 0
        compiled = torch.compile(fn, backend="torchburn", dynamic=False)
        with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
            compiled(a, b)


def test_gpu_engine_leaves_division_by_tensor_values_to_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """WGSL defines x / 0 as x and cannot report a fault: such programs run on the CPU engine."""
    from torchburn.runtime import gpu
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_DEVICE", "gpu")
    reload_config()
    try:
        if not gpu.gpu_available():
            pytest.skip(f"no WebGPU adapter: {gpu.gpu_unavailable_reason()}")
        a, b = operands(torch.int32, 64)
        b[5] = 0
        fn = DIVIDING["remainder"]
        with pytest.raises(RuntimeError, match="^ZeroDivisionError$"):
            run_compiled(fn, a, b)
        b[5] = 1
        got, reports = run_compiled(fn, a, b)
        torch.testing.assert_close(got, fn(a, b), rtol=0, atol=0)
        used = [(s.engine, s.engine_note or "") for r in reports for s in r.subgraphs if s.compiled]
        assert used and all(e == "cpu" and "ZeroDivisionError" in note for e, note in used), used
    finally:
        monkeypatch.undo()
        reload_config()


def test_threads_see_only_their_own_faults() -> None:
    """The counter is process-wide: a call that sees another thread's fault runs in PyTorch and
    still returns the right values; the faulting call always raises."""
    a, b = operands(torch.int32, 4096)
    bad = b.clone()
    bad[100] = 0
    fn = DIVIDING["fmod"]
    compiled = torch.compile(fn, backend="torchburn", dynamic=False)
    expected = fn(a, b)
    compiled(a, b)
    problems: list[str] = []

    def good_calls() -> None:
        for _ in range(200):
            if not torch.equal(compiled(a, b), expected):
                problems.append("wrong values")

    def bad_calls() -> None:
        for _ in range(200):
            try:
                compiled(a, bad)
                problems.append("no error")
            except RuntimeError as err:
                if str(err) != "ZeroDivisionError":
                    problems.append(str(err))

    threads = [threading.Thread(target=good_calls), threading.Thread(target=bad_calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not problems, problems[:5]


# ---- every integer binary op against eager, on edge values ---------------------------------------

def _all_ops(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Every binary op on integers whose value eager defines for these operands (b != 0)."""
    shift = (b & 7).to(a.dtype)  # torch leaves shifts past the width to C; keep them in range
    out = [a + b, a - b, a * b, a & b, a | b, a ^ b, a << shift, a >> shift,
           torch.minimum(a, b), torch.maximum(a, b), a == b, a != b, a < b, a <= b, a > b, a >= b,
           a // b, torch.div(a, b, rounding_mode="floor"), torch.remainder(a, b), torch.fmod(a, b)]
    return tuple(out)


def _edge_values(dtype: torch.dtype) -> list[int]:
    info = torch.iinfo(dtype)
    return [0, 1, -1, 2, -2, 7, info.min, info.max, info.min + 1, info.max - 1] if dtype.is_signed \
        else [0, 1, 2, 7, 128, 254, 255]


_COMPILED: dict[torch.dtype, Callable[..., Any]] = {}
N = 24


@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_integer_op_matches_eager_on_edge_values(dtype: torch.dtype, data: st.DataObject) -> None:
    info = torch.iinfo(dtype)
    value = st.one_of(st.sampled_from(_edge_values(dtype)), st.integers(info.min, info.max))
    a = torch.tensor(data.draw(st.lists(value, min_size=N, max_size=N)), dtype=dtype)
    b = torch.tensor(data.draw(st.lists(value.filter(lambda v: v != 0), min_size=N, max_size=N)), dtype=dtype)
    compiled = _COMPILED.get(dtype)
    if compiled is None:
        torch._dynamo.reset()
        out, reports = run_compiled(_all_ops, a, b, reset=False)
        assert_fully_compiled(reports)
        compiled = _COMPILED[dtype] = torch.compile(_all_ops, backend="torchburn", dynamic=False)
    got = compiled(a, b)
    expected = _all_ops(a, b)
    for k, (x, y) in enumerate(zip(got, expected)):
        torch.testing.assert_close(x, y, rtol=0, atol=0, msg=lambda m: f"op #{k} of _all_ops: {m}")


def test_the_runtime_spells_the_globals_as_codegen_does() -> None:
    from torchburn.codegen.llvm import bounds, faults as codegen_faults

    assert faults.FAULT_GLOBAL == codegen_faults.FAULT_GLOBAL
    assert faults.BOUNDS_GLOBAL == bounds.BOUNDS_GLOBAL


@pytest.mark.parametrize("dtype", [torch.int8, torch.int32], ids=str)
def test_every_pair_of_edge_values_on_the_llvm_and_reference_engines(dtype: torch.dtype) -> None:
    """All pairs of edge values (nonzero divisor), through both CPU engines: each equals eager."""
    values = _edge_values(dtype)
    a = torch.tensor([x for x in values for y in values if y != 0], dtype=dtype)
    b = torch.tensor([y for x in values for y in values if y != 0], dtype=dtype)
    expected = _all_ops(a, b)
    for name in ("llvm", "reference"):
        with engine(name):
            got, reports = run_compiled(_all_ops, a, b)
        assert {s.engine for r in reports for s in r.subgraphs if s.compiled} == {"cpu" if name == "llvm" else name}
        for k, (x, y) in enumerate(zip(got, expected)):
            torch.testing.assert_close(x, y, rtol=0, atol=0, msg=lambda m: f"{name}, op #{k} of _all_ops: {m}")
