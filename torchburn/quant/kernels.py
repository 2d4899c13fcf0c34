"""Eager reference kernels behind the ``torchburn::linear_*`` ops (forward and backward).

Semantics are fixed by `layouts`: dequantize to float32, multiply in float32.  How it is
done here is only about being reasonably fast in plain PyTorch:

* the weight is dequantized in slices of output rows (about 4 MiB of float32 each) into one
  buffer reused for the whole call, then multiplied with one GEMM per slice; no full float32
  copy of the weight, no fresh multi-megabyte allocation per slice (page faults cost more
  than the arithmetic), no Python loop over rows;
* INT4 is dequantized in *byte order* rather than element order: all low nibbles of a row
  first, then all high nibbles.  Both halves come out of contiguous whole-row mask/shift
  passes, while element order needs a strided interleave per group that costs several times
  more.  The activation's columns are permuted to match (a gather over ``in`` values per
  input row, cheap), and the GEMM computes the same sum in another order.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from .blocks import BLOCK_TYPES, dequantize_block_rows
from .layouts import dequantize_int4_rows, dequantize_int8_rows

#: Target number of float32 weight elements dequantized at a time (4 MiB): large enough for
#: an efficient GEMM per slice, small enough to stay in the last-level cache.
SLICE_ELEMENTS = 1 << 20

#: ``dequantize(start, stop, buffer) -> W[start:stop]`` as float32 ``[stop - start, in]``,
#: written into ``buffer`` (float32, at least that many elements).
RowDequantizer = Callable[[int, int, torch.Tensor], torch.Tensor]


def slice_rows(in_features: int, out_features: int) -> int:
    """Rows dequantized at a time for a weight of this shape."""
    return max(1, min(out_features, SLICE_ELEMENTS // max(1, in_features)))


def sliced_linear(x2: torch.Tensor, out_features: int, bias: Optional[torch.Tensor],
                  dequantize: RowDequantizer) -> torch.Tensor:
    """``x2 @ W.T + bias`` in float32 for ``x2`` float32 ``[m, in]``, ``W`` made by slices."""
    in_features = x2.shape[1]
    out = torch.empty(x2.shape[0], out_features, dtype=torch.float32, device=x2.device)
    rows = slice_rows(in_features, out_features)
    buffer = torch.empty(rows * in_features, dtype=torch.float32, device=x2.device)
    for start in range(0, out_features, rows):
        stop = min(start + rows, out_features)
        w = dequantize(start, stop, buffer)
        if stop - start == out_features:
            torch.matmul(x2, w.t(), out=out)
        else:
            out[:, start:stop] = x2 @ w.t()
    if bias is not None:
        out += bias.float()
    return out


def _rows_view(buffer: torch.Tensor, rows: int, in_features: int) -> torch.Tensor:
    return buffer[: rows * in_features].view(rows, in_features)


def int8_forward(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor,
                 bias: Optional[torch.Tensor]) -> torch.Tensor:
    out_features, in_features = qweight.shape
    x2 = x.reshape(-1, in_features).float()
    y = sliced_linear(x2, out_features, bias, int8_rows(qweight, scales))
    return y.to(x.dtype).reshape(*x.shape[:-1], out_features)


def int4_byte_order(in_features: int, group_size: int, device: torch.device) -> torch.Tensor:
    """Element index of each column of the byte-order dequantization (see module doc):
    column ``c < in/2`` is the low nibble of byte ``c``, column ``in/2 + c`` its high nibble."""
    half = group_size // 2
    byte = torch.arange(in_features // 2, device=device)
    low = (byte // half) * group_size + byte % half
    return torch.cat([low, low + half])


def dequantize_int4_byte_order(packed: torch.Tensor, scales: torch.Tensor,
                               mins: Optional[torch.Tensor], group_size: int,
                               out: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
    """The columns of `dequantize_int4_rows` permuted by `int4_byte_order`, into ``out``
    (float32 ``[rows, in]``), with ``codes`` (uint8 ``[rows, in]``) as scratch."""
    rows, half_in = packed.shape
    n_groups = half_in * 2 // group_size
    halves = codes.view(rows, 2, half_in)
    torch.bitwise_and(packed, 0x0F, out=halves[:, 0])
    torch.bitwise_right_shift(packed, 4, out=halves[:, 1])
    out.copy_(codes)  # uint8 -> float32, exact
    # [row, nibble half, group, byte within group]: a group's scale covers both halves.
    w = out.view(rows, 2, n_groups, group_size // 2)
    if mins is None:
        w.sub_(8.0).mul_(scales.float()[:, None, :, None])
    else:
        w.mul_(scales.float()[:, None, :, None]).add_(mins.float()[:, None, :, None])
    return out


def int4_forward(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor,
                 mins: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                 group_size: int) -> torch.Tensor:
    out_features, in_features = packed.shape[0], packed.shape[1] * 2
    order = int4_byte_order(in_features, group_size, x.device)
    x2 = x.reshape(-1, in_features).float().index_select(1, order)
    codes = torch.empty(slice_rows(in_features, out_features) * in_features,
                        dtype=torch.uint8, device=x.device)

    def dequantize(start: int, stop: int, buffer: torch.Tensor) -> torch.Tensor:
        return dequantize_int4_byte_order(
            packed[start:stop], scales[start:stop],
            None if mins is None else mins[start:stop], group_size,
            out=_rows_view(buffer, stop - start, in_features),
            codes=_rows_view(codes, stop - start, in_features),
        )

    y = sliced_linear(x2, out_features, bias, dequantize)
    return y.to(x.dtype).reshape(*x.shape[:-1], out_features)


# --- backward: d(x @ W.T + b)/dx = grad @ W; the weight gets no gradient ------------------

def grad_input(grad: torch.Tensor, x_dtype: torch.dtype, x_shape: torch.Size,
               in_features: int, dequantize: RowDequantizer) -> torch.Tensor:
    """``grad @ W`` in float32, ``W`` made slice by slice as in the forward."""
    out_features = grad.shape[-1]
    g2 = grad.reshape(-1, out_features).float()
    grad_x = torch.zeros(g2.shape[0], in_features, dtype=torch.float32, device=grad.device)
    rows = slice_rows(in_features, out_features)
    buffer = torch.empty(rows * in_features, dtype=torch.float32, device=grad.device)
    for start in range(0, out_features, rows):
        stop = min(start + rows, out_features)
        grad_x.addmm_(g2[:, start:stop], dequantize(start, stop, buffer))
    return grad_x.to(x_dtype).reshape(x_shape)


def grad_bias(grad: torch.Tensor, bias_dtype: torch.dtype) -> torch.Tensor:
    return grad.reshape(-1, grad.shape[-1]).float().sum(0).to(bias_dtype)


def int8_rows(qweight: torch.Tensor, scales: torch.Tensor) -> RowDequantizer:
    """A `RowDequantizer` for an INT8 weight, in element order."""
    in_features = qweight.shape[1]

    def dequantize(start: int, stop: int, buffer: torch.Tensor) -> torch.Tensor:
        out = _rows_view(buffer, stop - start, in_features)
        return dequantize_int8_rows(qweight[start:stop], scales[start:stop], out=out)

    return dequantize


def int4_rows(packed: torch.Tensor, scales: torch.Tensor, mins: Optional[torch.Tensor],
              group_size: int) -> RowDequantizer:
    """A `RowDequantizer` for an INT4 weight, in element order."""
    in_features = packed.shape[1] * 2

    def dequantize(start: int, stop: int, buffer: torch.Tensor) -> torch.Tensor:
        return dequantize_int4_rows(
            packed[start:stop], scales[start:stop],
            None if mins is None else mins[start:stop], group_size,
            out=_rows_view(buffer, stop - start, in_features),
        )

    return dequantize


def block_rows(blocks: torch.Tensor, block_type: str) -> RowDequantizer:
    """A `RowDequantizer` for a weight in ggml blocks (`blocks.BlockWeight`)."""
    bt = BLOCK_TYPES[block_type]
    in_features = blocks.shape[1] // bt.nbytes * bt.block

    def dequantize(start: int, stop: int, buffer: torch.Tensor) -> torch.Tensor:
        out = _rows_view(buffer, stop - start, in_features)
        return dequantize_block_rows(blocks[start:stop], block_type, out=out)

    return dequantize


def blocks_forward(x: torch.Tensor, blocks: torch.Tensor, bias: Optional[torch.Tensor],
                   block_type: str) -> torch.Tensor:
    out_features = blocks.shape[0]
    x2 = x.reshape(-1, x.shape[-1]).float()
    y = sliced_linear(x2, out_features, bias, block_rows(blocks, block_type))
    return y.to(x.dtype).reshape(*x.shape[:-1], out_features)
