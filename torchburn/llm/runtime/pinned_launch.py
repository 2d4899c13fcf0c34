"""A compiled step's launcher with the model's tensors pinned: guarded and addressed once.

A decode step's launcher (`backend/launcher_gen.py`) takes every weight as an argument and,
per call, checks each one's dtype, device, sizes and strides and reads its ``data_ptr()``:
for SmolLM2-135M's 30 layers (~270 weight tensors) that was ~2 ms of Python per token,
more than the attention and norms together. The weights of a bound step (`step_cache.bind`)
are the same tensor objects on every call, and a tensor's dtype, device, sizes and strides
never change, so their checks hold forever once they hold.

`pin` rewrites the launcher's ``launch`` source (Python's `ast`) into a function of the
remaining arguments only:

    def launch(a0, a1, a2):                      # a0, a2: weights; a1: ids
        if a0.dtype is not _dt0 or a0.shape != (576, 288) or a1.shape != (1, 1) ...:
            return _slow(a0, a1, a2, why=...)
        _entry(_Ptrs(a0.data_ptr(), a1.data_ptr(), a2.data_ptr(), o0.data_ptr()), ...)
    ->
    def launch(a1):
        if a1.shape != (1, 1) ...:
            return _slow(_pin_t0, a1, _pin_t2, why=...)
        _pin_a = _Ptrs.from_buffer_copy(_pin_tmpl)      # the pinned addresses already in it
        _pin_a[1] = a1.data_ptr()
        _pin_a[3] = o0.data_ptr()
        _entry(_pin_a, ...)

Guard terms that depend on pinned tensors only are dropped after checking, once, that the
launcher's whole guard passes for the call at hand; terms that depend on any other argument
stay. ``_pin_t<j>`` are the pinned tensors, ``_pin_p<j>`` their addresses and ``_pin_tmpl``
the pointer array with those addresses filled in: closure cells of the new function, which
shares the launcher's globals (swapping ``_entry`` there, as the profiler does, still
applies). A launcher whose source has another shape is not pinned.
"""
from __future__ import annotations

import ast
import base64
import logging
import marshal
import sys
from dataclasses import dataclass
from types import CodeType
from typing import Any, Callable, Mapping, Optional, Sequence

log = logging.getLogger("torchburn")


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _is_guard(stmt: ast.stmt) -> bool:
    """`if <test>: return _slow(...)` (the shape `launcher_gen` writes for every guard)."""
    if not isinstance(stmt, ast.If) or stmt.orelse or len(stmt.body) != 1:
        return False
    ret = stmt.body[0]
    return (isinstance(ret, ast.Return) and isinstance(ret.value, ast.Call)
            and isinstance(ret.value.func, ast.Name) and ret.value.func.id == "_slow")


class _Pin(ast.NodeTransformer):
    """Pinned arguments: `aJ.data_ptr()` -> `_pin_pJ`, any other `aJ` -> `_pin_tJ`."""

    def __init__(self, pinned: Mapping[str, int]) -> None:
        self.pinned = pinned

    def visit_Call(self, node: ast.Call) -> ast.AST:
        f = node.func
        if (isinstance(f, ast.Attribute) and f.attr == "data_ptr" and not node.args
                and isinstance(f.value, ast.Name) and f.value.id in self.pinned):
            return ast.copy_location(ast.Name(f"_pin_p{self.pinned[f.value.id]}", ast.Load()), node)
        return self.generic_visit(node)

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id in self.pinned:
            return ast.copy_location(ast.Name(f"_pin_t{self.pinned[node.id]}", ast.Load()), node)
        return node


def _split_guards(body: list[ast.stmt], params: list[str], pinned: set[str]) -> tuple[list[ast.stmt], list[ast.expr]]:
    """The body with guard terms that depend only on pinned arguments removed, and those
    terms (to be checked once). Dependencies follow the straight-line assignments."""
    deps: dict[str, set[str]] = {p: {p} for p in params}

    def depends(node: ast.AST) -> set[str]:
        out: set[str] = set()
        for name in _names(node):
            out |= deps.get(name, set())
        return out

    kept: list[ast.stmt] = []
    dropped: list[ast.expr] = []
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            found = depends(stmt.value)
            for target in stmt.targets:
                for name in _names(target):
                    deps[name] = found
        if _is_guard(stmt):
            assert isinstance(stmt, ast.If)
            terms = stmt.test.values if isinstance(stmt.test, ast.BoolOp) and isinstance(stmt.test.op, ast.Or) else [stmt.test]
            stay = []
            for term in terms:
                d = depends(term)
                (dropped if d and d <= pinned else stay).append(term)
            if not stay:
                continue
            stmt.test = stay[0] if len(stay) == 1 else ast.BoolOp(ast.Or(), stay)
        kept.append(stmt)
    return kept, dropped


