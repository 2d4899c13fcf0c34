"""The quantized linears `torchburn::linear_int8`, `torchburn::linear_int4` and
`torchburn::linear_blocks` (the custom ops of `torchburn/quant/ops.py`), lowered to the IR's `qlinear` followed by the bias add and the
cast back to x's dtype, which `fuse` computes in the same kernel (an epilogue); and the
block-quantized token embedding `torchburn::embedding_blocks` (`quant/embedding.py`), lowered
to an `index` of the asked rows' bytes and the IR's `dequantize` of those rows.

The `activations` attribute carries TORCHBURN_QLINEAR_ACTIVATIONS (int8, f32 or auto) into
the IR, so the CPU kernel's choice is part of the graph and of every cache key built from it;
so does the `form` attribute, "rows" under TORCHBURN_QLINEAR_INVARIANT (batch invariance:
docs/quantization.md).

It lives in `quant/` (DESIGN.md: quant owns its ops and their lowerings) and registers with
the frontend's registry when `torchburn.quant.ops` is imported: a graph can only hold these
ops once that module has defined them, so the lowering is always there when it is needed.
"""
from __future__ import annotations

from typing import Optional

import torch

from ..runtime.config import get_config
from ..frontend.builder import Builder, numel
from ..frontend.registry import Unsupported, lowering
from ..ir import dtypes as dt
from ..ir.expr import Const
from ..ir.qblocks import block_type as block_type_of
from ..ir.tensor import Value

torchburn_ops = torch.ops.torchburn


def _static_size(v: Value, dim: int, what: str) -> int:
    d = v.shape[dim]
    if not isinstance(d, Const):
        raise Unsupported(f"{what} has a symbolic size")
    return int(d.value)


#: `node.meta[QLINEAR_FORM]`: the kernel form the tuner chose for a quantized linear
#: (`backend/qlinear_tuning.py`), written as the `qlinear`'s `form` attribute.
QLINEAR_FORM = "torchburn_qlinear_form"


def _form(b: Builder) -> dict[str, str]:
    """The `form` attribute: "rows" under TORCHBURN_QLINEAR_INVARIANT (every row of x computed
    alike whatever the rows), else the tuner's choice, else none ("auto")."""
    if get_config().qlinear_invariant:
        return {"form": "rows"}
    form = b.node.meta.get(QLINEAR_FORM) if b.node is not None else None
    return {"form": str(form)} if form else {}


def _finish(b: Builder, y: Value, bias: Optional[Value], dtype: dt.DType) -> Value:
    """`y + bias` in f32, cast to x's dtype: elementwise ops the `qlinear` kernel fuses."""
    if bias is not None:
        y = b.elementwise("add", y, b.expand(b.to_compute(bias), y.shape))
    return b.cast(y, dtype)


@lowering(torchburn_ops.linear_int8.default)
def linear_int8(b: Builder, x: Value, qweight: Value, scales: Value, bias: Optional[Value]) -> Value:
    k = _static_size(qweight, 1, "qweight")
    group = k if scales.type.rank == 1 else k // _static_size(scales, 1, "scales")
    y = b.op("qlinear", x, qweight, scales, kind="int8", group_size=group, symmetric=True,
             activations=get_config().qlinear_activations, **_form(b))
    return _finish(b, y, bias, x.dtype)


@lowering(torchburn_ops.linear_int4.default)
def linear_int4(b: Builder, x: Value, packed: Value, scales: Value, mins: Optional[Value],
                bias: Optional[Value], group_size: int) -> Value:
    _static_size(packed, 1, "packed")
    operands = (x, packed, scales) if mins is None else (x, packed, scales, mins)
    y = b.op("qlinear", *operands, kind="int4", group_size=int(group_size), symmetric=mins is None,
             activations=get_config().qlinear_activations, **_form(b))
    return _finish(b, y, bias, x.dtype)


@lowering(torchburn_ops.linear_blocks.default)
def linear_blocks(b: Builder, x: Value, blocks: Value, bias: Optional[Value], block_type: str) -> Value:
    """`qlinear` of kind "blocks": the weight in ggml blocks, `block_type` naming its layout in
    `ir.qblocks` (group_size is the block's weight count, for the shape checks)."""
    _static_size(blocks, 1, "blocks")
    group = block_type_of(block_type).block
    y = b.op("qlinear", x, blocks, kind="blocks", block_type=str(block_type), group_size=group,
             symmetric=True, activations=get_config().qlinear_activations, **_form(b))
    return _finish(b, y, bias, x.dtype)


@lowering(torchburn_ops.embedding_blocks.default)
def embedding_blocks(b: Builder, ids: Value, blocks: Value, block_type: str) -> Value:
    """A token embedding in ggml blocks: the asked rows' bytes gathered (`index`), then those
    rows decoded (`dequantize`, the block table's definition), as the eager op does: the float
    table never exists. Compiled, a model whose embedding is Q4_K or Q6_K (most K-quant GGUF
    files) is one native call per step, which the LLM engine's step cache can store."""
    if ids.dtype.is_float or ids.dtype.is_bool:
        raise Unsupported("embedding_blocks: token ids must be integers")
    row_bytes = _static_size(blocks, 1, "blocks")
    bt = block_type_of(block_type)
    flat = b.reshape(ids, (numel(ids.shape),))
    rows = b.op("index", blocks, flat, dims=(0,), pos=0, wrap=False)  # eager refuses negative ids too
    w = b.op("dequantize", rows, kind="blocks", block_type=str(block_type), group_size=bt.block, symmetric=True)
    return b.reshape(w, (*ids.shape, Const(row_bytes // bt.nbytes * bt.block)))
