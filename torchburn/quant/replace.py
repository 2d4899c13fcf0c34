"""`quantize_`: swap the ``nn.Linear`` layers of a model for `QuantizedLinear`, in place.

Layers that cannot be quantized with the requested configuration are left as they are, and
the returned `QuantizeReport` says which and why (the same reasons are logged at INFO level),
so a model with a few odd-shaped layers still gets the rest quantized.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

import torch
from torch import nn

from .linear import QuantizedLinear, check_group_size, resolve_group_size

logger = logging.getLogger(__name__)

#: ``filter_fn(module, fully_qualified_name) -> bool``: quantize this linear layer?
FilterFn = Callable[[nn.Module, str], bool]


@dataclass
class QuantizeReport:
    """What `quantize_` did: names of replaced layers, and (name, reason) of skipped ones."""

    quantized: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"quantized {len(self.quantized)} linear layer(s), skipped {len(self.skipped)}"]
        lines += [f"  skipped {name}: {reason}" for name, reason in self.skipped]
        return "\n".join(lines)


def _skip_reason(
    parent: nn.Module, child: nn.Linear, quant_type: str, group_size: Optional[int]
) -> Optional[str]:
    if isinstance(parent, nn.MultiheadAttention):
        return "inside nn.MultiheadAttention, which reads its projection weights directly"
    if not child.weight.is_floating_point():
        return f"weight dtype {child.weight.dtype} is not floating point"
    if child.weight.is_meta:
        return "weight is on the meta device (no values to quantize)"
    try:
        check_group_size(quant_type, child.in_features, group_size)
    except ValueError as err:
        return str(err)
    return None


def quantize_(
    model: nn.Module,
    quant_type: str = "int8",
    group_size: Optional[int] = None,
    symmetric: bool = True,
    filter_fn: Optional[FilterFn] = None,
    scale_dtype: torch.dtype = torch.float32,
) -> QuantizeReport:
    """Replace every ``nn.Linear`` inside ``model`` by a `QuantizedLinear`, in place.

    ``group_size=None`` means per channel for INT8 and 64 for INT4.  ``filter_fn(module,
    name)`` returning False leaves a layer alone (not reported as skipped: it was not asked
    for).  Layers whose ``in_features`` the group size does not divide (or, for INT4, that
    is odd) are skipped with a reason in the report.  ``model`` itself must not be an
    ``nn.Linear`` (there is no parent to swap it in); use `QuantizedLinear.from_float`.
    """
    group_size = resolve_group_size(quant_type, group_size)
    if quant_type == "int8" and not symmetric:
        raise ValueError("INT8 quantization is symmetric only; pass symmetric=True")
    if isinstance(model, nn.Linear):
        raise ValueError(
            "quantize_ replaces children in place and cannot replace the model itself; "
            "use QuantizedLinear.from_float(model, ...)"
        )
    report = QuantizeReport()
    # Collect first: replacing while iterating named_modules() would mutate what we walk.
    targets = [
        (name, parent, child_name, child)
        for name, parent in model.named_modules()
        for child_name, child in parent.named_children()
        if isinstance(child, nn.Linear)
    ]
    # A layer reachable under two names (shared/tied) becomes one shared QuantizedLinear.
    done: dict[int, QuantizedLinear] = {}
    for parent_name, parent, child_name, child in targets:
        fqn = f"{parent_name}.{child_name}" if parent_name else child_name
        if filter_fn is not None and not filter_fn(child, fqn):
            continue
        reason = _skip_reason(parent, child, quant_type, group_size)
        if reason is not None:
            report.skipped.append((fqn, reason))
            logger.info("quantize_: skipped %s: %s", fqn, reason)
            continue
        quantized = done.get(id(child))
        if quantized is None:
            quantized = QuantizedLinear.from_float(
                child, quant_type, group_size, symmetric, scale_dtype
            )
            done[id(child)] = quantized
        setattr(parent, child_name, quantized)
        report.quantized.append(fqn)
    return report
