"""Fusion: decide which tensor values get memory and which are computed inside the kernels
that read them.

Each op either becomes the root of a kernel (`kernel = k`: its result is written to a buffer)
or is inlined into the kernels of its consumers (`fused_into = [k, ...]`): elementwise chains
become one loop nest, views become index arithmetic in the loads, and elementwise producers
fold into reductions. A value is materialized when it is a graph output, when recomputing it
in several consumers would duplicate expensive work (its own and that of the producers only it
reads, which will be inlined into it: SiLU's `mul(x, sigmoid(x))` read twice is stored; the
readers of a view count, not the view: `cos(emb)` seen through `unsqueeze` by the rotary embedding of every query and key), or when it feeds a matrix product (which
reads each element many times), or when it is a residual stream: an elementwise op that
reads a product and is read by another such op (`x2 = x1 + mlp(norm(x1))`) is stored, as its
product's epilogue, so that each layer of a deep model stores its sum once and gets the same
kernels, instead of every norm recomputing the stream from the embedding. An op the loop
builder writes only as a whole nest of its own (`dequantize`: `kernel_builder.ROOT_ONLY`) is
always a kernel's root.

Before:

    graph @main(%x: f32[8, 16], %b: f32[16]) {
      %0 = expand(%b) {shape = [8, 16]} : f32[8, 16]
      %1 = add(%x, %0) : f32[8, 16]
      %2 = exp(%1) : f32[8, 16]
      %3 = reduce_sum(%2) {dims = [1], keepdim = false} : f32[8]
      return %3
    }

After `fuse` (one kernel; nothing but the output is stored):

    graph @main(%x: f32[8, 16], %b: f32[16]) {
      %0 = expand(%b) {shape = [8, 16], fused_into = [0]} : f32[8, 16]
      %1 = add(%x, %0) {fused_into = [0]} : f32[8, 16]
      %2 = exp(%1) {fused_into = [0]} : f32[8, 16]
      %3 = reduce_sum(%2) {dims = [1], keepdim = false, kernel = 0} : f32[8]
      return %3
    }

**Epilogues.** A matrix product is always computed in a kernel of its own making (a GEMM, see
`loopgen/matmul.py`), but the elementwise ops computed from its result join that kernel when
they read it only at the same index, through elementwise ops only, and all end in one kernel
whose root is elementwise: bias adds, activations, residual adds, casts are then applied to the
accumulator tile before the only store, and the product is never written to memory. (One
reshape that regroups the rows, `[B*S, N] -> [B, S, N]`, may sit between them: the same
element, at another index.) The
matmul gets `fused_into` that kernel, whose root is the last op of the epilogue. A kernel takes
at most one matmul this way (the first, in graph order); a product read by two kernels, or
through a view or a reduction, keeps its own kernel.

**Attention through views.** An `attention` op read only by a chain of permutes and reshapes
whose last one is stored (PyTorch's SDPA result is a transposed view of a `[B, T, H, D]`
buffer; the graph returns that layout) is computed in that view's kernel: the attention nest
stores each element at the view's index (`loopgen/store_views.py`), with no copy kernel.

    %0 = attention(%q, %k, %v) {scale = 0.125, causal = true, ..., fused_into = [0]} : f32[4, 12, 1024, 64]
    %1 = permute(%0) {dims = [2, 0, 1, 3], kernel = 0} : f32[1024, 4, 12, 64]

**Producers of vector products** (`vector_producers`, on in the GPU pipeline, where each stored
value costs a dispatch). An elementwise op read by an `attention` op or by a product of one row
(`[1, K] @ [K, N]`: the decode step's linears), through views, is computed inside that kernel
instead of stored: the rotary embedding of the query and key, SwiGLU's `silu(gate) * up`
before the down projection. Such a kernel reads each operand element once per output row (or
block of query rows), so recomputing it is cheap. An op that reads a reduction (a norm's scale)
is still stored: inlined, the reduction would be a kernel of its own.

    %0 = matmul(%x, %wgu) {kernel = 0} : f32[1, 3072]
    %1 = slice(%0) {dim = 1, start = 0, end = 1536, step = 1, fused_into = [1]} : f32[1, 1536]
    %2 = slice(%0) {dim = 1, start = 1536, end = 3072, step = 1, fused_into = [1]} : f32[1, 1536]
    %3 = sigmoid(%1) {fused_into = [1]} : f32[1, 1536]
    %4 = mul(%1, %3) {fused_into = [1]} : f32[1, 1536]
    %5 = mul(%4, %2) {fused_into = [1]} : f32[1, 1536]      (without the option: kernel = 1)
    %6 = matmul(%5, %wd) {kernel = 1} : f32[1, 576]

Before:

    graph @main(%x: f32[32, 512], %w: f32[1024, 512], %b: f32[1024]) {
      %0 = permute(%w) {dims = [1, 0]} : f32[512, 1024]
      %1 = matmul(%x, %0) : f32[32, 1024]
      %2 = expand(%b) {shape = [32, 1024]} : f32[32, 1024]
      %3 = add(%1, %2) : f32[32, 1024]
      %4 = tanh(%3) : f32[32, 1024]
      return %4
    }

After `fuse` (one kernel: the GEMM with a bias and tanh epilogue):

    graph @main(%x: f32[32, 512], %w: f32[1024, 512], %b: f32[1024]) {
      %0 = permute(%w) {dims = [1, 0], fused_into = [0]} : f32[512, 1024]
      %1 = matmul(%x, %0) {fused_into = [0]} : f32[32, 1024]
      %2 = expand(%b) {shape = [32, 1024], fused_into = [0]} : f32[32, 1024]
      %3 = add(%1, %2) {fused_into = [0]} : f32[32, 1024]
      %4 = tanh(%3) {kernel = 0} : f32[32, 1024]
      return %4
    }
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from ...ir.expr import Const
from ...ir.ops import get_op
from ...ir.tensor import Graph, Op, Value
from ..base import TensorPass, register_pass
from ..loopgen.kernel_builder import ROOT_ONLY
from ..loopgen.store_views import view_chain_root
from .row_fusion import row_groups

#: Elementwise ops whose recomputation costs more than a memory round trip.
EXPENSIVE = frozenset({
    "exp", "exp2", "expm1", "log", "log2", "log10", "log1p", "sin", "cos", "tan", "asin", "acos",
    "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "sigmoid",
    "pow", "atan2", "lgamma", "digamma", "hypot", "fmod", "remainder",
})

FUSION_ATTRS = ("kernel", "fused_into")
#: Contractions whose kernels compute elementwise consumers on their finished tiles: the GEMM
#: (`loopgen/matmul.py`), the dequantizing linear (`loopgen/qlinear.py`) and the convolution
#: (`loopgen/conv.py`: bias, batch norm, activation, residual add on the output tile).
EPILOGUE_PRODUCTS = frozenset({"matmul", "qlinear", "conv"})


def category(op: Op) -> str:
    return get_op(op.name).category


def _regroups_rows(reshape: Op) -> bool:
    """A reshape that keeps the last dim and only splits or merges the dims before it."""
    src, dst = reshape.operands[0].shape, reshape.result.shape
    return len(src) >= 1 and len(dst) >= 2 and src[-1] == dst[-1]


def inline_cost(op: Op, inlined: set[Op], limit: int) -> int:
    """Rough cost of recomputing `op` with everything inlined into it (1 per cheap elementwise
    op, 10 per transcendental; a producer read twice counts twice), or any number above
    `limit` once it is known to exceed it. Stopping there keeps the walk short: the inlined
    DAG of a deep model, walked as a tree to the end, takes exponential time."""
    total = 0
    stack = [op]
    while stack:
        node = stack.pop()
        total += 10 if node.name in EXPENSIVE else 1 if category(node) == "elementwise" else 0
        if total > limit:
            return total
        stack.extend(p for v in node.operands if (p := v.producer) is not None and p in inlined)
    return total


def recompute_too_costly(op: Op, inlined: set[Op], uses: int, max_cost: int) -> bool:
    """Whether computing `op` in each of its `uses` costs more than `max_cost` beyond the first."""
    return uses > 1 and inline_cost(op, inlined, max_cost // (uses - 1)) * (uses - 1) > max_cost


@register_pass
@dataclass(frozen=True)
class Fuse(TensorPass):
    """Group ops into kernels (see the module docstring for the rules and an example)."""

    name: ClassVar[str] = "fuse"
    #: Largest inline cost (1 per cheap op, 10 per transcendental) recomputed per extra user.
    max_recompute_cost: int = 4
    #: Let elementwise consumers of a matmul join its kernel (see the module docstring).
    epilogues: bool = True
    #: Allow one row-regrouping reshape between a matmul and its epilogue (CPU GEMM handles it;
    #: the GPU's plain GEMM nest does not).
    epilogue_reshape: bool = True
    #: Compute row reductions (softmax, norms) inside the elementwise kernel that consumes them
    #: (see `row_fusion.py`).
    row_reductions: bool = True
    #: Largest inline cost an elementwise op may be recomputed at inside one row kernel, per
    #: extra use (`exp(x - max)` read by the sum's loop and by the normalizing loop costs 11).
    max_row_recompute_cost: int = 24
    #: Compute an `attention` op read only by permutes and reshapes that are stored (SDPA's
    #: output layout, a graph output) in their kernel: the attention nest stores each element
    #: at the view's index, and no copy kernel runs (`loopgen/store_views.py`).
    attention_views: bool = True
    #: Compute elementwise producers (rotary embeddings, SiLU * up) inside the attention ops and
    #: single-row products (matrix-vector, the decode step's linears) that read them, instead of
    #: storing them first (see "Producers of vector products" in the module docstring). The GPU
    #: pipeline turns it on: a stored value there costs a dispatch.
    vector_producers: bool = False

    def run(self, graph: Graph) -> Graph:
        for op in graph.ops:
            for a in FUSION_ATTRS:
                op.attrs.pop(a, None)
        users = graph.users()
        outputs = set(graph.outputs)
        inlined: set[Op] = set()
        reread: set[Op] = set()  # ops whose operands are read many times per output element
        # Decide from the consumers back, so an op knows how its users are computed.
        for op in reversed(graph.ops):
            if self._inline(op, users, outputs, inlined, reread):
                inlined.add(op)
        epilogue_roots: set[Op] = set()
        if self.epilogues:
            matmuls = self._epilogue_matmuls(graph, users, outputs, inlined)
            inlined |= matmuls
            epilogue_roots = {r for mm in matmuls
                              if (r := self._epilogue_root(mm, users, inlined, self.epilogue_reshape)) is not None}
        if self.row_reductions:
            inlined |= row_groups(graph, users, outputs, inlined, epilogue_roots, recompute_too_costly,
                                  self.max_row_recompute_cost)
        if self.attention_views:
            inlined |= {op for op in graph.ops if op.name == "attention" and op not in inlined
                        and len(op.results) == 1 and op.result not in outputs
                        and view_chain_root(op.result, users, inlined) is not None}
        kernels: dict[Op, set[int]] = {}
        next_id = 0
        for op in graph.ops:
            if op not in inlined:
                op.attrs["kernel"] = next_id
                next_id += 1
        for op in reversed(graph.ops):
            if op in inlined:
                ids: set[int] = set()
                for user in users.get(op.result, []):
                    ids |= kernels.get(user, set()) if user in inlined else {user.attrs["kernel"]}
                kernels[op] = ids
                op.attrs["fused_into"] = tuple(sorted(ids))
        return graph

    def _epilogue_matmuls(self, graph: Graph, users: dict[Value, list[Op]], outputs: set[Value],
                          inlined: set[Op]) -> set[Op]:
        """The matmuls to compute inside the kernel of their elementwise consumers."""
        taken: set[Op] = set()  # epilogue roots that already hold a matmul
        fused: set[Op] = set()
        for op in graph.ops:
            if op.name not in EPILOGUE_PRODUCTS or op.result in outputs:
                continue
            # `qlinear` kernels store at the product's own index: no reshape in between.
            root = self._epilogue_root(op, users, inlined, self.epilogue_reshape and op.name == "matmul")
            if root is not None and root not in taken:
                taken.add(root)
                fused.add(op)
        return fused

    @staticmethod
    def _epilogue_root(mm: Op, users: dict[Value, list[Op]], inlined: set[Op],
                       allow_reshape: bool = True) -> Op | None:
        """The one elementwise kernel root that every path from `mm`'s result reaches through
        elementwise ops of the same shape, or None. One reshape that only regroups the rows
        (the last dim kept, as a linear layer on `[batch, seq, features]` does) may sit on the
        way: ops after it have its shape, and each element still depends on one of the product."""
        roots: set[Op] = set()
        stack = [mm]
        seen: set[Op] = set()
        after: Op | None = None  # a reshape passed on the way, which fixes the shape after it
        while stack:
            op = stack.pop()
            consumers = users.get(op.result, [])
            if not consumers:
                return None
            for user in consumers:
                if user.name == "reshape" and op.result.shape == mm.result.shape:
                    if not allow_reshape or user not in inlined or not _regroups_rows(user):
                        return None
                    if after is not None and after.result.shape != user.result.shape:
                        return None
                    after = user
                elif category(user) != "elementwise" or user.result.shape != op.result.shape:
                    return None
                if user in inlined:
                    if user not in seen:
                        seen.add(user)
                        stack.append(user)
                else:
                    roots.add(user)
        return roots.pop() if len(roots) == 1 else None

    def _inline(self, op: Op, users: dict[Value, list[Op]], outputs: set[Value],
                inlined: set[Op], reread: set[Op]) -> bool:
        if category(op) == "contraction":
            reread.add(op)
        if len(op.results) != 1:
            return False
        result = op.result
        cat = category(op)
        if result in outputs or cat in ("reduction", "contraction", "ordered") or _root_only(op):
            return False
        consumers = users.get(result, [])
        if not consumers:
            return False
        feeds_reread = any(u in reread for u in consumers)
        if cat == "view":
            if any(_needs_buffer(u, result) for u in consumers):
                return False  # a convolution loads this operand from memory: store the view once
            # A view is index arithmetic: free to repeat anywhere.
            if feeds_reread:
                reread.add(op)
            return True
        if feeds_reread and not (self.vector_producers and cat == "elementwise"
                                 and _read_as_vector(consumers, users, reread)
                                 and not _behind_reduction(op)):
            # A contraction (matmul, convolution) reads each element many times: compute it
            # once, unless it is a constant.
            return cat == "factory"
        # A view read by several kernels is inlined into each of them, and so is what it
        # views: count the readers behind inlined views (`cos(emb)` viewed by `unsqueeze` and
        # read by the rotary embedding of every query and key has one consumer, and four
        # kernels that would each recompute it).
        uses = _uses_through_views(result, users, inlined)
        if uses == 1:
            return True
        if self.epilogues and _reads_product(op) and any(_reads_product(u) for u in consumers):
            # A residual stream: `x1 = x0 + attn(..)` read by a norm and by `x2 = x1 + mlp(..)`.
            # Inlined, each add pulls the previous ones along, so every norm of a deep model
            # recomputes the stream from the embedding: kernels that grow with depth and
            # differ from layer to layer. Stored, it is its product's epilogue (the product
            # is never written) and every layer gets the same kernels.
            return False
        # Decided from the consumers back, `op`'s producers are not decided yet: those it alone
        # reads will be inlined into it, and recomputed with it (SiLU's `mul(x, sigmoid(x))`
        # read by a squeeze-excite's mean and its scaling counted 1, not 11, and both readers
        # recomputed the sigmoid of a whole feature map).
        return not recompute_too_costly(op, inlined | _sole_producers(op, users, outputs), uses,
                                        self.max_recompute_cost)


#: Operands the convolution kernels load straight from a buffer (`loopgen/conv.py`: the input;
#: `loopgen/conv_grad_weight.py`: the gradient and the input); read through an inlined view,
#: the kernel would fall back to the element-by-element nest (a conv after GroupNorm's
#: backward reads its gradient as a reshape of `[N, G, C/G, H*W]`: 30-70x slower).
BUFFER_OPERANDS: dict[str, tuple[int, ...]] = {"conv": (0,), "conv_grad_weight": (0, 1)}


def _root_only(op: Op) -> bool:
    """Whether the loop builder computes `op` only as a kernel's root, a nest of its own
    (`ROOT_ONLY`: `dequantize` writes a row's blocks run by run), so it cannot be inlined into
    a consumer's kernel."""
    return op.name in ROOT_ONLY


def _needs_buffer(user: Op, value: Value) -> bool:
    """Whether `user` reads `value` as an operand that must be a buffer of its own."""
    return any(i < len(user.operands) and user.operands[i] is value for i in BUFFER_OPERANDS.get(user.name, ()))


#: How far `_sole_producers` walks back: enough for an activation's few ops, short in deep graphs.
SOLE_PRODUCERS_LIMIT = 16


def _sole_producers(op: Op, users: dict[Value, list[Op]], outputs: set[Value]) -> set[Op]:
    """Elementwise ops read only by `op` (or by such ops), walking back from `op`: `_inline`
    will inline them into it, since they have one reader (at most `SOLE_PRODUCERS_LIMIT`)."""
    found: set[Op] = set()
    stack = [op]
    while stack and len(found) < SOLE_PRODUCERS_LIMIT:
        node = stack.pop()
        for v in node.operands:
            p = v.producer
            if (p is None or p in found or len(p.results) != 1 or p.result in outputs
                    or category(p) != "elementwise" or len({id(u) for u in users.get(p.result, [])}) != 1):
                continue
            found.add(p)
            stack.append(p)
    return found


def _uses_through_views(value: Value, users: dict[Value, list[Op]], inlined: set[Op]) -> int:
    """How many ops read `value`, counting the readers of an inlined view instead of the view."""
    count = 0
    stack = list(users.get(value, []))
    while stack:
        user = stack.pop()
        if user in inlined and category(user) == "view" and len(user.results) == 1:
            stack.extend(users.get(user.result, []))
        else:
            count += 1
    return count


def _read_as_vector(consumers: list[Op], users: dict[Value, list[Op]], reread: set[Op]) -> bool:
    """Whether each of `consumers` that rereads its operands (through views) reads them as
    vectors (`_reads_as_vector`)."""
    stack = list(consumers)
    while stack:
        u = stack.pop()
        if u not in reread:
            continue
        if category(u) == "view" and len(u.results) == 1:
            stack.extend(users.get(u.result, []))
        elif not _reads_as_vector(u):
            return False
    return True


def _reads_as_vector(op: Op) -> bool:
    """Whether a contraction reads each element of its operands few times per output row: an
    `attention` op (each query row and key once per block of query rows) or a product of one
    row (`[1, K] @ [K, N]`, `qlinear` of one row: its operand is a vector each output reads)."""
    if op.name == "attention":
        return True
    if op.name in ("matmul", "qlinear") and len(op.results) == 1 and op.result.shape:
        return all(isinstance(d, Const) and int(d.value) == 1 for d in op.result.shape[:-1])
    return False


def _behind_reduction(op: Op) -> bool:
    """Whether `op` reads, through elementwise ops and views, a reduction (a norm's mean
    square): inlined into a product, the reduction would be a kernel of its own, which saves
    nothing over storing `op`. The walk stops at every other op (a product, an input)."""
    stack, seen = [op], set()
    while stack:
        node = stack.pop()
        for v in node.operands:
            p = v.producer
            if p is None or p in seen:
                continue
            seen.add(p)
            if category(p) == "reduction":
                return True
            if category(p) in ("elementwise", "view"):
                stack.append(p)
    return False


def _reads_product(op: Op) -> bool:
    """Whether an elementwise op reads a matmul or quantized linear's result directly (through
    views only), as an epilogue would."""
    if category(op) != "elementwise":
        return False
    for v in op.operands:
        p = v.producer
        while p is not None and category(p) == "view" and p.operands:
            p = p.operands[0].producer
        if p is not None and p.name in EPILOGUE_PRODUCTS:
            return True
    return False
