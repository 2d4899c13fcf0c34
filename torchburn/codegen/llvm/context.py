"""State shared by everything emitted into one LLVM module.

One `ModuleContext` per program: the llvmlite module, the target, declarations of intrinsics
and libm functions (declared once, by name), internal helper functions built on first use
(integer power, erfinv, digamma), unique names for outlined functions, and loop metadata.
"""
from __future__ import annotations

import itertools
import re
from typing import Callable, Sequence

import llvmlite.ir as ir

from ..target import Target
from .types import mangle


class ModuleContext:
    """The module being built and the declarations it holds."""

    def __init__(self, name: str, target: Target, bounds_check: bool = False) -> None:
        self.module = ir.Module(name=name)
        self.module.triple = target.triple
        self.target = target
        #: Check every load and store against its buffer (`bounds.py`, TORCHBURN_DEBUG=bounds).
        self.bounds_check = bounds_check
        self._counter = itertools.count()

    def declare(self, name: str, ret: ir.Type, args: Sequence[ir.Type]) -> ir.Function:
        """An external function (libm, libgomp) declared once; later calls reuse it."""
        existing = self.module.globals.get(name)
        if isinstance(existing, ir.Function):
            return existing
        fn = ir.Function(self.module, ir.FunctionType(ret, list(args)), name=name)
        fn.attributes.add("nounwind")
        return fn

    def intrinsic(self, base: str, ret: ir.Type, args: Sequence[ir.Type],
                  overloads: Sequence[ir.Type]) -> ir.Function:
        """An LLVM intrinsic, its name mangled from the overloaded types: `llvm.exp.v16f32`."""
        name = base + "".join("." + mangle(t) for t in overloads)
        return self.declare(name, ret, args)

    def helper(self, name: str, ret: ir.Type, args: Sequence[ir.Type],
               build: Callable[["ModuleContext", ir.Function], None]) -> ir.Function:
        """An internal function of this module, built by `build` the first time it is asked for."""
        existing = self.module.globals.get(name)
        if isinstance(existing, ir.Function):
            return existing
        fn = ir.Function(self.module, ir.FunctionType(ret, list(args)), name=name)
        fn.linkage = "internal"
        fn.attributes.add("nounwind")
        build(self, fn)
        return fn

    def unique_name(self, prefix: str) -> str:
        """A function name not yet used in the module."""
        while True:
            name = f"{prefix}.{next(self._counter)}"
            if name not in self.module.globals:
                return name

    def loop_metadata(self, *properties: str) -> ir.MDValue:
        """A fresh, self-referential `!llvm.loop` node with string properties such as
        `llvm.loop.unroll.full` (LLVM requires the first operand of a loop ID to be itself)."""
        props = [self.module.add_metadata([ir.MetaDataString(self.module, p)]) for p in properties]
        node = ir.values.MDValue(self.module, props, name=str(len(self.module.metadata)))
        node.operands = (node, *node.operands)
        return node


_NAME_RE = re.compile(r"[^A-Za-z0-9_.]")


def symbol_name(name: str) -> str:
    """A name that is a plain C identifier-ish symbol (letters, digits, `_` and `.`)."""
    return _NAME_RE.sub("_", name)
