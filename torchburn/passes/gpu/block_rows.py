"""The `blocks` form of `gpu-map`'s rows mapping: a product over weights in ggml blocks (GGUF
Q4_0, Q8_0, Q4_K, Q6_K...) with a row of invocations per output element.

The plain form of such a product (`quant/`'s block table lowered by `lower-to-loops-gpu`) is,
per output element, a serial loop over the row's blocks whose body computes the block's
scales (`let`s) and then runs one or more short loops over the block's elements (16 or 32
each), every one ending in the same accumulator update. One invocation per output element
walks the whole row alone; the rows mapping of `rows.py` does not apply (its loops over the
row are at the top of the row body). Here the row's `R` invocations take `G = R / E` blocks at
a time and, inside each, one element of every element loop each (`E` is the element loops'
extent): invocation `lane` handles block `bo * G + lane / E`, element `lane % E`, for `bo` in
`0 .. ceil(B / G)`. The block's scales are loaded by each of its `E` invocations (the same
addresses: one transaction). The partial sums are combined across the row as the rows mapping
does (`codegen/wgsl/rows.py`). Where every load that varies with the element reads runs of
four from a multiple of 4 (int4's groups `g * 16 + j` of packed bytes, Q4_K's blocks), each
invocation takes four elements with vec4 loads (a packed word of bytes, four f32 of x) and
`E / 4` invocations share a block.

Before (Q8_0, 64 outputs, 512 inputs):

    for i0 in 0..1 {
      for i1 in 0..64 {
        alloc %acc2: f32[1] strides [1] local
        %acc2[0] = 0.0:f32
        for b3 in 0..16 {
          let d6 = ...%w[i1, b3 * 34]...
          for l7 in 0..32 {
            let q9 = cast<i32>(bitcast<i8>(%w[i1, b3 * 34 + (2 + l7)]))
            %acc2[0] = fma(%x[i0, b3 * 32 + l7], cast<f32>(q9) * d6, %acc2[0])
          }
        }
        %out0[i0, i1] = %acc2[0]
      }
    }

After: `for i0 ... attrs {gpu = "rows", gpu_wg = "64", gpu_row_wg = "32"}`, `for i1 ... attrs
{gpu = "rows"}`, `for b3 ... attrs {gpu = "blocks", gpu_accs = "acc2=add"}` and `for l7 ...
attrs {gpu = "block_lanes"}`; nothing else changes.

A decoder's norm inlined into the product (`gpu-inline-rows`) puts a reduction over the row
before the blocks: `for r4 in 0..512 { let x = %x[0, r4]; %acc5[0] = %acc5[0] + x * x }`, then
`let t = rsqrt(%acc5[0] / 512.0 + eps)` read by the element loops. Such loops (only `let`s and
accumulator updates) take the rows mapping's `gpu = "lanes"` (and `gpu_vec = "4"`,
`gpu_accs`) and run over the same row of invocations first; without this the whole kernel
fell to the grid mapping (one workgroup per output, 240 us a product of a 135M decode step on
the H100 instead of 4).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const
from .rows import MIN_ROW, accumulator_update

#: Invocations per output element unless `gpu-map`'s `row_lanes` says otherwise.
BLOCK_ROW_LANES = 32


def _stmts(s: lp.Stmt) -> tuple[lp.Stmt, ...]:
    return s.stmts if isinstance(s, lp.Block) else (s,)


def _reads(e: lp.Stmt | ex.Expr, names: set[str]) -> bool:
    exprs = lp.stmt_exprs(e) if isinstance(e, lp.Stmt) else (e,)
    return any(isinstance(n, ex.Load) and n.buffer in names for x in exprs for n in ex.walk(x))


def _element_loop(f: lp.For, locals_: set[str]) -> Optional[tuple[int, str, str]]:
    """(extent, accumulator, combiner) of an element loop: `let`s and one accumulator update."""
    if f.start != Const(0) or not isinstance(f.extent, Const):
        return None
    body = _stmts(f.body)
    if not body or not isinstance(body[-1], lp.Store) or any(not isinstance(x, lp.Let) for x in body[:-1]):
        return None
    op = accumulator_update(body[-1], locals_)
    if op is None or any(_reads(x, locals_) for x in body[:-1]):
        return None
    return int(f.extent.value), body[-1].buffer, op


def _row_reduction(f: lp.For, locals_: set[str]) -> bool:
    """A loop over the row that only reduces into scalar locals (`let`s and accumulator
    updates, no other store): its rows mapping (`gpu = "lanes"`) can run before the blocks."""
    if f.start != Const(0) or not isinstance(f.extent, Const) or int(f.extent.value) < MIN_ROW:
        return False
    body = _stmts(f.body)
    stores = [x for x in body if not isinstance(x, lp.Let)]
    if not stores or any(accumulator_update(x, locals_) is None for x in stores):
        return False
    updated = {x.buffer for x in stores if isinstance(x, lp.Store)}
    return len(updated) == len(stores) and not any(_reads(x, updated) for x in body if isinstance(x, lp.Let))


def _lanes(f: lp.For, locals_: set[str], vectorize: bool) -> lp.For:
    """A row reduction before the blocks with the rows mapping's annotations (`rows.py`)."""
    accs = ",".join(f"{x.buffer}={accumulator_update(x, locals_)}" for x in _stmts(f.body) if isinstance(x, lp.Store))
    vec = (("gpu_vec", "4"),) if vectorize and int(f.extent.value) % 4 == 0 else ()  # type: ignore[attr-defined]
    return replace(f, annotations=f.annotations + (("gpu", "lanes"),) + vec + (("gpu_accs", accs),))


