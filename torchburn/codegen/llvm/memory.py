"""Loads and stores: from an n-d index and a buffer's strides to memory accesses.

The address of `%buf[i0, ..., in]` is `base + sum(i_d * stride_d)` elements, in i64. For a
vector access the flattened offset is analysed symbolically first (`lane_affine`): when it is
`offset0 + lane * 1` the access is one contiguous vector load/store, when the lane step is 0
it is a scalar access (broadcast on load), and otherwise it becomes a gather/scatter
(`llvm.masked.gather/scatter` with an all-true mask) over a vector of addresses -- except a
load whose offset is a scalar plus a lane pattern free of variables spanning a few elements
(`lane_pattern`: `%q[n, b 22 + 6 + ramp(0, 1, 32) % 16]`, a 16-byte row read twice), which is
one contiguous load of the span and a `shufflevector` (a broadcast or a byte shuffle, where a
gather would take one load per lane), and likewise an affine load whose lane step is a
small constant (`strided_pattern`: `x[.., ramp(ow * 2, 2, 16)]`). Alignment is
always the element's natural alignment: nothing more is known about tensor storage.

An index read through a reshape of contiguous dims holds the delinearized pieces of one
expression (a GEMM reading `[C*T, P]` from a buffer `[C, T, D, H, W]`), and the sum keeps them
apart: `(x // 3136) * 3136 + (x // 56 % 56) * 56 + x % 56` costs three divisions per element in
an inner loop, where the address is `x`. `linear_offset` merges such terms before the address
is emitted (`(x // c) * c s + (x % c) * s -> x s` and `(x // a % b) * a s + (x % a) * s ->
(x % (a b)) s`, exact for floor and truncating division alike), so LLVM sees an affine address
and strength-reduces it.

Bools live in memory as bytes (0/1) and in registers as i1; conversion happens here.

In bounds mode (`ModuleContext.bounds_check`, `TORCHBURN_DEBUG=bounds`) every address goes
through `bounds.py`, which checks it against the buffer's extent first.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Protocol, Sequence

import llvmlite.ir as ir

from ...ir import expr as ex
from ...ir.loop import Buffer
from ..errors import CodegenError
from . import bounds
from .function import FunctionState, Scope
from .types import I1, I32, I64, PTR, VOID, lanes_of, splat_const, storage_type, vector_of


class ExprEmitter(Protocol):
    """What memory accesses need of the expression emitter (`expr.ExprEmitter`, which builds
    on this module): the builder, the scope of buffers, index values, splats, values."""

    fs: FunctionState
    scope: Scope
    b: ir.IRBuilder

    def emit(self, e: ex.Expr) -> ir.Value: ...

    def index_value(self, e: ex.Expr) -> ir.Value: ...

    def splat(self, v: ir.Value, lanes: int) -> ir.Value: ...

_ZERO = ex.Const(0)
_ONE = ex.Const(1)


@dataclass(frozen=True)
class LaneAffine:
    """A vector of offsets `base + lane * stride` with scalar index expressions."""

    base: ex.Expr
    stride: ex.Expr


def lane_affine(e: ex.Expr) -> Optional[LaneAffine]:
    """Describe an integer (vector) expression as `base + lane * stride`, or None if it is not
    affine in the lane number (for example a loaded index vector)."""
    if e.lanes == 1:
        return LaneAffine(e, _ZERO)
    if isinstance(e, ex.Ramp):
        return LaneAffine(e.base, e.stride)
    if isinstance(e, ex.Broadcast) and e.value.lanes == 1:
        return LaneAffine(e.value, _ZERO)
    if isinstance(e, ex.Binary) and e.op in ("add", "sub", "mul"):
        a, b = lane_affine(e.a), lane_affine(e.b)
        if a is None or b is None:
            return None
        if e.op == "add":
            return LaneAffine(ex.add(a.base, b.base), ex.add(a.stride, b.stride))
        if e.op == "sub":
            return LaneAffine(ex.sub(a.base, b.base), ex.sub(a.stride, b.stride))
        if b.stride == _ZERO:
            return LaneAffine(ex.mul(a.base, b.base), ex.mul(a.stride, b.base))
        if a.stride == _ZERO:
            return LaneAffine(ex.mul(a.base, b.base), ex.mul(a.base, b.stride))
    return None


#: A lane pattern load reads at most this many elements (two 512-bit registers of bytes).
MAX_PATTERN_SPAN = 128


@dataclass(frozen=True)
class LanePattern:
    """Offsets `base + offsets[lane]`: `base` a scalar index expression, `offsets` constants."""

    base: ex.Expr
    offsets: tuple[int, ...]


def _lane_constants(e: ex.Expr, lanes: int) -> Optional[list[int]]:
    """The lanes of a variable-free integer vector expression (ramps, broadcasts, constants,
    arithmetic), or None."""
    if isinstance(e, ex.Const):
        return [int(e.value)] * lanes
    if isinstance(e, ex.Ramp):
        if not (isinstance(e.base, ex.Const) and isinstance(e.stride, ex.Const)):
            return None
        return [int(e.base.value) + int(e.stride.value) * j for j in range(lanes)]
    if isinstance(e, ex.Broadcast):
        return _lane_constants(e.value, lanes) if e.value.lanes == 1 else None
    if isinstance(e, ex.Binary) and e.dtype.is_int:
        a, b = _lane_constants(e.a, lanes), _lane_constants(e.b, lanes)
        if a is None or b is None:
            return None
        out = []
        for x, y in zip(a, b):
            try:
                out.append(ex.evaluate_index(ex.Binary(e.op, ex.Const(x, ex.ScalarType(e.dtype)),
                                                       ex.Const(y, ex.ScalarType(e.dtype)), ex.ScalarType(e.dtype)), {}))
            except (ValueError, ArithmeticError):
                return None
        return out
    return None


def _pattern_terms(e: ex.Expr, lanes: int) -> Optional[tuple[ex.Expr, list[int]]]:
    """`e` as (scalar part, constant lanes): its sum's terms split into scalars (and broadcasts
    of scalars) and variable-free vectors."""
    if e.lanes == 1:
        return e, [0] * lanes
    if isinstance(e, ex.Broadcast) and e.value.lanes == 1:
        return e.value, [0] * lanes
    if isinstance(e, ex.Binary) and e.op == "add":
        a, b = _pattern_terms(e.a, lanes), _pattern_terms(e.b, lanes)
        if a is None or b is None:
            return None
        return ex.add(a[0], b[0]), [x + y for x, y in zip(a[1], b[1])]
    if ex.free_vars(e):
        return None
    consts = _lane_constants(e, lanes)
    return None if consts is None else (_ZERO, consts)


def lane_pattern(buf: Buffer, index: Sequence[ex.Expr], lanes: int) -> Optional[LanePattern]:
    """The flattened offset of a vector index as a scalar plus constant lane offsets (all
    strides constant), or None:

        [n, b 22 + 6 + ramp(0, 1, 32) % 16]  ->  base n 22 K + b 22 + 6, offsets 0..15, 0..15"""
    base: ex.Expr = _ZERO
    offsets = [0] * lanes
    for i, s in zip(index, buf.strides):
        if i.dtype != ex.INDEX.dtype:
            return None
        terms = _pattern_terms(i, lanes)
        if terms is None:
            return None
        if any(terms[1]) and not isinstance(s, ex.Const):
            return None
        step = int(s.value) if isinstance(s, ex.Const) else 0
        base = ex.add(base, ex.mul(terms[0], s))
        offsets = [o + t * step for o, t in zip(offsets, terms[1])]
    return LanePattern(base, tuple(offsets))


def strided_pattern(affine: LaneAffine, lanes: int) -> Optional[LanePattern]:
    """A load with a small constant lane step (2 or more) as a `LanePattern`: the span it
    covers, `(lanes - 1) * step + 1` elements (no element past the last lane), loaded whole
    and its lanes picked by a shuffle, where a gather takes one load per lane. A stride-2
    window row of a pooling or a strided convolution's input (`x[.., ramp(ow * 2, 2, 16)]`)."""
    step = _const_int(affine.stride)
    if step is None or step < 2 or (lanes - 1) * step >= MAX_PATTERN_SPAN:
        return None
    return LanePattern(affine.base, tuple(i * step for i in range(lanes)))


