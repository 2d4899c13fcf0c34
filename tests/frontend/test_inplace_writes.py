"""In-place slot writes: a mutated input whose new value writes a few elements is stored in
place (only those elements), with reads of the old value ordered before the store."""
from __future__ import annotations

import torch

from torchburn.backend import report as rep
from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_graph
from torchburn.passes.lower_to_loops import LowerToLoops


def _cache_step(cache: torch.Tensor, slots: torch.Tensor, new: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    old = (cache[:, :3] * q).sum(1)  # reads the old values, including the slot written below
    cache.index_copy_(1, slots, new)
    return old


def test_index_copy_of_an_input_is_stored_in_place_and_matches_eager() -> None:
    torch._dynamo.reset()
    fast = torch.compile(_cache_step, backend="torchburn")
    a = torch.randn(2, 6, 3)
    b = a.clone()
    records = rep.start_recording()
    try:
        for s in (2, 4, 0, 5):  # slot 2 and 0 are read by the same call that writes them
            slots, new, q = torch.tensor([s]), torch.randn(2, 1, 3), torch.randn(3)
            torch.testing.assert_close(fast(a, slots, new, q), _cache_step(b, slots, new, q))
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    finally:
        rep.stop_recording()
    (sub,) = [s for r in records for s in r.subgraphs]
    assert sub.compiled and not [op for r in records for op in r.fallback_ops]


def _program(text: str) -> lp.Program:
    return LowerToLoops().run(parse_graph(text))


def test_in_place_index_put_has_no_output_buffer_and_no_copy_of_self() -> None:
    p = _program("""
graph @main(%c: f32[64, 2], %v: f32[1, 2], %i: i64[1]) {
  %0 = index_put(%c, %v, %i) {dims = [0], pos = 0, accumulate = false, inplace = true} : f32[64, 2]
  return %0
}""")
    assert p.outputs == () and p.result_names() == ("c",) and lp.written_inputs(p) == {"c"}
    (k,) = p.kernels
    stores = [s for s in lp.walk_stmts(k.body) if isinstance(s, lp.Store)]
    assert len(stores) == 1 and stores[0].buffer == "c"
    loops = [s for s in lp.walk_stmts(k.body) if isinstance(s, lp.For)]
    assert all(str(f.extent) != "64" for f in loops)  # nothing runs over the whole cache


def test_readers_of_the_old_value_are_called_before_the_store() -> None:
    p = _program("""
graph @main(%c: f32[8, 2], %v: f32[1, 2], %i: i64[1]) {
  %0 = index_put(%c, %v, %i) {dims = [0], pos = 0, accumulate = false, inplace = true} : f32[8, 2]
  %1 = exp(%c) : f32[8, 2]
  return %0, %1
}""")
    order = [c.kernel for c in p.calls]
    writer = next(c.kernel for c in p.calls if c.args[-1] == "c")
    reader = next(c.kernel for c in p.calls if "c" in c.args[:-1] or (c.args[-1] != "c" and "c" in c.args))
    assert order.index(reader) < order.index(writer)


def test_unsafe_in_place_marks_are_dropped() -> None:
    # the values are computed from the cache inside the same kernel: a copy, as before
    p = _program("""
graph @main(%c: f32[8, 2], %i: i64[1]) {
  %0 = slice(%c) {dim = 0, start = 0, end = 1, step = 1} : f32[1, 2]
  %1 = neg(%0) {fused_into = [0]} : f32[1, 2]
  %2 = index_put(%c, %1, %i) {dims = [0], pos = 0, accumulate = false, inplace = true, kernel = 0} : f32[8, 2]
  return %2
}""")
    assert lp.written_inputs(p) == set() and len(p.outputs) == 1
    # accumulate: a copy too
    p = _program("""
graph @main(%c: f32[8, 2], %v: f32[1, 2], %i: i64[1]) {
  %0 = index_put(%c, %v, %i) {dims = [0], pos = 0, accumulate = true, inplace = true} : f32[8, 2]
  return %0
}""")
    assert lp.written_inputs(p) == set()
