"""Bounds mode (`TORCHBURN_DEBUG=bounds`): every load and store checked against its buffer.

With `ModuleContext.bounds_check` set, `memory.py` passes each address through here. The
element offset of an access (every lane of it) is compared, unsigned, with the buffer's
extent `1 + sum((size_d - 1) * stride_d)` (0 when a size is 0); an access out of range is
redirected to a scratch area, so nothing outside the buffer is read or written (a load reads
0 or garbage the launcher never returns), and recorded:

    %bad = icmp uge i64 %offset, %extent              ; per lane for a vector access
    %p   = select i1 %bad, ptr @torchburn_bounds.scratch, ptr %address
    call void @torchburn.bounds.check(i1 %bad, ptr @"kernel @p.k0: buffer %x", i64 %offset, i64 %extent)

`@torchburn.bounds.record` (cold) keeps the first fault's place, offset and extent in the
process's record (`runtime/faults.py`, through the global `@torchburn_bounds`) and moves the
fault counter, so the launcher raises `OutOfBounds` naming kernel, buffer and index.
"""
from __future__ import annotations

import hashlib
import re
from typing import TYPE_CHECKING

import llvmlite.ir as ir

from ..errors import CodegenError
from .context import ModuleContext
from .faults import fault_global
from .function import BufferRef
from .types import I1, I8, I64, PTR, VOID, lanes_of, splat_const

if TYPE_CHECKING:
    from .memory import ExprEmitter

#: The global's name (`runtime/faults.py` spells it again: the warm path imports no codegen).
BOUNDS_GLOBAL = "torchburn_bounds"
#: Bytes of the scratch area accesses out of range go to: the widest vector access.
SCRATCH_BYTES = 4096

_RECORD = ir.LiteralStructType([I64, PTR, I64, I64])  # count, where, index, extent


def bounds_global(module: ir.Module) -> ir.GlobalVariable:
    """`@torchburn_bounds`: a pointer to an internal record until the loader repoints it."""
    existing = module.globals.get(BOUNDS_GLOBAL)
    if isinstance(existing, ir.GlobalVariable):
        return existing
    default = ir.GlobalVariable(module, _RECORD, BOUNDS_GLOBAL + ".default")
    default.linkage = "internal"
    default.initializer = ir.Constant(_RECORD, None)
    g = ir.GlobalVariable(module, PTR, BOUNDS_GLOBAL)
    g.initializer = default
    return g


def _scratch(module: ir.Module) -> ir.GlobalVariable:
    name = BOUNDS_GLOBAL + ".scratch"
    existing = module.globals.get(name)
    if isinstance(existing, ir.GlobalVariable):
        return existing
    ty = ir.ArrayType(I8, SCRATCH_BYTES)
    g = ir.GlobalVariable(module, ty, name)
    g.linkage = "internal"
    g.initializer = ir.Constant(ty, None)
    g.align = 64
    g.type = PTR  # llvmlite types globals as typed pointers; selects need it as `ptr`
    return g


def _where(ctx: ModuleContext, function: str, buffer: str) -> ir.GlobalVariable:
    """A C string naming the kernel and buffer, one per (kernel, buffer) in the module."""
    kernel = re.sub(r"(\.par\.\d+)+$", "", function)
    text = f"kernel @{kernel}: buffer %{buffer}".encode()
    name = "torchburn.where." + hashlib.blake2s(text, digest_size=8).hexdigest()
    existing = ctx.module.globals.get(name)
    if isinstance(existing, ir.GlobalVariable):
        return existing
    data = bytearray(text + b"\0")
    ty = ir.ArrayType(I8, len(data))
    g = ir.GlobalVariable(ctx.module, ty, name)
    g.linkage = "internal"
    g.global_constant = True
    g.initializer = ir.Constant(ty, data)
    return g


def _build_record(ctx: ModuleContext, fn: ir.Function) -> None:
    where, index, extent = fn.args
    entry, fill, done = (fn.append_basic_block(n) for n in ("entry", "fill", "done"))
    b = ir.IRBuilder(entry)
    record = b.load(bounds_global(ctx.module), typ=PTR)
    zero = ir.Constant(ir.IntType(32), 0)

    def field(k: int) -> ir.Value:
        return b.gep(record, [zero, ir.Constant(ir.IntType(32), k)], inbounds=True, source_etype=_RECORD)

    old = b.atomic_rmw("add", field(0), ir.Constant(I64, 1), "monotonic")
    b.cbranch(b.icmp_signed("==", old, ir.Constant(I64, 0)), fill, done)
    b.position_at_end(fill)
    for k, v in ((1, where), (2, index), (3, extent)):
        b.store(v, field(k))
    b.branch(done)
    b.position_at_end(done)
    counter = b.load(fault_global(ctx.module), typ=PTR)
    b.atomic_rmw("add", counter, ir.Constant(I64, 1), "monotonic")
    b.ret_void()


