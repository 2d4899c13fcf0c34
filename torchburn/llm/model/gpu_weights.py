"""A loaded model's weights laid out for the GPU engine (`LLM(device="gpu")`).

GGUF's Q5_0 and Q6_K blocks (22 and 210 bytes) start most blocks off a 4-byte word: the GPU's
block products read their codes a u32 word at a time with shifts, where our int8 and int4
layouts take vec4 loads. Their linears become grouped INT8 ones holding the same weights
(`quant.blocks.block_rows_as_int8`: codes and scales derived from the block table, exactly), and sibling
projections that are now alike are stacked (`fuse`): a Q4_K_M file's Q8_0 value projection
beside Q5_0 query and key projections becomes one QKV product.

    model.layers[0].self_attn: q_proj blocks Q5_0, k_proj blocks Q5_0, v_proj int8 g32 (Q8_0)
    -> model.layers[0].self_attn: qkv_proj int8 g32

The CPU engine keeps the blocks: its decode reads the weights at memory bandwidth, which the
int8 codes' 55% more bytes would cost.
"""
from __future__ import annotations

from torch import nn

from ...quant import BlockEmbedding, QuantizedLinear
from ...quant.blocks import block_rows_as_int8
from .fuse import fuse_projections
from .mapped import release

#: ggml block types whose linears the GPU engine reads as grouped INT8 codes.
GPU_INT8_CODES = ("Q5_0", "Q6_K")


def lay_out_for_gpu(model: nn.Module) -> int:
    """Convert ``model``'s Q5_0 and Q6_K linears in place (module docstring) and stack the
    projections that became alike; returns how many linears were converted."""
    embedded = {m.blocks.untyped_storage().data_ptr() for m in model.modules() if isinstance(m, BlockEmbedding)}
    converted = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if (isinstance(child, QuantizedLinear) and child.block_type in GPU_INT8_CODES
                    and child.blocks.untyped_storage().data_ptr() not in embedded):
                weight = block_rows_as_int8(child.blocks, child.block_type)
                bias = None if child.bias is None else child.bias.detach()
                setattr(parent, name, QuantizedLinear.from_weight(weight, bias))
                release(child.blocks)  # a view of the file's map: its pages are not read again
                converted += 1
    if converted and hasattr(model, "layers"):
        fuse_projections(model)
    return converted
