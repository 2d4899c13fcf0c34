"""The FX importer: symbolic integer arguments become symbols the launcher binds; symbolic sizes
written in different forms meet."""
from __future__ import annotations

import torch

import torchburn  # noqa: F401  (registers the backend)
from tests.helpers import assert_fully_compiled, run_compiled
from torchburn.ir.expr import Const, Var


def test_a_python_int_made_dynamic_is_an_argument_of_its_own() -> None:
    """Dynamo makes an int that changes between calls dynamic (`k + 1` arrives as a symbolic
    argument over a symbol no tensor shape carries); it must be bound from the argument."""
    fns = [lambda x, k=k: torch.sin(x) * (k + 1) + x.sum(-1, keepdim=True) for k in range(4)]
    x = torch.randn(8, 16)
    dynamic_seen = False
    for i, f in enumerate(fns):  # one Dynamo cache: the second call on recompiles with k dynamic
        out, reports = run_compiled(f, x, dynamic=None, reset=i == 0)
        torch.testing.assert_close(out, f(x))
        assert all(not s.internal_error for r in reports for s in r.subgraphs)
        dynamic_seen |= any(s.compiled for r in reports for s in r.subgraphs) and i > 0
    assert dynamic_seen, "the later calls must have compiled a graph with k symbolic"


def test_a_derived_size_argument_still_needs_no_input() -> None:
    f = lambda x: x.reshape(-1) * x.shape[0] * 2  # noqa: E731
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        out, _ = run_compiled(f, x, dynamic=True)
        torch.testing.assert_close(out, f(x))


def test_sizes_a_lowering_writes_otherwise_than_torch_meet_in_a_matmul() -> None:
    """`repeat` of 4 heads by a dynamic count `s0` has size `s0 * 4` as its lowering writes it
    and `4*s0` in torch's metadata (which the view of `a` takes); the batched matmul of the two
    needs equal batch dims (DeBERTa-v2's relative attention under dynamic=True raised
    'matmul: batch dimensions differ')."""
    def f(a: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        heads = w.repeat(a.shape[0], 1, 1)                  # [s0 * 4, 5, 6]
        return torch.bmm(a.reshape(-1, 3, 5), heads)        # [4*s0, 3, 5] x [s0 * 4, 5, 6]

    w = torch.randn(4, 5, 6)
    records = []
    for batch in (2, 3):
        a = torch.randn(batch, 4, 3, 5)
        out, new = run_compiled(f, a, w, dynamic=True, reset=batch == 2)
        torch.testing.assert_close(out, f(a, w))
        records += new
    assert len(records) == 1  # one compilation for both batches
    assert_fully_compiled(records)


def test_a_clamped_slice_length_torch_knows_to_be_a_size_meets_it() -> None:
    """A slice's length is written with the clamps of its bounds (`min(s1, 16) - 0`...), which
    torch's shape environment resolves to `s1` (it guarded on the length fitting); adding the
    slice to a tensor of length `s1` needs the sizes equal (Whisper's encoder positions under
    dynamic=True raised 'expand: cannot expand dim of size s1')."""
    def f(x: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        return x + table[1: x.shape[1] + 1]

    table = torch.randn(16, 8)
    records = []
    for length in (5, 9):
        x = torch.randn(2, length, 8)
        out, new = run_compiled(f, x, table, dynamic=True, reset=length == 5)
        torch.testing.assert_close(out, f(x, table))
        records += new
    assert len(records) == 1
    assert_fully_compiled(records)


def test_broadcast_of_one_size_written_two_ways() -> None:
    """torch's metadata does not always simplify a size (`((s0 // 4) ** 2) // (s0 // 4)` for
    ConvNeXt's `s0 // 4` under dynamic=True); the broadcast of an elementwise op takes such
    sizes as equal (the graph's guards), and the operand of the other form is reshaped to the
    common one instead of failing in `expand` ('cannot expand dim of size ...')."""
    from torchburn.frontend.builder import Builder
    from torchburn.ir import dtypes as dt
    from torchburn.ir import expr as ex
    from torchburn.ir.tensor import Graph, TensorType, Value

    s = ex.floordiv(Var("s0"), 4)
    other = ex.floordiv(ex.mul(s, s), s)
    a = Value("a", TensorType(dt.f32, (Var("b"), s)))
    c = Value("c", TensorType(dt.f32, (Const(1), other)))
    g = Graph("g", [a, c, Var("b"), Var("s0")])
    out = Builder(g).elementwise("add", a, c)
    assert out.shape == (Var("b"), s)
    assert [op.name for op in g.ops] == ["reshape", "expand", "add"]
