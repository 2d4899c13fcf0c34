"""gcd and lcm of integer tensors, as a fixed number of Euclid steps.

PyTorch runs Euclid's loop per element (`a, b = |a|, |b|; while a: a, b = b % a, a`). Its trip
count depends on the data, but it is bounded: Euclid needs at most k steps when both numbers
are below the Fibonacci number F(k + 2) (Lamé), so for an n-bit dtype a fixed number of steps
(14 for 8 bits, 94 for 64, with a margin) reaches the end for every pair. Each step is elementwise and leaves
finished elements (`a == 0`) as they are, so the whole computation fuses into one kernel with
no loop the IR would have to express:

    a, b = |x|, |y|                      # the magnitudes, wrapping as in C (|min| = min)
    repeat steps(dtype) times:
        r = b fmod where(a != 0, a, 1)   # never a division by zero
        a, b = where(a != 0, r, a), where(a != 0, a, b)
    gcd = b

The steps reproduce PyTorch's own operations (C remainder, wrapping `abs`), so results agree
on every input, the dtype's minimum included.
"""
from __future__ import annotations

from typing import Any

import torch

from ...ir import dtypes as dt
from ...ir.tensor import Value
from ..builder import Builder, Operand
from ..registry import Unsupported, lowering

aten = torch.ops.aten


def euclid_steps(bits: int) -> int:
    """Steps that finish Euclid on any pair of magnitudes below 2**bits (Lamé's bound)."""
    prev, cur, k = 0, 1, 1  # F(k) = cur
    while cur <= 2 ** bits:
        prev, cur, k = cur, prev + cur, k + 1
    return k  # F(k) > 2**bits, so k - 2 steps suffice; k leaves a margin


def _magnitude(b: Builder, x: Value) -> Value:
    return b.op("abs", x) if x.dtype.is_signed else x


def _gcd(b: Builder, x: Operand, y: Operand) -> tuple[Value, Value, Value]:
    """(gcd, x, y) with x and y as tensors of the common dtype, broadcast together."""
    comp, _ = b.promote(x, y)
    if not comp.is_int:
        raise Unsupported(f"gcd/lcm of {comp} tensors")
    xs, ys = b.broadcast(b.as_tensor(x, comp), b.as_tensor(y, comp))
    a, c = _magnitude(b, xs), _magnitude(b, ys)
    zero = b.expand(b.full(0, (), comp), xs.shape)
    one = b.expand(b.full(1, (), comp), xs.shape)
    for _ in range(euclid_steps(comp.bits)):
        live = b.op("ne", a, zero)
        r = b.op("fmod", c, b.op("where", live, a, one))
        a, c = b.op("where", live, r, a), b.op("where", live, a, c)
    return c, xs, ys


@lowering(aten.gcd)
def gcd(b: Builder, x: Operand, y: Operand, **kw: Any) -> Value:
    return _gcd(b, x, y)[0]


@lowering(aten.lcm)
def lcm(b: Builder, x: Operand, y: Operand, **kw: Any) -> Value:
    """`|x / g * y|`, 0 where g is 0 (both inputs 0). As in PyTorch's C++, 8- and 16-bit
    integers compute in i32 (C's promotion) and wrap on the way back; wider ones wrap in
    their own dtype. `x` is a multiple of `g`, so the floor division is exact; a gcd of -1
    (PyTorch's gcd of the minimum with some numbers) divides by negating, since
    `min / -1` traps (eager itself traps there for i32 and i64)."""
    g, xs, ys = _gcd(b, x, y)
    wide = dt.i32 if g.dtype.bits < 32 else g.dtype
    xw, gw, yw = b.cast(xs, wide), b.cast(g, wide), b.cast(ys, wide)

    def const(v: int) -> Value:
        return b.expand(b.full(v, (), wide), g.shape)

    none, minus_one = b.op("eq", gw, const(0)), b.op("eq", gw, const(-1))
    safe = b.op("where", b.op("or", none, minus_one), const(1), gw)
    quotient = b.op("where", minus_one, b.op("neg", xw), b.op("floordiv", xw, safe))
    magnitude = b.cast(_magnitude(b, b.op("mul", quotient, yw)), g.dtype)
    return b.op("where", none, b.expand(b.full(0, (), g.dtype), g.shape), magnitude)
