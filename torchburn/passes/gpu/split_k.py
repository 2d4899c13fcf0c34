"""`gpu-split-k`: split the reduction of a matrix product with few output tiles across workgroups.

A GPU GEMM gives each workgroup a tile of the output (`gpu-map`, `codegen/wgsl/gemm.py`). A
product with few output tiles and a long reduction (a transformer's down projection at batch x
sequence = 512 rows: 96 tiles of 64x64 for 768 outputs, 3072 products each) keeps only a few
workgroups busy for a long time on a GPU with 100+ multiprocessors. This pass cuts the k loop
into `S` equal parts: the product becomes a kernel computing the `S` partial products, a batch
loop of `S` more output tiles, into a temporary `%part[S, batch.., M, N]`, and a kernel summing
the parts and applying the epilogue (bias, activation, cast) that the product had. Each sum adds
the same partial products in a fixed order, so results are deterministic (they differ from the
unsplit product only by the association of the additions).

`splits = 0` (auto) splits a product whose static shape has fewer than `min_groups` output
tiles of 64x64 into the fewest parts (2, 4 or 8) that reach it, each part of at least
`min_depth` products and a multiple of 16 of them; `splits = 1` never splits; `splits = S`
splits every product it can in `S`.

Before (`splits = 2`; the program calls `@k0(%a, %b, %out0)`):

    kernel @k0(%a: f32[8, 64] strides [64, 1], %b: f32[64, 8] strides [8, 1], %out0: f32[8, 8] strides [8, 1]) {
      for i0 in 0..8 {
        for i1 in 0..8 {
          alloc %acc: f32[1] strides [1] local
          %acc[0] = 0.0:f32
          for k2 in 0..64 {
            let x3 = %a[i0, k2]
            let x4 = %b[k2, i1]
            %acc[0] = %acc[0] + x3 * x4
          }
          let t5 = %acc[0]
          %out0[i0, i1] = max(t5, 0.0:f32)
        }
      }
    }

After:

    program @f(%a: f32[8, 64] strides [64, 1], %b: f32[64, 8] strides [8, 1]) -> (%out0: f32[8, 8] strides [8, 1]) {
      temp %k0_part: f32[2, 8, 8] strides [64, 8, 1]
      call @k0_part(%a, %b, %k0_part)
      call @k0_sum(%k0_part, %out0)
    }
    kernel @k0_part(%a: f32[8, 64] strides [64, 1], %b: f32[64, 8] strides [8, 1], %k0_part: f32[2, 8, 8] strides [64, 8, 1]) {
      for ks0 in 0..2 {
        for i0 in 0..8 {
          for i1 in 0..8 {
            alloc %acc: f32[1] strides [1] local
            %acc[0] = 0.0:f32
            for k2 in 0..32 {
              let x3 = %a[i0, ks0 * 32 + k2]
              let x4 = %b[ks0 * 32 + k2, i1]
              %acc[0] = %acc[0] + x3 * x4
            }
            %k0_part[ks0, i0, i1] = %acc[0]
          }
        }
      }
    }
    kernel @k0_sum(%k0_part: f32[2, 8, 8] strides [64, 8, 1], %out0: f32[8, 8] strides [8, 1]) {
      for i0 in 0..8 {
        for i1 in 0..8 {
          let psum0 = %k0_part[0, i0, i1]
          let psum1 = psum0 + %k0_part[1, i0, i1]
          let t5 = psum1
          %out0[i0, i1] = max(t5, 0.0:f32)
        }
      }
    }
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Optional

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Var
from ...ir.transform import StmtMutator
from ..base import LoopPass, PassError, register_pass
from .map import _gemm_depth, _perfect_nest
from ..loop.loop_utils import buffers_accessed, substitute_stmt

F32 = ex.ScalarType(dt.f32)
#: Output tile edge the auto rule counts tiles with (`gpu-map`'s smaller GEMM tile).
TILE = 64


@dataclass(frozen=True)
class _Product:
    loops: list[lp.For]
    alloc: lp.Alloc
    init: lp.Store
    kloop: lp.For
    epilogue: tuple[lp.Stmt, ...]


def _match(k: lp.Kernel) -> Optional[_Product]:
    """The product nest of `k` (as `lower-to-loops-gpu` writes it) with static sizes, or None."""
    params = {b.name: b for b in k.params}
    symbols = {v.name for v in k.symbols}
    loops, inner = _perfect_nest(k.body)
    if len(loops) < 2 or _gemm_depth(k.body, params, symbols) != len(loops) or not isinstance(inner, lp.Block) \
            or len(inner.stmts) < 3:
        return None
    alloc, init, kloop, *epilogue = inner.stmts
    if not (isinstance(alloc, lp.Alloc) and isinstance(init, lp.Store) and isinstance(kloop, lp.For)):
        return None
    if any(not isinstance(f.extent, Const) or f.start != Const(0) for f in (*loops, kloop)):
        return None
    return _Product(loops, alloc, init, kloop, tuple(epilogue))


def _trimmed(k: lp.Kernel, extra: tuple[lp.Buffer, ...] = ()) -> lp.Kernel:
    """`k` with only the parameters its body reads or writes (plus `extra`, in order)."""
    used = buffers_accessed(k)
    params = tuple(p for p in k.params if p.name in used) + extra
    return replace(k, params=params)


def _fresh(k: lp.Kernel, prefix: str) -> Var:
    taken = {s.var.name for s in lp.walk_stmts(k.body) if isinstance(s, (lp.For, lp.Let))}
    n = 0
    while f"{prefix}{n}" in taken:
        n += 1
    return Var(f"{prefix}{n}")


def _unused(taken: set[str], prefix: str) -> str:
    n = 0
    while f"{prefix}{n}" in taken:
        n += 1
    taken.add(f"{prefix}{n}")
    return f"{prefix}{n}"


class _ReadAs(StmtMutator):
    """Reads of the accumulator `%acc[0]` become `value`."""

    def __init__(self, acc: str, value: ex.Expr) -> None:
        self.acc, self.value = acc, value

    def visit_Load(self, e: ex.Load) -> ex.Expr:
        return self.value if e.buffer == self.acc else e


@register_pass
@dataclass(frozen=True)
class GpuSplitK(LoopPass):
    """Split the reduction of products with few output tiles (module docstring)."""

    name: ClassVar[str] = "gpu-split-k"
    #: Parts of the k loop: 0 auto, 1 never, S > 1 every product that divides evenly.
    splits: int = 0
    #: Output tiles of 64x64 (with the parts) a product should have (auto).
    min_groups: int = 256
    #: Products per part at least (auto).
    min_depth: int = 256

    def __post_init__(self) -> None:
        for knob in ("splits", "min_groups", "min_depth"):
            value = getattr(self, knob)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise PassError(f"pass {self.name}: {knob}={value!r}; expected a non-negative integer")

    def parts(self, p: _Product) -> int:
        """How many parts the product's k loop is cut into (1: left as it is)."""
        depth = int(p.kloop.extent.value)  # type: ignore[attr-defined]

        def fits(s: int) -> bool:
            return depth % s == 0 and (depth // s) % 16 == 0

        if self.splits == 1:
            return 1
        if self.splits > 1:
            return self.splits if fits(self.splits) else 1
        sizes = [int(f.extent.value) for f in p.loops]  # type: ignore[attr-defined]
        *batch, m, n = sizes
        rows = m
        for b in batch:
            rows *= b
        if rows <= 4:  # a matrix-vector product: `gpu-map` gives it a reduction per output
            return 1
        groups = rows // m * -(-m // TILE) * -(-n // TILE)
        best = 1
        for s in (2, 4, 8):
            if groups * best >= self.min_groups or not fits(s) or depth // s < self.min_depth:
                break
            best = s
        return best

    def run(self, program: lp.Program) -> lp.Program:
        split: dict[str, tuple[lp.Kernel, lp.Kernel, lp.Buffer]] = {}
        names = {b.name for b in (*program.inputs, *program.outputs, *program.temps)} | {k.name for k in program.kernels}
        for k in program.kernels:
            p = _match(k)
            s = 1 if p is None else self.parts(p)
            if p is None or s <= 1:
                continue
            part_name = f"{k.name}_part"
            while part_name in names:
                part_name += "_"
            names.add(part_name)
            split[k.name] = self._split(k, p, s, part_name)
        if not split:
            return program
        kernels: list[lp.Kernel] = []
        for k in program.kernels:
            kernels.extend(split[k.name][:2] if k.name in split else (k,))
        calls: list[lp.KernelCall] = []
        for c in program.calls:
            if c.kernel not in split:
                calls.append(c)
                continue
            first, second, part = split[c.kernel]
            arg = {p.name: (a, c.offset(i)) for i, (p, a) in enumerate(zip(program.kernel(c.kernel).params, c.args))}
            arg[part.name] = (part.name, None)
            for piece in (first, second):
                bound = [arg[p.name] for p in piece.params]
                offsets = tuple(o for _, o in bound) if c.offsets else ()
                calls.append(lp.KernelCall(piece.name, tuple(a for a, _ in bound), offsets))
        temps = program.temps + tuple(x[2] for x in split.values())
        return replace(program, kernels=tuple(kernels), calls=tuple(calls), temps=temps)

    @staticmethod
    def _split(k: lp.Kernel, p: _Product, s: int, part_name: str) -> tuple[lp.Kernel, lp.Kernel, lp.Buffer]:
        sizes = [int(f.extent.value) for f in p.loops]  # type: ignore[attr-defined]
        shape = (s, *sizes)
        strides = []
        acc = 1
        for d in reversed(shape):
            strides.append(acc)
            acc *= d
        part = lp.Buffer(part_name, dt.f32, tuple(Const(d) for d in shape), tuple(Const(x) for x in reversed(strides)))
        depth = int(p.kloop.extent.value)  # type: ignore[attr-defined]
        chunk = depth // s
        sv = _fresh(k, "ks")
        kv = p.kloop.var
        kbody = substitute_stmt(p.kloop.body, {kv.name: ex.add(ex.mul(sv, Const(chunk)), kv)})
        kloop = replace(p.kloop, extent=Const(chunk), body=kbody)
        idx = (sv, *(f.var for f in p.loops))
        acc_load = ex.Load(p.alloc.buffer.name, (Const(0),), F32)
        store = lp.Store(part_name, idx, acc_load)
        nest: lp.Stmt = lp.Block((p.alloc, p.init, kloop, store))
        for f in reversed(p.loops):
            nest = replace(f, body=nest)
        nest = lp.For(sv, Const(0), Const(s), "serial", nest, p.loops[0].annotations)
        first = _trimmed(replace(k, name=f"{k.name}_part", body=nest), (part,))
        # the sum of the parts in a fixed order, as straight-line lets (an elementwise kernel:
        # `gpu-map` gives it vec4 loads and stores), then the product's own epilogue reading it
        taken = {x.var.name for x in lp.walk_stmts(k.body) if isinstance(x, (lp.For, lp.Let))}
        lets: list[lp.Stmt] = []
        total: ex.Expr = ex.Load(part_name, (Const(0), *idx[1:]), F32)
        for n in range(1, s):
            name = _unused(taken, "psum")
            lets.append(lp.Let(Var(name, F32), total))
            total = ex.Binary("add", Var(name, F32), ex.Load(part_name, (Const(n), *idx[1:]), F32), F32)
        name = _unused(taken, "psum")
        lets.append(lp.Let(Var(name, F32), total))
        epilogue = tuple(_ReadAs(p.alloc.buffer.name, Var(name, F32)).visit_stmt(x) for x in p.epilogue)
        body: lp.Stmt = lp.Block((*lets, *epilogue))
        for f in reversed(p.loops):
            body = replace(f, body=body)
        second = _trimmed(replace(k, name=f"{k.name}_sum", params=(part, *k.params), body=body))
        return first, second, part
