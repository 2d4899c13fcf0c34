"""Definitions of the tensor-level ops: what operands and attributes each takes, its result
types, and its documentation (which `docs/ir.md` is generated from).

Ops are deliberately explicit: elementwise ops take operands of one shape and one dtype (the
importer inserts `expand` and `cast`), so every pass and every backend sees a small,
regular op set.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from . import dtypes as dt
from .expr import (COMPARISONS, INFIX_OPS, NAMED_BINARY_OPS, UNARY_FUNCS, Const, Expr, as_expr,
                   floordiv, mul, sub)
from .tensor_type import TensorType
from .qblocks import BLOCK_TYPES

InferFn = Callable[[list[TensorType], dict[str, Any]], list[TensorType]]


class OpError(ValueError):
    """An op's operands or attributes are invalid; the message names the op and the problem."""


@dataclass(frozen=True)
class OpDef:
    """One tensor op: its category (`elementwise`, `view`, `reduction`, `contraction`,
    `factory`, `data`, `ordered`), its type rule, and a doc with an IR example."""

    name: str
    category: str
    infer: InferFn
    doc: str
    #: number of operands, or -1 for variadic
    arity: int


OPS: dict[str, OpDef] = {}


def define(name: str, category: str, arity: int, doc: str) -> Callable[[InferFn], InferFn]:
    def deco(fn: InferFn) -> InferFn:
        OPS[name] = OpDef(name, category, fn, doc.strip(), arity)
        return fn
    return deco


def get_op(name: str) -> OpDef:
    try:
        return OPS[name]
    except KeyError:
        raise OpError(f"unknown op {name!r}") from None