def flat_affine(buf: Buffer, index: Sequence[ex.Expr]) -> Optional[LaneAffine]:
    """The flattened element offset of a (vector) index as `base + lane * stride`, if affine."""
    if any(i.dtype != ex.INDEX.dtype for i in index):
        return None
    bases: list[tuple[ex.Expr, ex.Expr]] = []
    stride: ex.Expr = _ZERO
    for i, s in merge_delinearized(list(zip(index, buf.strides))):
        aff = lane_affine(i)
        if aff is None:
            return None
        bases.append((aff.base, s))
        stride = ex.add(stride, ex.mul(aff.stride, s))
    return LaneAffine(linear_offset(bases), stride)


def linear_offset(terms: Sequence[tuple[ex.Expr, ex.Expr]]) -> ex.Expr:
    """`sum(i * s)` over the (index, stride) `terms` (scalar index expressions), with the
    delinearized pieces of one expression merged back (see the module's docstring):

        [(x // 3136, 3136), (x // 56 % 56, 56), (x % 56, 1)]  ->  x
        [(c, 1354752), (x // 56, 56), (x % 56, 1)]           ->  c * 1354752 + x
    """
    off: ex.Expr = _ZERO
    for i, s in merge_delinearized([(_as_index(i), s) for i, s in terms]):
        off = ex.add(off, ex.mul(i, s))
    return off


