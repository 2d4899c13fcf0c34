"""The quantized-linear custom ops, ``torchburn::linear_int8`` and ``torchburn::linear_int4``.

They are what `QuantizedLinear` calls and what the compiler sees in a graph: one opaque node
carrying the packed weight, which the TorchBurn lowering turns into a fused
dequantize-and-multiply kernel.  Here they get

* an eager reference implementation (any device, in `kernels`): dequantize to float32,
  multiply in float32, return in ``x``'s dtype;
* a fake implementation, so Dynamo/AOTAutograd/Inductor can trace them (``fullgraph=True``);
* a backward for ``x`` and ``bias`` (the weight is frozen), so a partly quantized model still
  trains its float parts, and AOTAutograd can trace a graph whose input requires grad.

Schemas::

    torchburn::linear_int8(Tensor x, Tensor qweight, Tensor scales, Tensor? bias) -> Tensor
    torchburn::linear_int4(Tensor x, Tensor packed, Tensor scales, Tensor? mins,
                           Tensor? bias, int group_size) -> Tensor
    torchburn::linear_blocks(Tensor x, Tensor blocks, Tensor? bias, str block_type) -> Tensor

``linear_blocks`` takes a weight in ggml's own blocks (`blocks.BlockWeight`: Q4_0 ... Q6_K,
one row of blocks per output feature); ``block_type`` names its entry of the block table.

Operands follow `torchburn.quant.layouts`; ``x`` is ``[..., in]`` of any float dtype and the
result ``[..., out]`` of the same dtype.  ``linear_int8`` reads its grouping from the shape
of ``scales`` (``[out]`` per channel, ``[out, G]`` grouped) because the int8 bytes do not
depend on it.  ``linear_int4`` takes ``group_size`` explicitly because the nibble order does,
and a lowering wants it as a constant.  There is no ``symmetric`` flag: ``mins is None`` *is*
the symmetric form, so the two can never disagree.  Bad operands raise ValueError, in eager
mode and while tracing alike.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from . import kernels
from .blocks import block_in_features, check_block_layout
from .layouts import check_int4_layout, check_int8_layout


def _check_activation(x: torch.Tensor, in_features: int, out_features: int,
                      bias: Optional[torch.Tensor]) -> None:
    if not x.is_floating_point():
        raise ValueError(f"x must be a floating-point tensor; got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] != in_features:
        raise ValueError(
            f"x must have in_features={in_features} as its last dimension; "
            f"got shape {list(x.shape)}"
        )
    if bias is not None:
        if not bias.is_floating_point():
            raise ValueError(f"bias must be a floating-point tensor; got {bias.dtype}")
        if tuple(bias.shape) != (out_features,):
            raise ValueError(f"bias must have shape [{out_features}]; got {list(bias.shape)}")


def _check_int8(x: Tensor, qweight: Tensor, scales: Tensor, bias: Optional[Tensor]) -> None:
    check_int8_layout(qweight, scales)
    _check_activation(x, qweight.shape[1], qweight.shape[0], bias)


def _check_int4(x: Tensor, packed: Tensor, scales: Tensor, mins: Optional[Tensor],
                bias: Optional[Tensor], group_size: int) -> None:
    check_int4_layout(packed, scales, mins, group_size)
    _check_activation(x, packed.shape[1] * 2, packed.shape[0], bias)


def _check_blocks(x: Tensor, blocks: Tensor, bias: Optional[Tensor], block_type: str) -> None:
    bt = check_block_layout(blocks, block_type)
    _check_activation(x, block_in_features(blocks, bt), blocks.shape[0], bias)


@torch.library.custom_op("torchburn::linear_int8", mutates_args=())
def linear_int8(
    x: torch.Tensor,
    qweight: torch.Tensor,
    scales: torch.Tensor,
    bias: Optional[torch.Tensor],
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` an INT8 weight (``qweight``, ``scales``)."""
    _check_int8(x, qweight, scales, bias)
    return kernels.int8_forward(x, qweight, scales, bias)


@linear_int8.register_fake
def _linear_int8_fake(x: Tensor, qweight: Tensor, scales: Tensor,
                      bias: Optional[Tensor]) -> Tensor:
    _check_int8(x, qweight, scales, bias)
    return x.new_empty((*x.shape[:-1], qweight.shape[0]))


