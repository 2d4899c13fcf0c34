"""The source of a compiled subgraph's launcher, generated from its tensor graph and program.

The launcher (`launcher.Launcher`) is a small straight-line Python function that guards the
inputs, binds the symbols, allocates the outputs and makes one native call. It is generated
here, where the IR is at hand, as a `launcher.LauncherSpec`: plain text and names, no IR objects. So the
spec can be stored in the FX-graph cache (`fx_cache.py`) and a warm process can build the same
launcher without importing the IR, the lowerings or the passes.

Guards are as tight as Python allows: for static shapes one tuple comparison of the sizes and
one of the strides (of the dimensions whose size is not 1: a stride of a size-1 dimension is
never used); for symbolic shapes one comparison per dimension that is not bound by it.
"""
from __future__ import annotations

from typing import Optional

from ..frontend.dtypes import to_torch
from ..ir import dtypes as dt
from ..ir import expr as ex
from ..ir import loop as lp
from ..ir import semantics as sem
from ..ir.dtypes import DType
from ..ir.expr import Const, Expr, Var
from ..ir.tensor import Graph, Value
from ..runtime.config import get_config
from .launcher import LauncherSpec


#: Index ops and their Python spelling: on Python ints, `//` and `%` round toward -inf as the
#: IR's `floordiv` and `mod` (`ir/semantics.py`); `min`/`max` are the builtins.
_PY_INFIX: dict[str, str] = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%"}


def python_expr(e: Expr) -> str:
    """An index expression as Python source (symbols are local variables of the launcher).

    It computes what `ir.semantics` says, for sizes below 2**63 (Python ints do not wrap at
    i64, and sizes never get there); a constant or a cast to a narrower integer type wraps as
    the semantics do. `tests/backend/test_launcher.py` checks it against `evaluate_index`."""
    if isinstance(e, Const):
        return str(int(e.value) if e.dtype.is_bool else sem.wrap_int(int(e.value), e.dtype))
    if isinstance(e, Var):
        return e.name
    if isinstance(e, ex.Binary):
        a, b = python_expr(e.a), python_expr(e.b)
        if not e.a.dtype.is_int:
            raise ValueError(f"index op {e.op} on {e.a.type} has no Python form")
        if e.op in ("min", "max"):
            return f"{e.op}({a}, {b})"
        op = _PY_INFIX.get(e.op)
        if op is None:
            raise ValueError(f"index op {e.op} has no Python form")
        return _wrapped(f"({a} {op} {b})", e.dtype)
    if isinstance(e, ex.Cast):
        src, dst = e.value.dtype, e.dtype
        if not ((src.is_int or src.is_bool) and dst.is_int):
            raise ValueError(f"cast from {src} to {dst} in an index expression")
        inner = python_expr(e.value)
        return inner if _preserves(src, dst) else _wrapped(inner, dst)
    raise ValueError(f"not an index expression: {e}")


def _preserves(src: DType, dst: DType) -> bool:
    """Whether every value of `src` is one of `dst` (then a cast changes nothing)."""
    if src.is_bool:
        return True
    if src.kind == dst.kind:
        return dst.bits >= src.bits
    return src.kind == "u" and dst.bits > src.bits


def _wrapped(src: str, dtype: DType) -> str:
    """Python source wrapping the value of `src` to `dtype` (nothing to do for i64)."""
    if dtype == dt.index:
        return src
    if dtype.kind == "u":
        return f"({src} % {1 << dtype.bits})"
    half = 1 << (dtype.bits - 1)
    return f"(({src} + {half}) % {1 << dtype.bits} - {half})"


def solve_affine(size: Expr, actual: str, bound: set[str]) -> Optional[tuple[str, str]]:
    """For a size `a * s + b` (integers `a != 0`, `b`) in one symbol `s` not yet bound: `s` and
    the Python source computing it from the `actual` size. None for any other expression.

    The size's own guard (`actual != a * s + b`, already among the checks) rejects sizes the
    floor division does not invert exactly, so a bad input still goes to PyTorch."""
    names = ex.free_vars(size)
    if isinstance(size, (Var, Const)) or len(names) != 1:
        return None
    (name,) = names
    if name in bound:
        return None
    at = [_eval_index(size, {name: k}) for k in (0, 1, 2)]
    if any(x is None for x in at):
        return None
    b, a = at[0], at[1] - at[0]  # type: ignore[operator]
    if a == 0 or at[2] != 2 * a + b:
        return None
    return name, f"({actual} - ({b})) // ({a})"


def _eval_index(e: Expr, env: dict[str, int]) -> Optional[int]:
    """The value of an index expression at integer symbol values (None if not one)."""
    try:
        return ex.evaluate_index(e, env)
    except (ValueError, KeyError, TypeError, ZeroDivisionError, sem.UndefinedOp):
        return None


