"""`form-attention`: find attention written out by hand and make it the one `attention` op.

Models that do not call `scaled_dot_product_attention` (T5, a hand-written GPT, `transformers`
models run with `attn_implementation="eager"`) reach the tensor IR as two batched products
around a softmax:

    p = softmax(q @ k^T * scale [+ mask], dim=-1);  out = p @ v

where AOTAutograd has already decomposed the softmax (`reduce_max`, `sub`, `exp`,
`reduce_sum`, `div`), merged the leading dims for `bmm` (`reshape`) and repeated grouped
key/value heads (`reshape`, `expand`, `reshape`). Left alone, the `[.., Tq, Tk]` score matrix
is written to memory and read back three times; the `attention` op (`loopgen/attention.py` on
the CPU, `expand-attention` on the GPU) computes the same numbers in one pass over the keys,
with an online softmax.

The pattern matches only what has the op's exact semantics: the scale is a constant (`mul` or
`div` by a splat; none means 1), the mask is added (any float tensor broadcast to the scores:
HF's additive masks), the softmax runs over the last dim, every intermediate is read only by
the chain (a graph that returns or saves the probabilities, as a training forward does, keeps
them), and q, k, v are one float dtype. Grouped-query heads repeated by `expand` are read from
the un-repeated keys and values. The op computes in f32 where the chain computed in q's
dtype: for f16/bf16 models the result is as or more accurate than the chain's.

Before:

    graph @main(%q: f32[2, 4, 16, 8], %k: f32[2, 4, 16, 8], %v: f32[2, 4, 16, 8]) {
      %0 = permute(%k) {dims = [0, 1, 3, 2]} : f32[2, 4, 8, 16]
      %1 = reshape(%q) {shape = [8, 16, 8]} : f32[8, 16, 8]
      %2 = reshape(%0) {shape = [8, 8, 16]} : f32[8, 8, 16]
      %3 = matmul(%1, %2) : f32[8, 16, 16]
      %4 = reshape(%3) {shape = [2, 4, 16, 16]} : f32[2, 4, 16, 16]
      %5 = full() {shape = [2, 4, 16, 16], value = 0.25, dtype = f32} : f32[2, 4, 16, 16]
      %6 = mul(%4, %5) : f32[2, 4, 16, 16]
      %7 = reduce_max(%6) {dims = [3], keepdim = true} : f32[2, 4, 16, 1]
      %8 = expand(%7) {shape = [2, 4, 16, 16]} : f32[2, 4, 16, 16]
      %9 = sub(%6, %8) : f32[2, 4, 16, 16]
      %10 = exp(%9) : f32[2, 4, 16, 16]
      %11 = reduce_sum(%10) {dims = [3], keepdim = true} : f32[2, 4, 16, 1]
      %12 = expand(%11) {shape = [2, 4, 16, 16]} : f32[2, 4, 16, 16]
      %13 = div(%10, %12) : f32[2, 4, 16, 16]
      %14 = reshape(%13) {shape = [8, 16, 16]} : f32[8, 16, 16]
      %15 = reshape(%v) {shape = [8, 16, 8]} : f32[8, 16, 8]
      %16 = matmul(%14, %15) : f32[8, 16, 8]
      %17 = reshape(%16) {shape = [2, 4, 16, 8]} : f32[2, 4, 16, 8]
      return %17
    }

After:

    graph @main(%q: f32[2, 4, 16, 8], %k: f32[2, 4, 16, 8], %v: f32[2, 4, 16, 8]) {
      %18 = attention(%q, %k, %v) {scale = 0.25, causal = false, masked = false, segments = 1} : f32[2, 4, 16, 8]
      return %18
    }
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence

from ...ir import expr as ex
from ...ir.tensor import Op, Value
from ..base import register_pass
from .canonicalize import ReshapeReshape
from ..pattern import DeadOp, Pattern, PatternPass, RewritePattern, Rewriter, constant_value, producer


def _product(dims: Sequence[ex.Expr]) -> ex.Expr:
    out: ex.Expr = ex.Const(1)
    for d in dims:
        out = ex.mul(out, d)
    return out


def _unmerged(v: Value) -> Value:
    """`x` when `v` is `reshape(x)` merging x's leading dims into one (`[B, H, T, D]` ->
    `[B*H, T, D]`, as AOTAutograd writes `matmul` as `bmm`), else `v` itself."""
    op = producer(v, "reshape")
    if op is None or v.type.rank != 3:
        return v
    x = op.operands[0]
    if x.type.rank < 3 or tuple(x.shape[-2:]) != tuple(v.shape[-2:]):
        return v
    if _product(x.shape[:-2]) != v.shape[0]:
        return v
    return x


def _swapped_last_two(op: Op) -> bool:
    dims = list(op.attrs["dims"])
    r = len(dims)
    return dims == [*range(r - 2), r - 1, r - 2]


def _ungrouped(v: Value) -> Value:
    """The key/value tensor `x: [B, Hk, T, D]` when `v` is its grouped-query repeat, `reshape(
    expand(reshape(x, [B, Hk, 1, T, D]), [B, Hk, G, T, D]), [B, Hk*G, T, D])`, or the `expand`
    itself (canonicalize merged the outer reshape into the `bmm`'s), else `v`."""
    grown = producer(v, "expand")
    outer = None
    if grown is None:
        outer = producer(v, "reshape")
        grown = producer(outer.operands[0], "expand") if outer is not None else None
    inner = producer(grown.operands[0], "reshape") if grown is not None else None
    if inner is None:
        return v
    x = inner.operands[0]
    if x.type.rank < 3 or inner.result.type.rank != x.type.rank + 1:
        return v
    lead, hk, rest = x.shape[:-3], x.shape[-3], tuple(x.shape[-2:])
    if tuple(inner.result.shape) != (*lead, hk, ex.Const(1), *rest):
        return v
    g = grown.result.shape[-3]
    if tuple(grown.result.shape) != (*lead, hk, g, *rest):
        return v
    if outer is not None and tuple(v.shape) != (*lead, ex.mul(hk, g), *rest):
        return v
    return x


def _scaled(v: Value) -> tuple[Value, float]:
    """`(x, c)` when `v` is `x * c` or `x / c` with `c` a constant, else `(v, 1.0)`."""
    op = v.producer
    if op is not None and op.name in ("mul", "div"):
        a, b = op.operands
        for x, c in ((a, b), (b, a)) if op.name == "mul" else ((a, b),):
            value = constant_value(c)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value != 0:
                return x, float(value) if op.name == "mul" else 1.0 / float(value)
    return v, 1.0


def _row_reduction(v: Value, name: str, of: Value, rw: Rewriter) -> bool:
    """Whether `v` is `expand(name(of) {dims = [last], keepdim = true})`, each read only by the
    next op of the chain."""
    grown = producer(v, "expand")
    red = producer(grown.operands[0], name) if grown is not None else None
    if red is None or red.operands[0] is not of:
        return False
    if list(red.attrs["dims"]) != [of.type.rank - 1] or not bool(red.attrs.get("keepdim")):
        return False
    return _only_reader(rw, red.result, grown) and len(rw.users(v)) == 1 and not rw.is_returned(v)


def _only_reader(rw: Rewriter, v: Value, reader: Optional[Op]) -> bool:
    """Whether `reader` is the one op that reads `v` and the graph does not return it."""
    return reader is not None and not rw.is_returned(v) and rw.users(v) == [reader]


def _transposed(kt: Value) -> Optional[Value]:
    """`k` when `kt` is `permute(k)` swapping the last two dims, else None."""
    perm = producer(kt, "permute")
    return perm.operands[0] if perm is not None and _swapped_last_two(perm) else None


class MatmulSoftmaxMatmul(RewritePattern):
    """`matmul(softmax(q @ k^T * c [+ m]), v)` -> `attention(q, k, v[, m]) {scale = c}` (module
    docstring)."""

    op_name = "matmul"

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> bool:
        found = None if rewriter.is_dead(op) else self._match(op, rewriter)
        if found is None:
            return False
        q, k, v, mask, scale, root = found
        operands = [q, k, v] + ([mask] if mask is not None else [])
        attrs = {"scale": scale, "causal": False, "masked": mask is not None, "segments": 1}
        out = rewriter.insert_op_before(op, "attention", operands, attrs).result
        if tuple(out.shape) != tuple(root.shape):  # the product was a `bmm` of merged heads
            out = rewriter.insert_op_before(op, "reshape", [out], {"shape": root.shape}).result
        rewriter.replace_all_uses(root, out)
        return True

    def _match(self, op: Op, rw: Rewriter) -> Optional[tuple[Value, Value, Value, Optional[Value], float, Value]]:
        a, v = op.operands
        if a.type.rank < 3 or not a.dtype.is_float:
            return None
        p = _unmerged(a)
        if not _only_reader(rw, a, op) or (p is not a and not _only_reader(rw, p, a.producer)):
            return None
        v = _unmerged(v) if p is not a else v
        # the probabilities: div(e, expand(reduce_sum(e))) with e = exp(s - expand(reduce_max(s)))
        div = producer(p, "div")
        if div is None:
            return None
        e, den = div.operands
        exp = producer(e, "exp")
        if exp is None or not _row_reduction(den, "reduce_sum", e, rw) or rw.is_returned(e) \
                or sorted(map(id, rw.users(e))) != sorted((id(div), id(den.producer.operands[0].producer))):
            return None
        sub = producer(exp.operands[0], "sub")
        if sub is None or not _only_reader(rw, sub.result, exp):
            return None
        s, peak = sub.operands
        if not _row_reduction(peak, "reduce_max", s, rw) or rw.is_returned(s) or len(rw.users(s)) != 2:
            return None
        # the scores: [mask +] scale * (q @ k^T)
        mask: Optional[Value] = None
        found = self._product_of(s, rw)
        add = producer(s, "add")
        if found is None and add is not None:
            for x, m in (add.operands, add.operands[::-1]):
                found = self._product_of(x, rw) if _only_reader(rw, x, add) else None
                if found is not None:
                    mask = m
                    break
        if found is None:
            return None
        q, k, scale = found
        k, v = _ungrouped(k), _ungrouped(v)
        if not (q.dtype == k.dtype == v.dtype == s.dtype) or not (q.type.rank == k.type.rank == v.type.rank):
            return None
        if mask is not None and (mask.type.rank != q.type.rank or not mask.dtype.is_float):
            return None
        if tuple(k.shape[:-2]) != tuple(v.shape[:-2]) or k.shape[-2] != v.shape[-2] or q.shape[-1] != k.shape[-1]:
            return None
        if tuple(q.shape[:-3]) != tuple(k.shape[:-3]) or tuple(p.shape[:-1]) != tuple(q.shape[:-1]):
            return None
        hq, hk = q.shape[-3], k.shape[-3]
        if hq != hk and not (isinstance(hq, ex.Const) and isinstance(hk, ex.Const)
                             and int(hk.value) > 0 and int(hq.value) % int(hk.value) == 0):
            return None
        root = op.result
        if p is not a:  # merged heads: the graph reads the product through a split reshape
            readers = rw.users(root)
            if len(readers) == 1 and readers[0].name == "reshape" and not rw.is_returned(root) \
                    and tuple(readers[0].result.shape) == (*q.shape[:-1], v.shape[-1]):
                root = readers[0].result
        return q, k, v, mask, scale, root

    def _product_of(self, x: Value, rw: Rewriter) -> Optional[tuple[Value, Value, float]]:
        """`(q, k, scale)` when `x` is `scale * (q @ k^T)`, each step read only by the next."""
        y, scale = _scaled(x)
        if y is not x and not _only_reader(rw, y, x.producer):
            return None
        mm = y.producer
        split = mm is not None and mm.name == "reshape"
        if split:  # the product was a `bmm` of merged heads, split back
            if not _only_reader(rw, mm.operands[0], mm):
                return None
            mm = producer(mm.operands[0], "matmul")
        if mm is None or mm.name != "matmul":
            return None
        q3, kt3 = mm.operands
        if not split:
            q, k = q3, _transposed(kt3)
        else:
            q = _unmerged(q3)
            k3 = _transposed(kt3)  # transposed after the merge, or before it
            k = _unmerged(k3) if k3 is not None else _transposed(_unmerged(kt3))
            if q is q3 or k is None or k is k3 or tuple(y.shape) != (*q.shape[:-1], k.shape[-2]):
                return None
        if k is None or q.type.rank < 3:
            return None
        return q, k, scale


@register_pass
@dataclass(frozen=True)
class FormAttention(PatternPass):
    """Rewrite `softmax(q @ k^T * c [+ mask]) @ v` into the `attention` op (module docstring)."""

    name: ClassVar[str] = "form-attention"

    def patterns(self) -> Sequence[Pattern]:
        return [MatmulSoftmaxMatmul(), ReshapeReshape(), DeadOp()]
