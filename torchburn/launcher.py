"""Calling compiled programs with torch tensors: guards, output allocation, one native call.

For each compiled subgraph we generate a small Python function (as Inductor does) that
checks the inputs against what the program was compiled for (dtype, rank, sizes, strides,
device), binds the symbols, allocates the outputs with torch, and makes one native call with
the tensors' own memory (`data_ptr()`, zero copy). Generated code is straight-line Python,
which keeps the per-call overhead to a few microseconds.

An input that does not match (for example a transposed tensor where a contiguous one was
compiled) never reaches native code: that call runs the subgraph in PyTorch instead, and the
mismatch is logged and counted.
"""
from __future__ import annotations

import ctypes
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence, Union

import torch

from .frontend.dtypes import to_torch
from .ir import expr as ex
from .ir import loop as lp
from .ir.expr import Const, Expr, Var
from .ir.tensor import Graph, Value

log = logging.getLogger("torchburn")


def python_expr(e: Expr) -> str:
    """An index expression as Python source (symbols are local variables of the launcher)."""
    if isinstance(e, Const):
        return str(int(e.value))
    if isinstance(e, Var):
        return e.name
    if isinstance(e, ex.Binary):
        a, b = python_expr(e.a), python_expr(e.b)
        if e.op in ("min", "max"):
            return f"{e.op}({a}, {b})"
        op = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//", "mod": "%"}.get(e.op)
        if op is None:
            raise ValueError(f"index op {e.op} has no Python form")
        return f"({a} {op} {b})"
    if isinstance(e, ex.Cast):
        return python_expr(e.value)
    raise ValueError(f"not an index expression: {e}")


@dataclass
class LaunchStats:
    calls: int = 0
    eager_fallbacks: int = 0
    mismatches: list[str] = field(default_factory=list)


class _Workspace(threading.local):
    buffer: Optional[torch.Tensor] = None