def _dtype_name(dtype: object) -> str:
    return str(to_torch(dtype)).removeprefix("torch.")  # type: ignore[arg-type]


def _tuple_src(items: list[str]) -> str:
    return f"({', '.join(items)}{',' if len(items) == 1 else ''})"


def can_fault(program: lp.Program) -> bool:
    """Whether the program divides integers by something other than a constant known not to
    be 0, or checks an index read from a tensor (`codegen/llvm/faults.py`): then its launcher
    checks the fault counter after the call."""
    return any(not _nonzero_const(d) for k in program.kernels for d in lp.integer_divisors(k.body)) \
        or any(lp.checks_indices(k.body) for k in program.kernels)


def _nonzero_const(e: Expr) -> bool:
    if isinstance(e, ex.Broadcast):
        e = e.value
    return isinstance(e, Const) and int(e.value) != 0


#: Reductions that have no value over an empty dim: eager raises there.
_NEEDS_NONEMPTY = frozenset({"reduce_max", "reduce_min", "argmax", "argmin"})


def nonempty_checks(g: Graph, bound: set[str]) -> list[str]:
    """Conditions sending a call to eager when a max/min/argmax/argmin of the graph reduces
    over a symbolic dim that is 0 in this call: eager raises its own error there, where the
    kernel would return -inf or 0. (A dim known to be 0 never gets here: the lowering leaves
    such a reduction to PyTorch.)"""
    checks: list[str] = []
    for op in g.ops:
        if op.name not in _NEEDS_NONEMPTY or not op.operands:
            continue
        src = op.operands[0]
        dims = op.attrs.get("dims", (op.attrs.get("dim", 0),))
        for d in dims:
            size = src.shape[int(d)]
            if isinstance(size, Const) or not ex.free_vars(size) <= bound:
                continue
            check = f"{python_expr(size)} == 0"
            if check not in checks:
                checks.append(check)
    return checks


