"""Parallel loops through OpenMP: outline the loop, then `GOMP_parallel`.

A `parallel for i in start..+extent { body }` becomes three pieces:

    define internal void @k.par.N.work(ptr noalias %buf..., <free values>..., i64 %lo, i64 %hi)
        ; for i in lo..hi { body }  -- the body sees only its parameters
    define internal void @k.par.N.omp(ptr %ctx)
        ; load the values from the context struct, take this thread's contiguous slice
        ; of start..end from omp_get_thread_num()/omp_get_num_threads(), call .work
    ; at the loop's place:
    ;   store start, end and the free values into a stack struct %ctx
    ;   if end - start > 1: GOMP_parallel(@k.par.N.omp, %ctx, 0, 0) else: call .work(start, end)

Free values are every buffer pointer, symbol, `let` and outer loop index the body uses
(including symbols in the strides of buffers it touches). Buffers are real `noalias`
parameters of `.work`, so alias analysis inside the body is as good as in the kernel itself.
The team size passed to `GOMP_parallel` is read at each parallel loop through the module
global `@torchburn_num_threads`, a pointer the loader sets to the process's one thread count
(`runtime/threads.py`, TORCHBURN_NUM_THREADS); it starts out pointing at a 0, and 0 lets the
OpenMP runtime choose (torch's own setting). So the variable sets the threads of generated code
without touching torch's `omp_set_num_threads`. Slices are balanced: the first `n % threads` threads take
one extra iteration. Inside the outlined body, nested parallel loops run serially.
"""
from __future__ import annotations

from typing import Protocol

import llvmlite.ir as ir

from ...ir import expr as ex
from ...ir import loop as lp
from .function import BufferRef, FunctionState, Scope
from .types import I32, PTR, VOID


class StmtEmitter(Protocol):
    """What a parallel loop needs of the statement emitter (`stmt.StmtEmitter`, which calls
    this module): its function state, the loop bounds, and a counted loop; a new emitter of
    the same class emits the outlined body."""

    fs: FunctionState

    def __init__(self, fs: FunctionState) -> None: ...

    @property
    def b(self) -> ir.IRBuilder: ...

    def bounds(self, s: lp.For, scope: Scope) -> tuple[ir.Value, ir.Value]: ...

    def counted_loop(self, var: ex.Var, begin: ir.Value, end: ir.Value, body: lp.Stmt, scope: Scope) -> None: ...


#: The module global holding the address of the thread count (an i32) parallel loops use.
THREADS_GLOBAL = "torchburn_num_threads"


def thread_count_global(module: ir.Module) -> ir.GlobalVariable:
    """`@torchburn_num_threads`, defined on first use: a pointer to an internal 0 until the
    loader points it at the process's thread count."""
    existing = module.globals.get(THREADS_GLOBAL)
    if isinstance(existing, ir.GlobalVariable):
        return existing
    zero = ir.GlobalVariable(module, I32, THREADS_GLOBAL + ".default")
    zero.linkage = "internal"
    zero.global_constant = True
    zero.initializer = ir.Constant(I32, 0)
    g = ir.GlobalVariable(module, PTR, THREADS_GLOBAL)
    g.initializer = zero
    return g


def free_names(s: lp.For, scope: Scope) -> tuple[list[str], list[str]]:
    """Variables and buffers of `scope` that the loop body reads or writes."""
    var_names: set[str] = set()
    buf_names: set[str] = set()
    for st in lp.walk_stmts(s.body):
        if isinstance(st, lp.Store):
            buf_names.add(st.buffer)
        for e in lp.stmt_exprs(st):
            for node in ex.walk(e):
                if isinstance(node, ex.Var):
                    var_names.add(node.name)
                elif isinstance(node, ex.Load):
                    buf_names.add(node.buffer)
    bufs = sorted(n for n in buf_names if n in scope.buffers)
    for n in bufs:
        b = scope.buffers[n].buffer
        for e in (*b.shape, *b.strides):
            var_names |= ex.free_vars(e)
    return sorted(n for n in var_names if n in scope.vars), bufs


