"""Quantized linears' kernel forms, measured by the tuner (`runtime/tuner.py`).

A `qlinear` of M rows has up to three CPU kernels (the op's `form` attribute, `ir/ops.py`):
`rows` streams the weight row by row (the GEMV's kernel, best for a few rows), `panel` packs
the weight rows of each work item into a panel and multiplies int8 x by them with the output
columns in the lanes (`passes/quant/qgemm_i8.py`, best for many rows), and `gemm` decodes the
weight into f32 once and runs the float GEMM (`qlinear-to-gemm`). Where the crossover lies
depends on M, N, K, the block type and the machine (at 16 rows the panel's pack costs more
than it saves for a 2048 x 2048 int4 weight, and less for a 576 x 1536 one), so with a static
M from `MIN_ROWS` up to `MAX_ROWS` (the crossover region: decode batches of a server, short
prefill chunks) each form is compiled alone on the node's shapes and measured:

    torchburn::linear_int4(x: f32[64, 576], packed: u8[1536, 288], ...)
      -> qlinear f32[64,576] x int4 g32 [1536, 576]: panel (measured: panel 0.21 ms,
         rows 0.68 ms, gemm 0.52 ms; 2.5x the next)

The chosen form goes to the lowering in `node.meta[QLINEAR_FORM]` (`quant/lowering.py`) when
it differs from what the compiler does by itself (`auto`, the default candidate), so `off`
and `cached` without a record compile exactly as without a tuner. Records are kept per
target, shape and block type like every tuning record, in memory and on disk.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from ..quant.lowering import QLINEAR_FORM
from ..runtime.tuner import Candidate, Choice, Tuner
from .library_calls import CompileAlone, _concrete_shape, _Inputs, _single_node_graph

torchburn_ops = torch.ops.torchburn
#: The quantized linears' custom ops (`quant/ops.py`) and how each names its weight's layout.
QUANTIZED_LINEARS = {torchburn_ops.linear_int8.default: "int8", torchburn_ops.linear_int4.default: "int4",
                     torchburn_ops.linear_blocks.default: "blocks"}
#: Fewer rows than this are the GEMV's (`rows`) without measuring.
MIN_ROWS = 2
#: From this many rows on the panel wins by 2x or more wherever it applies (every layout at
#: 512 rows: docs/benchmarks.md), so `auto` is kept without measuring: a cold compile of a
#: large model's prefill chunks does not pay for candidates that cannot win.
MAX_ROWS = 128
#: The `gemm` form decodes the weight into f32 workspace: not for weights larger than this
#: (`qlinear-to-gemm`'s `max_weight_bytes`).
MAX_GEMM_WEIGHT_BYTES = 512 << 20
FAMILY = "qlinear"


def _layout(node: torch.fx.Node) -> str:
    kind = QUANTIZED_LINEARS[node.target]
    if kind == "int4":
        return f"int4 g{node.args[5]}"
    if kind == "blocks":
        return str(node.args[3])
    return "int8"


def rows_and_sizes(node: torch.fx.Node) -> Optional[tuple[int, int, int]]:
    """(M, N, K) of the node when all are static, else None."""
    x = _concrete_shape(node.args[0].meta.get("val"))
    out = _concrete_shape(node.meta.get("val"))
    if x is None or out is None:
        return None
    shape = x[0]
    return math.prod(shape[:-1]), out[0][-1], shape[-1]


def workload(node: torch.fx.Node) -> Optional[dict[str, Any]]:
    """The node as a tuning workload (layout, each tensor's shape and dtype), or None when a
    size is symbolic."""
    tensors = []
    for arg in node.all_input_nodes:
        desc = _concrete_shape(arg.meta.get("val"))
        if desc is None:
            return None
        tensors.append([list(desc[0]), list(desc[1]), str(desc[2]).replace("torch.", "")])
    return {"op": FAMILY, "layout": _layout(node), "tensors": tensors}


def describe(node: torch.fx.Node, sizes: tuple[int, int, int]) -> str:
    m, n, k = sizes
    return f"f32[{m},{k}] x {_layout(node)} [{n}, {k}]"


def candidates(node: torch.fx.Node, gen: torch.Generator, compile_alone: CompileAlone,
               sizes: tuple[int, int, int]) -> list[Candidate]:
    """`auto` (the default, also what a spent budget keeps: what the compiler picks by M and the target),
    then each explicit form: `rows`, `panel`, and `gemm` where the f32 weight fits. The form
    `auto` resolves to compiles to `auto`'s code: the tuner measures that kernel once."""
    inputs = _Inputs(node, gen)
    _, n, k = sizes

    def form(name: Optional[str]) -> Candidate:
        def prepare() -> Any:
            return inputs.runner(compile_alone(_single_node_graph(node, {QLINEAR_FORM: name} if name else None)))
        return Candidate(name or "auto", "generated", prepare, default=name is None)

    out = [form(None), form("rows"), form("panel")]
    if 4 * n * k <= MAX_GEMM_WEIGHT_BYTES:
        out.append(form("gemm"))
    return out


def choose_qlinear_forms(gm: torch.fx.GraphModule, tuner: Tuner,
                         compile_alone: CompileAlone) -> dict[torch.fx.Node, Choice]:
    """Measure the forms of each quantized linear of `gm` with static rows (MIN_ROWS <= M < MAX_ROWS) and
    mark the nodes where an explicit form beat `auto` (`node.meta[QLINEAR_FORM]`). Returns the
    choices (also in `tuner.choices`, which explain() shows). Under TORCHBURN_QLINEAR_INVARIANT
    every `qlinear` takes the rows form (`quant/lowering.py`): nothing is measured."""
    from ..runtime.config import get_config

    chosen: dict[torch.fx.Node, Choice] = {}
    if get_config().qlinear_invariant:
        return chosen
    gen = torch.Generator().manual_seed(0)
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in QUANTIZED_LINEARS:
            continue
        sizes = rows_and_sizes(node)
        work = workload(node)
        if sizes is None or work is None or not MIN_ROWS <= sizes[0] < MAX_ROWS:
            continue
        with unset_fake_temporarily():  # AOTAutograd compiles under a fake mode: measure real tensors
            choice = tuner.choose(FAMILY, work, describe(node, sizes), candidates(node, gen, compile_alone, sizes))
        chosen[node] = choice
        if choice.chosen != "auto":
            node.meta[QLINEAR_FORM] = choice.chosen
    return chosen