#: Bump when what `_build` makes (its code objects, the slot list) changes.
FORMAT = "pin1"


@dataclass(frozen=True)
class PinBuild:
    """What pinning a launcher's source makes, independent of the tensors' addresses (and so
    kept on disk): the guard check ``_check(*args) -> bool``, the module defining
    ``_make(_pin_t<j>, _pin_p<j>, ..., _pin_tmpl) -> launch``, the pinned argument
    positions in the order `_make` takes them, and which slot of the pointer array holds the
    address of which pinned argument (``slots``; ``ptrs`` is the array's length, None when the
    launcher builds no such array)."""

    guard: CodeType
    maker: CodeType
    cells: tuple[int, ...]
    slots: tuple[tuple[int, int], ...]
    ptrs: Optional[int]


def pin(launch: Callable[..., Any], fixed: Mapping[int, Any],
        sample: Sequence[Any]) -> Optional[Callable[..., Any]]:
    """`launch` as a function of its arguments not in `fixed` (position -> tensor), in order;
    None when its source is not a launcher's or its guard fails for `sample` (all arguments
    of one call, the fixed ones included).

    Rewriting the source is the costly part (parsing and compiling an 8B model's launcher:
    ~0.15 s, paid by every prefill and decode shape of every warm start), and it depends only
    on the source and which positions are pinned: its result is kept in memory and in the disk
    cache (`_cached_build`), and each process only checks the guard and fills in addresses."""
    launcher = getattr(launch, "launcher", None)
    source = getattr(launcher, "source", None)
    if not isinstance(source, str) or not fixed:
        return None
    scope = launch.__globals__
    make = scope.get("_Ptrs")
    ptrs = len(make()) if make is not None else None
    name = getattr(launcher, "name", "step")
    built = _cached_build(source, sorted(fixed), len(sample), ptrs, name)
    if built is None or any(j >= len(sample) for j in built.cells):
        return None
    namespace: dict[str, Any] = {}
    exec(built.guard, scope, namespace)
    try:
        if not namespace["_check"](*sample):
            return None
    except Exception as err:  # noqa: BLE001 - a guard that cannot run: keep the full launcher
        log.info("torchburn: a step launcher's guard did not run (%s); not pinned", err)
        return None
    template = None
    if built.ptrs is not None:
        array = make()
        for k, j in built.slots:
            array[k] = fixed[j].data_ptr()
        template = bytes(array)
    namespace = {}
    exec(built.maker, scope, namespace)
    values: list[Any] = []
    for j in built.cells:
        values += [fixed[j], fixed[j].data_ptr()]
    return namespace["_make"](*values, template)


_BUILDS: dict[str, Optional[PinBuild]] = {}


def _pin_key(source: str, fixed: Sequence[int], arity: int, ptrs: Optional[int]) -> str:
    """What a `PinBuild` depends on: the source, the pinned positions, the Python that
    compiled its code objects (marshal's format is per version), this module's format."""
    from blake3 import blake3

    h = blake3(f"{FORMAT} {sys.implementation.cache_tag} {sys.version} {list(fixed)} {arity} {ptrs}\n".encode())
    h.update(source.encode("utf-8"))
    return "pn" + h.hexdigest()


def _cached_build(source: str, fixed: Sequence[int], arity: int, ptrs: Optional[int],
                  name: str) -> Optional[PinBuild]:
    """`_build`'s result from this process's memo, else the disk cache, else built (and
    stored there). A launcher that cannot be pinned is remembered only in memory."""
    from ...runtime.config import get_config
    from ...runtime.disk_cache import disk_cache

    key = _pin_key(source, fixed, arity, ptrs)
    if key in _BUILDS:
        return _BUILDS[key]
    disk = disk_cache(get_config().cache_dir)
    built = _read(disk.load_graph(key, count=False)) if disk is not None else None
    if built is None:
        built = _build(source, fixed, arity, ptrs, name)
        if built is not None and disk is not None:
            disk.store_graph(key, {"guard": _pack(built.guard), "maker": _pack(built.maker),
                                    "cells": list(built.cells), "slots": [list(s) for s in built.slots],
                                    "ptrs": built.ptrs})
    _BUILDS[key] = built
    return built


def _pack(code: CodeType) -> str:
    return base64.b64encode(marshal.dumps(code)).decode("ascii")


