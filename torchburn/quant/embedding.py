"""`BlockEmbedding`: a token embedding kept in ggml blocks (GGUF files store it as Q6_K, Q4_K,
Q8_0 ...), and its custom op ``torchburn::embedding_blocks``.

A lookup gathers the byte rows of the asked tokens and dequantizes only those rows
(`blocks.dequantize_block_rows`): the float table never exists. The compiler does the same
(`quant/lowering.py`: `index` of the byte rows, then the IR's `dequantize`, one kernel), so a
model step with this embedding is one native call, which the LLM engine's step cache needs.

    torchburn::embedding_blocks(Tensor ids, Tensor blocks, str block_type) -> Tensor
"""
from __future__ import annotations

import torch
from torch import nn

from .blocks import BlockWeight, block_in_features, check_block_layout, dequantize_block_rows


@torch.library.custom_op("torchburn::embedding_blocks", mutates_args=())
def embedding_blocks(ids: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    """Rows ``ids`` of the weight ``blocks`` (ggml blocks of ``block_type``), float32
    ``[*ids.shape, in]``."""
    bt = check_block_layout(blocks, block_type)
    rows = torch.nn.functional.embedding(ids.reshape(-1), blocks)
    out = dequantize_block_rows(rows, block_type)
    return out.reshape(*ids.shape, block_in_features(blocks, bt))


@embedding_blocks.register_fake
def _embedding_blocks_fake(ids: torch.Tensor, blocks: torch.Tensor, block_type: str) -> torch.Tensor:
    bt = check_block_layout(blocks, block_type)
    return blocks.new_empty((*ids.shape, block_in_features(blocks, bt)), dtype=torch.float32)


class BlockEmbedding(nn.Module):
    """An embedding table in ggml blocks (module docstring); ``blocks`` is a buffer."""

    blocks: torch.Tensor

    def __init__(self, weight: BlockWeight) -> None:
        super().__init__()
        self.register_buffer("blocks", weight.blocks)
        self.block_type = weight.block_type

    def weight_blocks(self) -> BlockWeight:
        """The table as a `BlockWeight` (sharing the buffer: a tied output head uses it)."""
        return BlockWeight(blocks=self.blocks, block_type=self.block_type)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return torch.ops.torchburn.embedding_blocks(ids, self.blocks, self.block_type)

    def extra_repr(self) -> str:
        return f"num_embeddings={self.blocks.shape[0]}, block_type={self.block_type}"
