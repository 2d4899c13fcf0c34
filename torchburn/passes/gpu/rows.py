"""The `rows` mapping of `gpu-map`: a row kernel (softmax, LayerNorm, RMSNorm after row fusion)
as one workgroup per row, or a fraction of one for short rows.

Row fusion (`row_fusion.py`) leaves, inside the parallel row loops, a sequence of loops over
the row: reductions into scalar accumulators, then the elementwise loop that uses their
results (some loops do both, softmax's `exp` and its sum). On a GPU every loop over the row is
shared by the row's invocations, element `e` always going to invocation `e mod width`: so an
element a loop stores is read back by the invocation that stored it (no barrier between the
loops), and WGSL codegen (`codegen/wgsl/rows.py`) can keep the row in registers from the first
loop to the last. After each loop, the accumulators it updated are combined across the
row's invocations (a tree in workgroup memory, or subgroup operations where the adapter has
them), so every invocation holds the row's statistics for the loops that follow.

The row loops get `gpu = "rows"` (the outermost also `gpu_wg`, the workgroup size, and
`gpu_row_wg`, the invocations per row); each loop over the row gets `gpu = "lanes"`, and
`gpu_vec = "4"` where the row length is a multiple of 4 (codegen checks contiguity).

Before (softmax after row fusion and `lower-to-loops-gpu`):

    for i0 in 0..8 {
      alloc %acc3: f32[1] strides [1] local
      %acc3[0] = 0.0:f32
      alloc %acc6: f32[1] strides [1] local
      %acc6[0] = -inf:f32
      for r5 in 0..1000 {
        let x7 = %x[i0, r5]
        %acc6[0] = max(%acc6[0], x7)
      }
      let t8 = %acc6[0]
      for r2 in 0..1000 {
        let t10 = exp(%x[i0, r2] - t8)
        %acc3[0] = %acc3[0] + t10
        %out0[i0, r2] = t10
      }
      let t13 = 1.0:f32 / %acc3[0]
      for i1 in 0..1000 {
        %out0[i0, i1] = %out0[i0, i1] * t13
      }
    }

After: the same loops, `for i0 ... attrs {gpu = "rows", gpu_wg = "256", gpu_row_wg = "256"}`
and each `for r5/r2/i1 ... attrs {gpu = "lanes", gpu_vec = "4"}` (1000 % 4 == 0), with
`gpu_accs = "acc6=max"` on `r5` and `gpu_accs = "acc3=add"` on `r2` (the accumulators each
loop updates and their combiners).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr

#: Combiners a row's invocations can reduce together.
ROW_COMBINERS = ("add", "mul", "min", "max", "and", "or")
#: Rows shorter than this stay on the grid mapping (one invocation per row).
MIN_ROW = 16


def _stmts(s: lp.Stmt) -> tuple[lp.Stmt, ...]:
    return s.stmts if isinstance(s, lp.Block) else (s,)


def accumulator_update(s: lp.Stmt, locals_: set[str]) -> Optional[str]:
    """The combiner of `%acc[0] = %acc[0] <op> x` (or `fma(x, w, %acc[0])`, an add) on a scalar
    local (x, w not reading %acc), or None."""
    if not (isinstance(s, lp.Store) and s.buffer in locals_ and s.index == (Const(0),)):
        return None
    v = s.value
    cur = ex.Load(s.buffer, s.index, v.type)
    if isinstance(v, ex.Call) and v.name == "fma" and len(v.args) == 3 and v.args[2] == cur:
        op, others = "add", v.args[:2]  # `acc = fma(x, w, acc)`: a quantized product's update
    elif isinstance(v, ex.Binary) and v.op in ROW_COMBINERS and cur in (v.a, v.b):
        op, others = v.op, (v.b if v.a == cur else v.a,)
    else:
        return None
    if any(isinstance(n, ex.Load) and n.buffer == s.buffer for o in others for n in ex.walk(o)):
        return None
    return op


def _loop_ok(f: lp.For, locals_: set[str], params: set[str]) -> bool:
    """A loop over the row: straight-line lets and stores, each store an accumulator update or
    a global store indexed by the loop variable; locals read only through their updates."""
    if f.start != Const(0):
        return False
    updated: set[str] = set()
    for s in _stmts(f.body):
        if isinstance(s, lp.Let):
            continue
        if not isinstance(s, lp.Store):
            return False
        if s.buffer in locals_:
            if accumulator_update(s, locals_) is None or s.buffer in updated:
                return False
            updated.add(s.buffer)
        elif s.buffer not in params or f.var not in s.index:
            return False  # each iteration its own element: the loop variable is a whole index
    for s in _stmts(f.body):
        exprs = lp.stmt_exprs(s)
        for e in exprs:
            for n in ex.walk(e):
                if isinstance(n, ex.Load) and n.buffer in updated and not (
                        isinstance(s, lp.Store) and s.buffer == n.buffer):
                    return False
    return True


def _same_thread(loops: list[lp.For], params: set[str]) -> bool:
    """Every read of a buffer the kernel writes is at an index a row loop stores it at, with the
    loop variable in the same place: the invocation that wrote the element reads it."""
    def canon(f: lp.For, index: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(ex.substitute(i, {f.var.name: ex.Var("tb_row_e", f.var.type)}) for i in index)

    stored: dict[str, set[tuple[Expr, ...]]] = {}
    for f in loops:
        for s in _stmts(f.body):
            if isinstance(s, lp.Store) and s.buffer in params:
                stored.setdefault(s.buffer, set()).add(canon(f, s.index))
    for f in loops:
        for s in _stmts(f.body):
            for e in lp.stmt_exprs(s):
                for n in ex.walk(e):
                    if isinstance(n, ex.Load) and n.buffer in stored and canon(f, n.index) not in stored[n.buffer]:
                        return False
    return True


def _read_across_lanes(stmts: tuple[lp.Stmt, ...], row_loops: list[lp.For], params: set[str]) -> bool:
    """Whether a value one invocation stores is read by another: a buffer stored in a loop over
    the row read outside the loops, or a buffer stored outside them (by lane 0) read at all."""
    in_loops = {s.buffer for f in row_loops for s in lp.walk_stmts(f) if isinstance(s, lp.Store)} & params
    outside = {s.buffer for s in stmts if isinstance(s, lp.Store)} & params
    for s in stmts:
        loads = {n.buffer for e in (lp.stmt_exprs(s) if not isinstance(s, lp.For) else ()) for n in ex.walk(e)
                 if isinstance(n, ex.Load)}
        if loads & (in_loops | outside):
            return True
    return any(isinstance(n, ex.Load) and n.buffer in outside
               for f in row_loops for x in lp.walk_stmts(f) for e in lp.stmt_exprs(x) for n in ex.walk(e))


def row_lanes(row_length: Optional[int], vec: bool, rows: Optional[int], workgroup: int,
              lanes: int = 0, lane_elements: int = 16, many_rows: int = 64) -> int:
    """Invocations per row. `lanes` > 0 fixes it (a power of two within the workgroup). Else a
    row of few elements or of symbolic length gets one element (four, vectorized) per
    invocation, up to the workgroup; a kernel of at least `many_rows` static rows (`rows`, None
    for a kernel that writes its rows; a decode step's matrix-vector product, a row per output
    element, does not) gives each invocation about
    `lane_elements` elements instead, at least 32 invocations (a subgroup's worth) a row: more
    rows share a workgroup, each invocation issues several loads at once, and a row's partial
    sums combine in fewer steps."""
    if lanes:
        return lanes
    per = workgroup if row_length is None else -(-row_length // (4 if vec else 1))
    row_wg = 32
    while row_wg < per and row_wg < workgroup:
        row_wg *= 2
    if rows is not None and row_length is not None and rows >= many_rows:
        while row_wg > 32 and row_length / row_wg < lane_elements:
            row_wg //= 2
    return row_wg


def rows_annotate(loops: list[lp.For], n: int, params: set[str], workgroup: int,
                  vectorize: bool, lanes: int = 0, lane_elements: int = 16) -> Optional[lp.Stmt]:
    """The nest of `loops[0]` with the `rows` mapping (module docstring), or None when the body
    inside the first `n` (parallel) loops is not a row kernel. `lanes`, `lane_elements`: the
    invocations per row (`row_lanes`)."""
    if n == 0:
        return None
    inner = loops[n - 1].body
    stmts = _stmts(inner)
    locals_ = {x.buffer.name for x in stmts if isinstance(x, lp.Alloc)
               and all(d == Const(1) for d in x.buffer.shape)}
    row_loops: list[lp.For] = []
    for s in stmts:
        if isinstance(s, lp.For):
            if not _loop_ok(s, locals_, params):
                return None
            row_loops.append(s)
        elif isinstance(s, lp.Store):
            if s.buffer in locals_:
                continue
            if s.buffer not in params:
                return None
        elif not isinstance(s, (lp.Let, lp.Alloc)):
            return None
        elif isinstance(s, lp.Alloc) and s.buffer.name not in locals_:
            return None
    if not row_loops or len({f.extent for f in row_loops}) != 1 or not _same_thread(row_loops, params):
        return None
    if _read_across_lanes(stmts, row_loops, params):
        return None
    extent = row_loops[0].extent
    if isinstance(extent, Const) and int(extent.value) < MIN_ROW:
        return None
    vec = vectorize and isinstance(extent, Const) and int(extent.value) % 4 == 0
    rows: Optional[int] = 1
    for f in loops[:n]:
        rows = int(f.extent.value) * rows if isinstance(f.extent, Const) and rows is not None else None
    if any(isinstance(x, lp.Store) and x.buffer in params for f in row_loops for x in lp.walk_stmts(f)):
        # a row kernel that writes its rows (softmax, LayerNorm) keeps a lane per element: the
        # row stays in registers between its loops (`codegen/wgsl/rows.py`); only reductions
        # to a value per row (products, a norm's statistics) spread fewer lanes over many rows
        rows = None
    row_wg = row_lanes(int(extent.value) if isinstance(extent, Const) else None, vec, rows, workgroup,
                       lanes, lane_elements)
    wg = max(row_wg, min(workgroup, 64))
    lane_ann = (("gpu", "lanes"),) + ((("gpu_vec", "4"),) if vec else ())

    def lanes(f: lp.For) -> lp.For:
        accs = [f"{s.buffer}={accumulator_update(s, locals_)}" for s in _stmts(f.body)
                if isinstance(s, lp.Store) and s.buffer in locals_]
        extra = (("gpu_accs", ",".join(accs)),) if accs else ()
        return replace(f, annotations=f.annotations + lane_ann + extra)

    new_inner = lp.block(*(lanes(s) if isinstance(s, lp.For) else s for s in stmts))

    def rebuild(f: lp.For, depth: int) -> lp.Stmt:
        body = new_inner if depth == n - 1 else rebuild(loops[depth + 1], depth + 1)
        ann: tuple[tuple[str, str], ...] = (("gpu", "rows"),)
        if depth == 0:
            ann += (("gpu_wg", str(wg)), ("gpu_row_wg", str(row_wg)))
        return replace(f, body=body, annotations=f.annotations + ann)

    return rebuild(loops[0], 0)