def block_rows_annotate(loops: list[lp.For], n: int, workgroup: int, lanes: int = 0,
                        vectorize: bool = True) -> Optional[lp.Stmt]:
    """The nest of `loops[0]` with the `blocks` form (module docstring), or None when the body
    inside the first `n` (parallel) loops is not a serial loop over blocks of element loops,
    after nothing but reductions over the row into scalars (`_row_reduction`)."""
    if n == 0:
        return None
    stmts = _stmts(loops[n - 1].body)
    locals_ = {x.buffer.name for x in stmts if isinstance(x, lp.Alloc) and all(d == Const(1) for d in x.buffer.shape)}
    serial = [x for x in stmts if isinstance(x, lp.For)]
    if not serial or not locals_:
        return None
    blocks = serial[-1]
    at = stmts.index(blocks)
    # before the loop: the accumulators and their initial values, and reductions over the row
    # into other accumulators with the lets that use them (a norm's statistics, inlined into
    # the product: `gpu-inline-rows`); after it: lets and stores
    reductions = [f for f in serial[:-1] if _row_reduction(f, locals_)]
    if len(reductions) != len(serial) - 1 or len({f.extent for f in reductions}) > 1:
        return None  # the row's lanes step over one extent (`codegen/wgsl/rows.py`)
    if any(not (isinstance(x, lp.Alloc) and x.buffer.name in locals_)
           and not (isinstance(x, lp.Store) and x.buffer in locals_ and not _reads(x, locals_))
           and not isinstance(x, (lp.Let, lp.For)) for x in stmts[:at]):
        return None
    if any(not isinstance(x, (lp.Let, lp.Store)) or (isinstance(x, lp.Store) and x.buffer in locals_)
           for x in stmts[at + 1:]):
        return None
    if blocks.start != Const(0):
        return None
    inner = _stmts(blocks.body)
    found = [_element_loop(x, locals_) if isinstance(x, lp.For) else None for x in inner]
    if any(not isinstance(x, (lp.Let, lp.For)) for x in inner) or not any(found):
        return None
    if any(isinstance(x, lp.For) and f is None for x, f in zip(inner, found)):
        return None
    if any(isinstance(x, lp.Let) and _reads(x, locals_) for x in inner):
        return None
    elements = [f for f in found if f is not None]
    extent = elements[0][0]
    if any(e != extent for e, _, _ in elements) or extent & (extent - 1) or extent > workgroup:
        return None
    ops = {}
    for _, acc, op in elements:
        if ops.setdefault(acc, op) != op:
            return None
    if any(isinstance(x, lp.Store) and x.buffer in ops for f in reductions for x in _stmts(f.body)):
        return None  # a row reduction and the blocks feed one accumulator: combined twice
    row_wg = lanes or max(BLOCK_ROW_LANES, extent)
    if row_wg < extent or row_wg > workgroup:
        return None
    wg = max(row_wg, min(workgroup, 64))
    accs = ",".join(f"{a}={op}" for a, op in ops.items())
    new_inner = tuple(replace(x, annotations=x.annotations + (("gpu", "block_lanes"),))
                      if isinstance(x, lp.For) else x for x in inner)
    marked = replace(blocks, body=lp.block(*new_inner),
                     annotations=blocks.annotations + (("gpu", "blocks"), ("gpu_accs", accs)))
    before = tuple(_lanes(x, locals_, vectorize) if isinstance(x, lp.For) else x for x in stmts[:at])
    body = lp.block(*before, marked, *stmts[at + 1:])

    def rebuild(depth: int) -> lp.Stmt:
        f = loops[depth]
        ann: tuple[tuple[str, str], ...] = (("gpu", "rows"),)
        if depth == 0:
            ann += (("gpu_wg", str(wg)), ("gpu_row_wg", str(row_wg)))
        return replace(f, body=body if depth == n - 1 else rebuild(depth + 1), annotations=f.annotations + ann)

    return rebuild(0)
