"""`gpu-inline-rows`: a one-row kernel computed inside the row kernel that reads it.

On a GPU a stored value costs a dispatch: the decode step of a transformer normalizes one row
(RMSNorm: a sum of squares, then `x * rsqrt(..) * g`) and the matrix-vector product after it
reads that row. A kernel that computes a single row (its outer loops have extent 1: a prefix
of reductions into scalars, then one loop storing the row's elements), whose row is read by one
other kernel alone, is computed inside that reader instead: its prefix runs where the reader
starts a row of its own (before the reader's loop over the stored row's elements), and each
element is computed where the reader loaded it. The row is never stored; the norm's dispatch
is gone (a 30-layer decode step: 219 -> 158 dispatches).

Each row of the reader recomputes the prefix: a product's output element reads the whole
normalized row anyway, so the prefix (a second pass over the same `x`, from cache) at most
doubles a row's loads (LayerNorm's mean and shifted variance: three passes). The
`max_recompute` option (default 4) bounds it: the prefix's iterations may be
at most that many times those of the reader's loop over the stored row (0 turns the pass off).
The producer's inputs must not be written between the two calls or by the reader. They join
the reader's parameters before its last, the buffer it writes (`lp.written_inputs` reads a
program's in-place writes from the calls' last arguments).

Before:

    program @main(%x: f32[1, 64] strides [64, 1], %g: f32[64] strides [1], %w: f32[32, 64] strides [64, 1]) -> (%out0: f32[32] strides [1]) {
      temp %n: f32[1, 64] strides [64, 1]
      call @norm(%x, %g, %n)
      call @gemv(%n, %w, %out0)
    }
    kernel @norm(%x: f32[1, 64] strides [64, 1], %g: f32[64] strides [1], %n: f32[1, 64] strides [64, 1]) {
      for i0 in 0..1 {
        alloc %acc: f32[1] strides [1] local
        %acc[0] = 0.0:f32
        for r in 0..64 {
          let a = %x[i0, r]
          %acc[0] = %acc[0] + a * a
        }
        let s = rsqrt(%acc[0] / 64.0:f32 + 1e-05:f32)
        for i1 in 0..64 {
          %n[i0, i1] = %g[i1] * (%x[i0, i1] * s)
        }
      }
    }
    kernel @gemv(%n: f32[1, 64] strides [64, 1], %w: f32[32, 64] strides [64, 1], %out0: f32[32] strides [1]) {
      for j in 0..32 {
        alloc %dot: f32[1] strides [1] local
        %dot[0] = 0.0:f32
        for k in 0..64 {
          %dot[0] = %dot[0] + %n[0, k] * %w[j, k]
        }
        %out0[j] = %dot[0]
      }
    }

After (one kernel; `%n` is gone):

    program @main(...) -> (%out0: f32[32] strides [1]) {
      call @gemv_norm(%w, %x, %g, %out0)
    }
    kernel @gemv_norm(%w: ..., %x_1: f32[1, 64] strides [64, 1], %g_1: f32[64] strides [1], %out0: ...) {
      for j in 0..32 {
        alloc %acc_1: f32[1] strides [1] local
        %acc_1[0] = 0.0:f32
        for r_1 in 0..64 {
          let a_1 = %x_1[0, r_1]
          %acc_1[0] = %acc_1[0] + a_1 * a_1
        }
        let s_1 = rsqrt(%acc_1[0] / 64.0:f32 + 1e-05:f32)
        alloc %dot: f32[1] strides [1] local
        %dot[0] = 0.0:f32
        for k in 0..64 {
          let n_1 = %g_1[k] * (%x_1[0, k] * s_1)
          %dot[0] = %dot[0] + n_1 * %w[j, k]
        }
        %out0[j] = %dot[0]
      }
    }

`gpu-map` then maps the reader as before: its row is a sequence of loops over the row (the
prefix's reduction, the product's), one workgroup per output element (`rows.py`).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar, Optional

from ...ir import expr as ex
from ...ir import loop as lp
from ...ir.expr import Const, Expr, Var
from ...ir.transform import StmtMutator
from ..base import LoopPass, PassError, register_pass
from ..loop.dedup_kernels import dedup_program
from ..loop.loop_utils import NameSupply, _Freshen, substitute_stmt, vars_through_lets


@dataclass
class _Row:
    """A one-row kernel taken apart: the statements before its row loop (reductions into
    scalars), the row loop's variable, its statements (lets, then the store), the stored
    parameter and the index position the loop variable takes."""

    prefix: tuple[lp.Stmt, ...]
    var: Var
    lets: tuple[lp.Let, ...]
    value: Expr
    out: str
    position: int
    extent: int


def _stmts(s: lp.Stmt) -> tuple[lp.Stmt, ...]:
    return s.stmts if isinstance(s, lp.Block) else (s,)


def _static(e: Expr) -> Optional[int]:
    return int(e.value) if isinstance(e, Const) else None


def _written(k: lp.Kernel) -> set[str]:
    params = {p.name for p in k.params}
    return {s.buffer for s in lp.walk_stmts(k.body) if isinstance(s, lp.Store) and s.buffer in params}


def _loads(s: lp.Stmt, buffer: str) -> list[ex.Load]:
    return [n for e in lp.stmt_exprs(s) for n in ex.walk(e) if isinstance(n, ex.Load) and n.buffer == buffer]


def _iterations(s: lp.Stmt) -> Optional[int]:
    """Iterations of the innermost statements of `s` (a loop nest's trip count), or None
    when a loop's extent is not static."""
    if isinstance(s, lp.For):
        n, inner = _static(s.extent), _iterations(s.body)
        return None if n is None or inner is None else n * max(inner, 1)
    if isinstance(s, lp.Block):
        counts = [_iterations(x) for x in s.stmts]
        return None if any(c is None for c in counts) else sum(c for c in counts if c)  # type: ignore[misc]
    if isinstance(s, lp.If):
        return None
    return 0


def one_row(k: lp.Kernel) -> Optional[_Row]:
    """`k` as a one-row kernel (module docstring), or None."""
    zero: dict[str, Expr] = {}
    lets: list[lp.Stmt] = []  # constants computed before the loops of one iteration
    body = k.body
    while True:
        stmts = _stmts(body)
        if len(stmts) > 1 and all(isinstance(s, lp.Let) for s in stmts[:-1]):
            lets.extend(stmts[:-1])
            body = stmts[-1]
        if not (isinstance(body, lp.For) and _static(body.extent) == 1 and _static(body.start) == 0):
            break
        zero[body.var.name] = Const(0, body.var.type)
        body = body.body
    stmts = _stmts(substitute_stmt(lp.block(*lets, body), zero))
    if not stmts or not isinstance(stmts[-1], lp.For):
        return None
    tail, prefix = stmts[-1], stmts[:-1]
    params = {p.name for p in k.params}
    for s in prefix:
        for x in lp.walk_stmts(s):
            if isinstance(x, lp.Store) and x.buffer in params:
                return None
            if isinstance(x, lp.If):
                return None
    extent = _static(tail.extent)
    if extent is None or _static(tail.start) != 0:
        return None
    inner = _stmts(tail.body)
    if not inner or not isinstance(inner[-1], lp.Store) or not all(isinstance(x, lp.Let) for x in inner[:-1]):
        return None
    store = inner[-1]
    if store.buffer not in params or _written(k) != {store.buffer}:
        return None
    places = [i for i, e in enumerate(store.index) if e == tail.var]
    if len(places) != 1 or any(_static(e) != 0 for i, e in enumerate(store.index) if i != places[0]):
        return None
    out = next(p for p in k.params if p.name == store.buffer)
    size = 1
    for d in out.shape:
        n = _static(d)
        if n is None:
            return None
        size *= n
    if size != extent or any(_loads(x, store.buffer) for x in lp.walk_stmts(k.body)):
        return None
    return _Row(prefix, tail.var, inner[:-1], store.value, store.buffer, places[0], extent)  # type: ignore[arg-type]


@dataclass
class _Site:
    """Where the reader's loads of the row are: the loop body the prefix goes into (a path of
    steps from the kernel body: -1 enters a loop's body, n takes a block's n-th statement),
    the position there before which it goes, and the iterations of the reader's loop over
    the row."""

    path: tuple[int, ...]
    at: int
    row_iterations: int


def reader_site(k: lp.Kernel, param: str, position: int) -> Optional[_Site]:
    """Where the prefix of a row read through `param` goes in `k` (`_Site`), or None when the
    loads are not all inside loops over the row's elements in one enclosing loop's body, or
    index the row otherwise than at `position` (the other indices 0)."""
    lets = {s.var.name: s.value for s in lp.walk_stmts(k.body) if isinstance(s, lp.Let)}
    sites: set[tuple[tuple[int, ...], int]] = set()
    rows: list[int] = []

    def visit(s: lp.Stmt, path: tuple[int, ...], loops: list[tuple[lp.For, tuple[int, ...], int]]) -> bool:
        if isinstance(s, lp.For):
            body = path + (-1,)
            return visit(s.body, body, loops + [(s, body, 0)])
        if isinstance(s, lp.Block):
            for i, x in enumerate(s.stmts):
                inner = loops
                if loops and loops[-1][1] == path:  # this block is the innermost loop's body
                    inner = loops[:-1] + [(loops[-1][0], path, i)]
                if not visit(x, path + (i,), inner):
                    return False
            return True
        if isinstance(s, lp.If):  # loads under a condition: not inlined
            return not any(_loads(x, param) for x in lp.walk_stmts(s))
        unit = {f.var.name for f, _, _ in loops if _static(f.extent) == 1 and _static(f.start) == 0}
        for load in _loads(s, param):
            if any(_static(e) != 0 and not (isinstance(e, Var) and e.name in unit)
                   for i, e in enumerate(load.index) if i != position):
                return False  # another element than the row's (a loop of one iteration is at 0)
            deps = vars_through_lets(load.index[position], lets)
            first = next((n for n, (f, _, _) in enumerate(loops) if f.var.name in deps), None)
            if first is None or first == 0:
                return False  # no loop over the row, or nothing enclosing it
            _, body, at = loops[first - 1]
            sites.add((body, at))
            n = _iterations(loops[first][0])
            if n is None:
                return False
            rows.append(n)
        return True

    if not visit(k.body, (), []) or not sites:
        return None
    if len({p for p, _ in sites}) != 1:
        return None
    path = next(iter(sites))[0]
    return _Site(path, min(a for _, a in sites), min(rows))


class _Rename(StmtMutator):
    """Buffers renamed in loads and stores; loads of one buffer replaced by a function of
    their index."""

    def __init__(self, buffers: dict[str, str], loads: Optional[tuple[str, object]] = None) -> None:
        self.buffers, self.loads = buffers, loads

    def visit_Load(self, node: ex.Load) -> Expr:
        node = self.generic_visit(node)  # type: ignore[assignment]
        if self.loads is not None and node.buffer == self.loads[0]:
            return self.loads[1](node)  # type: ignore[operator]
        name = self.buffers.get(node.buffer)
        return node if name is None else replace(node, buffer=name)

    def visit_Store(self, s: lp.Store) -> lp.Stmt:
        s = self.generic_visit_stmt(s)  # type: ignore[assignment]
        name = self.buffers.get(s.buffer)
        return s if name is None else replace(s, buffer=name)


def _block_at(s: lp.Stmt, path: tuple[int, ...]) -> lp.Stmt:
    """The statement at `path` (`_Site.path`)."""
    for step in path:
        s = s.body if step == -1 else _stmts(s)[step]  # type: ignore[attr-defined]
    return s


def _replace_at(s: lp.Stmt, path: tuple[int, ...], new: lp.Stmt) -> lp.Stmt:
    """`s` with the statement at `path` replaced by `new`."""
    if not path:
        return new
    if path[0] == -1:
        return replace(s, body=_replace_at(s.body, path[1:], new))  # type: ignore[attr-defined]
    stmts = list(_stmts(s))
    stmts[path[0]] = _replace_at(stmts[path[0]], path[1:], new)
    return lp.block(*stmts)


def inline_row(producer: lp.Kernel, row: _Row, reader: lp.Kernel, param: str, site: _Site,
               name: str, bind: dict[str, str]) -> tuple[lp.Kernel, dict[str, str]]:
    """`reader` computing `producer`'s row itself: the fused kernel, and for each producer
    parameter it reads, the fused parameter it became (`bind`: producer parameter ->
    reader parameter bound to the same buffer, reused as it is)."""
    names = NameSupply.for_kernel(reader)
    names.used |= NameSupply.for_kernel(producer).used
    renamed: dict[str, str] = {}
    params = list(reader.params[:-1])  # the written buffer stays last (`lp.written_inputs`)
    for p in producer.params:
        if p.name == row.out:
            continue
        if p.name in bind:
            renamed[p.name] = bind[p.name]
            continue
        fresh = names.fresh(p.name)
        renamed[p.name] = fresh
        params.append(replace(p, name=fresh))
    params = [p for p in (*params, reader.params[-1]) if p.name != param]
    rename = _Rename(renamed)
    fresh = _Freshen(names, "")
    prefix = [fresh.visit_stmt(rename.visit_stmt(s)) for s in row.prefix]
    tail_var = Var(names.fresh("v"), row.value.type)
    tail = lp.block(*(rename.visit_stmt(s) for s in row.lets), lp.Let(tail_var, rename.visit(row.value)))
    tail = fresh.visit_stmt(substitute_stmt(tail, {row.var.name: Var("tb_row_index", row.var.type)}))

    def element(body: lp.Stmt) -> lp.Stmt:
        """`body` with each statement's loads of the row computed just before it."""
        out: list[lp.Stmt] = []
        for s in _stmts(body):
            if isinstance(s, lp.For):
                out.append(replace(s, body=element(s.body)))
                continue
            if isinstance(s, lp.If):
                out.append(replace(s, then=element(s.then), orelse=None if s.orelse is None else element(s.orelse)))
                continue
            done: dict[Expr, Var] = {}
            for load in _loads(s, param):
                if load in done:
                    continue
                copy = _Freshen(names, "").visit_stmt(substitute_stmt(tail, {"tb_row_index": load.index[row.position]}))
                stmts = _stmts(copy)
                out.extend(stmts)
                done[load] = stmts[-1].var  # type: ignore[union-attr]
            if done:
                s = _Rename({}, (param, lambda n: done[n])).visit_stmt(s)
            out.append(s)
        return lp.block(*out)

    body = element(reader.body)
    target = _block_at(body, site.path)
    stmts = list(_stmts(target))
    stmts[site.at:site.at] = prefix
    body = _replace_at(body, site.path, lp.block(*stmts))
    symbols = {v.name: v for v in (*reader.symbols, *producer.symbols)}
    origin = "; ".join(o for o in (dict(reader.attrs).get("origin"), dict(producer.attrs).get("origin")) if o)
    attrs = tuple((key, origin if key == "origin" else v) for key, v in reader.attrs)
    if origin and "origin" not in dict(attrs):
        attrs += (("origin", origin),)
    return replace(reader, name=name, params=tuple(params), symbols=tuple(symbols.values()), body=body,
                   attrs=attrs), renamed


@register_pass
@dataclass(frozen=True)
class GpuInlineRows(LoopPass):
    """Compute one-row kernels inside the row kernel that reads them (module docstring)."""

    name: ClassVar[str] = "gpu-inline-rows"
    #: The producer's iterations (its prefix) per reader row, at most this many times the
    #: reader's own loop over the row; 0 turns the pass off.
    max_recompute: float = 4.0

    def __post_init__(self) -> None:
        if self.max_recompute < 0:
            raise PassError(f"gpu-inline-rows: max_recompute must be >= 0, not {self.max_recompute}")

    def run(self, program: lp.Program) -> lp.Program:
        if self.max_recompute == 0:
            return program
        start = program
        # per kernel name (kernels are never renamed; a fused one gets a new name): each
        # kernel taken apart once, not once per round
        rows: dict[str, Optional[_Row]] = {}
        written: dict[str, set[str]] = {}
        for _ in range(len(program.calls)):
            fused = self._inline_one(program, rows, written)
            if fused is None:
                break
            program = fused
        if program is start:
            return program
        used = {a for c in program.calls for a in c.args}
        called = {c.kernel for c in program.calls}
        program = replace(program, temps=tuple(t for t in program.temps if t.name in used),
                          temp_offsets=tuple((n, o) for n, o in program.temp_offsets if n in used),
                          kernels=tuple(k for k in program.kernels if k.name in called))
        return dedup_program(program)

    def _inline_one(self, program: lp.Program, rows: dict[str, Optional[_Row]],
                    written: dict[str, set[str]]) -> Optional[lp.Program]:
        """`program` with its first inlinable producer call inlined into its reader, or None
        (`rows`, `written`: `one_row` and `_written` of the kernels seen, by name)."""
        temps = {t.name for t in program.temps}
        returned = set(program.result_names()) | {b.name for b in program.outputs}
        kernels = {k.name: k for k in program.kernels}
        for name, k in kernels.items():
            if name not in written:
                written[name] = _written(k)
        writes = [{c.args[n] for n, p in enumerate(kernels[c.kernel].params) if p.name in written[c.kernel]}
                  for c in program.calls]
        for i, call in enumerate(program.calls):
            producer = kernels[call.kernel]
            if producer.name not in rows:
                rows[producer.name] = one_row(producer)
            row = rows[producer.name]
            if row is None:
                continue
            out_pos = next(n for n, p in enumerate(producer.params) if p.name == row.out)
            out = call.args[out_pos]
            if out not in temps or out in returned or call.offset(out_pos) is not None:
                continue
            readers = [j for j, c in enumerate(program.calls) if j != i and out in c.args]
            if len(readers) != 1 or readers[0] < i or sum(w == out for w in writes[i]) != 1:
                continue
            j = readers[0]
            reader_call = program.calls[j]
            reader = kernels[reader_call.kernel]
            if reader_call.args.count(out) != 1 or out in writes[j]:
                continue
            inputs = {(a, call.offset(n)) for n, a in enumerate(call.args) if n != out_pos}
            if any(a in w for a, _ in inputs for w in writes[i + 1:j + 1]):
                continue
            pos = reader_call.args.index(out)
            param = reader.params[pos].name
            site = reader_site(reader, param, row.position)
            if site is None:
                continue
            work = [_iterations(s) for s in row.prefix]
            if any(n is None for n in work) or sum(work) > self.max_recompute * site.row_iterations:  # type: ignore[arg-type]
                continue
            bind: dict[str, str] = {}
            by_arg = {(a, reader_call.offset(n)): reader.params[n] for n, a in enumerate(reader_call.args)}
            for n, p in enumerate(producer.params):
                q = by_arg.get((call.args[n], call.offset(n)))
                if n != out_pos and q is not None and q.name != param and (q.dtype, q.shape, q.strides) == \
                        (p.dtype, p.shape, p.strides):
                    bind[p.name] = q.name
            name = NameSupply(kernels).fresh(f"{reader.name}_{producer.name}")
            fused, renamed = inline_row(producer, row, reader, param, site, name, bind)
            arg_of = {p.name: (reader_call.args[n], reader_call.offset(n)) for n, p in enumerate(reader.params)}
            for n, p in enumerate(producer.params):
                if n != out_pos and renamed[p.name] not in arg_of:
                    arg_of[renamed[p.name]] = (call.args[n], call.offset(n))
            args = tuple(arg_of[p.name] for p in fused.params)
            offsets = tuple(o for _, o in args) if any(o is not None for _, o in args) else ()
            new_call = lp.KernelCall(name, tuple(a for a, _ in args), offsets)
            calls = list(program.calls)
            calls[j] = new_call
            del calls[i]
            return replace(program, calls=tuple(calls), kernels=(*program.kernels, fused))
        return None
