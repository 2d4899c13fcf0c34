"""The loop form of `dequantize`: a quantized weight written out as f32, run by run.

A weight row is a sequence of blocks (a ggml block, or one scale group of int4/int8), each cut
into runs of consecutive weights that share a scale and an offset (`ir/qblocks.py`; an int4
group is two runs, its low and its high nibbles; an int8 group one). The nest takes a row, a
block, each run in turn (unrolled: the table's expressions differ from run to run), and the
run's weights with the scale and offset computed once:

    for n in 0..N
      for b in 0..K / block
        (each run r)  let d = scale(r); let m = offset(r)
          for l in 0..run:  %w[n, b block + r run + l] = f32(code(r)) * d + m

so the innermost loop is unit-stride in the output and in the codes' bytes, which `vectorize`
turns into vector loads, shifts and stores, and the row loop is the one `parallelize` splits.
Each element is the one `qlinear`'s kernels multiply by (`qlinear.weight_element`, the block
table's definition), so a `matmul` on this weight computes the same product.
"""
from __future__ import annotations

from typing import Callable, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.qblocks import block_type
from ...ir.tensor import Op
from ..loopgen.kernel_builder import KernelBuilder, root_rule
from .qlinear_blocks import instantiate

F32 = ScalarType(dt.f32)
I32 = ScalarType(dt.i32)

#: One run of a block: (its length, code(l), scale, offset or None) as expressions of the lane `l`.
Run = tuple[int, Callable[[Expr], Expr], Expr, Optional[Expr]]


def _block_runs(kb: KernelBuilder, op: Op, n: Expr, b: Var) -> tuple[int, list[Run]]:
    """Block size and runs of a ggml block weight (the table's expressions at row n, block b)."""
    bt = block_type(str(op.attrs["block_type"]))
    q = op.operands[0]
    base = ex.mul(b, Const(bt.nbytes))

    def byte_at(offset: Expr, lanes: int) -> Expr:
        return kb.value_at(q, (n, ex.add(base, offset)))

    runs: list[Run] = []
    for r in range(bt.runs):
        d = kb.bind(instantiate(bt.scale(r), byte_at, Const(0)), "d")
        off = bt.offset(r)
        m = None if off is None else kb.bind(instantiate(off, byte_at, Const(0)), "m")
        runs.append((bt.run, lambda lane, r=r: instantiate(bt.code(r), byte_at, lane), d, m))
    return bt.block, runs


def _group_runs(kb: KernelBuilder, op: Op, n: Expr, b: Var) -> tuple[int, list[Run]]:
    """Group size and runs of an int4 or int8 weight (the layouts of `quant/layouts.py`)."""
    q, s = op.operands[0], op.operands[1]
    mins = op.operands[2] if len(op.operands) > 2 else None
    g = int(op.attrs["group_size"])
    scale = ex.cast(kb.value_at(s, (n,) if s.type.rank == 1 else (n, b)), dt.f32)
    d = kb.bind(scale, "d")
    m = None if mins is None else kb.bind(ex.cast(kb.value_at(mins, (n, b)), dt.f32), "m")
    if op.attrs["kind"] == "int8":
        return g, [(g, lambda lane: ex.cast(kb.value_at(q, (n, ex.add(ex.mul(b, Const(g)), lane))), dt.i32), d, None)]
    h = g // 2

    def nibble(high: int) -> Callable[[Expr], Expr]:
        def code(lane: Expr) -> Expr:
            byte = ex.cast(kb.value_at(q, (n, ex.add(ex.mul(b, Const(h)), lane))), dt.i32)
            c = ex.Binary("and", ex.Binary("shr", byte, Const(4 * high, I32), I32), Const(15, I32), I32)
            return ex.Binary("sub", c, Const(8, I32), I32) if mins is None else c
        return code

    return g, [(h, nibble(0), d, m), (h, nibble(1), d, m)]


@root_rule("dequantize", only=True)  # no per-element form: never inlined (`fuse`)
def dequantize(kb: KernelBuilder, op: Op, out: lp.Buffer) -> lp.Stmt:
    """The nest of the module docstring, storing into `out` ([N, K] f32)."""
    if op.loc and op.loc not in kb.origins:
        kb.origins.append(op.loc)
    kb.used_buffers[out.name] = out
    rows, k = op.result.shape
    n, b = Var(kb.fresh("n")), Var(kb.fresh("b"))
    block = int(op.attrs["group_size"])
    kb.push()
    kb.push()
    size, runs = (_block_runs if op.attrs["kind"] == "blocks" else _group_runs)(kb, op, n, b)
    assert size == block
    start = 0
    for length, code, d, m in runs:
        lane = Var(kb.fresh("l"))
        kb.push()
        value = ex.Binary("mul", ex.cast(code(lane), dt.f32), d, F32)
        if m is not None:
            value = ex.Binary("add", value, m, F32)
        col = ex.add(ex.add(ex.mul(b, Const(block)), Const(start)), lane)
        kb.emit(lp.Store(out.name, (n, col), value))
        kb.emit(lp.For(lane, Const(0), Const(length), "serial", kb.pop()))
        start += length
    kb.emit(lp.For(b, Const(0), ex.floordiv(k, Const(block)), "serial", kb.pop()))
    origin = (("origin", "; ".join(kb.origins)),) if kb.origins else ()
    return lp.For(n, Const(0), rows, "serial", kb.pop(), origin)
