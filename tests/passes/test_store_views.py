"""`loopgen/store_views.py`: the index a permute or reshape gives each element of its operand
is the inverse of the load maps of `views.py`, and a bijection onto the result's elements."""
from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from torchburn.ir import expr as ex
from torchburn.ir.expr import Const, Var
from torchburn.ir import dtypes as dt
from torchburn.ir.tensor import Graph, Value
from torchburn.ir.tensor_type import TensorType
from torchburn.passes.loopgen.store_views import forward_index
from torchburn.passes.loopgen.views import VIEW_INDEX


def _view(name: str, in_shape: tuple[int, ...], **attrs):  # type: ignore[no-untyped-def]
    x = Value("x", TensorType.of(dt.f32, in_shape))
    return Graph("t", [x]).add_op(name, [x], attrs)


@st.composite
def _views(draw):  # type: ignore[no-untyped-def]
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    if draw(st.booleans()):
        return _view("permute", shape, dims=draw(st.permutations(range(len(shape)))))
    n = 1
    for d in shape:
        n *= d
    dims = []
    while n > 1 and len(dims) < 4:
        f = draw(st.sampled_from([d for d in range(1, n + 1) if n % d == 0]))
        dims.append(f)
        n //= f
    dims.append(n)
    return _view("reshape", shape, shape=draw(st.permutations(dims)))


@settings(max_examples=60, deadline=None)
@given(_views())
def test_forward_index_inverts_the_load_map(op) -> None:  # type: ignore[no-untyped-def]
    src, dst = op.operands[0].shape, op.result.shape
    names = [Var(f"i{n}") for n in range(len(src))]
    fwd = forward_index(op, tuple(names))
    seen = set()
    for point in itertools.product(*(range(int(d.value)) for d in src)):
        env = {v.name: p for v, p in zip(names, point)}
        out = tuple(ex.evaluate_index(e, env) for e in fwd)
        assert all(0 <= o < int(d.value) for o, d in zip(out, dst)), (op, point, out)
        back = VIEW_INDEX[op.name](op, tuple(Const(o) for o in out))
        assert tuple(ex.evaluate_index(e, {}) for e in back) == point
        seen.add(out)
    assert len(seen) == len(list(itertools.product(*(range(int(d.value)) for d in src))))
