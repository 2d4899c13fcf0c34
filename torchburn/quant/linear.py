"""`QuantizedLinear`: an ``nn.Linear`` replacement holding an INT8 or INT4 weight.

The packed weight lives in buffers (not parameters: it is not trained), so ``state_dict()``
carries it and ``load_state_dict()`` restores it, also into a module freshly built with the
same configuration.  ``forward`` is a single call to a ``torchburn::linear_*`` custom op, so a
compiled graph shows one node per layer that the compiler can lower as a whole.

Buffers (names are part of the checkpoint format):

====================  =======================================================
quant_type="int8"     ``qweight`` int8 [out, in], ``scales`` [out] or [out, in/g]
quant_type="int4"     ``packed`` uint8 [out, in/2], ``scales`` [out, in/g],
                      ``mins`` [out, in/g] when asymmetric
quant_type="blocks"   ``blocks`` uint8 [out, in/block*nbytes]: ggml blocks of
                      ``block_type`` (Q4_0 ... Q6_K, `blocks.BlockWeight`)
both                  ``bias`` [out] when the layer has a bias
====================  =======================================================
"""
from __future__ import annotations

from typing import Callable, Optional, Union

import torch
from torch import nn

from . import ops  # noqa: F401  (registers torch.ops.torchburn.*)
from .blocks import BlockWeight
from .layouts import SCALE_DTYPES, Int4Weight, Int8Weight, check_int4_group_size
from ..ir.qblocks import block_type as block_type_of
from .quantize import quantize_weight_int4_grouped, quantize_weight_int8

QUANT_TYPES = ("int8", "int4", "blocks")
#: Group size used for INT4 when none is given.
DEFAULT_INT4_GROUP_SIZE = 64


def resolve_group_size(quant_type: str, group_size: Optional[int]) -> Optional[int]:
    """The effective group size: ``None`` means per channel for INT8 and 64 for INT4."""
    if quant_type not in QUANT_TYPES:
        raise ValueError(f"quant_type must be one of {QUANT_TYPES}; got {quant_type!r}")
    if quant_type == "blocks":
        return group_size
    if group_size is None and quant_type == "int4":
        return DEFAULT_INT4_GROUP_SIZE
    if group_size is not None and (not isinstance(group_size, int) or group_size < 1):
        raise ValueError(f"group_size must be a positive integer or None; got {group_size!r}")
    return group_size


def check_group_size(quant_type: str, in_features: int, group_size: Optional[int]) -> None:
    """Raise ValueError if a layer of ``in_features`` inputs cannot use ``group_size``."""
    if quant_type == "blocks":
        if group_size is None or in_features % group_size:
            raise ValueError(f"in_features={in_features} is not a whole number of blocks of {group_size}")
    elif quant_type == "int4":
        if group_size is None:
            raise ValueError("INT4 needs a group size")
        check_int4_group_size(in_features, group_size)
    elif group_size is not None and in_features % group_size != 0:
        raise ValueError(f"group_size={group_size} does not divide in_features={in_features}")