@torch.library.custom_op("torchburn::linear_int4", mutates_args=())
def linear_int4(
    x: torch.Tensor,
    packed: torch.Tensor,
    scales: torch.Tensor,
    mins: Optional[torch.Tensor],
    bias: Optional[torch.Tensor],
    group_size: int,
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` an INT4 weight (``packed``, ``scales``, ``mins``)."""
    _check_int4(x, packed, scales, mins, bias, group_size)
    return kernels.int4_forward(x, packed, scales, mins, bias, group_size)


@linear_int4.register_fake
def _linear_int4_fake(x: Tensor, packed: Tensor, scales: Tensor, mins: Optional[Tensor],
                      bias: Optional[Tensor], group_size: int) -> Tensor:
    _check_int4(x, packed, scales, mins, bias, group_size)
    return x.new_empty((*x.shape[:-1], packed.shape[0]))


@torch.library.custom_op("torchburn::linear_blocks", mutates_args=())
def linear_blocks(
    x: torch.Tensor,
    blocks: torch.Tensor,
    bias: Optional[torch.Tensor],
    block_type: str,
) -> torch.Tensor:
    """``x @ W.T + bias`` with ``W`` kept in ggml blocks of ``block_type``."""
    _check_blocks(x, blocks, bias, block_type)
    return kernels.blocks_forward(x, blocks, bias, block_type)


@linear_blocks.register_fake
def _linear_blocks_fake(x: Tensor, blocks: Tensor, bias: Optional[Tensor], block_type: str) -> Tensor:
    _check_blocks(x, blocks, bias, block_type)
    return x.new_empty((*x.shape[:-1], blocks.shape[0]))


# --- autograd: gradients for x and bias; the quantized weight is a constant ---------------

def _setup_int8(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, qweight, scales, bias = inputs
    ctx.save_for_backward(qweight, scales)
    ctx.x_dtype, ctx.x_shape = x.dtype, x.shape
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward_int8(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    qweight, scales = ctx.saved_tensors
    grad_x = grad_bias = None
    if ctx.needs_input_grad[0]:
        rows = kernels.int8_rows(qweight, scales)
        grad_x = kernels.grad_input(grad, ctx.x_dtype, ctx.x_shape, qweight.shape[1], rows)
    if ctx.needs_input_grad[3]:
        grad_bias = kernels.grad_bias(grad, ctx.bias_dtype)
    return grad_x, None, None, grad_bias


def _setup_int4(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, packed, scales, mins, bias, group_size = inputs
    ctx.save_for_backward(packed, scales, mins)
    ctx.group_size = group_size
    ctx.x_dtype, ctx.x_shape = x.dtype, x.shape
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward_int4(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    packed, scales, mins = ctx.saved_tensors
    grad_x = grad_bias = None
    if ctx.needs_input_grad[0]:
        rows = kernels.int4_rows(packed, scales, mins, ctx.group_size)
        grad_x = kernels.grad_input(grad, ctx.x_dtype, ctx.x_shape, packed.shape[1] * 2, rows)
    if ctx.needs_input_grad[4]:
        grad_bias = kernels.grad_bias(grad, ctx.bias_dtype)
    return grad_x, None, None, None, grad_bias, None


def _setup_blocks(ctx: Any, inputs: tuple[Any, ...], output: Tensor) -> None:
    x, blocks, bias, block_type = inputs
    ctx.save_for_backward(blocks)
    ctx.block_type = block_type
    ctx.x_dtype, ctx.x_shape = x.dtype, x.shape
    ctx.bias_dtype = None if bias is None else bias.dtype


def _backward_blocks(ctx: Any, grad: Tensor) -> tuple[Optional[Tensor], ...]:
    (blocks,) = ctx.saved_tensors
    grad_x = grad_bias = None
    if ctx.needs_input_grad[0]:
        rows = kernels.block_rows(blocks, ctx.block_type)
        grad_x = kernels.grad_input(grad, ctx.x_dtype, ctx.x_shape, ctx.x_shape[-1], rows)
    if ctx.needs_input_grad[2]:
        grad_bias = kernels.grad_bias(grad, ctx.bias_dtype)
    return grad_x, None, grad_bias, None


linear_blocks.register_autograd(_backward_blocks, setup_context=_setup_blocks)
linear_int8.register_autograd(_backward_int8, setup_context=_setup_int8)
linear_int4.register_autograd(_backward_int4, setup_context=_setup_int4)

# The compiler's lowering of these ops registers with the frontend now that they exist.
from . import lowering  # noqa: E402,F401