def merge_delinearized(terms: Sequence[tuple[ex.Expr, ex.Expr]]) -> list[tuple[ex.Expr, ex.Expr]]:
    """The (index, stride) `terms` with the delinearized pieces of one expression merged back
    (`linear_offset`), scalar or vector alike: a vector index read through a flattened view,
    `[.., ramp(f, 1, 16) // 56, ramp(f, 1, 16) % 56]` with strides `[.., 56, 1]`, is the
    contiguous `ramp(f, 1, 16)` (a GroupNorm's statistics over 56x56 rows: a vector load where
    each dim alone made it a gather)."""
    pending = list(terms)
    merged = True
    while merged:
        merged = False
        for lo in range(len(pending)):
            for hi in range(len(pending)):
                m = None if hi == lo else _merge_pieces(pending[hi], pending[lo])
                if m is not None:
                    pending = [t for j, t in enumerate(pending) if j not in (hi, lo)] + [m]
                    merged = True
                    break
            if merged:
                break
    return pending


def _const_int(e: ex.Expr) -> Optional[int]:
    if isinstance(e, ex.Const) and e.type.dtype.is_int and e.type.lanes == 1:
        return int(e.value)
    return None


def _merge_pieces(hi: tuple[ex.Expr, ex.Expr], lo: tuple[ex.Expr, ex.Expr]) -> Optional[tuple[ex.Expr, ex.Expr]]:
    """One term for `hi` and `lo` where `lo` is `(x % c, s)` and `hi` is `(x // c, c s)` (->
    `(x, s)`) or `(x // c % b, c s)` (-> `(x % (c b), s)`); None otherwise. Constants only."""
    (p, sp), (q, sq) = hi, lo
    if not (isinstance(q, ex.Binary) and q.op == "mod" and isinstance(p, ex.Binary)):
        return None
    x, c, s_hi, s_lo = q.a, _uniform_int(q.b), _const_int(sp), _const_int(sq)
    if c is None or s_hi is None or s_lo is None or c <= 0 or s_lo == 0 or s_hi != c * s_lo:
        return None
    if p.op == "floordiv" and p.a == x and _uniform_int(p.b) == c:
        return x, sq
    b = _uniform_int(p.b)
    if (p.op == "mod" and b is not None and b > 0 and isinstance(p.a, ex.Binary) and p.a.op == "floordiv"
            and p.a.a == x and _uniform_int(p.a.b) == c):
        return ex.Binary("mod", x, _like(x, c * b), x.type), sq
    return None


def _uniform_int(e: ex.Expr) -> Optional[int]:
    """An integer constant, or a broadcast of one (a vector index's divisor)."""
    if isinstance(e, ex.Broadcast):
        e = e.value
    return _const_int(e)


def _like(x: ex.Expr, value: int) -> ex.Expr:
    """The constant `value` in `x`'s type (broadcast where `x` is a vector)."""
    c = ex.Const(value, ex.ScalarType(x.type.dtype))
    return ex.Broadcast(c, x.type) if x.type.lanes > 1 else c


