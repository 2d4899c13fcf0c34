"""`plan-memory` (passes/loop/memory_plan.py): offsets of temporaries of symbolic size stay short."""
from __future__ import annotations

from torchburn.ir import dtypes as dt
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp
from torchburn.ir.expr import Const, Var
from torchburn.ir.printer import print_expr
from torchburn.passes.loop.memory_plan import PlanMemory


def chain(n: int) -> lp.Program:
    """`n` temporaries, alternately f32[s0] and f32[16], all live at once (one call names all)."""
    s0 = Var("s0")
    temps = tuple(lp.Buffer(f"t{i}", dt.f32, (s0,) if i % 2 == 0 else (Const(16),), (Const(1),)) for i in range(n))
    kernel = lp.Kernel("k", temps, (s0,), lp.Block(()))
    call = lp.KernelCall("k", tuple(t.name for t in temps))
    return lp.Program("p", (), (), temps, (s0,), (call,), (kernel,))


def test_offsets_are_a_constant_plus_counted_symbolic_sizes() -> None:
    n = 200
    planned = PlanMemory().run(chain(n))
    offsets = dict(planned.temp_offsets)
    last = offsets[f"t{n - 1}"]
    assert len(print_expr(last)) < 80, print_expr(last)  # was a sum of 100 terms
    for s0 in (1, 7, 64):
        want = 0
        for i in range(n):
            assert ex.evaluate_index(offsets[f"t{i}"], {"s0": s0}) == want
            size = s0 * 4 if i % 2 == 0 else 64
            want += (size + 63) // 64 * 64
        assert ex.evaluate_index(planned.workspace_bytes, {"s0": s0}) == want