def launcher_spec(graph: Graph, program: lp.Program) -> LauncherSpec:
    """Generate the launcher of `program`, compiled from `graph`."""
    g, p = graph, program
    args = [f"a{i}" for i in range(len(g.inputs))]
    slow_args = ", ".join(args)
    body: list[str] = []
    bound: set[str] = set()
    checks: list[str] = []
    dtypes: list[tuple[str, str]] = []
    # Scalar symbol inputs first: they bind symbols directly.
    for i, v in enumerate(g.inputs):
        if isinstance(v, Var) and not v.name.startswith("_"):
            body.append(f"{v.name} = int(a{i})")
            bound.add(v.name)
    for i, v in enumerate(g.inputs):
        if not isinstance(v, Value):
            continue
        a = f"a{i}"
        dtypes.append((f"_dt{i}", _dtype_name(v.dtype)))
        layout = list(v.layout())
        static = all(isinstance(s, Const) for s in v.shape)
        # a stride of a dimension of size 0 or 1 is never used to address memory
        used = [d for d, s in enumerate(v.shape) if static and isinstance(s, Const) and int(s.value) > 1]
        if static and all(isinstance(layout[d], Const) for d in used):
            # the common case: dtype and device, one comparison of the sizes (which checks the
            # rank too), one of the strides that matter, all in the one `if` below
            checks.append(f"{a}.dtype is not _dt{i} or not {a}.is_cpu")
            checks.append(f"{a}.shape != {_tuple_src([python_expr(s) for s in v.shape])}")
            if used == list(range(len(v.shape))):
                checks.append(f"{a}.stride() != {_tuple_src([python_expr(st) for st in layout])}")
            elif used:
                body.append(f"st{i} = {a}.stride()")
                picked = _tuple_src([f"st{i}[{d}]" for d in used])
                checks.append(f"{picked} != {_tuple_src([python_expr(layout[d]) for d in used])}")
            continue
        body.append(f"if {a}.dtype is not _dt{i} or {a}.dim() != {v.type.rank} or not {a}.is_cpu:")
        body.append(f"    return _slow({slow_args}, why='input {i}: dtype, rank or device')")
        if not v.type.rank:
            continue
        body.append(f"sz{i} = {a}.shape; st{i} = {a}.stride()")
        for d, size in enumerate(v.shape):
            if isinstance(size, Var) and size.name not in bound:
                body.append(f"{size.name} = sz{i}[{d}]")
                bound.add(size.name)
            else:
                checks.append(f"sz{i}[{d}] != {python_expr(size)}")
        for d, (size, stride) in enumerate(zip(v.shape, layout)):
            if size == Const(1):
                continue
            if isinstance(stride, Var) and stride.name not in bound:
                body.append(f"{stride.name} = st{i}[{d}]")
                bound.add(stride.name)
            else:
                checks.append(f"(sz{i}[{d}] > 1 and st{i}[{d}] != {python_expr(stride)})")
    # Symbols that appear only inside a size expression such as `s1 + 3`: solved for.
    for i, v in enumerate(g.inputs):
        if isinstance(v, Value):
            for d, size in enumerate(v.shape):
                solved = solve_affine(size, f"sz{i}[{d}]", bound)
                if solved is not None:
                    body.append(f"{solved[0]} = {solved[1]}")
                    bound.add(solved[0])
                    checks.append(f"{solved[0]} < 0")
    checks += nonempty_checks(g, bound)
    if checks:
        body.append(f"if {' or '.join(checks)}:")
        body.append(f"    return _slow({slow_args}, why='dtype, device, sizes or strides differ from the compiled ones')")
    if p.kept:  # passed by `_fresh` below
        bound.add(lp.REFRESH)
    for s in p.symbols:
        if s.name not in bound:
            raise ValueError(f"symbol {s.name} cannot be bound from the inputs")
    # Outputs.
    for k, b in enumerate(p.outputs):
        dtypes.append((f"_odt{k}", _dtype_name(b.dtype)))
        # sizes as separate arguments: torch parses them faster than a tuple
        shape = ", ".join(python_expr(d) for d in b.shape) if b.shape else "()"
        body.append(f"o{k} = _empty({shape}, dtype=_odt{k})")
    ptrs = [f"a{i}.data_ptr()" for i, v in enumerate(g.inputs) if isinstance(v, Value)]
    ptrs += [f"o{k}.data_ptr()" for k in range(len(p.outputs))]
    syms = [s.name for s in p.symbols]
    sym_arg = f"_Syms({', '.join(syms)})" if syms else "_NOSYMS"
    ws = "None" if p.workspace_bytes == Const(0) else f"_ws({python_expr(p.workspace_bytes)})"
    tensor_args = [i for i, v in enumerate(g.inputs) if isinstance(v, Value)]
    if p.kept:
        # Temporaries kept in the workspace from the last call (`Program.kept`): computed again
        # when the tensors they come from, or the workspace, are not the last call's
        # (`Launcher._fresh`: identity, memory, version counter)
        position = {b.name: k for k, b in enumerate(p.inputs)}
        keyed = [f"a{tensor_args[position[name]]}" for name in p.kept_from]
        body.append(f"_w = {ws}")
        body.append(f"{lp.REFRESH} = _fresh(_w, {_tuple_src(keyed) if keyed else '()'})")
        ws = "_w"
    call = f"_entry(_Ptrs({', '.join(ptrs)}), {sym_arg}, {ws})"
    if can_fault(p) or get_config().bounds_check:
        # the fault counter moved during the call: a divisor was 0 (here or in a concurrent
        # call; PyTorch raises eager's error, or gives the values when the fault was not ours),
        # or, in bounds mode, an access was out of range (raised as `faults.OutOfBounds`)
        body += ["_f = _faults.value", call, "if _faults.value != _f:", f"    return _fault({slow_args})"]
    else:
        body.append(call)
    # Graph outputs, as the program says (not `g.outputs`: on a cache hit `g` never went
    # through the passes that may forward an input or merge two outputs); inputs returned
    # directly are copied. Program inputs are the graph's tensor inputs, in order.
    stored = lp.written_inputs(p)  # an in-place write (`inplace_writes.py`): the input itself
    source_of = {b.name: f"a{i}" if b.name in stored else f"a{i}.clone()" for b, i in zip(p.inputs, tensor_args)}
    source_of.update({b.name: f"o{k}" for k, b in enumerate(p.outputs)})
    kind_of = {b.name: f"input {i}" if b.name in stored else f"copy {i}" for b, i in zip(p.inputs, tensor_args)}
    kind_of.update({b.name: "new" for b in p.outputs})
    names = p.result_names()
    if len(names) != len(g.outputs) or any(n not in source_of for n in names):
        raise ValueError(f"{p.name}: the program returns {names}, the graph {len(g.outputs)} values")
    results = [source_of[n] for n in names]
    for k, shape in p.result_views:  # an output buffer returned in another shape: a view, no copy
        results[k] += f".view(({', '.join(python_expr(d) for d in shape)}{',' if len(shape) == 1 else ''}))"
    body.append(f"return {_tuple_src(results)}")
    # `launch(a0, ...)` and the same body taking AOTAutograd's boxed argument list, which
    # saves the frame `make_boxed_func` would add to every call
    unpack = f"{', '.join(args)}{',' if len(args) == 1 else ''} = args" if args else "pass"
    source = "\n".join([f"def launch({', '.join(args)}):"] + ["    " + ln for ln in body]
                       + ["", "", "def launch_boxed(args):", "    " + unpack] + ["    " + ln for ln in body]) + "\n"
    return LauncherSpec(source, p.name, tuple(dtypes), max(len(ptrs), 1), len(syms), len(results),
                        tuple(kind_of[n] for n in names))
