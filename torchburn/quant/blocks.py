"""Weights kept in ggml's own blocks (`BlockWeight`), and their reference dequantization.

A GGUF tensor of a block type of `torchburn.ir.qblocks` (Q4_0 ... Q8_0, Q2_K ... Q6_K) is kept
as the file's bytes, one row of blocks per output feature: ``blocks`` is uint8
``[out, in // block * nbytes]``. What the bytes mean is the type's expressions in the block
table; here they are evaluated on torch tensors, all rows and blocks at once, one run (the
weights sharing a scale) at a time:

    w[:, b, r run + l] = f32(code(r)) * scale(r) + offset(r)

with one rounding per operation, the order of gguf-py's ``gguf.quants.dequantize``, so the
values are its float32 values bit for bit. Only the rows asked for are dequantized (a slice of
rows for the eager linear, the gathered rows of an embedding): a float copy of the whole weight
never exists.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from ..ir import dtypes as dt
from ..ir import expr as ex
from ..ir.qblocks import BLOCK, BLOCK_TYPES, LANE, BlockType, block_type
from .layouts import Int8Weight

_TORCH_DTYPES = {
    dt.u8: torch.uint8, dt.i8: torch.int8, dt.i16: torch.int16, dt.i32: torch.int32,
    dt.i64: torch.int64, dt.index: torch.int64, dt.f16: torch.float16, dt.f32: torch.float32,
}
_BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "and": torch.bitwise_and,
    "or": torch.bitwise_or, "xor": torch.bitwise_xor, "shl": torch.bitwise_left_shift,
    "shr": torch.bitwise_right_shift, "lt": torch.lt, "ne": torch.ne,
    "mod": torch.remainder, "floordiv": lambda a, b: torch.div(a, b, rounding_mode="floor"),
}


def check_block_layout(blocks: torch.Tensor, type_name: str) -> BlockType:
    """Validate a `BlockWeight`'s tensor (dtype and shape only, so it runs on fake tensors
    too); the block type. Raises ValueError naming the problem."""
    bt = block_type(type_name)
    if blocks.dtype != torch.uint8 or blocks.dim() != 2:
        raise ValueError(f"{type_name} blocks must be a 2-D uint8 tensor [out, row bytes]; "
                         f"got {blocks.dtype} {list(blocks.shape)}")
    if blocks.shape[1] == 0 or blocks.shape[1] % bt.nbytes:
        raise ValueError(f"{type_name} rows of {blocks.shape[1]} bytes are not whole blocks of "
                         f"{bt.nbytes} bytes")
    return bt


def block_in_features(blocks: torch.Tensor, bt: BlockType) -> int:
    return blocks.shape[1] // bt.nbytes * bt.block


@dataclass(frozen=True, eq=False)
class BlockWeight:
    """A linear weight ``[out, in]`` kept as ggml blocks of type `block_type` (module doc)."""

    blocks: torch.Tensor
    block_type: str

    def __post_init__(self) -> None:
        check_block_layout(self.blocks, self.block_type)

    @property
    def layout(self) -> BlockType:
        return BLOCK_TYPES[self.block_type]

    @property
    def out_features(self) -> int:
        return self.blocks.shape[0]

    @property
    def in_features(self) -> int:
        return block_in_features(self.blocks, self.layout)


class _Evaluator:
    """The block table's expressions on a block tensor ``[rows, blocks, nbytes]``: values of
    shape ``[rows, blocks, 1]`` (per run) or ``[rows, blocks, run]`` (per lane)."""

    def __init__(self, blocks: torch.Tensor, run: int) -> None:
        self.blocks = blocks
        self.lane = torch.arange(run, device=blocks.device).view(1, 1, run)
        self.memo: dict[ex.Expr, torch.Tensor] = {}

    def __call__(self, e: ex.Expr) -> torch.Tensor:
        got = self.memo.get(e)
        if got is None:
            got = self.memo[e] = self._eval(e)
        return got

    def _eval(self, e: ex.Expr) -> torch.Tensor:
        if isinstance(e, ex.Const):
            return torch.tensor(e.value, dtype=_TORCH_DTYPES[e.type.dtype], device=self.blocks.device)
        if isinstance(e, ex.Var):
            assert e.name == LANE.name, e
            return self.lane
        if isinstance(e, ex.Load):
            assert e.buffer == BLOCK and len(e.index) == 1, e
            index = self(e.index[0])
            if index.dim() == 0:
                at = int(index)
                return self.blocks[:, :, at:at + 1]
            return self.blocks[:, :, index.reshape(-1)]
        if isinstance(e, ex.Binary):
            return _BINARY[e.op](self(e.a), self(e.b))
        if isinstance(e, ex.Cast):
            return self(e.value).to(_TORCH_DTYPES[e.type.dtype])
        if isinstance(e, ex.Bitcast):
            return self(e.value).view(_TORCH_DTYPES[e.type.dtype])
        if isinstance(e, ex.Select):
            return torch.where(self(e.cond), self(e.a), self(e.b))
        if isinstance(e, ex.Call) and e.name == "neg":
            return torch.neg(self(e.args[0]))
        raise ValueError(f"block expression node {e!r} has no torch evaluation")


def dequantize_block_rows(blocks: torch.Tensor, type_name: str,
                          out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """The float32 ``[rows, in]`` weights of ``blocks`` (uint8 ``[rows, row bytes]``, any
    slice of rows); ``out`` (float32, that shape, contiguous) is written when given."""
    bt = BLOCK_TYPES[type_name]
    rows, row_bytes = blocks.shape
    n_blocks = row_bytes // bt.nbytes
    in_features = n_blocks * bt.block
    w = torch.empty(rows, in_features, device=blocks.device) if out is None else out
    w4 = w.view(rows, n_blocks, bt.runs, bt.run)
    ev = _Evaluator(blocks.reshape(rows, n_blocks, bt.nbytes), bt.run)
    for r in range(bt.runs):
        code = ev(bt.code(r)).to(torch.float32)
        torch.mul(code, ev(bt.scale(r)), out=w4[:, :, r])
        offset = bt.offset(r)
        if offset is not None:
            w4[:, :, r].add_(ev(offset))
    return w


#: Weight rows `block_rows_as_int8` converts at a time (its temporaries stay a few MB).
CONVERT_ROWS = 1024


def block_rows_as_int8(blocks: torch.Tensor, type_name: str) -> Int8Weight:
    """The same float32 weights as grouped INT8 codes and scales, derived from the block
    table: code ``code(r)`` of each lane, one scale ``scale(r)`` per group of the runs that
    share their scale expression (Q5_0: the block's ``d`` for its 32 weights; Q6_K: ``d *
    scales[j]`` for each 16), float16 where every scale is one (exact), else float32 (a
    float16 times an int8 is exact in float32). For the GPU engine, whose products read
    whole-byte codes with vec4 loads (`llm/model/gpu_weights.py`). ValueError for a type with
    offsets or codes outside int8."""
    bt = check_block_layout(blocks, type_name)
    if any(bt.offset(r) is not None for r in range(bt.runs)):
        raise ValueError(f"{type_name} weights have offsets (mins): no symmetric INT8 form")
    share = next(k for k in range(bt.runs, 0, -1)
                 if bt.runs % k == 0 and all(bt.scale(r) == bt.scale(r - r % k) for r in range(bt.runs)))
    rows, row_bytes = blocks.shape
    n_blocks = row_bytes // bt.nbytes
    codes = torch.empty(rows, n_blocks, bt.runs, bt.run, dtype=torch.int8)
    scales = torch.empty(rows, n_blocks, bt.runs // share)
    for first in range(0, rows, CONVERT_ROWS):
        part = blocks[first:first + CONVERT_ROWS]
        ev = _Evaluator(part.reshape(part.shape[0], n_blocks, bt.nbytes), bt.run)
        for r in range(bt.runs):
            code = ev(bt.code(r))
            if int(code.min()) < -128 or int(code.max()) > 127:
                raise ValueError(f"{type_name} codes leave int8")
            codes[first:first + CONVERT_ROWS, :, r] = code
            if r % share == 0:
                scales[first:first + CONVERT_ROWS, :, r // share] = ev(bt.scale(r))[..., 0]
    scales = scales.reshape(rows, -1)
    half = scales.half()
    return Int8Weight(qweight=codes.reshape(rows, -1), scales=half if torch.equal(half.float(), scales) else scales)


def dequantize_blocks(weight: BlockWeight) -> torch.Tensor:
    """The float32 ``[out, in]`` matrix a `BlockWeight` stands for (tests and tools; the
    engine only ever dequantizes slices)."""
    return dequantize_block_rows(weight.blocks, weight.block_type)