def _read(record: Optional[dict[str, Any]]) -> Optional[PinBuild]:
    """A stored `PinBuild` (the record passed the cache's keyed digest), or None."""
    if record is None:
        return None
    try:
        guard, maker = (marshal.loads(base64.b64decode(record[k])) for k in ("guard", "maker"))
        if not isinstance(guard, CodeType) or not isinstance(maker, CodeType):
            return None
        ptrs = record["ptrs"]
        return PinBuild(guard, maker, tuple(int(j) for j in record["cells"]),
                        tuple((int(k), int(j)) for k, j in record["slots"]),
                        None if ptrs is None else int(ptrs))
    except (KeyError, TypeError, ValueError, EOFError) as err:
        log.warning("torchburn: a pinned launcher's cache record is malformed (%s); building it again", err)
        return None


def _build(source: str, fixed: Sequence[int], arity: int, ptrs: Optional[int],
           name: str) -> Optional[PinBuild]:
    """The guard check and the pinned launcher's module for `source` with arguments `fixed`
    pinned, or None when the source is not a launcher's of that arity."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "launch"), None)
    if fn is None or fn.args.vararg or fn.args.kwarg or fn.args.defaults:
        return None
    params = [a.arg for a in fn.args.args]
    if len(params) != arity or any(not 0 <= j < len(params) for j in fixed):
        return None
    if not any(_is_guard(s) for s in fn.body):
        return None
    guard = _guard_code(source)
    pinned = {params[j]: j for j in fixed}
    body, _ = _split_guards(list(fn.body), params, set(pinned))
    fn.body = [_Pin(pinned).visit(s) for s in body]
    fn.args.args = [a for a in fn.args.args if a.arg not in pinned]
    slots = _prefill_pointers(fn, {f"_pin_p{j}": j for j in fixed}, ptrs)
    cells = tuple(sorted(fixed))
    header = ", ".join(f"_pin_t{j}, _pin_p{j}" for j in cells) + ", _pin_tmpl"
    module = ast.parse(f"def _make({header}):\n    return launch\n")
    maker = module.body[0]
    assert isinstance(maker, ast.FunctionDef)
    maker.body.insert(0, fn)
    ast.fix_missing_locations(module)
    code = compile(module, f"<torchburn pinned launcher {name}>", "exec")
    return PinBuild(guard, code, cells, tuple(slots or ()), ptrs if slots is not None else None)


def _prefill_pointers(fn: ast.FunctionDef, known: Mapping[str, int], ptrs: Optional[int]) -> Optional[list[tuple[int, int]]]:
    """Build the pointer array from a template holding the pinned addresses: the call
    `_Ptrs(_pin_p0, a1.data_ptr(), ...)` (a ctypes array made from ~300 ints costs ~60 us)
    becomes `_pin_a = _Ptrs.from_buffer_copy(_pin_tmpl); _pin_a[1] = a1.data_ptr(); ...`
    (~1 us plus the slots that change). Returns the template's slots, (array index, pinned
    argument position) for each pinned address, or None (no such call; ``ptrs`` is the
    array's length, None where the launcher has no `_Ptrs`)."""
    for i, stmt in enumerate(fn.body):
        calls = [n for n in ast.walk(stmt) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "_Ptrs" and not n.keywords]
        if len(calls) != 1 or ptrs is None or len(calls[0].args) > ptrs:
            continue
        call = calls[0]
        slots: list[tuple[int, int]] = []
        prelude: list[ast.stmt] = ast.parse("_pin_a = _Ptrs.from_buffer_copy(_pin_tmpl)").body
        for k, arg in enumerate(call.args):
            if isinstance(arg, ast.Name) and arg.id in known:
                slots.append((k, known[arg.id]))
                continue
            prelude.append(ast.Assign([ast.Subscript(ast.Name("_pin_a", ast.Load()), ast.Constant(k), ast.Store())], arg))
        for node in ast.walk(stmt):
            for field, value in ast.iter_fields(node):
                if value is call:
                    setattr(node, field, ast.Name("_pin_a", ast.Load()))
                elif isinstance(value, list) and any(v is call for v in value):
                    setattr(node, field, [ast.Name("_pin_a", ast.Load()) if v is call else v for v in value])
        fn.body[i:i] = prelude
        return slots
    return None


def _guard_code(source: str) -> CodeType:
    """A module defining ``_check(*args) -> bool``: whether every guard of the launcher passes
    for its arguments (its statements up to the last guard, each `return _slow(...)` made
    `return False`, then `return True`)."""
    tree = ast.parse(source)
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "launch")
    last = max(i for i, s in enumerate(fn.body) if _is_guard(s))
    body: list[ast.stmt] = []
    for stmt in fn.body[:last + 1]:
        if _is_guard(stmt):
            assert isinstance(stmt, ast.If)
            stmt.body = [ast.Return(ast.Constant(False))]
        body.append(stmt)
    body.append(ast.Return(ast.Constant(True)))
    fn.body, fn.name = body, "_check"
    tree.body = [fn]
    return compile(ast.fix_missing_locations(tree), "<torchburn launcher guard>", "exec")
