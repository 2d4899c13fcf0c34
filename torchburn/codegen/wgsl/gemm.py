"""The tiled matrix product: a `gpu = "gemm"` loop nest -> one WGSL shader.

The kernel must have the shape `lower-to-loops-gpu` gives a matrix product (batch loops,
then):

    for i in 0..M {
      for j in 0..N {
        alloc %acc: f32[1] local
        %acc[0] = 0.0:f32
        for k in 0..K {
          lets computing a = A(i, k) and b = B(k, j)   (loads, views, casts)
          %acc[0] = %acc[0] + a * b
        }
        epilogue lets (bias, activation, cast) ; %out[.., i, j] = value
      }
    }

A workgroup computes a BM x BN tile of the output with (BM/TM) x (BN/TN) invocations, each
holding a TM x TN block of accumulators in registers (`vec4`s, fully unrolled). Per step of
BK along k, the workgroup stages an A tile (k-major) and a B tile in workgroup memory; the
next step's global loads are issued into registers before the current tile is consumed, so
their latency hides behind the arithmetic. With two stages (`.../s2`) the workgroup tiles are
double-buffered: step kt reads one while step kt+1's values are stored into the other, one
barrier per step instead of two. Global loads are `vec4` when an operand is a plain load
whose four consecutive k (or m, n) values are four aligned consecutive elements (`vec4.py`:
`k`, `k mod c`, plus multiples of 4); otherwise scalar. Out-of-range elements load as zero and
stores are bounds-checked, so any M, N, K works; a check is left out where the extent is static
and a multiple of the tile's (every row, column or k the workgroup touches is then in range).
The epilogue runs per element on the accumulators before the only store, at the product's index or, through a reshape regrouping
the rows, at the reshaped result's (`%out[i floordiv 16, i mod 16, j]`).
"""
from __future__ import annotations

from dataclasses import dataclass

from ...ir import dtypes as dt
from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, Var
from .kernel_state import KernelContext, Local
from .shader import Grid, KernelShader
from .types import WgslUnsupported, value_type
from .vec4 import runs_of_four


XYZW = "xyzw"


