"""WGSL for the `rows` mapping of `gpu-map` (`passes/gpu/rows.py`): a row kernel in one pass.

One workgroup per row, or `W / R` rows per workgroup of `W` invocations when the row is short
(`gpu_row_wg = R` invocations per row). Invocation `lane` of a row handles elements
`lane, lane + R, lane + 2R...` in every loop over the row (`gpu = "lanes"`), four consecutive
elements per step when the row is vectorized (`gpu_vec = "4"`: vec4 loads and stores). With a
static row length each loop runs a constant trip count `C`, and:

- **the row stays in registers**: an element a later loop reads again (the input of softmax's
  max, exp and sum; the `exp` stored by one loop and rescaled by the next) is kept in a
  per-invocation array `tb_cN[C]` from its first load or store; a global store that a later
  loop overwrites at the same place is dropped (softmax writes its output once);
- **reductions** are combined after the loop that computes them: each invocation's partial,
  then a tree in workgroup memory over the row's `R` invocations (all accumulators of the loop
  in the same tree), or, where the adapter has `subgroups`: a row that has the whole
  workgroup, `subgroupAdd`/`Max`/... and one workgroup-memory step across subgroups; several
  rows a workgroup, `subgroupShuffleXor` butterflies inside each row's invocations
  (`_reduce_lanes_subgroup`). Every invocation then holds the row's value for the loops that
  follow.

Stores outside the loops over the row (a per-row result) are made by the row's lane 0. Any row
length is safe: the last step's elements past the end are skipped, and rows past the end of a
workgroup of several rows take part in the barriers but load and store nothing.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Collection, Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.dtypes import DType
from ...ir.expr import Const, Expr, Var
from . import ops
from .expr import Rendered, const_text
from .kernel import KernelEmitter, loop_nest, product
from .shader import Grid, KernelShader
from .types import WgslUnsupported, value_type

#: Registers (scalars per invocation) the row cache may take.
MAX_CACHE_SCALARS = 64
#: Steps per loop over the row up to which the loop is unrolled (register indices constant).
MAX_UNROLL = 32
#: Combiners with a subgroup builtin.
SUBGROUP_OPS = {"add": "subgroupAdd", "mul": "subgroupMul", "min": "subgroupMin", "max": "subgroupMax"}

Key = tuple[str, tuple[Expr, ...]]


def _stmts(s: lp.Stmt) -> tuple[lp.Stmt, ...]:
    return s.stmts if isinstance(s, lp.Block) else (s,)


def identity(op: str, d: DType) -> object:
    """The neutral element of a combiner for dtype `d`."""
    if op == "add":
        return 0
    if op == "mul":
        return 1
    if op == "and":
        return True
    if op == "or":
        return False
    big: object = float("inf") if d.is_float else (1 << 31) - 1
    if op == "min":
        return big
    return -big if d.is_float else -(1 << 31)  # type: ignore[operator]


@dataclass
class CachePlan:
    """Which row elements live in registers: slot per key, where each slot is first filled,
    and which global stores a later loop overwrites."""

    slots: dict[Key, int] = field(default_factory=dict)
    #: (loop index, key) pairs whose first access is a load: fill the slot there.
    fill_at: dict[int, list[Key]] = field(default_factory=dict)
    #: (loop index, key) of stores a later loop overwrites (dropped).
    dropped: set[tuple[int, Key]] = field(default_factory=set)
    dtypes: dict[Key, DType] = field(default_factory=dict)


class RowsEmitter(KernelEmitter):
    """A `KernelEmitter` for kernels whose body carries the `rows` mapping."""

    def emit(self) -> KernelShader:
        prelude, nest = self._split(self.kernel.body)
        loops, inner = loop_nest(nest, "rows")
        if not loops:
            raise WgslUnsupported(f"kernel @{self.kernel.name} has no row loops")
        wg = int(loops[0].annotation("gpu_wg") or 256)
        self.row_wg = int(loops[0].annotation("gpu_row_wg") or wg)
        if wg > self.caps.max_invocations or wg % self.row_wg:
            raise WgslUnsupported(f"row workgroup {wg}/{self.row_wg} does not fit the device")
        self.wg = wg
        per_group = wg // self.row_wg
        self.live = ""
        self.in_lanes: Optional[int] = None
        self.vec_accs: set[str] = set()
        self.cache = CachePlan()
        extents = [f.extent for f in loops]
        count = self.r.scalar(product(extents))
        if per_group > 1:
            self.line(f"let tb_lane = lid % {self.row_wg}u;")
            self.line(f"let tb_g = (wid.y * nwg.x + wid.x) * {per_group}u + lid / {self.row_wg}u;")
            self.line(f"let tb_live = tb_g < u32({count});")
            self.line(f"let tb_gc = min(tb_g, u32({count}) - 1u);")
            self.live = "tb_live"
            linear = "tb_gc"
        else:
            self.line("let tb_lane = lid;")
            self.line("let tb_g = wid.y * nwg.x + wid.x;")
            self.line(f"if (tb_g >= u32({count})) {{ return; }}")
            linear = "tb_g"
        for s in prelude:
            self.stmt(s)
        self.unflatten(linear, loops, extents)
        self.row_allocs = {s.buffer.name: s.buffer for s in _stmts(inner) if isinstance(s, lp.Alloc)}
        self.lanes_loops = [s for s in _stmts(inner) if isinstance(s, lp.For) and s.annotation("gpu") == "lanes"]
        self.vec = 1
        self.steps: Optional[int] = None
        if self.lanes_loops:
            extent = self.lanes_loops[0].extent
            if all(f.annotation("gpu_vec") == "4" for f in self.lanes_loops) and self._plan_rows_vec4():
                self.vec = 4
            if isinstance(extent, Const):
                self.steps = -(-int(extent.value) // (self.vec * self.row_wg))
            self.cache = self._plan_cache()
        elif not any(isinstance(s, lp.For) and s.annotation("gpu") == "blocks" for s in _stmts(inner)):
            raise WgslUnsupported(f"kernel @{self.kernel.name}: a row body without loops over the row")
        self.uses_subgroups = False
        self.subgroup_ok = self.caps.subgroups
        self.blocks_vec = False
        self.shuffles = 0
        self._row_scope(_stmts(inner))
        groups = ex.floordiv(ex.add(product(extents), Const(per_group - 1)), Const(per_group))
        blocks = any(isinstance(s, lp.For) and s.annotation("gpu") == "blocks" for s in _stmts(inner))
        summary = "rows" + ("/blocks" if blocks else "") + (
            "/vec4" if self.vec == 4 or self.blocks_vec else "") + ("/cached" if self.cache.slots else "") + (
            "/subgroup" if self.uses_subgroups else "/tree")
        return self._finish(Grid((groups, Const(1), Const(1)), wg, "rows"), wg, summary)

    @staticmethod
    def _split(body: lp.Stmt) -> tuple[tuple[lp.Stmt, ...], lp.Stmt]:
        stmts = _stmts(body)
        return stmts[:-1], stmts[-1]

    # ---- plans ----------------------------------------------------------------------------------------
    def _plan_rows_vec4(self) -> bool:
        """Every loop over the row runs on vec4s (contiguous, aligned accesses; see `_plan_vec4`)."""
        saved = {n: a.vec4 for n, a in self.params.items()}
        varying: set[str] = set()
        for f in self.lanes_loops:
            accs = {s.buffer for s in _stmts(f.body) if isinstance(s, lp.Store) and s.buffer in self.row_allocs}
            if any(self.row_allocs[a].dtype.is_bool for a in accs):
                ok = False
            else:
                # an update `%acc[0] = %acc[0] op x` is checked as `let probe = x`
                ok = self._plan_vec4([f], self._probed(f, accs))
                if ok:
                    varying |= self.vector_vars
            if not ok:
                for n, a in self.params.items():
                    a.vec4 = saved[n]
                self.vector_vars, self.vec_var = set(), None
                return False
        self.vector_vars = varying
        return True

    @staticmethod
    def _probe(s: lp.Store) -> lp.Let:
        v = s.value
        cur = ex.Load(s.buffer, s.index, v.type)
        if isinstance(v, ex.Call):  # `fma(x, w, acc)`: what varies is x * w
            other: Expr = ex.Binary("mul", v.args[0], v.args[1], v.type)
        else:
            assert isinstance(v, ex.Binary)
            other = v.b if v.a == cur else v.a
        return lp.Let(Var(f"tb_probe_{s.buffer}", other.type), other)

    def _canon(self, f: lp.For, index: tuple[Expr, ...]) -> tuple[Expr, ...]:
        return tuple(ex.substitute(i, {f.var.name: Var("tb_row_e", f.var.type)}) for i in index)

    def _plan_cache(self) -> CachePlan:
        plan = CachePlan()
        if self.steps is None:
            return plan
        events: list[tuple[int, str, Key, DType]] = []  # (loop, "load"/"store", key, dtype)
        for li, f in enumerate(self.lanes_loops):
            inner_lets = {s.var.name for s in _stmts(f.body) if isinstance(s, lp.Let)}
            for s in _stmts(f.body):
                for e in lp.stmt_exprs(s):
                    for n in ex.walk(e):
                        if isinstance(n, ex.Load) and n.buffer in self.params:
                            names = set().union(*(ex.free_vars(i) for i in n.index))
                            if f.var.name in names and not names & inner_lets:
                                events.append((li, "load", (n.buffer, self._canon(f, n.index)), n.type.dtype))
                if isinstance(s, lp.Store) and s.buffer in self.params:
                    events.append((li, "store", (s.buffer, self._canon(f, s.index)), self.params[s.buffer].buffer.dtype))
        per_slot = self.steps * self.vec
        for li, kind, key, d in events:
            if d.is_bool or key in plan.slots:
                continue
            later_loads = any(l2 > li and k2 == "load" and key2 == key for l2, k2, key2, _ in events)
            if not later_loads or (len(plan.slots) + 1) * per_slot > MAX_CACHE_SCALARS:
                continue
            plan.slots[key] = len(plan.slots)
            plan.dtypes[key] = d
            if kind == "load":
                plan.fill_at.setdefault(li, []).append(key)
        for li, kind, key, _ in events:
            if kind == "store" and key in plan.slots and any(
                    l2 > li and k2 == "store" and key2 == key for l2, k2, key2, _ in events):
                plan.dropped.add((li, key))
        return plan

    # ---- statements -----------------------------------------------------------------------------------
    def _blocks(self, s: lp.For) -> None:
        """A serial loop over a row's ggml blocks (`passes/gpu/block_rows.py`): the row's `R`
        invocations take `G = R / E` blocks a step, `E` invocations a block, each one element
        of every element loop (`gpu = "block_lanes"`, extent `E`); the accumulators of
        `gpu_accs` are combined across the row once the loop is done."""
        ops_ = dict(x.split("=") for x in (s.annotation("gpu_accs") or "").split(",") if x)
        for a, op in ops_.items():
            if a not in self.locals or op not in ops.COMBINE:
                raise WgslUnsupported(f"block loop accumulator {a}={op} is not a scalar local with a combiner")
        elements = [x for x in _stmts(s.body) if isinstance(x, lp.For)]
        extents = {x.extent for x in elements}
        if len(extents) != 1 or not isinstance(next(iter(extents)), Const):
            raise WgslUnsupported("element loops of one block loop must share one constant extent")
        e = int(next(iter(extents)).value)  # type: ignore[attr-defined]
        if e & (e - 1) or self.row_wg % e:
            raise WgslUnsupported(f"element loops of {e} do not divide a row of {self.row_wg} invocations")
        accs = list(ops_)
        vec = self._plan_blocks_vec4(elements, accs)
        per_block = e // 4 if vec else e  # invocations a block: each 4 elements, or 1
        g = self.row_wg // per_block
        blocks = self.r.scalar(s.extent)
        self.line(f"let tb_sub = tb_lane / {per_block}u;")
        self.line(f"let tb_l = i32(tb_lane % {per_block}u){' * 4i' if vec else ''};")
        if vec:
            self._open_vec_accs(ops_)
        self.line(f"for (var tb_bo: u32 = 0u; tb_bo < (u32({blocks}) + {g - 1}u) / {g}u; tb_bo = tb_bo + 1u) {{")
        self.indent += 1
        self.line(f"let v_{s.var.name} = i32(tb_bo * {g}u + tb_sub);")
        guard = [f"v_{s.var.name} < {blocks}"] if not (isinstance(s.extent, Const) and int(s.extent.value) % g == 0) else []
        guard += [self.live] if self.live else []
        if guard:
            self.line(f"if ({' && '.join(guard)}) {{")
            self.indent += 1
        for x in _stmts(s.body):
            if isinstance(x, lp.For):
                if vec:  # this loop's vector lets (planned again: the plan is per loop)
                    self._plan_vec4([x], self._probed(x, accs))
                    self.vec_accs = set(accs)
                self.line("{")
                self.indent += 1
                self.line(f"let v_{x.var.name} = tb_l;")
                self.stmt(x.body)
                self.indent -= 1
                self.line("}")
                self.vec_accs, self.vec_var, self.vector_vars = set(), None, set()
            else:
                self.stmt(x)
        if guard:
            self.indent -= 1
            self.line("}")
        self.indent -= 1
        self.line("}")
        if vec:
            self._fold_vec_accs(ops_)
            self.vec_offsets = False
            self.blocks_vec = True
        self.pending += list(ops_.items())

    def _open_vec_accs(self, ops_: dict[str, str]) -> None:
        """Declare a vec4 partial (the combiner's identity) per accumulator of a vec4 loop."""
        for a, op in ops_.items():
            d = self.locals[a].buffer.dtype
            self.line(f"var tb_va_{a} = vec4<{value_type(d, self.caps)}>({const_text(identity(op, d), d, self.caps)});")

    def _fold_vec_accs(self, ops_: dict[str, str]) -> None:
        """Combine each vec4 partial's four lanes into its scalar accumulator."""
        for a, op in ops_.items():
            c = ops.COMBINE[op]
            lo = ops.fill(c, a=f"tb_va_{a}.x", b=f"tb_va_{a}.y")
            hi = ops.fill(c, a=f"tb_va_{a}.z", b=f"tb_va_{a}.w")
            self.line(f"l_{a} = {ops.fill(c, a=f'l_{a}', b=ops.fill(c, a=lo, b=hi))};")

    def _probed(self, f: lp.For, accs: Collection[str]) -> lp.Stmt:
        """The body of an element loop with its accumulator updates as `let`s of what they add."""
        return lp.block(*(self._probe(x) if isinstance(x, lp.Store) and x.buffer in accs else x
                          for x in _stmts(f.body)))

    def _plan_blocks_vec4(self, elements: list[lp.For], accs: list[str]) -> bool:
        """Whether every element loop of a blocks form runs on vec4s: four consecutive elements
        an invocation, each load varying with the element a run of four from a multiple of 4
        (`g * 16 + j`: a packed word of int4 bytes, four f32 of x); loads that do not vary
        (the block's scales) stay scalars. Leaves `vec_offsets` on when it does."""
        if any(self.locals[a].buffer.dtype.is_bool for a in accs):
            return False
        saved = {n: a.vec4 for n, a in self.params.items()}
        self.vec_offsets = True
        if all(self._plan_vec4([f], self._probed(f, accs)) for f in elements):
            return True
        for n, a in self.params.items():
            a.vec4 = saved[n]
        self.vec_offsets, self.vec_var, self.vector_vars = False, None, set()
        return False

    def _stmt_For(self, s: lp.For) -> None:
        if s.annotation("gpu") == "blocks" and self.in_lanes is None:
            self._blocks(s)
            return
        if s.annotation("gpu") != "lanes" or self.in_lanes is not None:
            super()._stmt_For(s)
            return
        li = self.lanes_loops.index(s)
        ops_ = dict(x.split("=") for x in (s.annotation("gpu_accs") or "").split(",") if x)
        accs = list(ops_)
        for a, op in ops_.items():
            if a not in self.locals or op not in ops.COMBINE:
                raise WgslUnsupported(f"row loop accumulator {a}={op} is not a scalar local with a combiner")
        if self.vec == 4:
            self._open_vec_accs(ops_)
            self.vec_accs = set(accs)
            self.vec_var = s.var.name
        n_elems = ex.floordiv(s.extent, Const(self.vec)) if self.vec > 1 else s.extent
        n_text = self.r.scalar(n_elems)
        self.in_lanes = li
        self.cur_loop = s
        if self.steps is not None and self.steps <= MAX_UNROLL:
            # unrolled: constant register indices, and only a step that can pass the end is guarded
            for k in range(self.steps):
                self.line("{")
                self.indent += 1
                self.line(f"let tb_k = {k}u;")
                self.line(f"let tb_e = tb_lane + {k * self.row_wg}u;")
                full = isinstance(n_elems, Const) and (k + 1) * self.row_wg <= int(n_elems.value)
                self._lane_step(s, li, ([] if full else [f"tb_e < u32({n_text})"]))
                self.indent -= 1
                self.line("}")
        else:
            if self.steps is not None:
                self.line(f"for (var tb_k: u32 = 0u; tb_k < {self.steps}u; tb_k = tb_k + 1u) {{")
                self.indent += 1
                self.line(f"let tb_e = tb_lane + tb_k * {self.row_wg}u;")
                guard = [f"tb_e < u32({n_text})"]
            else:
                self.line(f"for (var tb_e: u32 = tb_lane; tb_e < u32({n_text}); tb_e = tb_e + {self.row_wg}u) {{")
                self.indent += 1
                guard = []
            self._lane_step(s, li, guard)
            self.indent -= 1
            self.line("}")
        self.in_lanes = None
        if self.vec == 4:
            self._fold_vec_accs(ops_)
            self.vec_accs = set()
            self.vec_var = None
        self.pending += [(a, ops_[a]) for a in accs]

    def _row_scope(self, stmts: tuple[lp.Stmt, ...]) -> None:
        """The statements of a row, with the reductions of independent loops combined in one
        tree: a loop's accumulators are reduced across the row only when a later statement
        needs them, and statements that read them (row scalars, per-row stores) wait until then.
        LayerNorm's sum, shifted sum and sum of squares then share one tree."""
        self.pending: list[tuple[str, str]] = []
        deferred: list[lp.Stmt] = []
        waiting: set[str] = set()  # pending accumulators and the lets that wait on them

        def reads(x: lp.Stmt) -> set[str]:
            names: set[str] = set()
            for y in lp.walk_stmts(x):
                for e in lp.stmt_exprs(y):
                    for n in ex.walk(e):
                        if isinstance(n, ex.Load):
                            names.add(n.buffer)
                        elif isinstance(n, Var):
                            names.add(n.name)
            return names

        def flush() -> None:
            if self.pending:
                self._reduce_row(self.pending)
                self.pending = []
            for x in deferred:
                self.stmt(x)
            deferred.clear()
            waiting.clear()

        for x in stmts:
            waiting |= {a for a, _ in self.pending}
            needs = reads(x) & waiting
            if isinstance(x, lp.For):
                if needs:
                    flush()
                self.stmt(x)
            elif needs:
                deferred.append(x)
                if isinstance(x, lp.Let):
                    waiting.add(x.var.name)
                elif isinstance(x, lp.Store) and x.buffer in self.row_allocs:
                    waiting.add(x.buffer)
            else:
                self.stmt(x)
        flush()

    def _lane_step(self, s: lp.For, li: int, guard: list[str]) -> None:
        """One step of a loop over the row: this invocation's element(s) `tb_e`, if in range."""
        if self.live:
            guard = [*guard, self.live]
        if guard:
            self.line(f"if ({' && '.join(guard)}) {{")
            self.indent += 1
        scale = f" * {self.vec}i" if self.vec > 1 else ""
        self.line(f"let v_{s.var.name} = i32(tb_e){scale};")
        for key in self.cache.fill_at.get(li, []):
            buf, index = key
            real = tuple(ex.substitute(i, {"tb_row_e": s.var}) for i in index)
            text, _ = KernelEmitter._load(self, ex.Load(buf, real, ex.ScalarType(self.cache.dtypes[key])))
            self.line(f"tb_c{self.cache.slots[key]}[tb_k] = {text};")
        self.stmt(s.body)
        if guard:
            self.indent -= 1
            self.line("}")

    def _reduce_row(self, accs: list[tuple[str, str]]) -> None:
        """Combine each invocation's partial of `accs` across the row's invocations."""
        types = {a: self.locals[a].buffer.dtype for a, _ in accs}
        sub = self.subgroup_ok and all(op in SUBGROUP_OPS and not types[a].is_bool
                                       and value_type(types[a], self.caps) in ("f32", "i32", "u32")
                                       for a, op in accs)
        arrays = {}
        for j, (a, _) in enumerate(accs):
            d = types[a]
            t = "u32" if d.is_bool else value_type(d, self.caps)
            name = f"tb_red{j}_{t}"
            self.workgroup_arrays[name] = f"var<workgroup> {name}: array<{t}, {self.wg}>;"
            arrays[a] = name
        to = {a: (f"select(0u, 1u, l_{a})" if types[a].is_bool else f"l_{a}") for a, _ in accs}
        back = {a: (f" != 0u" if types[a].is_bool else "") for a, _ in accs}
        if sub and self.row_wg < self.wg:
            self.uses_subgroups = True
            self._reduce_lanes_subgroup(accs, arrays)
            return
        if sub:
            self.uses_subgroups = True
            for a, op in accs:
                self.line(f"let tb_s_{a} = {SUBGROUP_OPS[op]}(l_{a});")
                self.line(f"if (tb_sg_id == 0u) {{ {arrays[a]}[lid / tb_sg_n] = tb_s_{a}; }}")
            self.line("workgroupBarrier();")
            for a, op in accs:
                red = arrays[a]
                comb = ops.fill(ops.COMBINE[op], a=f"l_{a}", b=f"{red}[tb_i]")
                self.line(f"l_{a} = {red}[0];")
                self.line(f"for (var tb_i: u32 = 1u; tb_i < ({self.wg}u + tb_sg_n - 1u) / tb_sg_n; "
                          f"tb_i = tb_i + 1u) {{ l_{a} = {comb}; }}")
            self.line("workgroupBarrier();")
            return
        for a, _ in accs:
            self.line(f"{arrays[a]}[lid] = {to[a]};")
        self.line("workgroupBarrier();")
        step = self.row_wg // 2
        while step >= 1:
            combined = " ".join(
                f"{arrays[a]}[lid] = {ops.fill(ops.COMBINE[op], a=f'{arrays[a]}[lid]', b=f'{arrays[a]}[lid + {step}u]')};"
                for a, op in accs)
            self.line(f"if (tb_lane < {step}u) {{ {combined} }}")
            self.line("workgroupBarrier();")
            step //= 2
        for a, _ in accs:
            self.line(f"l_{a} = {arrays[a]}[lid - tb_lane]{back[a]};")
        self.line("workgroupBarrier();")

    def _reduce_lanes_subgroup(self, accs: list[tuple[str, str]], arrays: dict[str, str]) -> None:
        """Several rows a workgroup, with subgroups: each row's `R` invocations (aligned at
        multiples of `R`) combine by `subgroupShuffleXor` over blocks of `B = min(R, subgroup
        size)` lanes, which stay inside the row and inside one subgroup whatever the adapter's
        subgroup size; where the subgroup is smaller than the row (`B < R`), the blocks' values
        meet in workgroup memory. The barrier is unconditional (uniform control flow); on a
        32-wide subgroup with 32 invocations a row no value goes through memory. Each reduction
        names its block size apart (`tb_b0`, `tb_b1`...: a norm's and a product's in one kernel)."""
        R = self.row_wg
        b = f"tb_b{self.shuffles}"
        self.shuffles += 1
        self.line(f"let {b} = min({R}u, tb_sg_n);")
        for a, op in accs:
            comb = ops.fill(ops.COMBINE[op], a=f"l_{a}", b=f"subgroupShuffleXor(l_{a}, tb_m)")
            self.line(f"for (var tb_m: u32 = 1u; tb_m < {b}; tb_m = tb_m << 1u) {{ l_{a} = {comb}; }}")
            self.line(f"if ({b} < {R}u && (lid & ({b} - 1u)) == 0u) {{ {arrays[a]}[lid / {b}] = l_{a}; }}")
        self.line("workgroupBarrier();")
        self.line(f"if ({b} < {R}u) {{")
        self.indent += 1
        self.line(f"let tb_first = (lid - tb_lane) / {b};")
        for a, op in accs:
            red = arrays[a]
            comb = ops.fill(ops.COMBINE[op], a=f"l_{a}", b=f"{red}[tb_first + tb_i]")
            self.line(f"l_{a} = {red}[tb_first];")
            self.line(f"for (var tb_i: u32 = 1u; tb_i < {R}u / {b}; tb_i = tb_i + 1u) {{ l_{a} = {comb}; }}")
        self.indent -= 1
        self.line("}")
        self.line("workgroupBarrier();")

    def _stmt_Store(self, s: lp.Store) -> None:
        if s.buffer in self.locals:
            if s.buffer in self.vec_accs:
                self.line(f"tb_va_{s.buffer} = {self.r.render(s.value)[0]};")
                return
            super()._stmt_Store(s)
            return
        if self.in_lanes is None:
            guard = " && ".join(["tb_lane == 0u", *([self.live] if self.live else [])])
            self.lines.append("  " * self.indent + f"if ({guard}) {{")
            self.indent += 1
            super()._stmt_Store(s)
            self.indent -= 1
            self.line("}")
            return
        key = (s.buffer, self._canon(self.cur_loop, s.index))
        slot = self.cache.slots.get(key)
        if slot is not None:
            value = self.r.render(s.value)
            d = self.params[s.buffer].buffer.dtype
            self.line(f"tb_c{slot}[tb_k] = {self.r.splat(value, d, self.vec)};")
            if (self.in_lanes, key) in self.cache.dropped:
                return
            s = lp.Store(s.buffer, s.index, ex.Load(f"tb_c{slot}", (), s.value.type))
        super()._stmt_Store(s)

    def _load(self, e: ex.Load) -> Rendered:
        if e.buffer.startswith("tb_c") and not e.index:
            return f"{e.buffer}[tb_k]", self.vec
        if e.buffer in self.vec_accs:
            return f"tb_va_{e.buffer}", 4
        if self.in_lanes is not None and e.buffer in self.params:
            slot = self.cache.slots.get((e.buffer, self._canon(self.cur_loop, e.index)))
            if slot is not None:
                return f"tb_c{slot}[tb_k]", self.vec
        return super()._load(e)

    # ---- assembly -------------------------------------------------------------------------------------
    def assemble(self, bindings, wg, body):  # type: ignore[no-untyped-def]
        decl = [f"  var tb_c{slot}: array<{self._slot_type(key)}, {self.steps}>;" for key, slot in self.cache.slots.items()]
        text = super().assemble(bindings, wg, decl + body)
        if self.uses_subgroups:
            text = text.replace("@builtin(num_workgroups) nwg: vec3<u32>) {",
                                "@builtin(num_workgroups) nwg: vec3<u32>,\n"
                                "        @builtin(subgroup_invocation_id) tb_sg_id: u32, "
                                "@builtin(subgroup_size) tb_sg_n: u32) {")
        return text

    def _slot_type(self, key: Key) -> str:
        t = value_type(self.cache.dtypes[key], self.caps)
        return f"vec4<{t}>" if self.vec == 4 else t