class Launcher:
    """Callable for one compiled subgraph: `launcher(*args) -> tuple of tensors`."""

    def __init__(self, graph: Graph, program: lp.Program, entry: Callable[..., None],
                 eager: Callable[..., Any], keepalive: Any = None) -> None:
        self.graph = graph
        self.program = program
        self.entry = entry
        self.eager = eager
        self.keepalive = keepalive
        self.stats = LaunchStats()
        self._ws = _Workspace()
        self.source = self._generate()
        namespace: dict[str, Any] = {}
        exec(compile(self.source, f"<torchburn launcher {program.name}>", "exec"), self._globals(), namespace)
        #: The generated function; call it directly on hot paths.
        self.launch: Callable[..., tuple[Any, ...]] = namespace["launch"]

    def __call__(self, *args: Any) -> tuple[Any, ...]:
        return self.launch(*args)

    # ---- code generation --------------------------------------------------------------------------
    def _globals(self) -> dict[str, Any]:
        dtypes = {f"_dt{i}": to_torch(v.dtype) for i, v in enumerate(self.graph.inputs) if isinstance(v, Value)}
        out_dtypes = {f"_odt{i}": to_torch(b.dtype) for i, b in enumerate(self.program.outputs)}
        return {
            "__name__": __name__,
            "_entry": self.entry, "_empty": torch.empty, "_slow": self._slow, "_ws": self._workspace,
            "_P": ctypes.c_void_p, "_I": ctypes.c_int64, "min": min, "max": max,
            **dtypes, **out_dtypes,
        }

    def _generate(self) -> str:
        g, p = self.graph, self.program
        args = [f"a{i}" for i in range(len(g.inputs))]
        lines = [f"def launch({', '.join(args)}):"]
        body: list[str] = []
        bound: set[str] = set()
        checks: list[str] = []
        # Scalar symbol inputs first: they bind symbols directly.
        for i, v in enumerate(g.inputs):
            if isinstance(v, Var) and not v.name.startswith("_"):
                body.append(f"{v.name} = int(a{i})")
                bound.add(v.name)
        for i, v in enumerate(g.inputs):
            if not isinstance(v, Value):
                continue
            a = f"a{i}"
            body.append(f"if {a}.dtype is not _dt{i} or {a}.dim() != {v.type.rank} or not {a}.is_cpu:")
            body.append(f"    return _slow({', '.join(args)}, why='input {i}: dtype, rank or device')")
            if v.type.rank:
                body.append(f"sz{i} = {a}.shape; st{i} = {a}.stride()")
            for d, size in enumerate(v.shape):
                if isinstance(size, Var) and size.name not in bound:
                    body.append(f"{size.name} = sz{i}[{d}]")
                    bound.add(size.name)
                else:
                    checks.append(f"sz{i}[{d}] != {python_expr(size)}")
            for d, (size, stride) in enumerate(zip(v.shape, v.layout())):
                if size == Const(1):
                    continue
                if isinstance(stride, Var) and stride.name not in bound:
                    body.append(f"{stride.name} = st{i}[{d}]")
                    bound.add(stride.name)
                else:
                    checks.append(f"(sz{i}[{d}] > 1 and st{i}[{d}] != {python_expr(stride)})")
        if checks:
            body.append(f"if {' or '.join(checks)}:")
            body.append(f"    return _slow({', '.join(args)}, why='sizes or strides differ from the compiled ones')")
        for s in p.symbols:
            if s.name not in bound:
                raise ValueError(f"symbol {s.name} cannot be bound from the inputs")
        # Outputs.
        for k, b in enumerate(p.outputs):
            shape = ", ".join(python_expr(d) for d in b.shape)
            body.append(f"o{k} = _empty(({shape}{',' if len(b.shape) == 1 else ''}), dtype=_odt{k})")
        ptrs = [f"a{i}.data_ptr()" for i, v in enumerate(g.inputs) if isinstance(v, Value)]
        ptrs += [f"o{k}.data_ptr()" for k in range(len(p.outputs))]
        syms = [s.name for s in p.symbols]
        ws = "None" if p.workspace_bytes == Const(0) else f"_ws({python_expr(p.workspace_bytes)})"
        body.append(f"_entry((_P * {max(len(ptrs), 1)})({', '.join(ptrs)}), "
                    f"(_I * {max(len(syms), 1)})({', '.join(syms)}), {ws})")
        # Graph outputs: program outputs in order; inputs returned directly are copied.
        out_names = {b.name: k for k, b in enumerate(p.outputs)}
        input_pos = {v: i for i, v in enumerate(g.inputs) if isinstance(v, Value)}
        results: list[str] = []
        seen_out = 0
        assigned: dict[Value, str] = {}
        for v in g.outputs:
            if v in assigned:
                results.append(assigned[v])
            elif v in input_pos:
                results.append(f"a{input_pos[v]}.clone()")
            else:
                results.append(f"o{seen_out}")
                assigned[v] = f"o{seen_out}"
                seen_out += 1
        assert seen_out == len(out_names)
        body.append(f"return ({', '.join(results)}{',' if len(results) == 1 else ''})")
        lines += ["    " + ln for ln in body]
        return "\n".join(lines) + "\n"

    # ---- runtime helpers -----------------------------------------------------------------------------
    def _workspace(self, nbytes: int) -> int:
        buf = self._ws.buffer
        if buf is None or buf.numel() < nbytes:
            buf = torch.empty(max(nbytes, 64), dtype=torch.uint8)
            self._ws.buffer = buf
        return buf.data_ptr()

    def _slow(self, *args: Any, why: str) -> Any:
        self.stats.eager_fallbacks += 1
        if len(self.stats.mismatches) < 16:
            self.stats.mismatches.append(why)
        log.info("torchburn: %s: %s; running this call in PyTorch", self.program.name, why)
        out = self.eager(*args)
        return tuple(out) if isinstance(out, (list, tuple)) else (out,)