def emit_parallel_loop(se: "StmtEmitter", s: lp.For, scope: Scope) -> None:
    fs = se.fs
    b = se.b
    begin, end = se.bounds(s, scope)
    var_names, buf_names = free_names(s, scope)
    buffers = [scope.buffers[n] for n in buf_names]
    values = [scope.vars[n] for n in var_names]
    work = _emit_work(se, s, buffers, var_names, values, begin.type)
    omp = _emit_omp_wrapper(fs, work, len(buffers), [v.type for v in values], begin.type)

    # Pack start, end, the buffer pointers and the free values into a stack struct.
    fields = [begin, end, *(r.ptr for r in buffers), *values]
    struct = ir.LiteralStructType([f.type for f in fields])
    slot = fs.alloca(struct, name=f"{s.var.name}.ctx")
    for k, v in enumerate(fields):
        b.store(v, _field(b, slot, struct, k))

    gomp = fs.ctx.declare("GOMP_parallel", VOID, [PTR, PTR, I32, I32])
    trip = b.sub(end, begin)
    with b.if_else(b.icmp_signed(">", trip, ir.Constant(trip.type, 1))) as (many, few):
        with many:
            where = b.load(thread_count_global(fs.ctx.module), typ=PTR)
            threads = b.load(where, name="num_threads", typ=I32)
            b.call(gomp, [omp, slot, threads, ir.Constant(I32, 0)])
        with few:
            b.call(work, [*(r.ptr for r in buffers), *values, begin, end])


def _field(b: ir.IRBuilder, slot: ir.Value, struct: ir.LiteralStructType, k: int) -> ir.Value:
    return b.gep(slot, [ir.Constant(I32, 0), ir.Constant(I32, k)], inbounds=True, source_etype=struct)


def _emit_work(se: "StmtEmitter", s: lp.For, buffers: list[BufferRef], var_names: list[str],
               values: list[ir.Value], index_type: ir.Type) -> ir.Function:
    """The loop over one slice `lo..hi`, with every free value as a parameter."""
    fs = se.fs
    ctx = fs.ctx
    arg_types = [PTR] * len(buffers) + [v.type for v in values] + [index_type, index_type]
    fn = ir.Function(ctx.module, ir.FunctionType(VOID, arg_types), ctx.unique_name(fs.fn.name + ".par"))
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    inner_fs = FunctionState(ctx, fn, in_parallel=True, contract=fs.contract, prefetch=fs.prefetch)
    scope = Scope()
    args = list(fn.args)
    for ref, arg in zip(buffers, args):
        arg.name = ref.buffer.name
        if ref.noalias:
            arg.attributes.add("noalias")
        if ref.readonly:
            set.add(arg.attributes, "readonly")  # llvmlite's list of parameter attributes lacks it
        scope.buffers[ref.buffer.name] = BufferRef(ref.buffer, arg, ref.noalias, ref.readonly)
    for name, arg in zip(var_names, args[len(buffers):]):
        arg.name = name
        scope.vars[name] = arg
    lo, hi = args[-2], args[-1]
    type(se)(inner_fs).counted_loop(s.var, lo, hi, s.body, scope)
    inner_fs.finish()
    return fn


def _emit_omp_wrapper(fs: FunctionState, work: ir.Function, n_buffers: int,
                      value_types: list[ir.Type], index_type: ir.Type) -> ir.Function:
    """`void (ptr ctx)` run by every OpenMP thread: unpack, take a slice, call `work`."""
    ctx = fs.ctx
    fn = ir.Function(ctx.module, ir.FunctionType(VOID, [PTR]), work.name + ".omp")
    fn.linkage = "internal"
    fn.attributes.add("nounwind")
    b = ir.IRBuilder(fn.append_basic_block("entry"))
    struct = ir.LiteralStructType([index_type, index_type] + [PTR] * n_buffers + value_types)
    (slot,) = fn.args
    loaded = [b.load(_field(b, slot, struct, k), typ=t) for k, t in enumerate(struct.elements)]
    begin, end = loaded[0], loaded[1]

    tid = b.sext(b.call(ctx.declare("omp_get_thread_num", I32, []), []), index_type)
    nth = b.sext(b.call(ctx.declare("omp_get_num_threads", I32, []), []), index_type)
    zero = ir.Constant(index_type, 0)
    n = b.sub(end, begin)
    n = b.select(b.icmp_signed("<", n, zero), zero, n)
    per = b.sdiv(n, nth)
    extra = b.srem(n, nth)
    # lo = tid * per + min(tid, extra); hi = lo + per + (tid < extra)
    has_extra = b.icmp_signed("<", tid, extra)
    lo = b.add(b.mul(tid, per), b.select(has_extra, tid, extra))
    hi = b.add(b.add(lo, per), b.zext(has_extra, index_type))
    b.call(work, [*loaded[2:], b.add(begin, lo), b.add(begin, hi)])
    b.ret_void()
    return fn
