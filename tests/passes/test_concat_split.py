"""A concat is looped over one operand at a time (`KernelBuilder.concat_parts`,
`indexing_rules.split_nest`): stored, or inlined into the in-place slot write of a KV cache,
each operand's elements are copied by a nest of their own (no chain of selects loading every
operand per element), with the results of the reference."""
from __future__ import annotations

import numpy as np
import pytest

from tests.passes import test_matmul
from torchburn.ir import expr as ex
from torchburn.ir import loop as lp


def _selects(k: lp.Kernel) -> int:
    return sum(1 for s in lp.walk_stmts(k.body) for e in lp.stmt_exprs(s) for n in ex.walk(e)
               if isinstance(n, ex.Select))


@pytest.mark.parametrize("dim", [0, 1])
def test_stored_concat_copies_each_operand_once(dim: int) -> None:
    shapes = [(2, 8), (3, 8), (1, 8)] if dim == 0 else [(4, 16), (4, 8), (4, 24)]
    ins = ", ".join(f"%a{i}: f32[{r}, {c}]" for i, (r, c) in enumerate(shapes))
    out = (sum(r for r, _ in shapes), shapes[0][1]) if dim == 0 else (shapes[0][0], sum(c for _, c in shapes))
    text = f"""graph @main({ins}) {{
  %e = neg(%a1) : f32[{shapes[1][0]}, {shapes[1][1]}]
  %0 = concat(%a0, %e, %a2) {{dim = {dim}}} : f32[{out[0]}, {out[1]}]
  return %0
}}"""
    c = test_matmul.Compiled(text)
    (k,) = [k for k in c.program.kernels if any(isinstance(s, lp.Store) and s.buffer == "out0"
                                                for s in lp.walk_stmts(k.body))]
    assert _selects(k) == 0
    rng = np.random.default_rng(dim)
    arrays = {f"a{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    result = np.zeros(out, np.float32)
    c({**arrays, "out0": result})
    expected = np.concatenate([arrays["a0"], -arrays["a1"], arrays["a2"]], axis=dim)
    np.testing.assert_allclose(result, expected, rtol=1e-6)


def _operand_loads(program: lp.Program) -> list[ex.Load]:
    """The loads of the new rows (`%k0`, `%k1`, ...) in the program's one kernel."""
    (k,) = program.kernels
    return [e for s in lp.walk_stmts(k.body) for e0 in lp.stmt_exprs(s) for e in ex.walk(e0)
            if isinstance(e, ex.Load) and e.buffer.startswith("k")]


def test_stacked_slot_write_reads_each_new_row_once() -> None:
    """A decode step's KV write: new rows of every layer stacked, stored in place at a slot."""
    n = 6
    ins = ", ".join(f"%k{i}: f32[1, 1, 1, 8]" for i in range(n))
    text = f"""graph @main(%c: f32[{n}, 1, 5, 8], {ins}, %i: i64[1]) {{
  %0 = concat({", ".join(f"%k{i}" for i in range(n))}) {{dim = 0}} : f32[{n}, 1, 1, 8]
  %1 = index_put(%c, %0, %i) {{dims = [2], pos = 2, accumulate = false, inplace = true}} : f32[{n}, 1, 5, 8]
  return %1
}}"""
    c = test_matmul.Compiled(text)
    assert len(c.program.kernels) == 1 and lp.written_inputs(c.program) == {"c"}
    loads = _operand_loads(c.program)
    assert sorted(e.buffer for e in loads) == sorted(f"k{i}" for i in range(n))  # once each (was n each)
    rng = np.random.default_rng(1)
    cache = rng.standard_normal((n, 1, 5, 8)).astype(np.float32)
    rows = {f"k{i}": rng.standard_normal((1, 1, 1, 8)).astype(np.float32) for i in range(n)}
    slot = np.array([3], np.int64)
    expected = cache.copy()
    expected[:, :, 3:4] = np.concatenate(list(rows.values()))
    c({"c": cache, **rows, "i": slot})
    np.testing.assert_array_equal(cache, expected)


@pytest.mark.parametrize("batch", [1, 3])
def test_stack_of_rows_written_in_place_reads_each_once(batch: int) -> None:
    """`torch.stack` of the new rows of a batched step decomposes to a concat along dim 0 and a
    reshape to [N, batch, ...] (`KernelBuilder.stack_parts`): written into the cache in place,
    each operand is still loaded by its own nest, not through a chain of N selects."""
    n = 6
    ins = ", ".join(f"%k{i}: f32[{batch}, 2, 1, 8]" for i in range(n))
    text = f"""graph @main(%c: f32[{n}, {batch}, 2, 5, 8], {ins}, %i: i64[1]) {{
  %0 = concat({", ".join(f"%k{i}" for i in range(n))}) {{dim = 0}} : f32[{n * batch}, 2, 1, 8]
  %1 = reshape(%0) {{shape = [{n}, {batch}, 2, 1, 8]}} : f32[{n}, {batch}, 2, 1, 8]
  %2 = index_put(%c, %1, %i) {{dims = [3], pos = 3, accumulate = false, inplace = true}} : f32[{n}, {batch}, 2, 5, 8]
  return %2
}}"""
    c = test_matmul.Compiled(text)
    assert len(c.program.kernels) == 1 and lp.written_inputs(c.program) == {"c"}
    loads = _operand_loads(c.program)
    # each operand's vectors of 8 (batch x 2 of them) loaded once: no chain of n selects, which
    # loaded every operand for every element (n times as many loads)
    assert sorted(e.buffer for e in loads) == sorted(f"k{i}" for i in range(n) for _ in range(2 * batch))
    rng = np.random.default_rng(batch)
    cache = rng.standard_normal((n, batch, 2, 5, 8)).astype(np.float32)
    rows = {f"k{i}": rng.standard_normal((batch, 2, 1, 8)).astype(np.float32) for i in range(n)}
    slot = np.array([2], np.int64)
    expected = cache.copy()
    expected[:, :, :, 2:3] = np.stack(list(rows.values()))
    c({"c": cache, **rows, "i": slot})
    np.testing.assert_array_equal(cache, expected)
