"""Which loop form a `qlinear` kernel takes on a CPU: int8 activations (`qlinear_i8.py`), the
f32 SIMD kernel (`qlinear.py`), or the plain per-element nest.

Weights in ggml blocks (kind "blocks") take `qlinear_blocks_i8`'s kernel (int8 activations,
the blocks' codes as byte vectors) where the table gives its reading of the type and the CPU
has byte dot products, else `qlinear_blocks`' f32 forms, both generated from the block table. The choice reads the op (K static, x and the weight streamable), M (known, or chosen at run
time between the GEMV and the multi-row form) and the target (`CpuInfo`: vector width,
threads, native byte dot products):

    qlinear(%x: f32[1, 4096], %q: u8[4096, 2048], ...) {kind = "int4", group = 32}
      -> M = 1 is static: one form; int8 activations where `dot4_u8i8_acc` is native (or asked
         for), else the f32 GEMV of `QLinearBuilder`
    qlinear(%x: f32[s0, 4096], ...)
      -> if s0 <= 1 { GEMV form } else { multi-row form }
    qlinear(%x: f32[512, 4096], ...) {kind = "int4", group = 32}
      -> M >= 16 is static: the panel kernel of `qgemm_i8.py` (int8 activations, weight rows
         packed per work item, output columns in the lanes), where the CPU has byte dot products
    qlinear(%x: f32[16, 576], ...) {kind = "int4", group = 32}   on a CPU with AMX-INT8
      -> M >= `lower-to-loops{qlinear_tile_rows}` is static: the tile form of `qlinear_tiles.py`
         (16 weight rows by 16 rows of x per `tile_dot_u8i8`)
    qlinear(%x: f32[256, 576], ...) {kind = "int4", group = 32, form = "rows"}
      -> the rows form at any M (static or not; x quantized a block of rows at a time where
         M x K exceeds its buffer): what TORCHBURN_QLINEAR_INVARIANT writes, since each form
         adds a row's float terms in its own order and only within one form is a row's
         result independent of the other rows (docs/quantization.md, "Batch invariance")
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const
from ...ir.tensor import Op
from ..loopgen.matmul import CpuInfo, static_int
from .qlinear import QLinear, QLinearBuilder, _probes, build_qlinear_grouped, build_qlinear_plain, plan_qlinear
from .qgemm_i8 import build_qgemm_i8, plan_qgemm_i8
from .qlinear_blocks import BlocksBuilder, build_blocks_plain, plan_blocks
from .qlinear_blocks_i8 import build_blocks_i8, plain_columns, plan_blocks_i8
from .qlinear_i8 import build_qlinear_i8, plan_qlinear_i8
from .qlinear_tiles import build_qlinear_tiles, plan_qlinear_tiles

if TYPE_CHECKING:
    from ..loopgen.kernel_builder import KernelBuilder


def plain_qlinear(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer, grouped: bool = False) -> lp.Stmt:
    """The per-element nest (GPUs, and operands the SIMD forms cannot stream): the block
    table's for kind "blocks", else `build_qlinear_plain`; with `grouped` (the GPU lowering),
    int4 and grouped int8 with their k loop split by group where K allows (`build_qlinear_grouped`)."""
    if qop.attrs["kind"] == "blocks":
        return build_blocks_plain(kb, root, qop, out)
    if grouped:
        nest = build_qlinear_grouped(kb, root, qop, out)
        if nest is not None:
            return nest
    return build_qlinear_plain(kb, root, qop, out)


def build_qlinear(kb: "KernelBuilder", root: Op, qop: Op, out: lp.Buffer,
                  cpu: CpuInfo, activations: Optional[str] = None, tile_rows: int = 0) -> lp.Stmt:
    """The CPU kernel computing `root` (a `qlinear`, or the last op of its epilogue) into
    `out`: the SIMD nest when x and the weight can be streamed and K is static, else the
    plain nest. With M known only at run time, the GEMV and the multi-row form are both
    built and chosen by M. `activations` ("auto", "int8", "f32"; by default the op's attribute)
    says when x is quantized to int8 (`qlinear_i8`). From `tile_rows` rows of x (0: never) a
    target with AMX-INT8 takes the tile form (`qlinear_tiles`)."""
    ql = QLinear.of(qop)
    if qop.loc and qop.loc not in kb.origins:  # the kernel names the user's line of the linear
        kb.origins.append(qop.loc)
    choice = activations or ql.activations
    probes = _probes(kb, ql) if static_int(ql.k) is not None else None
    if probes is None:
        return plain_qlinear(kb, root, qop, out)
    x_load, q_load, row, k, n = probes

    def form(m: Optional[int]) -> lp.Stmt:
        tile_plan = plan_qlinear_tiles(ql, m, cpu, choice, tile_rows)
        if tile_plan is not None:
            return build_qlinear_tiles(kb, root, qop, out, tile_plan, (x_load, q_load, row, k, n))
        gemm_plan = plan_qgemm_i8(ql, m, cpu, choice)
        if gemm_plan is not None:
            return build_qgemm_i8(kb, root, qop, out, gemm_plan, (x_load, q_load, row, k, n))
        if ql.kind == "blocks":
            i8_blocks = plan_blocks_i8(ql, m, cpu, choice) if plain_columns(q_load, k) else None
            if i8_blocks is not None:
                return build_blocks_i8(kb, root, qop, out, i8_blocks, (x_load, q_load, row, k, n))
            blocks_plan = plan_blocks(ql, m, cpu)
            return BlocksBuilder(kb, root, qop, out, blocks_plan, x_load, q_load, row, k, n).build()
        i8_plan = plan_qlinear_i8(ql, m, cpu, choice)
        if i8_plan is not None:
            return build_qlinear_i8(kb, root, qop, out, i8_plan, (x_load, q_load, row, k, n))
        plan = plan_qlinear(ql, m, cpu)
        return QLinearBuilder(kb, root, qop, out, plan, x_load, q_load, row, k, n).build()

    m = static_int(ql.m)
    if m is not None:
        return form(m)
    return lp.If(ex.binary("le", ql.m, Const(1)), form(1), form(None))