class QuantizedLinear(nn.Module):
    """``y = x @ W.T + bias`` with ``W`` stored as INT8 or grouped INT4.

    Build one with `from_float` (quantize an ``nn.Linear``), `from_weight` (wrap an
    `Int8Weight`/`Int4Weight`, e.g. imported from GGUF), or the constructor (empty buffers of
    the right shapes, ready for ``load_state_dict``).

    ``group_size=None`` means per output channel for INT8 and 64 for INT4.  ``symmetric``
    matters for INT4 only (INT8 is always symmetric).  The output has ``x``'s dtype; the
    arithmetic is float32.  Dtype conversions of the module (``.half()``, ``.to(dtype)``)
    convert the bias but never the scales, which keep the dtype they were made with.
    """

    # Buffers, declared for type checkers; which exist depends on quant_type (module doc).
    qweight: torch.Tensor
    packed: torch.Tensor
    blocks: torch.Tensor
    scales: torch.Tensor
    mins: Optional[torch.Tensor]
    bias: Optional[torch.Tensor]
    group_size: Optional[int]

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        quant_type: str = "int8",
        group_size: Optional[int] = None,
        symmetric: bool = True,
        scale_dtype: torch.dtype = torch.float32,
        device: Optional[Union[torch.device, str]] = None,
        block_type: Optional[str] = None,
    ) -> None:
        super().__init__()
        if (quant_type == "blocks") != (block_type is not None):
            raise ValueError("block_type is given exactly when quant_type is 'blocks'")
        if block_type is not None:
            group_size = block_type_of(block_type).block
        group_size = resolve_group_size(quant_type, group_size)
        check_group_size(quant_type, in_features, group_size)
        if quant_type == "int8" and not symmetric:
            raise ValueError("INT8 quantization is symmetric only; pass symmetric=True")
        if scale_dtype not in SCALE_DTYPES:
            raise ValueError(f"scale_dtype must be one of {SCALE_DTYPES}; got {scale_dtype}")
        self.in_features = in_features
        self.out_features = out_features
        self.quant_type = quant_type
        self.group_size = group_size
        self.symmetric = symmetric
        self.scale_dtype = scale_dtype
        #: The ggml block type of quant_type "blocks" (None otherwise).
        self.block_type = block_type

        def scales(shape: tuple[int, ...]) -> torch.Tensor:
            return torch.zeros(shape, dtype=scale_dtype, device=device)

        # Per channel (INT8 only) is one scale per row; otherwise one per group.
        if group_size is None:
            scale_shape: tuple[int, ...] = (out_features,)
        else:
            scale_shape = (out_features, in_features // group_size)
        if block_type is not None:
            row_bytes = block_type_of(block_type).row_bytes(in_features)
            self.register_buffer(
                "blocks", torch.zeros(out_features, row_bytes, dtype=torch.uint8, device=device))
        elif quant_type == "int8":
            self.register_buffer(
                "qweight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device)
            )
            self.register_buffer("scales", scales(scale_shape))
        else:
            self.register_buffer(
                "packed",
                torch.zeros(out_features, in_features // 2, dtype=torch.uint8, device=device),
            )
            self.register_buffer("scales", scales(scale_shape))
            self.register_buffer("mins", None if symmetric else scales(scale_shape))
        self.register_buffer(
            "bias", torch.zeros(out_features, device=device) if bias else None
        )

    @classmethod
    def from_weight(
        cls, weight: Union[Int8Weight, Int4Weight, BlockWeight], bias: Optional[torch.Tensor] = None
    ) -> "QuantizedLinear":
        """Wrap an already quantized weight (for instance one imported from GGUF).

        The module shares the weight's tensors (no copy); the bias is copied.
        """
        # Placeholders on "meta" cost nothing; every one is replaced below.
        if isinstance(weight, BlockWeight):
            module = cls(weight.in_features, weight.out_features, bias=bias is not None,
                         quant_type="blocks", block_type=weight.block_type, device="meta")
            module.blocks = weight.blocks
        elif isinstance(weight, Int8Weight):
            module = cls(
                weight.in_features, weight.out_features, bias=bias is not None,
                quant_type="int8",
                group_size=None if weight.per_channel else weight.group_size,
                scale_dtype=weight.scales.dtype, device="meta",
            )
            module.qweight = weight.qweight
        elif isinstance(weight, Int4Weight):
            module = cls(
                weight.in_features, weight.out_features, bias=bias is not None,
                quant_type="int4", group_size=weight.group_size, symmetric=weight.symmetric,
                scale_dtype=weight.scales.dtype, device="meta",
            )
            module.packed = weight.packed
            module.mins = weight.mins
        else:
            raise ValueError(
                f"weight must be an Int8Weight, Int4Weight or BlockWeight; got {type(weight).__name__}"
            )
        if not isinstance(weight, BlockWeight):
            module.scales = weight.scales
        if bias is not None:
            if tuple(bias.shape) != (weight.out_features,) or not bias.is_floating_point():
                raise ValueError(
                    f"bias must be a float tensor of shape [{weight.out_features}]; "
                    f"got {bias.dtype} {list(bias.shape)}"
                )
            module.bias = bias.detach().clone()
        return module

    @classmethod
    def from_float(
        cls,
        linear: nn.Linear,
        quant_type: str = "int8",
        group_size: Optional[int] = None,
        symmetric: bool = True,
        scale_dtype: torch.dtype = torch.float32,
    ) -> "QuantizedLinear":
        """Quantize an ``nn.Linear`` (its weight; the bias stays float, in its own dtype)."""
        if not isinstance(linear, nn.Linear):
            raise ValueError(f"from_float expects an nn.Linear; got {type(linear).__name__}")
        group_size = resolve_group_size(quant_type, group_size)
        check_group_size(quant_type, linear.in_features, group_size)
        weight: Union[Int8Weight, Int4Weight]
        if quant_type == "int8":
            if not symmetric:
                raise ValueError("INT8 quantization is symmetric only; pass symmetric=True")
            weight = quantize_weight_int8(linear.weight, group_size, scale_dtype)
        else:
            assert group_size is not None  # resolve_group_size gives INT4 a default
            weight = quantize_weight_int4_grouped(linear.weight, group_size, symmetric, scale_dtype)
        return cls.from_weight(weight, linear.bias)

    def quantized_weight(self) -> Union[Int8Weight, Int4Weight, BlockWeight]:
        """The weight as an `Int8Weight`/`Int4Weight`/`BlockWeight` (sharing this module's
        buffers)."""
        if self.block_type is not None:
            return BlockWeight(blocks=self.blocks, block_type=self.block_type)
        if self.quant_type == "int8":
            return Int8Weight(qweight=self.qweight, scales=self.scales)
        assert self.group_size is not None
        return Int4Weight(
            packed=self.packed, scales=self.scales, mins=self.mins, group_size=self.group_size
        )

    def _apply(
        self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True
    ) -> QuantizedLinear:
        """Move ``scales``/``mins`` with the module but keep their dtype.

        ``model.to(torch.bfloat16)`` or ``.half()`` after quantization would otherwise round
        float32 scales, or turn GGUF's exact float16 scales into bfloat16, silently changing
        the weight.  The bias follows the model like any float tensor.
        """
        held: dict[str, torch.Tensor] = {}
        for name in ("scales", "mins"):
            tensor = self._buffers.get(name)
            if tensor is not None:
                held[name] = tensor
                self._buffers[name] = None
        try:
            super()._apply(fn, recurse)
        finally:
            for name, tensor in held.items():
                moved = fn(tensor)
                if moved.dtype != tensor.dtype:
                    moved = tensor.to(device=moved.device)
                self._buffers[name] = moved
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.block_type is not None:
            return torch.ops.torchburn.linear_blocks(x, self.blocks, self.bias, self.block_type)
        if self.quant_type == "int8":
            y: torch.Tensor = torch.ops.torchburn.linear_int8(
                x, self.qweight, self.scales, self.bias
            )
        else:
            y = torch.ops.torchburn.linear_int4(
                x, self.packed, self.scales, self.mins, self.bias, self.group_size
            )
        return y

    def extra_repr(self) -> str:
        if self.block_type is not None:
            return (f"in_features={self.in_features}, out_features={self.out_features}, "
                    f"bias={self.bias is not None}, quant_type=blocks, block_type={self.block_type}")
        group = "per_channel" if self.group_size is None else f"group_size={self.group_size}"
        kind = "" if self.quant_type == "int8" else f", symmetric={self.symmetric}"
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, quant_type={self.quant_type}, {group}{kind}, "
            f"scale_dtype={str(self.scale_dtype).removeprefix('torch.')}"
        )
