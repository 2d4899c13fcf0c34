"""Convolution kernels: register-blocked direct convolutions with fused epilogues.

`conv_root.build_conv` lowers one `conv` (`x: [N, C, *in]`, `w: [Cout, C / groups, *k]`, any
number of spatial dims, stride, padding, dilation, groups), with the elementwise ops fused
after it (bias, batch norm, activation, residual add; see `fuse`), to one of two loop nests
built here, or, for an unpadded 1x1 convolution with enough channels, to the packed product of
`conv_pointwise.py` (`plan_pointwise`). Both direct forms compute a tile of output channels x
output positions along the last spatial dim in vector accumulators, then run the epilogue on
the finished tile before the only store.

**Channels form** (`groups` small, many output channels per group): the vectors run along the
output channels. The weight is packed first, once per call, into vectors of W channels
(`%wp[group block, ci, *taps, lane]`, zeros past the group's channels), so the micro-kernel
loads CV weight vectors per tap and broadcasts one input element per output position
(`mr` positions, CV x mr accumulators):

    for ti in 0..items (parallel)            n, group, channel block, outer positions, width tile
      acc[j][c] = 0                          j < CV channel vectors, c < P positions
      if interior { taps, unmasked } else { taps, clamped and masked }
        for ci in 0..C/groups
          for kh in 0..KH { ih = oh*s - p + kh*d; if 0 <= ih < H {
            for kw in 0..KW {
              wv_j = %wp[g*CB + b0 + j, ci, kh, kw, ramp(0, 1, W)]
              xb_c = broadcast(x[n, g*C/groups + ci, ih, (ow0 + c)*s - p + kw*d])
              acc[j][c] = fma(xb_c, wv_j, acc[j][c]) }}}
      %ct[c, ramp(j*W, 1, W)] = acc[j][c] ; epilogue loops over %ct -> out

**Width form** (depthwise and other convolutions with few channels per group): the vectors
run along the output width (a `ramp` of the input positions, stride s), each of R channels
of the tile broadcasts its own weight tap:

      xv = x[n, cin(co_r), ih, ramp(ow0*s - p + kw*d, s, W)] ; acc[r][v] = fma(xv, broadcast(w[co_r, ci, kh, kw]), acc[r][v])

**Blocks of positions.** Tiles run channel tile outermost (each sweeps every position, its
weights kept in cache) unless the input outgrows L2 and each input element feeds few taps:
then in blocks of position tiles whose
input fits in a quarter of L2, every channel tile inside a block (`ConvPlan.block`), so the
input comes from memory once (`position_block`); the width form, where the whole weight fits
in half of L2, puts its channel tiles innermost instead (`ConvPlan.channels_inner`):

    for ti in 0..n * blocks * tiles_c * B     (n, pb, tc, pi) = unflatten(ti)
      pt = pb * B + pi ; if pt < position tiles { (*rows, tw) = unflatten(pt); the tile as above }

**Bounds.** A tile is *interior* when every tap of every position it computes lies inside the
input along the last dim and the tile is whole; its loads are plain. Other tiles clamp every
input index into the input and select zero for taps in the padding; positions and channels
past the end are clamped to the last one (computed, never stored). Rows of the outer spatial
dims that fall into the padding are skipped with an `if`. The channels form instead reads a
zero-padded copy of the input where any tile would not be interior (padding, or a row whose
last tile is not whole: `padded_channels_input`), sized for whole tiles, so that every tile
takes the plain path. The epilogue stores only the valid part of a tile. No load or store
leaves its buffer.

**Epilogue.** As in `matmul.py`: the tile goes to a local `%ct`, and `for r < rows: for c <
cols: out[n, co0 + r, ..., ow0 + c] = epilogue(%ct[..])`, a loop the vectorizer widens along
the output width.

A convolution whose output width or channels give no useful vector (`plan_conv` returns None)
keeps the element-by-element nest of `nn_rules.py`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, ScalarType, Var
from ...ir.tensor import Op, Value
from .nest_helpers import NestHelpers
from .kernel_builder import KernelBuilder
from .matmul import MIN_PARALLEL_FLOPS, CpuInfo, fused_product, micro_tile, static_int

Index = tuple[Expr, ...]

#: Vector accumulators a micro-kernel keeps at most (16 vector registers on AVX2: the rest hold
#: the weight vectors and broadcasts; a channels-form tile may keep fewer, `channels_tile`).
ACCUMULATORS = 12
#: The same on 512-bit targets (AVX-512, 32 registers). Not 24: 24 accumulators, 4 weight vectors
#: and a broadcast leave 3 registers, and LLVM spilled accumulators in the inner loop (119
#: stack accesses in ResNet's 64-channel 3x3 kernel at 56x56; 231 once batch norm's bias and a
#: ReLU were in the epilogue, whose constants it keeps in registers across the loop). With 20,
#: one thread: that kernel with batch norm and ReLU 1.7-1.8 ms against 2.2-3.1 ms (eager
#: 2.0); none of 12 layers of ResNet-50 and EfficientNet-B0 measured was slower.
ACCUMULATORS_WIDE = 20
#: Input channels x taps from which a width-form tile of channels reads enough input (K
#: elements of each of its positions) that the channel tiles go innermost
#: (`ConvPlan.channels_inner`). ResNet-50's 256-to-64 1x1 at 56x56, one thread: every one of
#: its 7 channel tiles streamed the 3.2 MB input, 256 rows 12.5 KB apart.
CHANNEL_TILES_INNER_MIN_K = 64
#: Pointwise convolutions with at least this many input channels and output channels take
#: the GEMM form (`plan_pointwise`). With 16 input channels the width form was faster (one
#: thread, AVX2, BN folded: EfficientNet's 16-to-96 expansion at 112x112 1.2-1.5 ms against
#: 1.9-2.1 ms: each tile's product is 16 steps long, and copying the input costs a sixth of
#: it); from 24 the GEMM form was (24-to-144 at 56x56 0.52-0.59 against 0.82-0.94 ms).
POINTWISE_GEMM_MIN_CIN = 24
POINTWISE_GEMM_MIN_COUT = 16
#: The output width the width form is planned for where it is symbolic (Dynamo's dynamic shapes:
#: variable-length audio, a second image size): rows of at least two vectors of 16 lanes, so a
#: tile keeps two vectors (the plan of any static row that long). Before, such a convolution
#: (depthwise, or fewer output channels than a vector has lanes) took the per-element nest.
SYMBOLIC_WIDTH_HINT = 64
#: Vector registers a channels-form tile leaves for the input broadcasts that LLVM keeps live
#: across the (fully unrolled) taps of the last dim: with stride-1 taps, position `q + 1` of
#: tap `k` reads what position `q` of tap `k + 1` does, and LLVM reuses the broadcast instead
#: of loading it again (`channels_tile`).
REUSED_BROADCASTS = 2


def channels_tile(cv: int, budget: int, cpu: CpuInfo, k_last: int) -> tuple[int, int]:
    """Vectors of channels and positions of a channels-form tile: at most `budget`
    accumulators (`cv x pos`), and no more registers in all than the file holds: the
    accumulators, the tile's `cv` weight vectors, the broadcast of an input element (unless
    the fma takes it from memory, AVX-512) and the broadcasts reused across the taps of the
    last dim (`REUSED_BROADCASTS`, where it has more than one tap). Where `cv` weight vectors
    leave too few registers for `budget / cv` positions, the tile keeps two weight vectors and
    as many positions as fit: on AVX2 (16 registers) 4 x 3 needed 4 + 12 + 1 + 2 and LLVM
    spilled weight vectors to the stack in the inner loop (12 stack accesses per 36 fmas in
    ResNet's 64-channel 3x3 at 56x56). One thread, CPU time, ResNet-50's 3x3 layers without an
    epilogue, 4 x 3 -> 2 x 5: 64-to-64 at 56x56 4.80 -> 2.97-3.09 ms (eager 2.8-2.9), 128 at
    28x28 6.77 -> 2.82 (eager 2.7-3.1), 256 at 14x14 4.05 -> 3.13 (eager 3.0), 512 at 7x7 8.90
    -> 5.26-5.40 (eager 4.4-4.6); the 7x7 stride-2 stem 8.41 -> 5.91 (eager 6.0-6.3). Of the
    tiles that fit, 2 x 5 was faster than 3 x 3 (3.62, 3.38, 5.58 ms) and 4 x 2 (3.40, 3.84 at
    256, 6.36 at 512): fewer weight vectors, fewer streams of weights per tile."""
    spare = 0 if cpu.folds_broadcast() else 1
    reused = min(max(k_last - 1, 0), REUSED_BROADCASTS)
    registers = cpu.vector_registers()
    pos = max(1, budget // cv)
    if cv * pos + cv + spare + reused > registers:
        cv = min(cv, 2)
        pos = max(1, min(budget // cv, (registers - spare - reused - cv) // cv))
    return cv, pos


@dataclass(frozen=True)
class ConvPlan:
    """Blocking of one convolution: `form` "channels", "width" or "gemm" (`plan_pointwise`),
    `lanes` per vector, `cv` vectors (channels form) or channels (width form; MR in the gemm
    form) per tile, `pos` output positions (channels form) or vectors of positions (width form;
    NR / lanes in the gemm form) per tile, and whether the tiles run on threads."""

    form: str
    lanes: int
    cv: int
    pos: int
    parallel: bool
    #: Width form: the tiles of output channels are the innermost of the tile loop, so that
    #: consecutive tiles read the same block of input (all its channels at the tile's
    #: positions) from the L1/L2 cache while the weight stays in L2; otherwise each tile of
    #: channels streams the whole input (see `CHANNEL_TILES_INNER_MIN_K`).
    channels_inner: bool = False
    #: Tiles of positions per block (0: none). With a block, the tile loop runs
    #: blocks of `block` position tiles outermost and, inside a block, every tile of channels
    #: over the block's positions: the input the block reads stays in L2 while each tile of
    #: channels reads it, where without blocks every tile of channels streamed the whole input
    #: (see `position_block`).
    block: int = 0
    #: GEMM form: output positions per work item (packed input block; see `plan_pointwise`).
    nc: int = 0

    def describe(self) -> str:
        if self.form == "gemm":
            order = " channels inner" if self.channels_inner else ""
            return (f"gemm lanes={self.lanes} mr={self.cv} nr={self.pos * self.lanes} nc={self.nc} "
                    f"parallel={'yes' if self.parallel else 'no'}{order} (packed product over positions)")
        kind = "vectors over channels" if self.form == "channels" else "vectors over width"
        order = " channel tiles inner" if self.channels_inner else ""
        if self.block:
            order += f" position blocks of {self.block} tiles"
        return (f"{self.form} lanes={self.lanes} cv={self.cv} pos={self.pos} "
                f"parallel={'yes' if self.parallel else 'no'}{order} ({kind})")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2_floor(n: int) -> int:
    p = 1
    while p * 2 <= n:
        p *= 2
    return p


#: Blocks of positions only where each input element feeds at most this many taps (the taps
#: over the product of the strides; see `position_block`).
BLOCKED_INPUT_REUSE_MAX = 2.0


def position_block(tiles_c: int, position_tiles: Optional[int], input_bytes: int, weight_bytes: int,
                   reuse: float, cpu: CpuInfo) -> int:
    """Position tiles per block (0: no blocks).

    Without blocks, each of the `tiles_c` tiles of channels sweeps every position, so an input
    larger than L2 comes from memory `tiles_c` times, each tile's many input rows (one stream
    per input channel, more than a prefetcher follows) missing in every cache. Blocks of
    positions whose share of the input fits in a quarter of L2 (the rest holds a tile's
    weights) read the input once, but the whole weight once per block (a contiguous packed
    stream). That pays where an input element feeds few taps (`reuse`: taps over the product
    of the strides, at most
    `BLOCKED_INPUT_REUSE_MAX`: little work per input byte fetched) and the input read again
    costs more than the weight read again (a byte of scattered rows counted twice). One thread,
    CPU time, f32, blocked against not: wav2vec2's 512-to-512 conv1d k3 s2 over 3199 steps
    (reuse 1.5) 25 against 62 ms, eager 19-20; its input gradient's one-tap phase (reuse 1)
    6.4 against 12.3 ms. VGG's 3x3 layers at stride 1 (reuse 9) lose: 256-to-256 at 56x56
    30.6 against 29.0 ms, 512-to-512 at 28x28 34.7 against 31.9, 64-to-128 at 112x112 16.6
    against 15.8; so do inputs that fit in L2 (ResNet-50's 64-to-256 1x1 at 56x56, 0.8 MB:
    1.95 against 1.70 ms; 1024-to-256 at 14x14 1.31 against 1.24).
    """
    if tiles_c < 2 or not position_tiles or position_tiles < 2 or input_bytes <= cpu.l2_bytes:
        return 0
    if reuse > BLOCKED_INPUT_REUSE_MAX:
        return 0
    per_tile = max(1, input_bytes // position_tiles)
    block = max(1, (cpu.l2_bytes // 4) // per_tile)
    if block >= position_tiles:
        return 0
    blocks = _cdiv(position_tiles, block)
    return block if 2 * input_bytes * (tiles_c - 1) >= weight_bytes * (blocks - 1) else 0


def plan_pointwise(cout: int, cin: int, positions: int, batch: Optional[int], dtype: dt.DType,
                   cpu: CpuInfo) -> Optional[ConvPlan]:
    """The GEMM form of a pointwise convolution (`conv_pointwise.py`), or None where the
    direct kernels are kept: fewer than `POINTWISE_GEMM_MIN_CIN` input or
    `POINTWISE_GEMM_MIN_COUT` output channels. MR x NR is `matmul.micro_tile`'s. NC positions per work item, so that the packed
    input block (`Cin x NC`) fills at most a quarter of L2, in a multiple of the threads. The
    panels of positions run outermost (`channels_inner`: each panel stays in L1 while every
    micro-panel of channels reads it) where the packed weight fits in half of L2; a larger
    weight (ResNet-50's 512-to-2048 at 7x7, 4 MB) keeps its micro-panel in L1 instead, over
    every panel of the block."""
    if cout < POINTWISE_GEMM_MIN_COUT or cin < POINTWISE_GEMM_MIN_CIN or positions < 1:
        return None
    lanes = cpu.lanes(dtype)
    mr, nvec = micro_tile(cpu)
    nr = nvec * lanes
    item = max(dt.compute_dtype(dtype).itemsize, 1)
    nc_cap = max(nr, (cpu.l2_bytes // 4) // (cin * item) // nr * nr)
    blocks = _cdiv(positions, min(nc_cap, _cdiv(positions, nr) * nr))
    flops = 2.0 * cout * cin * positions * (batch or (1 << 20))
    parallel = cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS

    def block_size(count: int) -> int:
        return _cdiv(_cdiv(positions, count), nr) * nr

    if parallel and batch is not None:
        # as many blocks for every thread, where the positions allow
        blocks = next((b for b in range(blocks, _cdiv(positions, nr) + 1)
                       if batch * _cdiv(positions, block_size(b)) % cpu.threads == 0), blocks)
    nc = block_size(blocks)
    weight_fits = _cdiv(cout, mr) * mr * cin * item <= cpu.l2_bytes // 2
    return ConvPlan("gemm", lanes, mr, nvec, parallel, channels_inner=weight_fits, nc=nc)


def plan_conv(cout: int, groups: int, cin_g: int, taps: int, out_w: Optional[int], positions: Optional[int],
              batch: Optional[int], dtype: dt.DType, cpu: CpuInfo, stride_one: bool = False,
              epilogue: bool = False, in_positions: Optional[int] = None,
              input_reuse: Optional[float] = None, pointwise: bool = False, k_last: int = 1) -> Optional[ConvPlan]:
    """The blocking for a convolution with `cout` output channels in `groups` groups, `cin_g`
    input channels per group, `taps` kernel taps, `out_w` output positions along the last dim
    and `positions` in all (None: not known), `in_positions` input positions per channel (None:
    not known), `input_reuse` the taps per input element (taps / the product of the strides;
    None: taps x positions / in_positions), `stride_one` when every stride is 1, `epilogue`
    when ops are fused after it, `pointwise` for a 1x1 convolution without padding (the
    GEMM form, `plan_pointwise`, in one group where it pays), `k_last` the taps along the last
    dim (`channels_tile`); None when no form pays."""
    if pointwise and groups == 1 and taps == 1 and positions is not None and (out_w is not None):
        gemm = plan_pointwise(cout, cin_g, positions, batch, dtype, cpu)
        if gemm is not None:
            return gemm
    lanes = cpu.lanes(dtype)
    budget = ACCUMULATORS_WIDE if cpu.vector_bits >= 512 else ACCUMULATORS
    cout_g = cout // groups
    big = 1 << 20
    flops = 2.0 * cout * cin_g * taps * (positions or big) * (batch or big)
    parallel = cpu.threads > 1 and flops >= MIN_PARALLEL_FLOPS
    # A pointwise (1x1, stride 1) convolution over long rows is a product of the weight and
    # rows of the input: its width form shares each input vector among many channels and
    # leaves whole vectors of output positions to the epilogue, where the channels form's
    # epilogue runs on `pos`-wide pieces (EfficientNet's 16-to-96 expansion at 112x112 with
    # batch norm and SiLU, one thread: 1.04 ms against 5.15 ms).
    if input_reuse is None and positions is not None and in_positions:
        input_reuse = taps * positions / in_positions
    reuse = taps if input_reuse is None else input_reuse
    pointwise_rows = taps == 1 and stride_one and out_w is not None and out_w >= 2 * lanes
    # Channels form: at least half of each channel vector is real.
    if cout_g * 2 >= lanes and lanes >= 2 and not pointwise_rows:
        cb = _cdiv(cout_g, lanes)
        # the most vectors per tile (at most 4) that waste the fewest on the last tile of a group
        cv = min(range(min(4, cb), 0, -1), key=lambda v: _cdiv(cb, v) * v - cb)
        cv, pos = channels_tile(cv, budget, cpu, k_last)
        if out_w is not None:
            pos = min(pos, out_w)
        if epilogue and pos >= 4:
            # The epilogue runs along the tile's positions, which the vectorizer widens to the
            # largest power of two and finishes element by element: 6 positions were a vector
            # of 4 and 2 scalar SiLUs. A power of two leaves no scalar tail (one thread, BN and
            # SiLU: EfficientNet's stem 0.83 -> 0.67 ms, 40->240 1x1 at 28x28 0.72 -> 0.61 ms;
            # with ReLU ResNet's 64-channel 3x3 at 56x56 2.19 -> 1.96 ms).
            pos = _pow2_floor(pos)
        elif out_w is not None and pos > 1:
            # Among the 3/4 largest, the fewest tiles x (positions + 1): a last tile that is
            # not whole computes all its positions and stores some, and each tile costs about
            # one position more (its weight loads, its stores). One thread, CPU time: VGG's
            # 512-to-512 at 28x28, 7 tiles of 4 27.8 ms against 6 of 5 28.6; U-Net's 64-to-64
            # at 128x128, 26 tiles of 5 12.1 ms against 32 of 4 12.9.
            pos = min(range(max(1, (3 * pos + 3) // 4), pos + 1), key=lambda p: (_cdiv(out_w, p) * (p + 1), -p))
        block = 0
        if positions is not None and out_w is not None and in_positions is not None:
            block = position_block(_cdiv(cb, cv), positions // out_w * _cdiv(out_w, pos),
                                   cin_g * in_positions * dtype.itemsize, cb * lanes * cin_g * taps * dtype.itemsize,
                                   reuse, cpu)
        return ConvPlan("channels", lanes, cv, pos, parallel, block=block)
    # Width form: vectors along the output width, at most the width (2 lanes at least). A
    # symbolic width is planned at `SYMBOLIC_WIDTH_HINT` (a narrower row masks its tile's
    # missing positions, computed and never stored, as any row's last tile does).
    width = SYMBOLIC_WIDTH_HINT if out_w is None else out_w
    if width < 2:
        return None
    wl = min(lanes, _pow2_floor(width))
    nvec = 2 if width >= 2 * wl and budget >= 8 else 1
    # Channels of a group share their input vectors: as many as the registers hold. A
    # depthwise channel has its own, loaded once per tap: half as many keep the loads ahead.
    rc = max(1, min(cout, budget // nvec // (1 if cout_g > 1 else 2)))
    # Tiles of channels innermost where a tile reads much input (many input channels and taps),
    # the input (at least its output positions' worth) does not fit in L2 and the whole weight
    # fits in half of it: the input is then read from memory once, not once per tile of
    # channels. (Where the input fits in L2, the original order keeps a tile's weights in L1:
    # 64-to-256 1x1 at 56x56, 0.8 MB of input, was no faster inner.)
    weight_bytes = cout * cin_g * taps * dtype.itemsize
    input_bytes = groups * cin_g * (positions or 0) * dtype.itemsize
    inner = (cout > rc and cin_g * taps >= CHANNEL_TILES_INNER_MIN_K
             and weight_bytes <= cpu.l2_bytes // 2 and input_bytes > cpu.l2_bytes)
    block = 0
    if not inner and cout_g > 1 and cin_g * taps >= CHANNEL_TILES_INNER_MIN_K and positions is not None \
            and in_positions is not None:
        # a weight too large for the channel tiles to go inner, over an input that outgrows L2
        # (wav2vec2's 512-to-512 input gradient's one-tap phase, 1 MB of weight, 3.2 MB of input):
        # blocks of positions, as the channels form
        block = position_block(_cdiv(cout, rc), positions // out_w * _cdiv(out_w, nvec * wl),
                               groups * cin_g * in_positions * dtype.itemsize, weight_bytes,
                               reuse, cpu)
    return ConvPlan("width", wl, rc, nvec, parallel, channels_inner=inner, block=block)


# ---- small IR helpers ------------------------------------------------------------------------------

def _ramp(base: Expr, lanes: int, stride: Expr = Const(1)) -> Expr:
    return ex.Ramp(base, stride, ScalarType(dt.index, lanes))


def _vec(e: Expr, lanes: int) -> Expr:
    """A scalar index broadcast to `lanes` (vectors pass through)."""
    return e if e.type.lanes == lanes else ex.Broadcast(e, ScalarType(e.type.dtype, lanes))


def _in_range(e: Expr, size: Expr) -> Expr:
    lanes = e.type.lanes
    ge = ex.Binary("ge", e, _vec(Const(0), lanes), ScalarType(dt.bool_, lanes))
    lt = ex.Binary("lt", e, _vec(size, lanes), ScalarType(dt.bool_, lanes))
    return ex.Binary("and", ge, lt, ScalarType(dt.bool_, lanes))


def _clamp(e: Expr, size: Expr) -> Expr:
    lanes = e.type.lanes
    lo = ex.Binary("max", e, _vec(Const(0), lanes), e.type)
    return ex.Binary("min", lo, _vec(ex.sub(size, Const(1)), lanes), e.type)


def unflatten(let: Callable[[Expr, str], Expr], item: Expr, extents: Sequence[Expr]) -> list[Expr]:
    """The coordinates of `item` in a row-major grid of `extents` (bound with `let`)."""
    coords: list[Expr] = []
    rest = item
    for size in reversed(extents[1:]):
        coords.append(let(ex.mod(rest, size), "q"))
        rest = let(ex.floordiv(rest, size), "q")
    coords.append(rest)
    return list(reversed(coords))


@dataclass(frozen=True)
class _Conv:
    """The sizes and attributes of one convolution, as the builders read them."""

    x: Value
    w: Value
    bias: Optional[Value]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int

    @staticmethod
    def of(op: Op) -> "_Conv":
        def ints(key: str) -> tuple[int, ...]:
            return tuple(int(v) for v in op.attrs[key])
        bias = op.operands[2] if len(op.operands) == 3 else None
        return _Conv(op.operands[0], op.operands[1], bias, ints("stride"), ints("padding"), ints("dilation"),
                     int(op.attrs["groups"]))

    @property
    def nsp(self) -> int:
        return len(self.stride)

    @property
    def in_size(self) -> tuple[Expr, ...]:
        return self.x.shape[2:]

    @property
    def k_size(self) -> tuple[Expr, ...]:
        return self.w.shape[2:]


# ---- the builder -----------------------------------------------------------------------------------

class ConvBuilder(NestHelpers):
    """Builds the loop nest of one convolution kernel (see the module docstring)."""

    def __init__(self, kb: KernelBuilder, root: Op, conv: Op, out: lp.Buffer, plan: ConvPlan) -> None:
        self.kb = kb
        self.root = root
        self.conv = conv
        self.out = out
        self.plan = plan
        self.c = _Conv.of(conv)
        self.out_size = conv.result.shape[2:]
        self.cout = conv.result.shape[1]
        self.cin_g = self.c.w.shape[1]
        self.cout_g = ex.floordiv(self.cout, Const(self.c.groups))
        self.conv_t = conv.result.dtype
        self.acc_t = dt.compute_dtype(self.conv_t)
        self.has_epilogue = root is not conv
        self.pack_stmts: list[lp.Stmt] = []
        self._outer_taps: tuple[Var, ...] = ()

    def fma(self, a: Expr, b: Expr, c: Expr) -> Expr:
        if self.acc_t.is_float:
            return ex.Call("fma", (a, b, c), c.type)
        return ex.Binary("add", ex.Binary("mul", a, b, c.type), c, c.type)

    def scalar_at(self, v: Value, idx: Index) -> Expr:
        return ex.cast(self.kb.value_at(v, idx), self.acc_t)

    def unflatten(self, item: Expr, extents: Sequence[Expr]) -> list[Expr]:
        return unflatten(self.let, item, extents)

    def outer_loop(self, item: Var, extent: Expr, body: lp.Stmt) -> lp.Stmt:
        kb = self.kb
        described = self.plan.describe()
        kb.attrs["conv"] = described
        notes = ((("origin", "; ".join(kb.origins)),) if kb.origins else ()) + (("conv", described),)
        return self.loop(item, extent, body, "parallel" if self.plan.parallel else "serial", notes)

    # -- taps --
    def taps(self, n: Expr, outer: Sequence[Expr], inner: "Callable[[Expr, Index, Var], None]",
             padded: bool = False) -> lp.Stmt:
        """`for ci { for k0 { ih0 = ...; if valid { ... for k_last { inner(ci, ipos, k_last) }}}}`
        over the outer spatial dims (rows in the padding skipped); `padded`: the rows of a
        zero-padded input (`padded_channels_input`), every one valid (no `if`)."""
        kb, c = self.kb, self.c
        ci = self.var("ci")
        kb.push((ci,))
        tap_vars = [self.var("kt") for _ in range(c.nsp)]
        # Build from the innermost tap loop outwards.
        kb.push((tap_vars[-1],))
        ipos: list[Expr] = []
        conds: list[Optional[Expr]] = []
        # The positions of the outer dims are bound where their tap variable is (see below);
        # build them now as expressions (the lets are emitted in the loops' scopes).
        for s in range(c.nsp - 1):
            shift = Const(0 if padded else c.padding[s])
            ipos.append(ex.add(ex.sub(ex.mul(outer[s], Const(c.stride[s])), shift),
                               ex.mul(tap_vars[s], Const(c.dilation[s]))))
            conds.append(_in_range(ipos[-1], c.in_size[s]) if c.padding[s] > 0 and not padded else None)
        self._outer_taps = tuple(tap_vars[:-1])
        inner(ci, tuple(ipos), tap_vars[-1])
        body = kb.pop()
        stmt: lp.Stmt = self.loop(tap_vars[-1], c.k_size[-1], body)
        for s in range(c.nsp - 2, -1, -1):
            cond = conds[s]
            if cond is not None:
                stmt = lp.If(cond, stmt)
            stmt = self.loop(tap_vars[s], c.k_size[s], stmt)
        kb.emit(stmt)
        return self.loop(ci, self.cin_g, kb.pop())

    def interior(self, ow0: Expr, npos: int) -> Expr:
        """Whether positions `ow0 .. ow0 + npos - 1` exist and read only inside the input
        along the last dim, for every tap."""
        c = self.c
        e = c.nsp - 1
        s, p, d = c.stride[e], c.padding[e], c.dilation[e]
        last = ex.add(ex.sub(ex.mul(ex.add(ow0, Const(npos - 1)), Const(s)), Const(p)),
                      ex.mul(ex.sub(c.k_size[e], Const(1)), Const(d)))
        whole = ex.binary("le", ex.add(ow0, Const(npos)), self.out_size[e])
        cond = ex.Binary("and", whole, ex.binary("le", last, ex.sub(c.in_size[e], Const(1))), ex.BOOL)
        if p > 0:
            first = ex.sub(ex.mul(ow0, Const(s)), Const(p))
            cond = ex.Binary("and", cond, ex.binary("ge", first, Const(0)), ex.BOOL)
        return cond

    # -- the epilogue --
    def epilogue(self, n: Expr, co0: Expr, outer: Optional[Sequence[Expr]], ow0: Expr, rows: Expr, cols: Expr,
                 tile_value) -> lp.Stmt:  # type: ignore[no-untyped-def]
        """`for r < rows: for c < cols: out[n, co0 + r, *outer, ow0 + c] = epilogue(tile(r, c))`;
        with `outer` None, `ow0 + c` is a flattened position, stored at its coordinates
        (`PointwiseConvBuilder.flat_output`)."""
        kb = self.kb
        r, cc = self.var("r"), self.var("c")
        kb.push()
        if outer is None:  # a 2-D map: p // W, p % W
            p, width = ex.add(ow0, cc), self.out_size[-1]
            idx = (n, ex.add(co0, r), ex.floordiv(p, width), ex.mod(p, width))
        else:
            idx = (n, ex.add(co0, r), *outer, ex.add(ow0, cc))
        total = tile_value(r, cc)
        if self.c.bias is not None:
            total = ex.Binary("add", total, self.scalar_at(self.c.bias, (ex.add(co0, r),)), total.type)
        value = kb.bind(ex.cast(total, self.conv_t), "x")
        kb.define(self.conv.result, idx, value)
        result = kb.compute(self.root, idx) if self.has_epilogue else value
        kb.used_buffers[self.out.name] = self.out
        kb.emit(lp.Store(self.out.name, idx, result))
        return self.loop(r, rows, self.loop(cc, cols, kb.pop()))

    def store_tile(self, n: Expr, co0: Expr, outer: Sequence[Expr], ow0: Expr, nch: int, npos: int,
                   ch_left: Expr, pos_left: Expr, tile_value) -> None:  # type: ignore[no-untyped-def]
        """The epilogue for a whole tile (constant extents, which the vectorizer likes) or an
        edge tile (the valid part only)."""
        full = ex.Binary("and", ex.binary("ge", ch_left, Const(nch)), ex.binary("ge", pos_left, Const(npos)), ex.BOOL)
        whole = self.epilogue(n, co0, outer, ow0, Const(nch), Const(npos), tile_value)
        edge = self.epilogue(n, co0, outer, ow0, ex.minimum(Const(nch), ch_left), ex.minimum(Const(npos), pos_left),
                             tile_value)
        self.kb.emit(lp.If(full, whole, edge))

    # -- the nest --
    def build(self) -> lp.Stmt:
        return self.build_channels() if self.plan.form == "channels" else self.build_width()

    def build_channels(self) -> lp.Stmt:
        kb, plan, c = self.kb, self.plan, self.c
        w = plan.lanes
        vt = ScalarType(self.acc_t, w)
        lane = _ramp(Const(0), w)
        groups = Const(c.groups)
        cb = ex.floordiv(ex.add(self.cout_g, Const(w - 1)), Const(w))  # vector blocks per group
        wp = self.pack_weight(cb)
        e = c.nsp - 1
        ow_n = self.out_size[e]
        tiles_c = ex.floordiv(ex.add(cb, Const(plan.cv - 1)), Const(plan.cv))
        tiles_w = ex.floordiv(ex.add(ow_n, Const(plan.pos - 1)), Const(plan.pos))
        item = self.var("ti")
        kb.push((item,))
        guard: Optional[Expr] = None
        if plan.block:
            extents, (n, g), tc, outer, tw, guard = self.blocked_tiles(item, [self.c.x.shape[0], groups], tiles_c,
                                                                       tiles_w)
        else:
            extents = [self.c.x.shape[0], groups, tiles_c, *self.out_size[:-1], tiles_w]
            coords = self.unflatten(item, extents)
            n, g, tc, outer, tw = coords[0], coords[1], coords[2], coords[3:-1], coords[-1]
        b0 = self.let(ex.mul(tc, Const(plan.cv)), "b")
        ow0 = self.let(ex.mul(tw, Const(plan.pos)), "ow")
        blocks = [self.let(ex.add(ex.mul(g, cb), ex.minimum(ex.add(b0, Const(j)), ex.sub(cb, Const(1)))), "gb")
                  for j in range(plan.cv)]
        accs = [[self.local("acc", (w,)) for _ in range(plan.pos)] for _ in range(plan.cv)]
        for row in accs:
            for a in row:
                kb.emit(lp.Store(a.name, (lane,), ex.const(0, self.acc_t, w)))
        cin0 = ex.mul(g, self.cin_g)
        s_e, p_e, d_e = c.stride[e], c.padding[e], c.dilation[e]
        xpad = self.padded_channels_input(ex.mul(tiles_w, Const(plan.pos))) if self._channels_need_padding() else None

        def body(masked: bool):  # type: ignore[no-untyped-def]
            def inner(ci: Expr, ipos: Index, kw: Var) -> None:
                cabs = ex.add(cin0, ci)
                wv = [kb.bind(ex.Load(wp.name, (blocks[j], ci, *self._tap_index(kw), lane), vt), "wv")
                      for j in range(plan.cv)]
                for q in range(plan.pos):
                    ow = ex.add(ow0, Const(q))
                    if xpad is not None:  # every position and tap inside the padded copy
                        iw = kb.bind(ex.add(ex.mul(ow, Const(s_e)), ex.mul(kw, Const(d_e))), "iw")
                        pos = [self._row_index(ps) for ps in ipos]
                        xs = ex.cast(ex.Load(xpad.name, (n, cabs, *pos, iw), ScalarType(c.x.dtype)), self.acc_t)
                        xb = kb.bind(ex.Broadcast(kb.bind(xs, "xs"), vt), "xb")
                        for j in range(plan.cv):
                            a = accs[j][q]
                            kb.emit(lp.Store(a.name, (lane,), self.fma(xb, wv[j], ex.Load(a.name, (lane,), vt))))
                        continue
                    if masked:
                        ow = ex.minimum(ow, ex.sub(ow_n, Const(1)))
                    iw = kb.bind(ex.add(ex.sub(ex.mul(ow, Const(s_e)), Const(p_e)), ex.mul(kw, Const(d_e))), "iw")
                    pos = [self._row_index(ps) for ps in ipos]
                    if masked and p_e > 0:
                        xs = self.scalar_at(c.x, (n, cabs, *pos, _clamp(iw, c.in_size[e])))
                        xs = ex.select(kb.bind(_in_range(iw, c.in_size[e])), xs, Const(0, ScalarType(self.acc_t)))
                    else:
                        xs = self.scalar_at(c.x, (n, cabs, *pos, iw))
                    xb = kb.bind(ex.Broadcast(kb.bind(xs, "xs"), vt), "xb")
                    for j in range(plan.cv):
                        a = accs[j][q]
                        kb.emit(lp.Store(a.name, (lane,), self.fma(xb, wv[j], ex.Load(a.name, (lane,), vt))))
            kb.push()
            kb.emit(self.taps(n, outer, inner, padded=xpad is not None))
            return kb.pop()

        if xpad is not None:
            kb.emit(body(False))
        else:
            kb.emit(lp.If(self.interior(ow0, plan.pos), body(False), body(True)))
        tile = self.local("ct", (plan.pos, plan.cv * w))
        for j in range(plan.cv):
            for q in range(plan.pos):
                kb.emit(lp.Store(tile.name, (Const(q), _ramp(Const(j * w), w)), ex.Load(accs[j][q].name, (lane,), vt)))
        co_in_g = ex.mul(b0, Const(w))
        co0 = self.let(ex.add(ex.mul(g, self.cout_g), co_in_g), "co")
        ch_left = ex.sub(self.cout_g, co_in_g)
        pos_left = ex.sub(ow_n, ow0)
        self.store_tile(n, co0, outer, ow0, plan.cv * w, plan.pos, ch_left, pos_left,
                        lambda r, q: ex.Load(tile.name, (q, r), ScalarType(self.acc_t)))
        if guard is not None:
            kb.emit(lp.If(guard, kb.pop()))
        return lp.block(*self.pack_stmts, self.outer_loop(item, self._product(extents), kb.pop()))

    def blocked_tiles(self, item: Var, lead: list[Expr], tiles_c: Expr, tiles_w: Expr
                      ) -> tuple[list[Expr], list[Expr], Expr, list[Expr], Expr, Optional[Expr]]:
        """The tile loop in blocks of positions (`ConvPlan.block`): `item` over `[*lead,
        position block, channel tile, position tile in the block]`. Returns the extents, the
        lead coordinates, the channel tile, the outer rows, the width tile and the guard that
        skips the missing tiles of a partial last block (None when every block is whole; else
        a frame is pushed for the guarded body, which the caller pops into an `If`)."""
        block = self.plan.block
        places = [*self.out_size[:-1], tiles_w]
        ptiles = self._product(places)
        blocks_ = ex.floordiv(ex.add(ptiles, Const(block - 1)), Const(block))
        extents = [*lead, blocks_, tiles_c, Const(block)]
        coords = self.unflatten(item, extents)
        pb, tc, pi = coords[-3:]
        pt = self.let(ex.add(ex.mul(pb, Const(block)), pi), "pt")
        guard: Optional[Expr] = None
        whole = static_int(ptiles)
        if whole is None or whole % block:
            guard = ex.binary("lt", pt, ptiles)
            self.kb.push()
        pcoords = self.unflatten(pt, places)
        return extents, coords[:-3], tc, pcoords[:-1], pcoords[-1], guard

    def _row_index(self, p: Expr) -> Expr:
        """An outer input row index (its `if` guarantees it is inside the input)."""
        return self.kb.bind(p, "ih")

    def _tap_index(self, kw: Var) -> tuple[Expr, ...]:
        """The tap index of the packed weight: the outer tap variables, then `kw`."""
        return (*self._outer_taps, kw)

    @staticmethod
    def _product(extents: Sequence[Expr]) -> Expr:
        total: Expr = Const(1)
        for x in extents:
            total = ex.mul(total, x)
        return total

    def pack_weight(self, cb: Expr) -> lp.Buffer:
        """`%wp[g * CB + b, ci, *taps, lane] = w[g * Cout/groups + b * W + lane, ci, *taps]`,
        zero past the group's channels: a workspace buffer filled once per call, before the
        tiles (`self.pack_stmts`)."""
        kb, c, w = self.kb, self.c, self.plan.lanes
        shape = (ex.mul(Const(c.groups), cb), self.cin_g, *c.k_size, Const(w))
        wp = kb.scratch(self.acc_t, shape)
        vars_ = kb.loops(shape, "p")
        kb.push(vars_)
        gb, ci, taps, ln = vars_[0], vars_[1], vars_[2:-1], vars_[-1]
        g = ex.floordiv(gb, cb)
        co_g = kb.bind(ex.add(ex.mul(ex.mod(gb, cb), Const(w)), ln), "co")
        co = ex.add(ex.mul(g, self.cout_g), ex.minimum(co_g, ex.sub(self.cout_g, Const(1))))
        value = self.scalar_at(c.w, (co, ci, *taps))
        ok = kb.bind(ex.binary("lt", co_g, self.cout_g))
        kb.emit(lp.Store(wp.name, vars_, ex.select(ok, kb.bind(value, "wx"), Const(0, ScalarType(self.acc_t)))))
        self.pack_stmts = [kb.nest(vars_, shape, kb.pop())]
        return wp

    def build_width(self) -> lp.Stmt:
        kb, plan, c = self.kb, self.plan, self.c
        w = plan.lanes
        vt = ScalarType(self.acc_t, w)
        lane = _ramp(Const(0), w)
        e = c.nsp - 1
        ow_n = self.out_size[e]
        span = plan.pos * w
        tiles_c = ex.floordiv(ex.add(self.cout, Const(plan.cv - 1)), Const(plan.cv))
        tiles_w = ex.floordiv(ex.add(ow_n, Const(span - 1)), Const(span))
        item = self.var("ti")
        kb.push((item,))
        guard: Optional[Expr] = None
        if plan.block:
            extents, (n,), tc, outer, tw, guard = self.blocked_tiles(item, [c.x.shape[0]], tiles_c, tiles_w)
        elif plan.channels_inner:
            extents = [c.x.shape[0], *self.out_size[:-1], tiles_w, tiles_c]
            coords = self.unflatten(item, extents)
            n, outer, tw, tc = coords[0], coords[1:-2], coords[-2], coords[-1]
        else:
            extents = [c.x.shape[0], tiles_c, *self.out_size[:-1], tiles_w]
            coords = self.unflatten(item, extents)
            n, tc, outer, tw = coords[0], coords[1], coords[2:-1], coords[-1]
        co0 = self.let(ex.mul(tc, Const(plan.cv)), "co")
        ow0 = self.let(ex.mul(tw, Const(span)), "ow")
        chans = [self.let(ex.minimum(ex.add(co0, Const(r)), ex.sub(self.cout, Const(1))), "cr")
                 for r in range(plan.cv)]
        cin0 = [self.let(ex.mul(ex.floordiv(ch, self.cout_g), self.cin_g), "cg") for ch in chans]
        accs = [[self.local("acc", (w,)) for _ in range(plan.pos)] for _ in range(plan.cv)]
        for row in accs:
            for a in row:
                kb.emit(lp.Store(a.name, (lane,), ex.const(0, self.acc_t, w)))
        s_e, p_e, d_e = c.stride[e], c.padding[e], c.dilation[e]
        in_w = c.in_size[e]
        xpad = self.padded_input(ex.mul(tiles_w, Const(span))) if self._needs_padded_input() else None

        def body(masked: bool):  # type: ignore[no-untyped-def]
            def inner(ci: Expr, ipos: Index, kw: Var) -> None:
                pos = [self._row_index(ps) for ps in ipos]
                taps = self._tap_index(kw)
                base = kb.bind(ex.add(ex.sub(ex.mul(ow0, Const(s_e)), Const(p_e)), ex.mul(kw, Const(d_e))), "iw")
                if xpad is not None:  # the phase of the tap, and its first position in that phase
                    phase = kb.bind(ex.mod(ex.mul(kw, Const(d_e)), Const(s_e)), "ph") if s_e > 1 else Const(0)
                    q0 = kb.bind(ex.add(ow0, ex.floordiv(ex.mul(kw, Const(d_e)), Const(s_e))), "q")
                for r in range(plan.cv):
                    wb = kb.bind(ex.Broadcast(kb.bind(self.scalar_at(c.w, (chans[r], ci, *taps)), "ws"), vt), "wb")
                    cabs = ex.add(cin0[r], ci)
                    for v in range(plan.pos):
                        iv = _ramp(ex.add(base, Const(v * w * s_e)), w, Const(s_e))
                        if xpad is not None:
                            xi = (n, cabs, *pos, phase, _ramp(ex.add(q0, Const(v * w)), w))
                            xv = ex.cast(ex.Load(xpad.name, xi, ScalarType(c.x.dtype, w)), self.acc_t)
                        elif masked:
                            ivl = kb.bind(iv, "iv")
                            xv: Expr = ex.Load(self._x_buffer(), self._x_index(n, cabs, pos, _clamp(ivl, in_w)),
                                               ScalarType(c.x.dtype, w))
                            xv = ex.cast(xv, self.acc_t)
                            if p_e > 0:
                                xv = ex.select(kb.bind(_in_range(ivl, in_w)), kb.bind(xv, "xv"), ex.const(0, self.acc_t, w))
                        else:
                            xv = ex.cast(ex.Load(self._x_buffer(), self._x_index(n, cabs, pos, iv),
                                                 ScalarType(c.x.dtype, w)), self.acc_t)
                        xv = kb.bind(xv, "xv")
                        a = accs[r][v]
                        kb.emit(lp.Store(a.name, (lane,), self.fma(xv, wb, ex.Load(a.name, (lane,), vt))))
            kb.push()
            kb.emit(self.taps(n, outer, inner))
            return kb.pop()

        if xpad is not None:
            kb.emit(body(False))
        else:
            kb.emit(lp.If(self.interior(ow0, span), body(False), body(True)))
        tile = self.local("ct", (plan.cv, span))
        for r in range(plan.cv):
            for v in range(plan.pos):
                kb.emit(lp.Store(tile.name, (Const(r), _ramp(Const(v * w), w)), ex.Load(accs[r][v].name, (lane,), vt)))
        self.store_tile(n, co0, outer, ow0, plan.cv, span, ex.sub(self.cout, co0), ex.sub(ow_n, ow0),
                        lambda r, q: ex.Load(tile.name, (r, q), ScalarType(self.acc_t)))
        if guard is not None:
            kb.emit(lp.If(guard, kb.pop()))
        return lp.block(*self.pack_stmts, self.outer_loop(item, self._product(extents), kb.pop()))

    def _needs_padded_input(self) -> bool:
        """Whether the width form reads a padded, phase-split copy of the input
        (`padded_input`): with padding along the last dim, the tiles at both ends of every
        row would clamp and mask each vector load (a gather per tap); with a stride, every
        load would be a strided gather. (A last tile longer than the rest of a row, without
        padding, is one tile per row: it stays masked.)"""
        e = self.c.nsp - 1
        return self.c.padding[e] > 0 or self.c.stride[e] > 1

    def padded_input(self, out_w: Expr) -> lp.Buffer:
        """The input's rows zero-padded and split by phase of the stride: `%xp[n, c, *rows, ph,
        q]` is the padded row's element `q * s + ph` (`x[.., q * s + ph - p]`, zero outside the
        row), for every `q` that `out_w` output positions read. A workspace filled once per
        call (`self.pack_stmts`), so that every tile of the width form loads plain vectors from
        it: tap `k` of output positions `ow..` reads phase `k*d % s` at `ow + k*d // s ..`
        (contiguous, also for a strided convolution; no clamp, no mask, no gather per tap).

            stride 1: for n, c, *rows { for j < p: xp[.., 0, j] = 0;
                                        for iw < W: xp[.., 0, p + iw] = x[.., iw];
                                        for j < Q - p - W: xp[.., 0, p + W + j] = 0 }
            stride s: for n, c, *rows, ph < s, q < Q { i = q*s + ph - p;
                                        xp[.., ph, q] = select(0 <= i < W, x[.., clamp(i)], 0) }
        """
        kb, c = self.kb, self.c
        e = c.nsp - 1
        s_e, p_e, d_e = c.stride[e], c.padding[e], c.dilation[e]
        in_w = c.in_size[e]
        xt = ScalarType(c.x.dtype)
        zero = Const(0, xt)
        span_taps = ex.floordiv(ex.mul(ex.sub(c.k_size[e], Const(1)), Const(d_e)), Const(s_e))
        width = ex.add(out_w, span_taps)
        if s_e == 1:
            width = ex.maximum(width, ex.add(in_w, Const(p_e)))
        outer = (c.x.shape[0], c.x.shape[1], *c.in_size[:-1])
        xp = kb.scratch(c.x.dtype, (*outer, Const(s_e), width))
        vars_ = kb.loops(outer, "x")
        kb.push(vars_)
        if s_e == 1:
            j, iw, k = self.var("j"), self.var("iw"), self.var("j")
            kb.emit(self.loop(j, Const(p_e), lp.Store(xp.name, (*vars_, Const(0), j), zero)))
            load = ex.Load(self._x_buffer(), (*vars_, iw), xt)
            kb.emit(self.loop(iw, in_w, lp.Store(xp.name, (*vars_, Const(0), ex.add(iw, Const(p_e))), load)))
            tail = ex.sub(width, ex.add(in_w, Const(p_e)))
            kb.emit(self.loop(k, tail, lp.Store(xp.name, (*vars_, Const(0), ex.add(ex.add(in_w, Const(p_e)), k)), zero)))
        else:
            ph, q = self.var("ph"), self.var("q")
            kb.push()
            i = kb.bind(ex.sub(ex.add(ex.mul(q, Const(s_e)), ph), Const(p_e)), "i")
            load = kb.bind(ex.Load(self._x_buffer(), (*vars_, _clamp(i, in_w)), xt), "x")
            kb.emit(lp.Store(xp.name, (*vars_, ph, q), ex.select(kb.bind(_in_range(i, in_w)), load, zero)))
            kb.emit(self.loop(ph, Const(s_e), self.loop(q, width, kb.pop())))
        self.pack_stmts.append(kb.nest(vars_, outer, kb.pop()))
        return xp

    def _channels_need_padding(self) -> bool:
        """Whether the channels form reads a zero-padded copy of the input
        (`padded_channels_input`): with padding, or a last tile of positions that is not whole,
        some tiles would clamp and mask every load of every tap. VGG's 512-channel 3x3 at
        28x28 (pad 1, 6 tiles of 5 positions a row, the first and last masked), one thread,
        CPU time: 33.6 ms masked; the same layer without padding on a 30x30 input 29.0."""
        c = self.c
        if any(p > 0 for p in c.padding):
            return True
        ow_n = static_int(self.out_size[-1])
        return ow_n is None or ow_n % self.plan.pos != 0

    def padded_channels_input(self, out_w: Expr) -> lp.Buffer:
        """The input zero-padded in every spatial dim: `%xp[n, c, *rows, q]` is `x[n, c, *(rows
        - p), q - p]`, zero outside the input, for every row and column that the output's rows
        and `out_w` positions (whole tiles) read. A workspace filled once per call
        (`self.pack_stmts`), so that every tile of the channels form loads plain elements,
        no clamp, no mask, no row `if`:

            for n, c, *rows { if rows - p inside the input {
                                for j < min(p, Q): xp[.., j] = 0
                                for iw < clamp(Q - p, 0, W): xp[.., p + iw] = x[.., rows - p, iw]
                                for j < rest: xp[.., p + copied + j] = 0 }
                              else { for j < Q: xp[.., j] = 0 } }
        """
        kb, c = self.kb, self.c
        e = c.nsp - 1
        xt = ScalarType(c.x.dtype)
        zero = Const(0, xt)
        sizes: list[Expr] = []
        for s in range(c.nsp):
            o = out_w if s == e else self.out_size[s]
            span = ex.mul(ex.sub(c.k_size[s], Const(1)), Const(c.dilation[s]))
            sizes.append(ex.add(ex.add(ex.mul(ex.sub(o, Const(1)), Const(c.stride[s])), span), Const(1)))
        outer = (c.x.shape[0], c.x.shape[1], *sizes[:-1])
        xp = kb.scratch(c.x.dtype, (*outer, sizes[-1]))
        vars_ = kb.loops(outer, "x")
        rows = [ex.sub(r, Const(c.padding[s])) for s, r in enumerate(vars_[2:])]
        width, p_e, in_w = sizes[-1], c.padding[e], c.in_size[e]
        left = ex.minimum(Const(p_e), width)
        mid = ex.maximum(Const(0), ex.minimum(in_w, ex.sub(width, Const(p_e))))
        right = ex.sub(ex.sub(width, left), mid)
        kb.push(vars_)
        j, iw, k, z = self.var("j"), self.var("iw"), self.var("j"), self.var("j")
        kb.push()
        kb.emit(self.loop(j, left, lp.Store(xp.name, (*vars_, j), zero)))
        load = ex.Load(self._x_buffer(), (vars_[0], vars_[1], *rows, iw), xt)
        kb.emit(self.loop(iw, mid, lp.Store(xp.name, (*vars_, ex.add(iw, Const(p_e))), load)))
        kb.emit(self.loop(k, right, lp.Store(xp.name, (*vars_, ex.add(ex.add(left, mid), k)), zero)))
        copy = kb.pop()
        zeros = self.loop(z, width, lp.Store(xp.name, (*vars_, z), zero))
        conds = [_in_range(r, c.in_size[s]) for s, r in enumerate(rows) if c.padding[s] > 0]
        if conds:
            ok = conds[0]
            for cond in conds[1:]:
                ok = ex.Binary("and", ok, cond, ex.BOOL)
            kb.emit(lp.If(ok, copy, zeros))
        else:
            kb.emit(copy)
        self.pack_stmts.append(kb.nest(vars_, outer, kb.pop()))
        return xp

    def _x_buffer(self) -> str:
        buf = self.kb.buffers[self.c.x]
        self.kb.used_buffers[buf.name] = buf
        return buf.name

    @staticmethod
    def _x_index(n: Expr, cabs: Expr, pos: Sequence[Expr], last: Expr) -> Index:
        return (n, cabs, *pos, last)


def fused_conv(root: Op, materialized: set[Value]) -> Optional[Op]:
    """`fused_product` for `conv`."""
    return fused_product(root, materialized, "conv")


def conv_plan_for(conv: Op, cpu: CpuInfo, epilogue: bool = False) -> Optional[ConvPlan]:
    """The plan `build_conv` would use for `conv` (with ops fused after it where `epilogue`),
    or None (element-by-element nest)."""
    c = _Conv.of(conv)
    sizes = [static_int(d) for d in (conv.result.shape[1], c.w.shape[1], *c.k_size)]
    if any(s is None for s in sizes) or c.groups < 1:
        return None
    cout, cin_g, *ks = [int(s) for s in sizes if s is not None]
    if cout % c.groups or cout == 0 or cin_g == 0 or any(k == 0 for k in ks):
        return None
    taps = 1
    for k in ks:
        taps *= k
    out = [static_int(d) for d in conv.result.shape[2:]]
    positions: Optional[int] = 1
    for o in out:
        positions = None if o is None or positions is None else positions * o
    if positions == 0:
        return None
    in_positions: Optional[int] = 1
    for i in c.in_size:
        si = static_int(i)
        in_positions = None if si is None or in_positions is None else in_positions * int(si)
    pointwise = taps == 1 and not any(c.padding)
    return plan_conv(cout, c.groups, cin_g, taps, out[-1], positions, static_int(conv.result.shape[0]),
                     dt.compute_dtype(conv.result.dtype), cpu, stride_one=all(st == 1 for st in c.stride),
                     epilogue=epilogue, in_positions=in_positions,
                     input_reuse=taps / math.prod(c.stride), pointwise=pointwise, k_last=ks[-1])