def _check_index(buf: Buffer, index: Sequence[ex.Expr]) -> int:
    """Validate an index against its buffer; return the access's lane count."""
    if len(index) != buf.ndim:
        raise CodegenError(f"%{buf.name} has {buf.ndim} dimensions but is indexed with {len(index)}")
    lanes = {i.lanes for i in index} - {1}
    if len(lanes) > 1:
        raise CodegenError(f"%{buf.name} indexed with vectors of different widths {sorted(lanes)}")
    for i in index:
        if not i.dtype.is_int:
            raise CodegenError(f"%{buf.name} indexed with a {i.type} expression")
    return lanes.pop() if lanes else 1


def _gep(b: ir.IRBuilder, base: ir.Value, offset: ir.Value, elem: ir.Type) -> ir.Value:
    """`getelementptr inbounds elem, base, offset`; a vector offset gives a vector of pointers
    (llvmlite types every GEP as a scalar `ptr`, so the type is corrected here)."""
    gep = b.gep(base, [offset], inbounds=True, source_etype=elem)
    if isinstance(offset.type, ir.VectorType):
        gep.type = ir.VectorType(PTR, offset.type.count)
    return gep


class Access:
    """One load or store: resolves the buffer and computes the address(es)."""

    def __init__(self, em: "ExprEmitter", buffer: str, index: Sequence[ex.Expr]) -> None:
        self.em = em
        self.ref = em.scope.buffer(buffer)
        self.buf = self.ref.buffer
        self.lanes = _check_index(self.buf, index)
        self.index = tuple(index)
        self.elem = storage_type(self.buf.dtype)
        self.align = self.buf.dtype.itemsize
        self.affine = flat_affine(self.buf, index) if self.lanes > 1 else None
        self.pattern: Optional[LanePattern] = None
        if self.lanes > 1 and self.affine is None:
            found = lane_pattern(self.buf, index, self.lanes)
            if found is not None and max(found.offsets) - min(found.offsets) < MAX_PATTERN_SPAN:
                self.pattern = found
        elif self.lanes > 1 and self.affine is not None:
            self.pattern = strided_pattern(self.affine, self.lanes)

    @property
    def kind(self) -> str:
        """`scalar`, `contiguous` (one vector access), `uniform` (all lanes one address) or
        `gather` (lane-wise addresses)."""
        if self.lanes == 1:
            return "scalar"
        if self.affine is not None and self.affine.stride == _ONE:
            return "contiguous"
        if self.affine is not None and self.affine.stride == _ZERO:
            return "uniform"
        return "gather"

    def scalar_pointer(self) -> ir.Value:
        """Address of the first lane (for scalar, contiguous and uniform accesses)."""
        offset = self._scalar_offset() if self.affine is None else self.em.index_value(self.affine.base)
        ptr = _gep(self.em.b, self.ref.ptr, offset, self.elem)
        if self.em.fs.ctx.bounds_check:
            span = self.lanes if self.kind == "contiguous" else 1
            ptr = bounds.guard_pointer(self.em, self.ref, offset, span, ptr, self.buf.dtype.itemsize)
        return ptr

    def vector_pointers(self) -> ir.Value:
        offsets = self._vector_offsets()
        ptrs = _gep(self.em.b, self.ref.ptr, offsets, self.elem)
        if self.em.fs.ctx.bounds_check:
            ptrs = bounds.guard_pointers(self.em, self.ref, offsets, ptrs, self.buf.dtype.itemsize)
        return ptrs

    def _scalar_offset(self) -> ir.Value:
        return self.em.index_value(linear_offset(list(zip(self.index, self.buf.strides))))

    def _vector_offsets(self) -> ir.Value:
        """The offsets of all lanes as an `<N x i64>` (general gather/scatter path): `base +
        lane * stride` where the offset is affine, else the sum over the dims."""
        b = self.em.b
        vt = ir.VectorType(I64, self.lanes)
        if self.affine is not None:
            base = self.em.splat(self.em.index_value(self.affine.base), self.lanes)
            step = self.em.splat(self.em.index_value(self.affine.stride), self.lanes)
            lane = ir.Constant(vt, list(range(self.lanes)))
            return b.add(base, b.mul(lane, step))
        total: ir.Value = splat_const(vt, 0)
        for i, s in zip(self.index, self.buf.strides):
            iv = self.em.index_value(i)
            if lanes_of(iv.type) == 1:
                iv = self.em.splat(iv, self.lanes)
            stride = self.em.splat(self.em.index_value(s), self.lanes)
            total = b.add(total, b.mul(iv, stride))
        return total