def _build_check(ctx: ModuleContext, fn: ir.Function) -> None:
    record = ctx.helper("torchburn.bounds.record", VOID, [PTR, I64, I64], _build_record)
    record.attributes.add("cold")
    record.attributes.add("noinline")
    bad, where, index, extent = fn.args
    entry, fault, done = (fn.append_basic_block(n) for n in ("entry", "fault", "done"))
    b = ir.IRBuilder(entry)
    b.cbranch(bad, fault, done)
    b.position_at_end(fault)
    b.call(record, [where, index, extent])
    b.branch(done)
    b.position_at_end(done)
    b.ret_void()


def extent(em: "ExprEmitter", ref: BufferRef) -> ir.Value:
    """The elements the buffer spans, as an i64: 0 when a size is 0."""
    b = em.b
    span: ir.Value = ir.Constant(I64, 1)
    empty: ir.Value = ir.Constant(I1, 0)
    for size, stride in zip(ref.buffer.shape, ref.buffer.strides):
        n = em.index_value(size)
        s = em.index_value(stride)
        empty = b.or_(empty, b.icmp_signed("<=", n, ir.Constant(I64, 0)))
        span = b.add(span, b.mul(b.sub(n, ir.Constant(I64, 1)), s))
    return b.select(empty, ir.Constant(I64, 0), span)


def _check(em: "ExprEmitter", ref: BufferRef, bad: ir.Value, index: ir.Value, ext: ir.Value) -> None:
    ctx = em.fs.ctx
    check = ctx.helper("torchburn.bounds.check", VOID, [I1, PTR, I64, I64], _build_check)
    check.attributes.add("alwaysinline")
    where = _where(ctx, em.fs.fn.name, ref.buffer.name)
    em.b.call(check, [bad, where, index, ext])


def guard_pointer(em: "ExprEmitter", ref: BufferRef, offset: ir.Value, span: int, ptr: ir.Value,
                  itemsize: int) -> ir.Value:
    """`ptr` (to `span` elements from element `offset`) or, when they leave the buffer, the
    scratch area; the fault is recorded."""
    if span * itemsize > SCRATCH_BYTES:
        raise CodegenError(f"bounds mode: an access of {span * itemsize} bytes to %{ref.buffer.name} is wider "
                           f"than the scratch area ({SCRATCH_BYTES} bytes)")
    b = em.b
    ext = extent(em, ref)
    bad = b.icmp_unsigned(">=", offset, ext)
    if span > 1:
        bad = b.or_(bad, b.icmp_unsigned(">=", b.add(offset, ir.Constant(I64, span - 1)), ext))
    _check(em, ref, bad, offset, ext)
    return b.select(bad, _scratch(em.fs.ctx.module), ptr)


def guard_pointers(em: "ExprEmitter", ref: BufferRef, offsets: ir.Value, ptrs: ir.Value, itemsize: int) -> ir.Value:
    """A vector of pointers, the lanes that leave the buffer sent to the scratch area; the
    fault is recorded with the smallest offending offset."""
    b = em.b
    ctx = em.fs.ctx
    lanes = lanes_of(offsets.type)
    if lanes * itemsize > SCRATCH_BYTES:
        raise CodegenError(f"bounds mode: {lanes} lanes of %{ref.buffer.name} exceed the scratch area")
    ext = extent(em, ref)
    ext_v = em.splat(ext, lanes)
    bad = b.icmp_unsigned(">=", offsets, ext_v)
    bad_type = bad.type
    reduce_or = ctx.intrinsic("llvm.vector.reduce.or", I1, [bad_type], [bad_type])
    reduce_min = ctx.intrinsic("llvm.vector.reduce.smin", I64, [offsets.type], [offsets.type])
    first = b.call(reduce_min, [b.select(bad, offsets, splat_const(offsets.type, (1 << 63) - 1))])
    _check(em, ref, b.call(reduce_or, [bad]), first, ext)
    scratch = em.splat(_scratch(ctx.module), lanes)
    return b.select(bad, scratch, ptrs)