@dataclass(frozen=True)
class Tile:
    """Tile shape `BMxBNxBK/TMxTN[/sS][/ar][/gG]` (the `gpu_tile` annotation): S = 2
    double-buffers the workgroup tiles (one barrier per step of BK instead of two); `ar` keeps
    the A tile in workgroup memory as rows of k (`tb_As[m][k]`: a vec4 along k is stored as it
    was loaded, and read back as four k steps of one row) instead of k-major (`tb_As[k][m]`:
    four scalar stores per vec4 loaded along k, one vec4 read per k step and four rows); G > 1
    launches the output tiles in groups of G tile rows, column by column within a group, so
    that the workgroups running together share A and B tiles in L2 (Triton's grouped order).
    `sw` XOR-swizzles the k-major tiles in 16-byte units: element (k, m) lives in vec4 slot
    `(m / 4) ^ s(k)` of row k, with s(k) < 8 chosen so that the scalar stores of A loaded as
    vec4s along k (four k rows at once, one bank apart otherwise) land in different banks.
    `w` arranges each 32 consecutive invocations as an 8 x 4 block of the (TX x TY) grid
    instead of two rows of TX, so that a warp's vec4 reads of the B tile span 128 bytes
    instead of 256 (one pass through the banks instead of two)."""

    bm: int
    bn: int
    bk: int
    tm: int
    tn: int
    stages: int = 1
    a_rows: bool = False
    swizzle: bool = False
    warp: bool = False
    group: int = 1

    @staticmethod
    def parse(text: str) -> "Tile":
        try:
            block, thread, *rest = text.split("/")
            bm, bn, bk = (int(x) for x in block.split("x"))
            tm, tn = (int(x) for x in thread.split("x"))
            stages, group = 1, 1
            flags: set[str] = set()
            order = ["s", "ar", "sw", "w", "g"]  # each option at most once, in this order
            for opt in rest:
                kind = opt if opt in ("ar", "sw", "w") else opt[:1]
                if kind not in order:
                    raise ValueError
                order = order[order.index(kind) + 1:]
                if kind == "s":
                    if opt not in ("s1", "s2"):
                        raise ValueError
                    stages = int(opt[1:])
                elif kind == "g":
                    group = int(opt[1:])
                    if group < 1:
                        raise ValueError
                else:
                    flags.add(kind)
        except ValueError:
            raise WgslUnsupported(f"gpu_tile {text!r}: expected BMxBNxBK/TMxTN[/s2][/ar][/sw][/w][/gG], "
                                  "e.g. 128x128x16/8x8") from None
        return Tile(bm, bn, bk, tm, tn, stages, "ar" in flags, "sw" in flags, "w" in flags, group)

    @property
    def threads(self) -> int:
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def shared_bytes(self) -> int:
        return 4 * self.bk * (self.bm + self.bn) * self.stages

    def __str__(self) -> str:
        return (f"{self.bm}x{self.bn}x{self.bk}/{self.tm}x{self.tn}" + ("/s2" if self.stages == 2 else "")
                + ("/ar" if self.a_rows else "") + ("/sw" if self.swizzle else "") + ("/w" if self.warp else "")
                + (f"/g{self.group}" if self.group > 1 else ""))

    def check(self) -> None:
        if self.tm % 4 or self.tn % 4 or self.bm % self.tm or self.bn % self.tn or self.bk % 4:
            raise WgslUnsupported(f"tile {self}: TM, TN, BK must be multiples of 4 dividing BM, BN")
        if self.swizzle and (self.bm % 32 or self.bn % 32):
            raise WgslUnsupported(f"tile {self}: /sw needs BM and BN multiples of 32 (8 vec4 slots a row)")
        if self.warp and ((self.bn // self.tn) % 8 or (self.bm // self.tm) % 4):
            raise WgslUnsupported(f"tile {self}: /w needs BN/TN a multiple of 8 and BM/TM a multiple of 4")

    def swizzle_of(self, k: int) -> int:
        """s(k): the XOR applied to the vec4 slots of row k of a k-major tile (0 without `sw`).
        The stores of one vec4 loaded along k write rows 4q..4q+3 for the BK/4 values of q a
        warp holds, which would otherwise all map to the same banks; s spreads each q over its
        own group of slots: s = (q mod span) * (8 / span) with span = min(BK/4, 8)."""
        if not self.swizzle:
            return 0
        span = min(self.bk // 4, 8)
        return ((k // 4) % span) * (8 // span)

    def swizzle_expr(self, k: str) -> str:
        """`swizzle_of` of the u32 WGSL expression `k`."""
        span = min(self.bk // 4, 8)
        return f"((({k}) / 4u) % {span}u) * {8 // span}u"


SMALL_TILE = Tile(64, 64, 16, 4, 4)


@dataclass
class MatmulNest:
    batch: list[lp.For]
    i: lp.For
    j: lp.For
    k: lp.For
    acc: lp.Buffer
    a_lets: list[lp.Let]
    b_lets: list[lp.Let]
    a: Expr
    b: Expr
    epilogue: list[lp.Let]
    out: str
    value: Expr
    #: Where element (batch.., i, j) is stored: the loop variables, or an index computed from
    #: them (a reshape regrouping the rows in the epilogue: `%out[i floordiv 16, i mod 16, j]`).
    index: tuple[Expr, ...]


def _fail(why: str) -> WgslUnsupported:
    return WgslUnsupported(f"gemm: the loop nest is not a plain matrix product ({why})")


def match_matmul(root: lp.For, symbols: frozenset[str] = frozenset()) -> MatmulNest:
    """Take the nest `lower-to-loops-gpu` gives a matrix product apart (raises
    `WgslUnsupported` when it is not one):

        for b.. { for i { for j {
          alloc %acc: f32[1] local ; %acc[0] = 0
          for k { lets ; %acc[0] = %acc[0] + A(i, k) * B(k, j) }
          epilogue lets ; %out[b.., i, j] = value
        } } }
    """
    loops: list[lp.For] = []
    s: lp.Stmt = root
    while isinstance(s, lp.For):
        loops.append(s)
        s = s.body
    if len(loops) < 2 or not isinstance(s, lp.Block):
        raise _fail("expected output loops around a block")
    *batch, iloop, jloop = loops
    stmts = list(s.stmts)
    if len(stmts) < 4 or not isinstance(stmts[0], lp.Alloc) or not isinstance(stmts[1], lp.Store) \
            or not isinstance(stmts[2], lp.For):
        raise _fail("expected alloc, init, k loop")
    alloc, init, kloop = stmts[0], stmts[1], stmts[2]
    acc = alloc.buffer
    *tail, store = stmts[3:]
    epilogue = [x for x in tail if isinstance(x, lp.Let)]
    if init.buffer != acc.name or not isinstance(store, lp.Store) or len(epilogue) != len(tail):
        raise _fail("accumulator or epilogue")
    if acc.dtype != dt.f32 or not (isinstance(init.value, Const) and init.value.value == 0):
        raise _fail(f"accumulator {acc.dtype} from {init.value}")
    kstmts = kloop.body.stmts if isinstance(kloop.body, lp.Block) else (kloop.body,)
    *body, upd = kstmts
    lets = [x for x in body if isinstance(x, lp.Let)]
    cur = ex.Load(acc.name, (Const(0),), ex.ScalarType(acc.dtype))
    if not (isinstance(upd, lp.Store) and upd.buffer == acc.name and isinstance(upd.value, ex.Binary)
            and upd.value.op == "add" and cur in (upd.value.a, upd.value.b)) or len(lets) != len(body):
        raise _fail("k loop body")
    prod = upd.value.b if upd.value.a == cur else upd.value.a
    if isinstance(prod, Var):
        found = [x for x in lets if x.var == prod]
        if len(found) != 1:
            raise _fail("product")
        lets = [x for x in lets if x.var != prod]
        prod = found[0].value
    if not (isinstance(prod, ex.Binary) and prod.op == "mul"):
        raise _fail("product")
    for f in loops + [kloop]:
        if f.start != Const(0):
            raise _fail("a loop does not start at 0")
    bnames = {f.var.name for f in batch} | set(symbols)
    a_names = bnames | {iloop.var.name, kloop.var.name}
    b_names = bnames | {jloop.var.name, kloop.var.name}
    a_lets: list[lp.Let] = []
    b_lets: list[lp.Let] = []
    for x in lets:
        fv = ex.free_vars(x.value)
        if fv <= a_names:
            a_lets.append(x)
            a_names.add(x.var.name)
        elif fv <= b_names:
            b_lets.append(x)
            b_names.add(x.var.name)
        else:
            raise _fail(f"let {x.var.name} mixes i and j")
    a, b = prod.a, prod.b
    if not (ex.free_vars(a) <= a_names and ex.free_vars(b) <= b_names):
        a, b = b, a
    if not (ex.free_vars(a) <= a_names and ex.free_vars(b) <= b_names):
        raise _fail("the factors mix i and j")
    loop_names = {f.var.name for f in loops}
    if any(not ex.free_vars(x) <= loop_names | set(symbols) for x in store.index):
        raise _fail("output index")
    return MatmulNest(batch, iloop, jloop, kloop, acc, a_lets, b_lets, a, b, epilogue, store.buffer, store.value,
                      store.index)


class GemmEmitter:
    """Emits the tiled GEMM shader through a kernel emitter's renderer (`KernelContext`) and buffers."""

    def __init__(self, k: KernelContext) -> None:
        self.k = k

    def emit(self, root: lp.For) -> KernelShader:
        k = self.k
        nest = self._match(root)
        tile = Tile.parse(root.annotation("gpu_tile") or str(SMALL_TILE))
        tile.check()
        if tile.threads > k.caps.max_invocations or tile.shared_bytes > k.caps.max_workgroup_storage:
            tile = SMALL_TILE
        self.tile = tile
        self.nest = nest
        #: Per operand side ("a": M, "b": N, "k": K), whether the extent is static and a
        #: multiple of the tile's: every row (column, k) a workgroup touches is then in range.
        self.whole = {side: isinstance(e, Const) and int(e.value) % size == 0
                      for side, e, size in (("a", nest.i.extent, tile.bm), ("b", nest.j.extent, tile.bn),
                                            ("k", nest.k.extent, tile.bk))}
        a_mode = self._vec_mode(nest.a_lets, nest.a, nest.i, nest.k)
        b_mode = self._vec_mode(nest.b_lets, nest.b, nest.j, nest.k)
        funcs = [self._operand_fn("tb_a", nest.a_lets, nest.a, (*nest.batch, nest.i, nest.k), a_mode),
                 self._operand_fn("tb_b", nest.b_lets, nest.b, (*nest.batch, nest.k, nest.j), b_mode),
                 self._epilogue_fn()]
        body = self._main(a_mode, b_mode)
        bindings = k.bindings()
        if len(bindings) + k.uses_fault > k.caps.max_storage_buffers:
            raise WgslUnsupported(f"kernel @{k.kernel.name} needs {len(bindings) + k.uses_fault} storage buffers; the device "
                                  f"allows {k.caps.max_storage_buffers}")
        k.workgroup_arrays["tb_As"] = f"var<workgroup> tb_As: array<vec4<f32>, {tile.stages * tile.bk * tile.bm // 4}>;"
        k.workgroup_arrays["tb_Bs"] = f"var<workgroup> tb_Bs: array<vec4<f32>, {tile.stages * tile.bk * tile.bn // 4}>;"
        k.helpers.sources["tb_operands"] = "\n".join(funcs)
        source = k.assemble(bindings, tile.threads, body)
        M, N = nest.i.extent, nest.j.extent
        groups = (ex.floordiv(ex.add(N, Const(tile.bn - 1)), Const(tile.bn)),
                  ex.floordiv(ex.add(M, Const(tile.bm - 1)), Const(tile.bm)),
                  _product([f.extent for f in nest.batch]))
        summary = f"gemm {tile} A:{a_mode} B:{b_mode}"
        return KernelShader(k.kernel.name, source, bindings, Grid(groups, tile.threads, "gemm"), summary)

    def _epilogue_fn(self) -> str:
        """`tb_epi(batch.., i, j, acc) -> value stored`: the epilogue of one element."""
        k, nest = self.k, self.nest
        k.locals[nest.acc.name] = Local(nest.acc, 1)
        params = "".join(f"v_{f.var.name}: i32, " for f in (*nest.batch, nest.i, nest.j))
        saved, k.lines, k.indent = k.lines, [], 1
        for s in nest.epilogue:
            k.stmt(s)
        body = k.lines
        k.lines = saved
        text, _ = k.r.render(nest.value)
        t = value_type(k.params[nest.out].buffer.dtype, k.caps)
        return (f"fn tb_epi({params}l_{nest.acc.name}: f32) -> {t} {{\n" + "\n".join(body)
                + f"\n  return {text};\n}}")

    def _match(self, root: lp.For) -> MatmulNest:
        return match_matmul(root, frozenset(self.k.symbols))

    # ---- operands ---------------------------------------------------------------------------------------
    def _vec_mode(self, lets: list[lp.Let], value: Expr, row: lp.For, kl: lp.For) -> str:
        """"k4" (vec4 along k), "r4" (vec4 along the row/column index) or "scalar"."""
        load = value
        if isinstance(value, Var) and len(lets) == 1 and lets[0].var == value:
            load = lets[0].value
        elif lets:
            return "scalar"
        if not isinstance(load, ex.Load) or load.buffer not in self.k.params or load.dtype != dt.f32:
            return "scalar"
        buf = self.k.params[load.buffer].buffer
        for mode, along, extent in (("k4", kl.var, kl.extent), ("r4", row.var, row.extent)):
            if not (isinstance(extent, Const) and int(extent.value) % 4 == 0) or buf.strides[-1] != Const(1):
                continue
            if not runs_of_four(load.index, along):
                continue
            if all(size == Const(1) or (isinstance(st, Const) and int(st.value) % 4 == 0)
                   for size, st in zip(buf.shape[:-1], buf.strides[:-1])):
                self.k.params[load.buffer].vec4 = True
                return mode
        return "scalar"

    def _operand_fn(self, name: str, lets: list[lp.Let], value: Expr, loops: tuple[lp.For, ...], mode: str) -> str:
        k = self.k
        params = ", ".join(f"v_{f.var.name}: i32" for f in loops)
        saved, k.lines, k.indent = k.lines, [], 1
        for s in lets:
            k.stmt(s)
        body = k.lines
        k.lines = saved
        text, _ = k.r.render(value)
        if mode != "scalar":
            load = lets[0].value if lets else value
            assert isinstance(load, ex.Load)
            off = k.offset(k.params[load.buffer].buffer, load.index)
            return (f"fn {name}4({params}) -> vec4<f32> {{\n  return ld4_{load.buffer}({off});\n}}\n"
                    f"fn {name}({params}) -> f32 {{\n" + "\n".join(body) + f"\n  return {text};\n}}")
        return f"fn {name}({params}) -> f32 {{\n" + "\n".join(body) + f"\n  return {text};\n}}"

    # ---- the shader body --------------------------------------------------------------------------------
    def _main(self, a_mode: str, b_mode: str) -> list[str]:
        k, t, nest = self.k, self.tile, self.nest
        r = k.r
        tx_n = t.bn // t.tn
        rg, cg = t.tm // 4, t.tn // 4
        L: list[str] = []

        def line(s: str, ind: int = 1) -> None:
            L.append("  " * ind + s)

        if t.warp:
            # each 32 consecutive invocations: an 8 (tx) x 4 (ty) block of the grid
            line("let tb_lane = lid % 32u;")
            line("let tb_warp = lid / 32u;")
            line(f"let tb_tx = (tb_warp % {tx_n // 8}u) * 8u + tb_lane % 8u;")
            line(f"let tb_ty = (tb_warp / {tx_n // 8}u) * 4u + tb_lane / 8u;")
        else:
            line(f"let tb_tx = lid % {tx_n}u;")
            line(f"let tb_ty = lid / {tx_n}u;")
        line(f"let tb_M = {r.scalar(nest.i.extent)};")
        line(f"let tb_N = {r.scalar(nest.j.extent)};")
        line(f"let tb_K = {r.scalar(nest.k.extent)};")
        if t.group > 1:
            # tiles in groups of G tile rows, down the rows of a group before the next column
            line("let tb_pid = wid.y * nwg.x + wid.x;")
            line(f"let tb_gfirst = (tb_pid / ({t.group}u * nwg.x)) * {t.group}u;")
            line(f"let tb_gsize = min(nwg.y - tb_gfirst, {t.group}u);")
            line(f"let tb_gin = tb_pid % ({t.group}u * nwg.x);")
            line(f"let tb_m0 = i32(tb_gfirst + tb_gin % tb_gsize) * {t.bm}i;")
            line(f"let tb_n0 = i32(tb_gin / tb_gsize) * {t.bn}i;")
        else:
            line(f"let tb_m0 = i32(wid.y) * {t.bm}i;")
            line(f"let tb_n0 = i32(wid.x) * {t.bn}i;")
        if nest.batch:
            saved, k.lines, k.indent = k.lines, [], 1
            k.line("let tb_z = wid.z;")
            k.unflatten("tb_z", nest.batch, [f.extent for f in nest.batch])
            L += k.lines
            k.lines = saved
        bargs = "".join(f"v_{f.var.name}, " for f in nest.batch)
        a_plan = self._plan("a", a_mode, t.bm, t.bk)
        b_plan = self._plan("b", b_mode, t.bn, t.bk)
        for name, n, vec in (("a", a_plan[0], a_mode != "scalar"), ("b", b_plan[0], b_mode != "scalar")):
            for l in range(n):
                line(f"var tb_r{name}{l}: {'vec4<f32>' if vec else 'f32'};")
        for g in range(rg):
            for q in range(4):
                for c in range(cg):
                    line(f"var tb_c{g}_{q}_{c} = vec4<f32>(0.0);")

        def prefetch(k0: str, ind: int) -> None:
            for l in range(a_plan[0]):
                self._load_lines(line, "a", a_mode, l, k0, bargs, ind)
            for l in range(b_plan[0]):
                self._load_lines(line, "b", b_mode, l, k0, bargs, ind)

        def slot(first: int, own: str, kk: int) -> str:
            """The vec4 slot `first + own` of row kk of a k-major tile, swizzled (`/sw`)."""
            sw = t.swizzle_of(kk)
            if not sw:
                return f"{first}u + {own}" if first else own
            if first % 8 == 0:  # the XOR touches only the low three bits, all of `own`'s
                return f"{first}u + ({own} ^ {sw}u)" if first else f"({own} ^ {sw}u)"
            return f"(({first}u + {own}) ^ {sw}u)"

        def compute(base_a: str, base_b: str) -> None:
            if t.a_rows:
                return compute_a_rows(base_a, base_b)
            for kk in range(t.bk):
                line("{", 2)
                for g in range(rg):
                    line(f"let a{g} = tb_As[{base_a}{kk * t.bm // 4}u + {slot(g * (t.bm // t.tm), 'tb_ty', kk)}];", 3)
                for c in range(cg):
                    line(f"let b{c} = tb_Bs[{base_b}{kk * t.bn // 4}u + {slot(c * (t.bn // t.tn), 'tb_tx', kk)}];", 3)
                for g in range(rg):
                    for q in range(4):
                        for c in range(cg):
                            acc = f"tb_c{g}_{q}_{c}"
                            line(f"{acc} = fma(vec4<f32>(a{g}.{XYZW[q]}), b{c}, {acc});", 3)
                line("}", 2)

        def compute_a_rows(base_a: str, base_b: str) -> None:
            # the invocation's TM rows of A as vec4s along k, each used for four k steps
            bk4 = t.bk // 4
            for k4 in range(bk4):
                line("{", 2)
                for g in range(rg):
                    for q in range(4):
                        line(f"let a{g}_{q} = tb_As[{base_a}(tb_ty * 4u + {g * t.bm // rg + q}u) * {bk4}u + {k4}u];", 3)
                for e in range(4):
                    kk = 4 * k4 + e
                    line("{", 3)
                    for c in range(cg):
                        line(f"let b{c} = tb_Bs[{base_b}{kk * t.bn // 4}u + {slot(c * (t.bn // t.tn), 'tb_tx', kk)}];", 4)
                    for g in range(rg):
                        for q in range(4):
                            for c in range(cg):
                                acc = f"tb_c{g}_{q}_{c}"
                                line(f"{acc} = fma(vec4<f32>(a{g}_{q}.{XYZW[e]}), b{c}, {acc});", 4)
                    line("}", 3)
                line("}", 2)

        def stash(base_a: str, base_b: str, ind: int) -> None:
            for l in range(a_plan[0]):
                self._stash_lines(line, "a", a_mode, l, base_a, ind)
            for l in range(b_plan[0]):
                self._stash_lines(line, "b", b_mode, l, base_b, ind)

        prefetch("0", 1)
        line(f"let tb_nk = (tb_K + {t.bk - 1}) / {t.bk};")
        if t.stages == 1:
            line("for (var tb_kt: i32 = 0; tb_kt < tb_nk; tb_kt = tb_kt + 1) {")
            stash("", "", 2)
            line("workgroupBarrier();", 2)
            line("if (tb_kt + 1 < tb_nk) {", 2)
            prefetch(f"(tb_kt + 1) * {t.bk}", 3)
            line("}", 2)
            compute("", "")
            line("workgroupBarrier();", 2)
            line("}")
        else:
            # two workgroup tiles: step kt reads one while the next step's values go to the other
            size_a, size_b = t.bk * t.bm // 4, t.bk * t.bn // 4
            stash("", "", 1)
            line("workgroupBarrier();")
            line("for (var tb_kt: i32 = 0; tb_kt < tb_nk; tb_kt = tb_kt + 1) {")
            line(f"let tb_sa = u32(tb_kt & 1) * {size_a}u;", 2)
            line(f"let tb_sb = u32(tb_kt & 1) * {size_b}u;", 2)
            line("let tb_more = tb_kt + 1 < tb_nk;", 2)
            line("if (tb_more) {", 2)
            prefetch(f"(tb_kt + 1) * {t.bk}", 3)
            line("}", 2)
            compute("tb_sa + ", "tb_sb + ")
            line("if (tb_more) {", 2)
            stash(f"{size_a}u - tb_sa + ", f"{size_b}u - tb_sb + ", 3)
            line("}", 2)
            line("workgroupBarrier();", 2)
            line("}")
        self._store_lines(line, rg, cg)
        return L

    def _plan(self, which: str, mode: str, rows: int, bk: int) -> tuple[int, int]:
        """(loads per invocation, items in the tile) of an operand's staging."""
        items = rows * bk // 4 if mode != "scalar" else rows * bk
        return -(-items // self.tile.threads), items

    def _load_lines(self, line, which: str, mode: str, l: int, k0: str, bargs: str, ind: int) -> None:
        t = self.tile
        rows = t.bm if which == "a" else t.bn
        origin = "tb_m0" if which == "a" else "tb_n0"
        limit = "tb_M" if which == "a" else "tb_N"
        n_items = self._plan(which, mode, rows, t.bk)[1]
        reg = f"tb_r{which}{l}"
        c = f"(lid + {l * t.threads}u)"
        fn = f"tb_{which}"

        def call(rowv: str, kv: str, vec: bool) -> str:
            f = fn + ("4" if vec else "")
            return f"{f}({bargs}{rowv}, {kv})" if which == "a" else f"{f}({bargs}{kv}, {rowv})"

        if mode == "k4":
            row = f"{origin} + i32({c} / {t.bk // 4}u)"
            kv = f"{k0} + i32({c} % {t.bk // 4}u) * 4"
        elif mode == "r4":
            row = f"{origin} + i32({c} % {rows // 4}u) * 4"
            kv = f"{k0} + i32({c} / {rows // 4}u)"
        else:
            row = f"{origin} + i32({c} % {rows}u)"
            kv = f"{k0} + i32({c} / {rows}u)"
        # the checks a static extent that the tile divides makes always true are left out
        conds = [] if n_items % t.threads == 0 else [f"{c} < {n_items}u"]
        if not self.whole[which]:
            conds.append(f"{row} < {limit}")
        if not self.whole["k"]:
            conds.append(f"{kv} < tb_K")
        value = call(row, kv, mode != "scalar")
        if not conds:
            line(f"{reg} = {value};", ind)
            return
        line(f"{reg} = {'0.0' if mode == 'scalar' else 'vec4<f32>(0.0)'};", ind)
        line(f"if ({' && '.join(conds)}) {{ {reg} = {value}; }}", ind)

    def _stash_lines(self, line, which: str, mode: str, l: int, base: str = "", ind: int = 2) -> None:
        t = self.tile
        rows = t.bm if which == "a" else t.bn
        arr = "tb_As" if which == "a" else "tb_Bs"
        n_items = self._plan(which, mode, rows, t.bk)[1]
        c = f"(lid + {l * t.threads}u)"
        reg = f"tb_r{which}{l}"
        guard = "" if n_items % t.threads == 0 else f"if ({c} < {n_items}u) "
        if which == "a" and t.a_rows:
            # rows of k: element (row, k) at row * BK + k
            if mode == "k4":  # item c is (row c / (BK/4), k4 c % (BK/4)): vec4 slot c
                line(f"{guard}{{ {arr}[{base}{c}] = {reg}; }}", ind)
            elif mode == "r4":  # rows 4 (c % (BM/4)) .. +3 of k c / (BM/4)
                for q in range(4):
                    flat = f"((({c} % {rows // 4}u) * 4u + {q}u) * {t.bk}u + {c} / {rows // 4}u)"
                    line(f"{guard}{{ {arr}[{base}{flat} / 4u][{flat} % 4u] = {reg}.{XYZW[q]}; }}", ind)
            else:  # row c % BM, k c / BM
                flat = f"(({c} % {rows}u) * {t.bk}u + {c} / {rows}u)"
                line(f"{guard}{{ {arr}[{base}{flat} / 4u][{flat} % 4u] = {reg}; }}", ind)
        elif not t.swizzle:
            if mode == "k4":
                row = f"({c} / {t.bk // 4}u)"
                kq = f"({c} % {t.bk // 4}u)"
                for q in range(4):
                    flat = f"(({kq} * 4u + {q}u) * {rows}u + {row})"
                    line(f"{guard}{{ {arr}[{base}{flat} / 4u][{flat} % 4u] = {reg}.{XYZW[q]}; }}", ind)
            elif mode == "r4":
                line(f"{guard}{{ {arr}[{base}{c}] = {reg}; }}", ind)
            else:
                line(f"{guard}{{ {arr}[{base}{c} / 4u][{c} % 4u] = {reg}; }}", ind)
        else:
            # k-major, swizzled: element (k, m) in slot k * rows/4 + ((m / 4) ^ s(k)), lane m % 4
            r4 = rows // 4
            if mode == "k4":  # rows c / (BK/4), k 4 (c % (BK/4)) + q
                row = f"({c} / {t.bk // 4}u)"
                k0 = f"(({c} % {t.bk // 4}u) * 4u)"
                sw = t.swizzle_expr(k0)
                for q in range(4):
                    at = f"({k0} + {q}u) * {r4}u + (({row} / 4u) ^ {sw})"
                    line(f"{guard}{{ {arr}[{base}{at}][{row} % 4u] = {reg}.{XYZW[q]}; }}", ind)
            elif mode == "r4":  # k c / (rows/4), slot c % (rows/4)
                kv = f"({c} / {r4}u)"
                line(f"{guard}{{ {arr}[{base}{kv} * {r4}u + (({c} % {r4}u) ^ {t.swizzle_expr(kv)})] = {reg}; }}", ind)
            else:  # k c / rows, m c % rows
                kv = f"({c} / {rows}u)"
                m = f"({c} % {rows}u)"
                at = f"{kv} * {r4}u + (({m} / 4u) ^ {t.swizzle_expr(kv)})"
                line(f"{guard}{{ {arr}[{base}{at}][{m} % 4u] = {reg}; }}", ind)

    def _store_lines(self, line, rg: int, cg: int) -> None:
        k, t, nest = self.k, self.tile, self.nest
        out = k.params[nest.out].buffer
        N = nest.j.extent
        vec_ok = (out.dtype == dt.f32 and isinstance(N, Const) and int(N.value) % 4 == 0 and out.strides[-1] == Const(1)
                  and nest.index[-1] == nest.j.var
                  and all(size == Const(1) or (isinstance(st, Const) and int(st.value) % 4 == 0)
                          for size, st in zip(out.shape[:-1], out.strides[:-1])))
        if vec_ok:
            k.params[nest.out].vec4 = True
        bargs = "".join(f"v_{f.var.name}, " for f in nest.batch)

        def at(row: Expr, col: Expr) -> tuple[Expr, ...]:
            """The output index of element (row, col) of the tile."""
            names = {nest.i.var.name: row, nest.j.var.name: col}
            return tuple(ex.substitute(x, names) for x in nest.index)

        k.r.nonneg |= {f"tb_row{g}_{q}" for g in range(rg) for q in range(4)} | {f"tb_col{c}" for c in range(cg)}
        for g in range(rg):
            for q in range(4):
                row = Var(f"tb_row{g}_{q}")
                line(f"let v_{row.name} = tb_m0 + {g * t.bm // rg + q}i + i32(tb_ty) * 4;")
                line("{" if self.whole["a"] else f"if (v_{row.name} < tb_M) {{")
                for c in range(cg):
                    col = Var(f"tb_col{c}")
                    acc = f"tb_c{g}_{q}_{c}"
                    colx = f"tb_n0 + {c * t.bn // cg}i + i32(tb_tx) * 4"
                    line("{", 2)
                    line(f"let v_{col.name} = {colx};", 3)
                    def epi(e: int) -> str:
                        colv = f"v_{col.name}" if e == 0 else f"v_{col.name} + {e}"
                        return f"tb_epi({bargs}v_{row.name}, {colv}, {acc}.{XYZW[e]})"

                    if vec_ok:
                        off = k.offset(out, at(row, col))
                        value = f"vec4<f32>({', '.join(epi(e) for e in range(4))})"
                        st = f"st4_{nest.out}({off}, {value});"
                        line(st if self.whole["b"] else f"if (v_{col.name} < tb_N) {{ {st} }}", 3)
                    else:
                        for e in range(4):
                            off = k.offset(out, at(row, ex.add(col, Const(e))))
                            st = f"st_{nest.out}({off}, {epi(e)});"
                            line(st if self.whole["b"] else f"if (v_{col.name} + {e} < tb_N) {{ {st} }}", 3)
                    line("}", 2)
                line("}")


def _product(exprs: list[Expr]) -> Expr:
    out: Expr = Const(1)
    for e in exprs:
        out = ex.mul(out, e)
    return out