def _as_index(e: ex.Expr) -> ex.Expr:
    return e if e.dtype == ex.INDEX.dtype else ex.cast(e, ex.INDEX.dtype)


def _all_true(lanes: int) -> ir.Constant:
    return splat_const(ir.VectorType(I1, lanes), 1)


def emit_load(em: "ExprEmitter", e: ex.Load) -> ir.Value:
    acc = Access(em, e.buffer, e.index)
    if e.type.dtype != acc.buf.dtype:
        raise CodegenError(f"load of %{e.buffer} ({acc.buf.dtype}) typed as {e.type}")
    if e.type.lanes != acc.lanes and acc.lanes != 1:
        raise CodegenError(f"load of %{e.buffer}: index has {acc.lanes} lanes, value {e.type.lanes}")
    b = em.b
    kind = acc.kind
    if kind in ("scalar", "uniform"):
        value = b.load(acc.scalar_pointer(), typ=acc.elem, align=acc.align)
        value = _from_storage(b, value, acc.buf)
        return em.splat(value, e.type.lanes) if e.type.lanes > 1 else value
    vt = ir.VectorType(acc.elem, acc.lanes)
    if kind == "contiguous":
        prefetch_ahead(em, acc, em.index_value(acc.affine.base))  # type: ignore[union-attr]
        value = b.load(acc.scalar_pointer(), typ=vt, align=acc.align)
    elif acc.pattern is not None:
        prefetch_ahead(em, acc, em.index_value(ex.add(acc.pattern.base, ex.Const(min(acc.pattern.offsets)))))
        value = _pattern_load(em, acc, acc.pattern)
    else:
        ptrs = acc.vector_pointers()
        fn = em.fs.ctx.intrinsic("llvm.masked.gather", vt, [ptrs.type, I32, ir.VectorType(I1, acc.lanes), vt],
                                 [vt, ptrs.type])
        value = b.call(fn, [ptrs, ir.Constant(I32, acc.align), _all_true(acc.lanes), ir.Constant(vt, ir.Undefined)])
    return _from_storage(b, value, acc.buf)