def infer_types(name: str, operand_types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    """Result types of op `name` applied to operands of these types, or an `OpError`."""
    d = get_op(name)
    if d.arity >= 0 and len(operand_types) != d.arity:
        raise OpError(f"{name}: expected {d.arity} operands, got {len(operand_types)}")
    return d.infer(operand_types, attrs)


def _same_shape(name: str, types: list[TensorType]) -> None:
    first = types[0].shape
    for t in types[1:]:
        if t.shape != first:
            raise OpError(f"{name}: operand shapes differ: {list(map(str, first))} vs {list(map(str, t.shape))}")


def _same_dtype(name: str, types: list[TensorType]) -> None:
    first = types[0].dtype
    for t in types[1:]:
        if t.dtype != first:
            raise OpError(f"{name}: operand dtypes differ: {first} vs {t.dtype}")


def _norm_dims(name: str, dims: Any, rank: int) -> tuple[int, ...]:
    out = []
    for d in dims:
        if not -rank <= d < max(rank, 1):
            raise OpError(f"{name}: dim {d} out of range for rank {rank}")
        out.append(d % max(rank, 1))
    return tuple(sorted(set(out)))


# ---- elementwise ---------------------------------------------------------------------------

PREDICATES = frozenset({"isnan", "isinf", "isfinite", "signbit"})


def _unary(name: str) -> None:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        t = types[0]
        return [t.with_dtype(dt.bool_) if name in PREDICATES else t]
    OPS[name] = OpDef(name, "elementwise", infer,
                      f"Elementwise `{name}`.\n\n    %1 = {name}(%0) : f32[4]", 1)


def _binary(name: str) -> None:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        _same_shape(name, types)
        _same_dtype(name, types)
        t = types[0]
        return [t.with_dtype(dt.bool_) if name in COMPARISONS else t]
    spelled = INFIX_OPS.get(name, name)
    OPS[name] = OpDef(name, "elementwise", infer,
                      f"Elementwise `{spelled}` of two tensors of one shape and dtype.\n\n"
                      f"    %2 = {name}(%0, %1) : f32[4]", 2)


for _n in sorted(UNARY_FUNCS):
    _unary(_n)
for _n in sorted(set(INFIX_OPS) | NAMED_BINARY_OPS):
    _binary(_n)


@define("where", "elementwise", 3, """
Pick `a` where `cond` is true, else `b`; `cond` is bool, `a` and `b` share a dtype.

    %3 = where(%c, %a, %b) : f32[4]
""")
def _where(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    _same_shape("where", types)
    if types[0].dtype != dt.bool_:
        raise OpError("where: condition must be bool")
    _same_dtype("where", types[1:])
    return [types[1]]


@define("cast", "elementwise", 1, """
Convert elements to `dtype` (float to int truncates toward zero, to bool tests != 0).

    %1 = cast(%0) {dtype = f16} : f16[4]
""")
def _cast(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [types[0].with_dtype(attrs["dtype"])]


# ---- views -----------------------------------------------------------------------------------

@define("permute", "view", 1, """
Reorder dimensions: result dim i is operand dim `dims[i]`.

    %1 = permute(%0) {dims = [1, 0]} : f32[8, 4]    # %0: f32[4, 8]
""")
def _permute(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    t, dims = types[0], tuple(attrs["dims"])
    if sorted(dims) != list(range(t.rank)):
        raise OpError(f"permute: dims {list(dims)} is not a permutation of rank {t.rank}")
    return [TensorType(t.dtype, tuple(t.shape[d] for d in dims))]


@define("expand", "view", 1, """
Broadcast size-1 dimensions (and new leading ones) to `shape`.

    %1 = expand(%0) {shape = [3, 4]} : f32[3, 4]    # %0: f32[1, 4]
""")
def _expand(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    t, shape = types[0], tuple(as_expr(d) for d in attrs["shape"])
    if len(shape) < t.rank:
        raise OpError(f"expand: target rank {len(shape)} below operand rank {t.rank}")
    for src, dst in zip(reversed(t.shape), reversed(shape)):
        if src != dst and src != Const(1):
            raise OpError(f"expand: cannot expand dim of size {src} to {dst}")
    return [TensorType(t.dtype, shape)]


@define("reshape", "view", 1, """
Reinterpret the elements in row-major order with a new `shape` of the same element count.

    %1 = reshape(%0) {shape = [2, 6]} : f32[2, 6]   # %0: f32[3, 4]
""")
def _reshape(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [TensorType(types[0].dtype, tuple(as_expr(d) for d in attrs["shape"]))]


@define("slice", "view", 1, """
Take `start, start+step, ...` below `end` along `dim` (bounds already clamped).

    %1 = slice(%0) {dim = 1, start = 2, end = 8, step = 2} : f32[4, 3]   # %0: f32[4, 10]
""")
def _slice(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    t = types[0]
    dim = attrs["dim"]
    if not 0 <= dim < t.rank:
        raise OpError(f"slice: dim {dim} out of range for rank {t.rank}")
    start, end, step = as_expr(attrs["start"]), as_expr(attrs["end"]), as_expr(attrs["step"])
    length = floordiv(sub(end, start) + sub(step, 1), step)
    shape = list(t.shape)
    shape[dim] = length
    return [TensorType(t.dtype, tuple(shape))]


# ---- reductions ----------------------------------------------------------------------------

REDUCTIONS = ("reduce_sum", "reduce_prod", "reduce_max", "reduce_min", "reduce_any", "reduce_all")


def _reduced_shape(name: str, t: TensorType, attrs: dict[str, Any]) -> tuple[Expr, ...]:
    dims = _norm_dims(name, attrs["dims"], t.rank)
    keep = bool(attrs.get("keepdim", False))
    out: list[Expr] = []
    for i, d in enumerate(t.shape):
        if i in dims:
            if keep:
                out.append(Const(1))
        else:
            out.append(d)
    return tuple(out)


def _reduction(name: str) -> None:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        t = types[0]
        dtype = dt.bool_ if name in ("reduce_any", "reduce_all") else t.dtype
        return [TensorType(dtype, _reduced_shape(name, t, attrs))]
    kind = name.split("_")[1]
    OPS[name] = OpDef(name, "reduction", infer,
                      f"Reduce with `{kind}` over `dims` (keepdim keeps them as size 1).\n\n"
                      f"    %1 = {name}(%0) {{dims = [1], keepdim = false}} : f32[4]   # %0: f32[4, 8]", 1)


for _n in REDUCTIONS:
    _reduction(_n)


def _arg_reduction(name: str) -> None:
    def infer(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
        t = types[0]
        a = dict(attrs, dims=[attrs["dim"]])
        return [TensorType(dt.i64, _reduced_shape(name, t, a))]
    OPS[name] = OpDef(name, "reduction", infer,
                      f"Index (i64) of the first {name[3:]}imum along `dim`; NaN counts as the extreme.\n\n"
                      f"    %1 = {name}(%0) {{dim = 1, keepdim = false}} : i64[4]   # %0: f32[4, 8]", 1)


for _n in ("argmax", "argmin"):
    _arg_reduction(_n)


# ---- contraction -------------------------------------------------------------------------------

@define("matmul", "contraction", 2, """
Batched matrix product `[..., M, K] x [..., K, N] -> [..., M, N]`; batch dims are equal.
Accumulates in f32 for half-precision inputs.

    %2 = matmul(%0, %1) : f32[32, 1024]   # %0: f32[32, 512], %1: f32[512, 1024]
""")
def _matmul(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    a, b = types
    if a.rank < 2 or a.rank != b.rank:
        raise OpError(f"matmul: operands must have equal rank >= 2, got {a.rank} and {b.rank}")
    if a.shape[:-2] != b.shape[:-2]:
        raise OpError("matmul: batch dimensions differ")
    if a.shape[-1] != b.shape[-2]:
        raise OpError(f"matmul: inner dimensions differ: {a.shape[-1]} vs {b.shape[-2]}")
    _same_dtype("matmul", types)
    return [TensorType(a.dtype, (*a.shape[:-1], b.shape[-1]))]


QLINEAR_KINDS = ("int8", "int4", "blocks")


#: The values of `qlinear`'s `form` attribute.
QLINEAR_FORMS = ("auto", "panel", "rows", "gemm", "tiles")


@define("qlinear", "contraction", -1, """
A linear layer on a quantized weight, dequantized on the fly: `y[..., n] = sum_k x[..., k] *
W[n, k]` for `x: [..., K]` of any float dtype, the result in f32 (bias and the cast back are
elementwise ops after it, which `fuse` puts in the same kernel). Operands are
`(x, qweight, scales)`, plus `mins` when `symmetric = false`; the layouts are those of
`torchburn/quant/layouts.py`:

- `kind = "int8"`: `qweight: i8[N, K]`; `scales: [N]` with `group_size = K` (per channel)
  or `[N, K / group_size]`; `W[n, k] = scales[n, k / group_size] * qweight[n, k]`.
- `kind = "int4"`: `qweight: u8[N, K / 2]`, two codes per byte: byte `j` of group `G` holds
  element `G g + j` in its low nibble and `G g + j + g / 2` in its high one (`g`:
  `group_size`, even, dividing K); `scales` (and `mins`) `[N, K / g]`;
  `W = scale * (q - 8)` when `symmetric`, else `W = scale * q + min`.
- `kind = "blocks"`: the weight in ggml's blocks of `block_type` (`ir/qblocks.py`: Q4_0 ...
  Q6_K), `qweight: u8[N, K / block * nbytes]` and no scales operand (they are in the blocks);
  `group_size` is the block's weight count; `W` is the block table's expression.

Scales and mins are f32, f16 or bf16 and are widened to f32 before use. The optional
`form` says which CPU kernel computes it: `"auto"` (the default: by M and the target),
`"panel"` (int8 activations by a packed weight panel, `passes/quant/qgemm_i8.py`), `"rows"`
(the weight streamed row by row, `qlinear.py` / `qlinear_i8.py`), `"gemm"` (`dequantize`
and the float GEMM, pass `qlinear-to-gemm`) or `"tiles"` (16 weight rows by 16 rows of x per
AMX tile product, `passes/quant/qlinear_tiles.py`; int4 and grouped int8 on a CPU with
AMX-INT8, else as "auto"); the tuner writes it where it measured the forms.

    %3 = qlinear(%x, %q, %s) {kind = "int4", group_size = 64, symmetric = true} : f32[16, 4096]
    # %x: f32[16, 4096], %q: u8[4096, 2048], %s: f16[4096, 64]
    %2 = qlinear(%x, %q) {kind = "blocks", block_type = "Q6_K", group_size = 256, symmetric = true} : f32[1, 512]
    # %x: f32[1, 512], %q: u8[512, 420]
""")
def _qlinear(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    kind, group, symmetric = attrs["kind"], attrs["group_size"], attrs["symmetric"]
    if attrs.get("form", "auto") not in QLINEAR_FORMS:
        raise OpError(f"qlinear: unknown form {attrs['form']!r}; expected one of {QLINEAR_FORMS}")
    if kind not in QLINEAR_KINDS:
        raise OpError(f"qlinear: unknown kind {kind!r}; expected one of {QLINEAR_KINDS}")
    if kind == "blocks":
        return _qlinear_blocks(types, attrs)
    if not isinstance(group, int) or isinstance(group, bool) or group < 1:
        raise OpError(f"qlinear: group_size must be a positive integer, got {group!r}")
    if not isinstance(symmetric, bool) or (kind == "int8" and not symmetric):
        raise OpError("qlinear: symmetric must be a bool, and true for int8")
    expected = 3 if symmetric else 4
    if len(types) != expected:
        raise OpError(f"qlinear: expected {expected} operands (x, qweight, scales"
                      f"{'' if symmetric else ', mins'}), got {len(types)}")
    x, q, s = types[0], types[1], types[2]
    if not x.dtype.is_float or x.rank < 1:
        raise OpError(f"qlinear: x must be a float tensor of rank >= 1, got {x}")
    if q.rank != 2 or q.dtype != (dt.i8 if kind == "int8" else dt.u8):
        raise OpError(f"qlinear: {kind} qweight must be {'i8' if kind == 'int8' else 'u8'} of rank 2, got {q}")
    n, k = q.shape[0], x.shape[-1]
    packed_k = k if kind == "int8" else floordiv(k, as_expr(2))
    _static_equal("qlinear: qweight's columns and x's last dim", q.shape[1], packed_k)
    if kind == "int4" and group % 2:
        raise OpError(f"qlinear: int4 group_size must be even, got {group}")
    if isinstance(k, Const) and int(k.value) % group:
        raise OpError(f"qlinear: group_size {group} does not divide K = {k}")
    per_channel = kind == "int8" and s.rank == 1
    if per_channel:
        _static_equal("qlinear: group_size of per-channel scales and K", as_expr(group), k)
    for name, t in (("scales", s), ("mins", types[3] if len(types) == 4 else None)):
        if t is None:
            continue
        if not t.dtype.is_float or t.dtype == dt.f64:
            raise OpError(f"qlinear: {name} must be f32, f16 or bf16, got {t.dtype}")
        shape = (n,) if per_channel else (n, floordiv(k, as_expr(group)))
        if t.rank != len(shape):
            raise OpError(f"qlinear: {name} must have rank {len(shape)}, got {t}")
        for a, b in zip(t.shape, shape):
            _static_equal(f"qlinear: {name} shape", a, b)
    return [TensorType(dt.f32, (*x.shape[:-1], n))]


def _qlinear_blocks(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    """The shapes of a `qlinear` of kind "blocks" (see `qlinear`)."""
    name = attrs.get("block_type")
    bt = BLOCK_TYPES.get(name) if isinstance(name, str) else None
    if bt is None:
        raise OpError(f"qlinear: block_type must be one of {tuple(BLOCK_TYPES)}, got {name!r}")
    if attrs["group_size"] != bt.block or attrs["symmetric"] is not True:
        raise OpError(f"qlinear: {name} needs group_size = {bt.block} and symmetric = true")
    if len(types) != 2:
        raise OpError(f"qlinear: kind blocks takes 2 operands (x, qweight), got {len(types)}")
    x, q = types
    if not x.dtype.is_float or x.rank < 1:
        raise OpError(f"qlinear: x must be a float tensor of rank >= 1, got {x}")
    if q.rank != 2 or q.dtype != dt.u8:
        raise OpError(f"qlinear: blocks qweight must be u8 of rank 2, got {q}")
    k = x.shape[-1]
    if isinstance(k, Const) and int(k.value) % bt.block:
        raise OpError(f"qlinear: {name} blocks of {bt.block} do not divide K = {k}")
    _static_equal("qlinear: qweight's bytes per row and x's last dim",
                  q.shape[1], mul(floordiv(k, as_expr(bt.block)), as_expr(bt.nbytes)))
    return [TensorType(dt.f32, (*x.shape[:-1], q.shape[0]))]


@define("dequantize", "data", -1, """
A quantized weight as f32: `W[n, k]`, element for element the weight `qlinear` multiplies by
(same operands after x, same attributes). The product of many rows of x runs faster as this
followed by a float `matmul` (pass `qlinear-to-gemm`) than as a `qlinear` that decodes every
weight once per tile of rows.

    %1 = dequantize(%q, %s) {kind = "int4", group_size = 32, symmetric = true} : f32[64, 128]
    # %q: u8[64, 64], %s: f16[64, 4]
    %1 = dequantize(%q) {kind = "blocks", block_type = "Q4_K", group_size = 256, symmetric = true} : f32[8, 512]
    # %q: u8[8, 288]
""")
def _dequantize(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    if not types:
        raise OpError("dequantize: expected the quantized weight (and its scales, mins)")
    q = types[0]
    kind = attrs.get("kind")
    if q.rank != 2:
        raise OpError(f"dequantize: the quantized weight must have rank 2, got {q}")
    cols = q.shape[1]
    if kind == "blocks":
        bt = BLOCK_TYPES.get(attrs.get("block_type")) if isinstance(attrs.get("block_type"), str) else None
        if bt is None:
            raise OpError(f"dequantize: block_type must be one of {tuple(BLOCK_TYPES)}, got {attrs.get('block_type')!r}")
        if isinstance(cols, Const) and int(cols.value) % bt.nbytes:
            raise OpError(f"dequantize: {bt.name} rows of {cols} bytes are not whole blocks of {bt.nbytes}")
        k = mul(floordiv(cols, as_expr(bt.nbytes)), as_expr(bt.block))
    else:
        k = cols if kind == "int8" else mul(cols, as_expr(2))
    # the operands and attributes are qlinear's after x: let it check them
    _qlinear([TensorType(dt.f32, (k,)), *types], attrs)
    return [TensorType(dt.f32, (q.shape[0], k))]


def _static_equal(what: str, a: Expr, b: Expr) -> None:
    """Raise when two sizes are both known and differ (symbolic sizes are checked at run time
    by the caller's guards)."""
    if isinstance(a, Const) and isinstance(b, Const) and a != b:
        raise OpError(f"{what} differ: {a} vs {b}")


# ---- factories and data movement ---------------------------------------------------------------

@define("full", "factory", 0, """
A tensor of `shape` filled with `value`.

    %0 = full() {shape = [2, 3], value = 0.0, dtype = f32} : f32[2, 3]
""")
def _full(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [TensorType.of(attrs["dtype"], attrs["shape"])]


@define("iota", "factory", 0, """
`start + i * step` along `dim` of a tensor of `shape` (arange when rank is 1).

    %0 = iota() {shape = [5], dim = 0, start = 0, step = 1, dtype = i64} : i64[5]
""")
def _iota(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [TensorType.of(attrs["dtype"], attrs["shape"])]


@define("concat", "data", -1, """
Join tensors along `dim`; other dimensions and dtypes are equal.

    %2 = concat(%0, %1) {dim = 0} : f32[5, 4]   # %0: f32[2, 4], %1: f32[3, 4]
""")
def _concat(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    if not types:
        raise OpError("concat: needs at least one operand")
    dim = attrs["dim"]
    _same_dtype("concat", types)
    base = types[0]
    total: Expr = Const(0)
    for t in types:
        if t.rank != base.rank or any(a != b for i, (a, b) in enumerate(zip(t.shape, base.shape)) if i != dim):
            raise OpError("concat: operands differ outside the concatenated dim")
        total = total + t.shape[dim]
    shape = list(base.shape)
    shape[dim] = total
    return [TensorType(base.dtype, tuple(shape))]


def numel(shape: tuple[Expr, ...]) -> Expr:
    """The element count of a shape, as an index expression."""
    n: Expr = Const(1)
    for d in shape:
        n = mul(n, d)
    return n


# =============================================================================================
# Neural-network ops: convolutions and pooling (element rules in passes/loopgen/nn_rules.py).
# Spatial attributes (`stride`, `padding`, `dilation`, `window`...) are tuples with one entry
# per spatial dim; the spatial dims are the trailing ones.
# =============================================================================================

def _ints(attrs: dict[str, Any], key: str) -> tuple[int, ...]:
    return tuple(int(v) for v in attrs[key])


def _conv_out_size(size: Expr, k: Expr, s: int, p: int, d: int) -> Expr:
    """`(size + 2p - d (k - 1) - 1) // s + 1`, the output length of a convolution or pool."""
    span = mul(as_expr(d), sub(k, 1))
    return floordiv(sub(sub(size + as_expr(2 * p), span), 1), as_expr(s)) + as_expr(1)


def _check_groups(name: str, channels: Expr, cout: Expr, cin_g: Expr, attrs: dict[str, Any]) -> None:
    """`channels == cin_g * groups` and `cout % groups == 0` where the sizes are known."""
    groups = attrs.get("groups", 1)
    if not isinstance(groups, int) or groups < 1:
        raise OpError(f"{name}: groups must be a positive integer, got {groups!r}")
    known = [int(e.value) if isinstance(e, Const) and e.type.dtype.is_int else None for e in (channels, cout, cin_g)]
    c, co, cg = known
    if c is not None and cg is not None and c != cg * groups:
        raise OpError(f"{name}: {c} input channels, but the weight takes {cg} per group x {groups} groups")
    if co is not None and co % groups:
        raise OpError(f"{name}: {co} output channels do not split into {groups} groups")


@define("conv", "contraction", -1, """
Convolution of `x: [N, C, *in]` with `w: [Cout, C / groups, *k]` (and an optional bias
`[Cout]`), cross-correlation as in PyTorch. Out-of-range taps (padding) contribute zero.
One output element accumulates over `C / groups` and the kernel window.

    %3 = conv(%x, %w, %b) {stride = [1, 1], padding = [1, 1], dilation = [1, 1], groups = 1} : f32[2, 8, 16, 16]
    # %x: f32[2, 3, 16, 16], %w: f32[8, 3, 3, 3], %b: f32[8]
""")
def _conv(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    if len(types) not in (2, 3):
        raise OpError(f"conv: expected 2 or 3 operands, got {len(types)}")
    x, w = types[0], types[1]
    stride, padding, dilation = _ints(attrs, "stride"), _ints(attrs, "padding"), _ints(attrs, "dilation")
    nsp = len(stride)
    if x.rank != nsp + 2 or w.rank != nsp + 2 or len(padding) != nsp or len(dilation) != nsp:
        raise OpError(f"conv: ranks of x ({x.rank}), w ({w.rank}) and attributes ({nsp} spatial dims) differ")
    _same_dtype("conv", types)
    if len(types) == 3 and (types[2].rank != 1 or types[2].shape[0] != w.shape[0]):
        raise OpError("conv: bias must be [Cout]")
    _check_groups("conv", x.shape[1], w.shape[0], w.shape[1], attrs)
    out = tuple(_conv_out_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i])
                for i in range(nsp))
    return [TensorType(x.dtype, (x.shape[0], w.shape[0], *out))]


@define("conv_grad_input", "contraction", 2, """
The gradient of `conv` with respect to its input (a transposed convolution): from
`grad: [N, Cout, *out]` and `w: [Cout, C / groups, *k]` to `[N, C, *in_size]`. Each element
sums over the output positions and channels its taps reach.

    %2 = conv_grad_input(%g, %w) {stride = [2], padding = [1], dilation = [1], groups = 1, in_size = [9]} : f32[2, 3, 9]
    # %g: f32[2, 8, 5], %w: f32[8, 3, 3]
""")
def _conv_grad_input(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    g, w = types
    _same_dtype("conv_grad_input", types)
    in_size = tuple(as_expr(d) for d in attrs["in_size"])
    if g.rank != len(in_size) + 2 or w.rank != g.rank:
        raise OpError("conv_grad_input: ranks of grad, w and in_size differ")
    if g.shape[1] != w.shape[0] and all(isinstance(d, Const) for d in (g.shape[1], w.shape[0])):
        raise OpError(f"conv_grad_input: grad has {g.shape[1]} channels, the weight {w.shape[0]} outputs")
    groups = int(attrs["groups"])
    _check_groups("conv_grad_input", mul(w.shape[1], as_expr(groups)), w.shape[0], w.shape[1], attrs)
    return [TensorType(g.dtype, (g.shape[0], mul(w.shape[1], as_expr(groups)), *in_size))]


@define("conv_grad_weight", "contraction", 2, """
The gradient of `conv` with respect to its weight: from `grad: [N, Cout, *out]` and the
input `x: [N, C, *in]` to `[Cout, C / groups, *window]` (`window`: the kernel's spatial
size); each element sums over the batch and the output positions.

    %2 = conv_grad_weight(%g, %x) {stride = [1, 1], padding = [0, 0], dilation = [1, 1], groups = 1, window = [3, 3]} : f32[8, 3, 3, 3]
""")
def _conv_grad_weight(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    g, x = types
    _same_dtype("conv_grad_weight", types)
    kernel = tuple(as_expr(d) for d in attrs["window"])
    if g.rank != len(kernel) + 2 or x.rank != g.rank:
        raise OpError("conv_grad_weight: ranks of grad, x and window differ")
    groups = int(attrs["groups"])
    for what, d in (("input", x.shape[1]), ("output", g.shape[1])):
        if isinstance(d, Const) and int(d.value) % groups:
            raise OpError(f"conv_grad_weight: {d} {what} channels do not split into {groups} groups")
    return [TensorType(g.dtype, (g.shape[1], floordiv(x.shape[1], as_expr(groups)), *kernel))]


POOL_KINDS = ("max", "argmax", "avg")


@define("pool", "reduction", 1, """
Pooling over the trailing spatial dims, one window per element of `out_size`. `kind` is `max`,
`avg` or `argmax` (the i64 position of the maximum inside the input's spatial plane, row
major; NaN wins, the first maximum is kept). Fixed windows use `window` (the kernel size),
`stride`, `padding`, `dilation` (padding never takes part in a max; `avg` divides by
`divisor_override`, or the window clipped to the padded input when `count_include_pad`, or
the window clipped to the input). `adaptive = true` uses PyTorch's adaptive windows
`[floor(i * in / out), ceil((i + 1) * in / out))` instead.

    %1 = pool(%x) {kind = "max", window = [2, 2], stride = [2, 2], padding = [0, 0], dilation = [1, 1], out_size = [4, 4], adaptive = false, count_include_pad = true, divisor_override = none} : f32[2, 3, 4, 4]
""")
def _pool(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    x = types[0]
    if attrs["kind"] not in POOL_KINDS:
        raise OpError(f"pool: unknown kind {attrs['kind']!r}")
    out_size = tuple(as_expr(d) for d in attrs["out_size"])
    if x.rank < len(out_size):
        raise OpError("pool: operand has fewer dims than out_size")
    dtype = dt.i64 if attrs["kind"] == "argmax" else x.dtype
    return [TensorType(dtype, (*x.shape[:x.rank - len(out_size)], *out_size))]


@define("pool_grad", "reduction", -1, """
The gradient of `pool` with respect to its input, gathered per input element: `kind = "max"`
takes `(grad, indices)` (the `argmax` of the forward pool) and sums the gradients of the
windows whose maximum is this element; `kind = "avg"` takes `(grad)` and sums each covering
window's gradient divided by its divisor. Attributes as for `pool`, plus `in_size`.
PyTorch's max-pooling gradients are lowered to a `scatter` of each window's gradient to its
argmax instead (one write per window, where this gathers over every covering window).

    %2 = pool_grad(%g, %i) {kind = "max", window = [2, 2], stride = [2, 2], padding = [0, 0], dilation = [1, 1], in_size = [8, 8], adaptive = false, count_include_pad = true, divisor_override = none} : f32[2, 3, 8, 8]
""")
def _pool_grad(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    g = types[0]
    kind = attrs["kind"]
    if kind not in ("max", "avg") or len(types) != (2 if kind == "max" else 1):
        raise OpError(f"pool_grad: kind {kind!r} with {len(types)} operands")
    in_size = tuple(as_expr(d) for d in attrs["in_size"])
    if kind == "max" and (types[1].shape != g.shape or not types[1].dtype.is_int):
        raise OpError("pool_grad: indices must be integers of the gradient's shape")
    return [TensorType(g.dtype, (*g.shape[:g.rank - len(in_size)], *in_size))]


# =============================================================================================
# Indexing, scatter, sorting and scan ops (rules in passes/loopgen/indexing_rules.py).
# Index operands are i64; out-of-range indices are clamped into range (PyTorch raises there),
# so no kernel ever reads or writes outside a buffer.
#
# Ops of category `ordered` are always the root of their own kernel, built by a root rule:
# their result is written in a data-dependent or sequential order (a copy followed by
# updates through indices, a scan along a dim, a sort), not element by element.
# =============================================================================================

@define("gather", "data", 2, """
`out[i] = src[i with dim replaced by index[i]]`; the result has the index's shape.

    %2 = gather(%src, %idx) {dim = 1} : f32[4, 3]   # %src: f32[4, 6], %idx: i64[4, 3]
""")
def _gather(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    src, idx = types
    if not idx.dtype.is_int or idx.rank != src.rank:
        raise OpError("gather: index must be an integer tensor of the source's rank")
    if not 0 <= attrs["dim"] < max(src.rank, 1):
        raise OpError(f"gather: dim {attrs['dim']} out of range")
    return [TensorType(src.dtype, idx.shape)]


def _indexed_shape(name: str, src: TensorType, idx: list[TensorType], attrs: dict[str, Any]) -> tuple[Expr, ...]:
    dims, pos = tuple(attrs["dims"]), int(attrs["pos"])
    if len(dims) != len(idx) or not idx:
        raise OpError(f"{name}: {len(dims)} indexed dims but {len(idx)} index tensors")
    if any(not 0 <= d < src.rank for d in dims) or list(dims) != sorted(set(dims)):
        raise OpError(f"{name}: indexed dims {list(dims)} invalid for rank {src.rank}")
    for t in idx:
        if not t.dtype.is_int or t.shape != idx[0].shape:
            raise OpError(f"{name}: index tensors must be integers of one shape")
    rest = [d for i, d in enumerate(src.shape) if i not in dims]
    if not 0 <= pos <= len(rest):
        raise OpError(f"{name}: pos {pos} out of range")
    return (*rest[:pos], *idx[0].shape, *rest[pos:])


@define("index", "data", -1, """
Advanced indexing `src[..., i0, ..., i1, ...]`: operands `(src, i0, i1, ...)`, the index
tensors (one shape) picking along `dims` of `src`; negative indices count from the end
(unless `wrap = false`, as `index_select` and `embedding`: then they are out of range). An
index out of range is a fault (`checked_index` in the kernel), raised as eager's error.
The result is the non-indexed dims of `src` with the index shape inserted at `pos`.

    %3 = index(%x, %i) {dims = [0], pos = 0} : f32[3, 4]   # %x: f32[5, 4], %i: i64[3]
""")
def _index(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    return [TensorType(types[0].dtype, _indexed_shape("index", types[0], types[1:], attrs))]


@define("flip", "view", 1, """
Reverse the order of elements along `dims`.

    %1 = flip(%0) {dims = [1]} : f32[4, 6]
""")
def _flip(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    _norm_dims("flip", attrs["dims"], types[0].rank)
    return [types[0]]


@define("pad", "data", 1, """
Constant padding: `low[d]` elements before and `high[d]` after each dim (negative values
crop), filled with `value`.

    %1 = pad(%0) {low = [0, 1], high = [0, 2], value = 0.0} : f32[4, 9]   # %0: f32[4, 6]
""")
def _pad(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    t = types[0]
    low, high = tuple(attrs["low"]), tuple(attrs["high"])
    if len(low) != t.rank or len(high) != t.rank:
        raise OpError(f"pad: low/high need {t.rank} entries")
    shape = tuple(d + as_expr(lo) + as_expr(hi) for d, lo, hi in zip(t.shape, low, high))
    return [TensorType(t.dtype, shape)]


@define("slice_scatter", "data", 2, """
`self` with the slice `start, start + step, ...` along `dim` replaced by `src` (as many
elements as `src` has along `dim`).

    %2 = slice_scatter(%x, %s) {dim = 0, start = 1, step = 2} : f32[6, 4]   # %s: f32[2, 4]
""")
def _slice_scatter(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    _same_dtype("slice_scatter", types)
    if types[0].rank != types[1].rank:
        raise OpError("slice_scatter: self and src ranks differ")
    return [types[0]]


SCATTER_REDUCES = ("none", "add", "mul", "max", "min")


@define("scatter", "ordered", 3, """
Copy `self`, then for every element `i` of `index` in row-major order combine `src[i]` into
`out[i with dim replaced by index[i]]` with `reduce` (`none` overwrites, `add`, `mul`, `max`,
`min`). With `include_self = false` the targeted elements start from the reduction's identity
instead of `self`. Duplicate indices are applied in order. With `inplace = true` (`self` a
graph input, see `lower-to-loops`) the result is `self`'s own memory and nothing is copied.

    %3 = scatter(%x, %idx, %src) {dim = 1, reduce = "add", include_self = true} : f32[4, 6]
""")
def _scatter(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    x, idx, src = types
    if attrs["reduce"] not in SCATTER_REDUCES:
        raise OpError(f"scatter: unknown reduce {attrs['reduce']!r}")
    if not idx.dtype.is_int or idx.rank != x.rank or src.rank != x.rank:
        raise OpError("scatter: index and src must have self's rank (index integer)")
    _same_dtype("scatter", [x, src])
    return [x]


@define("index_put", "ordered", -1, """
Copy `self`, then write (or with `accumulate`, add) `values` through advanced indices:
operands `(self, values, i0, i1, ...)`, `dims` and `pos` as for `index`, and `values` has the
shape `index` would return. Duplicate indices are applied in order. With `inplace = true`
(`self` a graph input the graph writes back, as a KV cache; see `lower-to-loops`) the result
is `self`'s own memory: only the indexed elements are stored, nothing is copied.

    %4 = index_put(%cache, %new, %slot) {dims = [1], pos = 1, accumulate = false, inplace = true} : f32[2, 64, 8]   # %new: f32[2, 1, 8], %slot: i64[1]
    %3 = index_put(%x, %v, %i) {dims = [0], pos = 0, accumulate = true} : f32[5, 4]   # %v: f32[3, 4], %i: i64[3]
""")
def _index_put(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    x, vals = types[0], types[1]
    _same_dtype("index_put", [x, vals])
    if vals.shape != _indexed_shape("index_put", x, types[2:], attrs):
        raise OpError("index_put: values do not have the indexed shape")
    return [x]


@define("argsort", "ordered", 1, """
The permutation (i64) that sorts each lane along `dim`, ascending or `descending`; NaN sorts
above every number and equal elements keep their order (a stable sort).

    %1 = argsort(%x) {dim = 1, descending = false} : i64[4, 6]
""")
def _argsort(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    _norm_dims("argsort", [attrs["dim"]], types[0].rank)
    return [types[0].with_dtype(dt.i64)]


SCAN_KINDS = ("add", "mul", "max", "min", "logaddexp", "argmax", "argmin")


@define("scan", "ordered", 1, """
Inclusive scan along `dim` with `kind`: `add` (cumsum), `mul` (cumprod), `max`, `min`,
`logaddexp` (logcumsumexp), or `argmax`/`argmin`: the i64 position of the running maximum
(minimum), the last one among equals, NaN winning (cummax/cummin's indices).

    %1 = scan(%x) {dim = 1, kind = "add"} : f32[4, 6]
""")
def _scan(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    if attrs["kind"] not in SCAN_KINDS:
        raise OpError(f"scan: unknown kind {attrs['kind']!r}")
    _norm_dims("scan", [attrs["dim"]], types[0].rank)
    return [types[0].with_dtype(dt.i64) if attrs["kind"] in ("argmax", "argmin") else types[0]]


# =============================================================================================
# Attention (the loop nest is built by passes/loopgen/attention.py).
# =============================================================================================

@define("attention", "contraction", -1, """
Scaled dot-product attention as one op: `out[.., h, i, :] = sum_j p[i, j] v[.., h / G, j, :]`
with `p = softmax_j(scale * q[.., h, i, :] . k[.., h / G, j, :] + mask)`, computed in f32 and
stored in q's dtype. `q: [*B, Hq, Tq, D]`, each key/value segment `k: [*B, Hk, Tk, D]`, `v:
[*B, Hk, Tk, Dv]`; `G = Hq / Hk` query heads share a key/value head (grouped-query attention,
no repeat materialized). Operands are `q`, then `k, v` of each of `segments` segments, then,
when `masked`, one mask per segment of shape `[*B, Hq, Tq, Tk]` (a view may broadcast it): a
bool mask keeps the keys where it is true, a float mask is added to the scores. The segments
are one softmax over their concatenated keys (a KV cache and the step's new keys, without
concatenating them); `causal` (one segment only) keeps key `j <= i`, aligned top-left as in
PyTorch. Sizes may be symbolic (a cache view of `s0` filled slots). A row with no key left
divides 0 by 0, as PyTorch's softmax does.

    %3 = attention(%q, %k, %v) {scale = 0.125, causal = true, masked = false, segments = 1} : f32[2, 8, 16, 64]
    # %q: f32[2, 8, 16, 64], %k: f32[2, 2, 16, 64], %v: f32[2, 2, 16, 64]
""")
def _attention(types: list[TensorType], attrs: dict[str, Any]) -> list[TensorType]:
    segments, masked, causal = attrs.get("segments", 1), attrs.get("masked", False), attrs.get("causal", False)
    if not isinstance(segments, int) or isinstance(segments, bool) or segments < 1:
        raise OpError(f"attention: segments must be a positive integer, got {segments!r}")
    if not isinstance(masked, bool) or not isinstance(causal, bool):
        raise OpError("attention: masked and causal must be bools")
    if causal and segments != 1:
        raise OpError("attention: causal takes one segment")
    if not isinstance(attrs.get("scale"), float):
        raise OpError(f"attention: scale must be a float, got {attrs.get('scale')!r}")
    expected = 1 + segments * (3 if masked else 2)
    if len(types) != expected:
        raise OpError(f"attention: expected {expected} operands for {segments} segment(s)"
                      f"{' with masks' if masked else ''}, got {len(types)}")
    q = types[0]
    if q.rank < 3 or not q.dtype.is_float:
        raise OpError(f"attention: q must be a float tensor [*B, H, T, D], got {q}")
    batch, hq, tq, d = q.shape[:-3], q.shape[-3], q.shape[-2], q.shape[-1]
    dv: Expr | None = None
    for s in range(segments):
        k, v = types[1 + 2 * s], types[2 + 2 * s]
        for name, t in (("k", k), ("v", v)):
            if t.rank != q.rank or t.dtype != q.dtype:
                raise OpError(f"attention: {name} of segment {s} must be {q.dtype} of rank {q.rank}, got {t}")
            for a, b in zip(t.shape[:-3], batch):
                _static_equal(f"attention: batch dims of q and {name}", a, b)
        for a, b in zip(k.shape[-3:-1], v.shape[-3:-1]):
            _static_equal("attention: heads and keys of k and v", a, b)
        _static_equal("attention: head dim of q and k", k.shape[-1], d)
        hk = k.shape[-3]
        if isinstance(hq, Const) and isinstance(hk, Const) and int(hq.value) % int(hk.value):
            raise OpError(f"attention: {hq} query heads do not group over {hk} key/value heads")
        if dv is not None:
            _static_equal("attention: value dims of the segments", v.shape[-1], dv)
        dv = v.shape[-1]
        if masked:
            m = types[1 + 2 * segments + s]
            want = (*batch, hq, tq, k.shape[-2])
            if m.rank != len(want) or not (m.dtype == dt.bool_ or m.dtype.is_float):
                raise OpError(f"attention: mask of segment {s} must be bool or float {list(map(str, want))}, got {m}")
            for a, b in zip(m.shape, want):
                _static_equal("attention: mask shape", a, b)
    assert dv is not None
    return [TensorType(q.dtype, (*batch, hq, tq, dv))]
