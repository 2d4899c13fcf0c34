"""Which kernel computes a convolution root: `conv.conv_plan_for` plans it, then the builder
of the plan's form builds the nest: `conv.ConvBuilder` for the direct forms ("channels",
"width"), `conv_pointwise.PointwiseConvBuilder` for the packed product ("gemm"). (A module of
its own: the pointwise builder extends the direct one, so `conv.py` cannot import it.)"""
from __future__ import annotations

from typing import Optional

from ...ir import loop as lp
from ...ir.tensor import Op
from .conv import ConvBuilder, ConvPlan, conv_plan_for, fused_conv
from .conv_pointwise import PointwiseConvBuilder
from .kernel_builder import KernelBuilder, LoweringError
from .matmul import CpuInfo


def build_conv(kb: KernelBuilder, root: Op, conv: Op, out: lp.Buffer, plan: ConvPlan) -> lp.Stmt:
    """The loop nest computing `root` (a conv, or the last op of its epilogue) into `out`."""
    for o in (root, conv):
        if o.loc and o.loc not in kb.origins:
            kb.origins.append(o.loc)
    kb.used_buffers[out.name] = out
    if plan.form == "gemm":
        return PointwiseConvBuilder(kb, root, conv, out, plan).build()
    return ConvBuilder(kb, root, conv, out, plan).build()


def conv_root(kb: KernelBuilder, op: Op, out: lp.Buffer, cpu: CpuInfo) -> Optional[lp.Stmt]:
    """A convolution kernel for root `op` (a conv or its epilogue's last op), or None when the
    convolution keeps the element-by-element nest."""
    conv = fused_conv(op, set(kb.buffers))
    if conv is None:
        raise LoweringError(f"lower-to-loops: kernel root {op.name} has no fused conv")
    if conv.operands[0] not in kb.buffers:
        return None  # the width form loads x directly: x must have a buffer (fuse gives it one)
    plan = conv_plan_for(conv, cpu, epilogue=op is not conv)
    if plan is None:
        return None
    return build_conv(kb, op, conv, out, plan)