def prefetch_ahead(em: "ExprEmitter", acc: Access, offset: ir.Value) -> None:
    """A prefetch of the element `FunctionState.prefetch[buffer]` bytes past `offset` (an
    element offset into the buffer), clamped to the buffer's last element, for a buffer the
    kernel streams: the hardware prefetchers keep a core's stream short of bytes in flight
    (the Q6_K decode GEMV from DRAM read 19.5 GB/s, 28.5 with 2 KB ahead, docs/benchmarks.md).
    A buffer whose size is not static gets none."""
    ahead = em.fs.prefetch.get(acc.buf.name)
    size = _static_elements(acc.buf)
    if not ahead or size is None:
        return
    b = em.b
    step = max(1, ahead // acc.buf.dtype.itemsize)
    target = b.add(offset, ir.Constant(offset.type, step))
    last = ir.Constant(offset.type, size - 1)
    target = b.select(b.icmp_signed("<", target, last), target, last)
    ptr = _gep(b, acc.ref.ptr, target, acc.elem)
    fn = em.fs.ctx.intrinsic("llvm.prefetch", VOID, [ptr.type, I32, I32, I32], [ptr.type])
    # read, keep in all cache levels, data
    b.call(fn, [ptr, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])


def _static_elements(buf: Buffer) -> Optional[int]:
    total = 1
    for d in buf.shape:
        if not isinstance(d, ex.Const):
            return None
        total *= int(d.value)
    return total


def _pattern_load(em: "ExprEmitter", acc: Access, pattern: LanePattern) -> ir.Value:
    """The span of a `LanePattern` as one vector load, its lanes picked by a shuffle."""
    b = em.b
    low = min(pattern.offsets)
    span = max(pattern.offsets) - low + 1
    offset = em.index_value(ex.add(pattern.base, ex.Const(low)))
    ptr = _gep(b, acc.ref.ptr, offset, acc.elem)
    if em.fs.ctx.bounds_check:
        ptr = bounds.guard_pointer(em, acc.ref, offset, span, ptr, acc.buf.dtype.itemsize)
    if span == 1:
        return em.splat(b.load(ptr, typ=acc.elem, align=acc.align), acc.lanes)
    pieces = _pieces(sorted(set(pattern.offsets)))
    if len(pieces) in (2, 4) and len({n for _, n in pieces}) == 1 and len(pieces) * pieces[0][1] < span:
        # a few equal runs with gaps (two blocks' nibble bytes): each run one load, the runs
        # concatenated, so no bytes between them are read (no odd-sized load to split)
        width = pieces[0][1]
        vt = ir.VectorType(acc.elem, width)
        parts = [b.load(_gep(b, ptr, ir.Constant(I64, start - low), acc.elem), typ=vt, align=acc.align)
                 for start, _ in pieces]
        while len(parts) > 2:
            n = lanes_of(parts[0].type)
            cat = ir.Constant(ir.VectorType(I32, 2 * n), list(range(2 * n)))
            parts = [b.shuffle_vector(parts[i], parts[i + 1], cat) for i in range(0, len(parts), 2)]
        where = {start + j: i * width + j for i, (start, _) in enumerate(pieces) for j in range(width)}
        mask = ir.Constant(ir.VectorType(I32, acc.lanes), [where[o] for o in pattern.offsets])
        second = parts[1] if len(parts) == 2 else ir.Constant(parts[0].type, ir.Undefined)
        return b.shuffle_vector(parts[0], second, mask)
    whole = b.load(ptr, typ=ir.VectorType(acc.elem, span), align=acc.align)
    mask = ir.Constant(ir.VectorType(I32, acc.lanes), [o - low for o in pattern.offsets])
    return b.shuffle_vector(whole, ir.Constant(whole.type, ir.Undefined), mask)


def _pieces(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted distinct offsets as maximal runs of consecutive ones, (start, length)."""
    out: list[tuple[int, int]] = []
    for o in offsets:
        if out and out[-1][0] + out[-1][1] == o:
            out[-1] = (out[-1][0], out[-1][1] + 1)
        else:
            out.append((o, 1))
    return out


def emit_store(em: "ExprEmitter", buffer: str, index: Sequence[ex.Expr], value: ex.Expr) -> None:
    acc = Access(em, buffer, index)
    if value.dtype != acc.buf.dtype:
        raise CodegenError(f"store of a {value.type} value into %{buffer} ({acc.buf.dtype})")
    if value.lanes != acc.lanes and value.lanes != 1:
        raise CodegenError(f"store into %{buffer}: index has {acc.lanes} lanes, value {value.lanes}")
    b = em.b
    v = _to_storage(b, em.emit(value), acc.buf)
    kind = acc.kind
    if kind == "scalar":
        b.store(v, acc.scalar_pointer(), align=acc.align)
        return
    if value.lanes == 1:
        v = em.splat(v, acc.lanes)
    if kind == "uniform":
        # Every lane writes the same element: the last lane's write is the one that remains.
        last = b.extract_element(v, ir.Constant(I32, acc.lanes - 1))
        b.store(last, acc.scalar_pointer(), align=acc.align)
    elif kind == "contiguous":
        b.store(v, acc.scalar_pointer(), align=acc.align)
    else:
        ptrs = acc.vector_pointers()
        fn = em.fs.ctx.intrinsic("llvm.masked.scatter", ir.VoidType(),
                                 [v.type, ptrs.type, I32, ir.VectorType(I1, acc.lanes)], [v.type, ptrs.type])
        b.call(fn, [v, ptrs, ir.Constant(I32, acc.align), _all_true(acc.lanes)])


def _from_storage(b: ir.IRBuilder, v: ir.Value, buf: Buffer) -> ir.Value:
    if not buf.dtype.is_bool:
        return v
    return b.icmp_unsigned("!=", v, splat_const(v.type, 0))


def _to_storage(b: ir.IRBuilder, v: ir.Value, buf: Buffer) -> ir.Value:
    if not buf.dtype.is_bool:
        return v
    return b.zext(v, vector_of(storage_type(buf.dtype), lanes_of(v.type)))
