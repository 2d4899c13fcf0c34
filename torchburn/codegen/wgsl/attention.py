"""Flash attention: a `gpu = "attention"` loop nest -> one WGSL shader.

The nest is the one `loopgen/attention_gpu.py` writes: a row loop nest `(*B, Hq, Tq)` whose
loops marked `attn = "q" | "k<s>" | "v<s>" | "m<s>" | "out"` say how to read one element of
each operand (views, casts and fused producers included) and how to store one output element.
Each becomes a WGSL function (`fa_q(b.., h, i, c)`, `fa_k0(b.., h, i, j, c)`, ...); the
schedule is this module's own, in one of two forms:

- **prefill** (many query rows): the cooperative tiled schedule of `attention_tiled.py`: a
  workgroup per `(batch, head, block of BQ rows)` computes each BQ x BK score tile as a product
  of workgroup-memory tiles, each invocation a TM x TN register micro-tile of scores and TM rows
  of the output, with an online softmax (row max and sum through subgroup shuffles or workgroup
  memory). The tile is `gpu-map{attention_tile}` (`gpu_tile` on the nest) or the first of
  `attention_tiled.AUTO_TILES` that fits the device's workgroup memory. Where none fits (large
  head dims on a small device) or `attention_tile=rows`: one invocation per row, its pre-scaled
  q row and output accumulator in registers as `vec4`s, K and V staged per tile of BK keys in
  workgroup memory, each invocation computing its BK scores and the online-softmax update
  (`corr = exp(m - m_new)` rescales the sum and the accumulator). With `causal`, tiles past the
  block's last row are never loaded, keys past a row's own index score -inf.
- **decode** (at most `DECODE_ROWS` query rows): a workgroup per query row, the keys in tiles
  of WG: each invocation scores one key of the tile into workgroup memory, then groups of
  `Dv / 4` lanes (a lane per `vec4` of the value row) take every G-th scored key, each group
  with its own running max, sum and accumulator; one pass over the G groups' states merges
  them. Two barriers a tile and one for the merge. Only the keys `0..Tk` exist for the
  shader: `Tk` is the loop extent, a program symbol for a cache view.

Segments (a cache and the step's new keys) run one after the other with the same running
state. Loads past the last key or head dim (`D % 4 != 0`) are never issued: the accessors are
called only for elements that exist, staged tiles are zero-padded. Storage may be f16 (with
`shader-f16`); every accumulation is f32.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, Var
from . import attention_tiled as tiled
from .kernel_state import KernelContext, Local
from .shader import Grid, KernelShader
from .types import WgslUnsupported
from .vec4 import runs_of_four

#: Query rows at most (static) for the decode form.
DECODE_ROWS = 8
#: Query rows per workgroup of the prefill form (at most; fewer for short sequences).
BLOCK_Q = 64
#: Keys per staged tile of the prefill form (at most; fewer where workgroup memory is short).
BLOCK_K = 32
#: Workgroup size of the decode form (at most).
DECODE_WG = 256
#: Head dims above this would not fit in registers.
MAX_HEAD_DIM = 256


def _fail(why: str) -> WgslUnsupported:
    return WgslUnsupported(f"attention: the loop nest is not the flash-attention form ({why})")


def _stmts(s: lp.Stmt) -> tuple[lp.Stmt, ...]:
    return s.stmts if isinstance(s, lp.Block) else (s,)


def _static(e: Expr) -> Optional[int]:
    return int(e.value) if isinstance(e, Const) else None


@dataclass
class AttentionNest:
    """The parts of the nest the shader is written from."""

    grid: list[lp.For]
    scale: float
    causal: bool
    q: lp.For
    out: lp.For
    keys: list[lp.For] = field(default_factory=list)
    k: list[lp.For] = field(default_factory=list)
    v: list[lp.For] = field(default_factory=list)
    m: list[Optional[lp.For]] = field(default_factory=list)

    @property
    def d(self) -> int:
        return int(self.q.extent.value)  # type: ignore[attr-defined]

    @property
    def dv(self) -> int:
        return int(self.out.extent.value)  # type: ignore[attr-defined]


def match_attention(root: lp.For) -> AttentionNest:
    """Find the row nest, the accessor loops and the options (raises `WgslUnsupported`)."""
    grid: list[lp.For] = []
    s: lp.Stmt = root
    while isinstance(s, lp.For) and s.annotation("attn") is None:
        grid.append(s)
        s = s.body
    if len(grid) < 2 or any(f.start != Const(0) for f in grid):
        raise _fail("expected row loops from 0")
    tagged: dict[str, lp.For] = {}
    for x in lp.walk_stmts(s):
        if isinstance(x, lp.For) and x.annotation("attn") is not None:
            tag = x.annotation("attn") or ""
            if tag == "keys":
                tag = f"keys{x.annotation('attn_segment')}"
            if tag in tagged:
                raise _fail(f"two loops marked {tag!r}")
            tagged[tag] = x
    try:
        scale = float(root.annotation("attn_scale") or "")
        segments = int(root.annotation("attn_segments") or "")
    except ValueError:
        raise _fail("attn_scale / attn_segments") from None
    if "q" not in tagged or "out" not in tagged:
        raise _fail("no q or out accessor")
    nest = AttentionNest(grid, scale, root.annotation("attn_causal") == "true", tagged["q"], tagged["out"])
    for seg in range(segments):
        for tag in (f"keys{seg}", f"k{seg}", f"v{seg}"):
            if tag not in tagged:
                raise _fail(f"no {tag!r} loop")
        nest.keys.append(tagged[f"keys{seg}"])
        nest.k.append(tagged[f"k{seg}"])
        nest.v.append(tagged[f"v{seg}"])
        nest.m.append(tagged.get(f"m{seg}"))
    for f in (nest.q, nest.out, *nest.k, *nest.v):
        if _static(f.extent) is None or f.start != Const(0):
            raise _fail("a head dim is not a constant")
    if {_static(f.extent) for f in nest.k} != {nest.d} or {_static(f.extent) for f in nest.v} != {nest.dv}:
        raise _fail("head dims differ between segments")
    if max(nest.d, nest.dv) > MAX_HEAD_DIM:
        raise WgslUnsupported(f"attention: head dim {max(nest.d, nest.dv)} above {MAX_HEAD_DIM}")
    return nest


class AttentionEmitter:
    """Writes the shader through a kernel emitter (`KernelContext`), as the GEMM does."""

    def __init__(self, k: KernelContext) -> None:
        self.k = k

    def emit(self, root: lp.For) -> KernelShader:
        k = self.k
        nest = match_attention(root)
        self.nest = nest
        #: Accessors with a vec4 form (`_plain_vec4`).
        self.vec4: set[str] = set()
        self.d4, self.v4 = -(-nest.d // 4), -(-nest.dv // 4)
        gvars = [f.var for f in nest.grid]
        funcs = [self._value_fn("fa_q", nest.q, [*gvars, nest.q.var], nest.d)]
        for s in range(len(nest.keys)):
            j = nest.keys[s].var
            funcs.append(self._value_fn(f"fa_k{s}", nest.k[s], [*gvars, j, nest.k[s].var], nest.d))
            funcs.append(self._value_fn(f"fa_v{s}", nest.v[s], [*gvars, j, nest.v[s].var], nest.dv))
            m = nest.m[s]
            if m is not None:
                funcs.append(self._value_fn(f"fa_m{s}", m, [*gvars, j, m.var], None))
        funcs.append(self._store_fn(nest.out, [*gvars, nest.out.var]))
        k.helpers.sources["fa_operands"] = "\n".join(funcs)
        tq = nest.grid[-1].extent
        tq_static = _static(tq)
        self.uses_subgroups = False
        if tq_static is not None and tq_static <= DECODE_ROWS:
            body, wg, groups, summary = self._decode()
        else:
            lay = None
            if self._rows_free_kv():
                lay = tiled.choose(root.annotation("gpu_tile"), self.d4, self.v4, tq_static,
                                   k.caps.max_workgroup_storage, k.caps.max_invocations)
            if lay is not None:
                body, wg, groups, summary = tiled.emit_tiled(self, lay)
            else:
                body, wg, groups, summary = self._prefill()
        bindings = k.bindings()
        if len(bindings) + k.uses_fault > k.caps.max_storage_buffers:
            raise WgslUnsupported(f"kernel @{k.kernel.name} needs {len(bindings) + k.uses_fault} storage buffers; the device "
                                  f"allows {k.caps.max_storage_buffers}")
        source = k.assemble(bindings, wg, body)
        if self.uses_subgroups:
            source = source.replace("@builtin(num_workgroups) nwg: vec3<u32>) {",
                                    "@builtin(num_workgroups) nwg: vec3<u32>,\n"
                                    "        @builtin(subgroup_size) tb_sg_n: u32) {")
        return KernelShader(k.kernel.name, source, bindings, Grid((groups, Const(1), Const(1)), wg, "groups"),
                            summary)

    def _rows_free_kv(self) -> bool:
        """Whether the key and value accessors ignore the query row (they read `(b, h, j, c)`):
        the cooperative schedule stages one tile for all rows of a block."""
        row = self.nest.grid[-1].var.name
        for f in (*self.nest.k, *self.nest.v):
            for x in lp.walk_stmts(f.body):
                if any(row in ex.free_vars(e) for e in lp.stmt_exprs(x)):
                    return False
        return True

    # ---- accessors ---------------------------------------------------------------------------------
    def _check_vars(self, f: lp.For, stmts: tuple[lp.Stmt, ...], params: list[Var]) -> None:
        """The accessor reads only its parameters, the symbols and its own lets."""
        known = {v.name for v in params} | set(self.k.symbols)
        for x in stmts:
            for e in lp.stmt_exprs(x):
                missing = ex.free_vars(e) - known
                if missing:
                    raise _fail(f"accessor {f.annotation('attn')} reads {sorted(missing)}")
            if isinstance(x, lp.Let):
                known.add(x.var.name)

    def _render(self, stmts: tuple[lp.Stmt, ...]) -> list[str]:
        k = self.k
        saved, k.lines, k.indent = k.lines, [], 1
        for s in stmts:
            k.stmt(s)
        out, k.lines = k.lines, saved
        return out

    def _value_fn(self, name: str, f: lp.For, params: list[Var], dim: Optional[int]) -> str:
        """`fn name(params) -> f32`: the element the loop stores last; with `dim`, also
        `name_z`, which is 0 past the head dim (a padded vec4 lane) and reads nothing there."""
        self._check_vars(f, _stmts(f.body), params)
        *lets, last = _stmts(f.body)
        if not isinstance(last, lp.Store) or any(not isinstance(x, lp.Let) for x in lets):
            raise _fail(f"accessor {f.annotation('attn')}: expected lets and one store")
        args = ", ".join(f"v_{v.name}: i32" for v in params)
        body = self._render(tuple(lets))
        text, _ = self.k.r.render(last.value)
        out = f"fn {name}({args}) -> f32 {{\n" + "\n".join(body) + f"\n  return f32({text});\n}}"
        if dim is not None and self._plain_vec4(f, tuple(lets), last, dim):
            load = lets[0].value
            assert isinstance(load, ex.Load)
            off = self.k.offset(self.k.params[load.buffer].buffer, load.index)
            self.vec4.add(name)
            out += f"\nfn {name}_4({args}) -> vec4<f32> {{\n  return ld4_{load.buffer}({off});\n}}"
        if dim is not None:
            call = ", ".join(f"v_{v.name}" for v in params)
            guard = f"  if (v_{params[-1].name} >= {dim}) {{ return 0.0; }}\n" if dim % 4 else ""
            out += f"\nfn {name}_z({args}) -> f32 {{\n{guard}  return {name}({call});\n}}"
        return out

    def _plain_vec4(self, f: lp.For, lets: tuple[lp.Stmt, ...], last: lp.Store, dim: int) -> bool:
        """Whether the accessor is one f32 load, contiguous along the head dim with rows of a
        multiple of 4 elements: then four elements are one aligned `vec4` load (`name_4`)."""
        if dim % 4 or len(lets) != 1 or not isinstance(lets[0], lp.Let) or last.value != lets[0].var:
            return False
        load = lets[0].value
        if not isinstance(load, ex.Load) or load.buffer not in self.k.params:
            return False
        buf = self.k.params[load.buffer].buffer
        c = f.var
        if buf.dtype.name != "f32" or buf.strides[-1] != Const(1) or not runs_of_four(load.index, c):
            return False
        if not all(size == Const(1) or (isinstance(st, Const) and int(st.value) % 4 == 0)
                   for size, st in zip(buf.shape[:-1], buf.strides[:-1])):
            return False
        self.k.params[load.buffer].vec4 = True
        return True

    def _store_fn(self, f: lp.For, params: list[Var]) -> str:
        """`fn fa_out(params, value)`: the loop's statements after its first (the store of
        the value into a local)."""
        first, *rest = _stmts(f.body)
        self._check_vars(f, tuple(rest), params)
        if not (isinstance(first, lp.Store) and first.buffer in self._locals_of(f)):
            raise _fail("out accessor: expected the value stored into a local first")
        buf = self._locals_of(f)[first.buffer]
        self.k.locals[buf.name] = Local(buf, 1)
        args = ", ".join(f"v_{v.name}: i32" for v in params)
        body = self._render(tuple(rest))
        return f"fn fa_out({args}, l_{buf.name}: f32) {{\n" + "\n".join(body) + "\n}"

    def _locals_of(self, f: lp.For) -> dict[str, lp.Buffer]:
        found = {x.buffer.name: x.buffer for x in lp.walk_stmts(self.k.kernel.body) if isinstance(x, lp.Alloc)}
        return found

    # ---- pieces of both forms ------------------------------------------------------------------------
    def _args(self, row: str, *extra: str) -> str:
        """Arguments of an accessor: the row loop variables (the query row given as `row`)."""
        names = [f"v_{f.var.name}" for f in self.nest.grid[:-1]] + [row, *extra]
        return ", ".join(names)

    def _vec(self, fn: str, args: str, c0: str) -> str:
        """Four elements from `c0` (a multiple of 4) of an accessor, as one vec4."""
        if fn in self.vec4:
            return f"{fn}_4({args}, {c0})"
        return f"vec4<f32>({', '.join(f'{fn}_z({args}, {c0} + {e})' for e in range(4))})"

    def _load_q(self, L: list[str], row: str) -> None:
        # one variable per vec4 (not an array indexed in loops), so that they stay registers
        for c in range(self.d4):
            L.append(f"  let fa_qr{c} = {self._vec('fa_q', self._args(row), str(4 * c))} * {self._scale()};")
        for c in range(self.v4):
            L.append(f"  var fa_a{c} = vec4<f32>(0.0);")
        L.append("  var fa_m = -tb_inf();")
        L.append("  var fa_l = 0.0;")

    def _scale(self) -> str:
        return f"f32({self.nest.scale!r})"

    def _store_row(self, L: list[str], row: str, acc: str, inv: str, ind: str, c: int) -> None:
        """Store the output columns `4c..4c+3` (those that exist) of a row from a vec4."""
        for e in range(4):
            if 4 * c + e < self.nest.dv:
                L.append(f"{ind}fa_out({self._args(row)}, {4 * c + e}, {acc}.{'xyzw'[e]} * {inv});")

    # ---- prefill -----------------------------------------------------------------------------------
    def _prefill(self) -> tuple[list[str], int, Expr, str]:
        k, nest = self.k, self.nest
        r = k.r
        tq = nest.grid[-1].extent
        n = _static(tq)
        bq = BLOCK_Q if n is None else max(16, min(BLOCK_Q, 1 << max(0, (n - 1).bit_length())))
        bq = min(bq, k.caps.max_invocations)
        budget = min(k.caps.max_workgroup_storage, 32768)
        bk = BLOCK_K
        while bk > 1 and bk * (self.d4 + self.v4) * 16 > budget:
            bk //= 2
        if bk * (self.d4 + self.v4) * 16 > budget:
            raise WgslUnsupported(f"attention: head dims {nest.d}/{nest.dv} need more workgroup memory")
        d4, v4 = self.d4, self.v4
        k.workgroup_arrays["fa_Ks"] = f"var<workgroup> fa_Ks: array<vec4<f32>, {bk * d4}>;"
        k.workgroup_arrays["fa_Vs"] = f"var<workgroup> fa_Vs: array<vec4<f32>, {bk * v4}>;"
        heads = Const(1)
        for f in nest.grid[:-1]:
            heads = ex.mul(heads, f.extent)
        nqb = ex.floordiv(ex.add(tq, Const(bq - 1)), Const(bq))
        groups = ex.mul(heads, nqb)
        iv = f"v_{nest.grid[-1].var.name}"
        L: list[str] = []
        L.append("  let fa_g = wid.y * nwg.x + wid.x;")
        L.append(f"  let fa_tq = {r.scalar(tq)};")
        L.append(f"  let fa_nqb = u32((fa_tq + {bq - 1}) / {bq});")
        L.append(f"  if (fa_g >= fa_nqb * u32({r.scalar(heads)})) {{ return; }}")
        L.append("  let fa_q0 = i32(fa_g % fa_nqb) * " + str(bq) + ";")
        L.append("  let fa_rest = fa_g / fa_nqb;")
        saved, k.lines, k.indent = k.lines, [], 1
        k.unflatten("fa_rest", nest.grid[:-1], [f.extent for f in nest.grid[:-1]])
        L += k.lines
        k.lines = saved
        L.append(f"  let {iv} = fa_q0 + i32(lid);")
        L.append(f"  let fa_ic = min({iv}, fa_tq - 1);")
        self._load_q(L, "fa_ic")
        for s, keys in enumerate(nest.keys):
            L.append("  {")
            L.append(f"  let fa_T = {r.scalar(keys.extent)};")
            end = f"min(fa_T, min(fa_tq, fa_q0 + {bq}))" if nest.causal else "fa_T"
            L.append(f"  let fa_E = {end};")
            L.append(f"  for (var fa_j0: i32 = 0; fa_j0 < fa_E; fa_j0 = fa_j0 + {bk}) {{")
            L.append("    workgroupBarrier();")
            for arr, fn, w in (("fa_Ks", f"fa_k{s}", d4), ("fa_Vs", f"fa_v{s}", v4)):
                L.append(f"    for (var t: u32 = lid; t < {bk * w}u; t = t + {bq}u) {{")
                L.append(f"      let j = fa_j0 + i32(t / {w}u);")
                L.append(f"      let c0 = i32(t % {w}u) * 4;")
                L.append("      var x = vec4<f32>(0.0);")
                L.append(f"      if (j < fa_E) {{ x = {self._vec(fn, self._args('fa_ic', 'j'), 'c0')}; }}")
                L.append(f"      {arr}[t] = x;")
                L.append("    }")
            L.append("    workgroupBarrier();")
            L.append(f"    let fa_n = min({bk}, fa_E - fa_j0);")
            L.append("    var fa_tm = -tb_inf();")
            for jj in range(bk):  # unrolled: the scores and vec4s stay registers
                L.append(f"    var fa_s{jj} = -tb_inf();")
                L.append(f"    if ({jj} < fa_n) {{")
                L.append("      var dot = vec4<f32>(0.0);")
                for c in range(d4):
                    L.append(f"      dot = fma(fa_qr{c}, fa_Ks[{jj * d4 + c}], dot);")
                L.append("      var sc = dot.x + dot.y + dot.z + dot.w;")
                if nest.m[s] is not None:
                    L.append(f"      sc = sc + fa_m{s}({self._args('fa_ic', f'fa_j0 + {jj}')}, 0);")
                if nest.causal:
                    L.append(f"      if (fa_j0 + {jj} > {iv}) {{ sc = -tb_inf(); }}")
                L.append(f"      fa_s{jj} = sc;")
                L.append("    }")
                L.append(f"    fa_tm = max(fa_tm, fa_s{jj});")
            L.append("    let fa_mn = max(fa_m, fa_tm);")
            L.append("    let fa_mu = select(fa_mn, 0.0, fa_mn == -tb_inf());")
            L.append("    let fa_corr = exp(fa_m - fa_mu);")
            L.append("    fa_l = fa_l * fa_corr;")
            for c in range(v4):
                L.append(f"    fa_a{c} = fa_a{c} * fa_corr;")
            for jj in range(bk):
                L.append(f"    if ({jj} < fa_n) {{")
                L.append(f"      let p = exp(fa_s{jj} - fa_mu);")
                L.append("      fa_l = fa_l + p;")
                for c in range(v4):
                    L.append(f"      fa_a{c} = fma(vec4<f32>(p), fa_Vs[{jj * v4 + c}], fa_a{c});")
                L.append("    }")
            L.append("    fa_m = fa_mn;")
            L.append("  }")
            L.append("  }")
        L.append(f"  if ({iv} < fa_tq) {{")
        L.append("    let fa_inv = 1.0 / fa_l;")
        for c in range(v4):
            self._store_row(L, iv, f"fa_a{c}", "fa_inv", "    ", c)
        L.append("  }")
        return L, bq, groups, f"attention/flash-rows {bq}x{bk}"

    # ---- decode ------------------------------------------------------------------------------------
    def _decode(self) -> tuple[list[str], int, Expr, str]:
        """A workgroup per query row, the keys in tiles of `wg`: each invocation scores one key
        of the tile into workgroup memory, then `G = wg / v4` groups of `v4` lanes (a lane per
        vec4 of the value row) each take every G-th key of the tile, with their own running
        max, sum and accumulator vec4; one merge of the G groups ends the row. Two barriers a
        tile and one for the merge (the earlier tree merged every invocation's state in about
        70 barrier steps, most of a decode layer's attention time on an H100)."""
        k, nest = self.k, self.nest
        r = k.r
        total: Optional[int] = 0
        for keys in nest.keys:
            e = _static(keys.extent)
            total = None if e is None or total is None else total + e
        v4 = self.v4
        wg = 32
        cap = min(DECODE_WG, k.caps.max_invocations)
        while wg < cap and (total is None or wg < total or wg < v4):
            wg *= 2
        if v4 > wg:
            raise WgslUnsupported(f"attention: value head dim {nest.dv} above {4 * wg} for the decode form")
        groups_n = wg // v4
        k.workgroup_arrays["fa_s"] = f"var<workgroup> fa_s: array<f32, {wg}>;"
        k.workgroup_arrays["fa_gm"] = f"var<workgroup> fa_gm: array<f32, {groups_n}>;"
        k.workgroup_arrays["fa_gl"] = f"var<workgroup> fa_gl: array<f32, {groups_n}>;"
        k.workgroup_arrays["fa_ga"] = f"var<workgroup> fa_ga: array<vec4<f32>, {groups_n * v4}>;"
        rows = Const(1)
        for f in nest.grid:
            rows = ex.mul(rows, f.extent)
        iv = f"v_{nest.grid[-1].var.name}"
        L: list[str] = []
        L.append("  let fa_g = wid.y * nwg.x + wid.x;")
        L.append(f"  if (fa_g >= u32({r.scalar(rows)})) {{ return; }}")
        saved, k.lines, k.indent = k.lines, [], 1
        k.unflatten("fa_g", nest.grid, [f.extent for f in nest.grid])
        L += k.lines
        k.lines = saved
        for c in range(self.d4):
            L.append(f"  let fa_qr{c} = {self._vec('fa_q', self._args(iv), str(4 * c))} * {self._scale()};")
        L.append(f"  let fa_grp = i32(lid / {v4}u);")
        L.append(f"  let fa_c = i32(lid % {v4}u);")
        L.append(f"  let fa_in = lid < {groups_n * v4}u;")
        L.append("  var fa_a = vec4<f32>(0.0);")
        L.append("  var fa_m = -tb_inf();")
        L.append("  var fa_l = 0.0;")
        for s, keys in enumerate(nest.keys):
            L.append("  {")
            L.append(f"  let fa_T = {r.scalar(keys.extent)};")
            L.append(f"  let fa_E = {'min(fa_T, ' + iv + ' + 1)' if nest.causal else 'fa_T'};")
            L.append(f"  for (var fa_j0: i32 = 0; fa_j0 < fa_E; fa_j0 = fa_j0 + {wg}) {{")
            L.append("    let j = fa_j0 + i32(lid);")
            L.append("    var sc = -tb_inf();")
            L.append("    if (j < fa_E) {")
            L.append("      var dot = vec4<f32>(0.0);")
            for c in range(self.d4):
                L.append(f"      dot = fma(fa_qr{c}, {self._vec(f'fa_k{s}', self._args(iv, 'j'), str(4 * c))}, dot);")
            L.append("      sc = dot.x + dot.y + dot.z + dot.w;")
            if nest.m[s] is not None:
                L.append(f"      sc = sc + fa_m{s}({self._args(iv, 'j')}, 0);")
            L.append("    }")
            L.append("    workgroupBarrier();")
            L.append("    fa_s[lid] = sc;")
            L.append("    workgroupBarrier();")
            L.append(f"    let fa_n = min({wg}, fa_E - fa_j0);")
            L.append("    if (fa_in) {")
            L.append(f"      for (var t: i32 = fa_grp; t < fa_n; t = t + {groups_n}) {{")
            L.append("        let st = fa_s[t];")
            L.append("        let mn = max(fa_m, st);")
            L.append("        let mu = select(mn, 0.0, mn == -tb_inf());")
            L.append("        let corr = exp(fa_m - mu);")
            L.append("        let p = exp(st - mu);")
            L.append("        fa_l = fa_l * corr + p;")
            vv = self._vec(f"fa_v{s}", self._args(iv, "fa_j0 + t"), "4 * fa_c")
            L.append(f"        fa_a = fma(vec4<f32>(p), {vv}, fa_a * corr);")
            L.append("        fa_m = mn;")
            L.append("      }")
            L.append("    }")
            L.append("  }")
            L.append("  }")
        # merge the groups: the maximum, then the rescaled sums and accumulators
        L.append("  if (fa_in) {")
        L.append("    fa_ga[lid] = fa_a;")
        L.append("    if (fa_c == 0) { fa_gm[fa_grp] = fa_m; fa_gl[fa_grp] = fa_l; }")
        L.append("  }")
        L.append("  workgroupBarrier();")
        L.append(f"  if (lid < {v4}u) {{")
        L.append("    var fa_M = -tb_inf();")
        L.append(f"    for (var g: u32 = 0u; g < {groups_n}u; g = g + 1u) {{ fa_M = max(fa_M, fa_gm[g]); }}")
        L.append("    let fa_Mu = select(fa_M, 0.0, fa_M == -tb_inf());")
        L.append("    var fa_L = 0.0;")
        L.append("    var fa_A = vec4<f32>(0.0);")
        L.append(f"    for (var g: u32 = 0u; g < {groups_n}u; g = g + 1u) {{")
        L.append("      let f = exp(fa_gm[g] - fa_Mu);")
        L.append("      fa_L = fa_L + fa_gl[g] * f;")
        L.append(f"      fa_A = fma(fa_ga[g * {v4}u + lid], vec4<f32>(f), fa_A);")
        L.append("    }")
        L.append("    let fa_inv = 1.0 / fa_L;")
        for e in range(4):
            col = f"4 * fa_c + {e}"
            guard = f"if ({col} < {nest.dv}) " if nest.dv % 4 else ""
            L.append(f"    {guard}{{ fa_out({self._args(iv)}, {col}, fa_A.{'xyzw'[e]} * fa_inv); }}")
        L.append("  }")
        return L, wg, rows, f"attention/decode {wg}x{groups_n}"
