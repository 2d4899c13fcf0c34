"""Visitors that rebuild expressions and statements: the tool every loop pass is written with.

A mutator visits each node with `visit_<ClassName>`; the default rebuilds the node from its
visited children and returns the same object when nothing changed, so unchanged subtrees are
shared and cheap.
"""
from __future__ import annotations

from dataclasses import fields, replace
from typing import Any

from . import expr as ex
from . import loop as lp


class ExprMutator:
    """Rebuild an expression bottom-up; override `visit_<Node>` to change some nodes."""

    def visit(self, e: ex.Expr) -> ex.Expr:
        method = getattr(self, "visit_" + type(e).__name__, None)
        if method is not None:
            return method(e)
        return self.generic_visit(e)

    def generic_visit(self, e: ex.Expr) -> ex.Expr:
        changes: dict[str, Any] = {}
        for f in fields(e):  # type: ignore[arg-type]
            v = getattr(e, f.name)
            if isinstance(v, ex.Expr):
                nv = self.visit(v)
                if nv is not v:
                    changes[f.name] = nv
            elif isinstance(v, tuple) and v and isinstance(v[0], ex.Expr):
                nt = tuple(self.visit(x) for x in v)
                if any(a is not b for a, b in zip(nt, v)):
                    changes[f.name] = nt
        return replace(e, **changes) if changes else e  # type: ignore[type-var]


class StmtMutator(ExprMutator):
    """Rebuild a statement tree; expressions inside go through the `ExprMutator` methods."""

    def visit_stmt(self, s: lp.Stmt) -> lp.Stmt:
        method = getattr(self, "visit_" + type(s).__name__, None)
        if method is not None:
            return method(s)
        return self.generic_visit_stmt(s)

    def generic_visit_stmt(self, s: lp.Stmt) -> lp.Stmt:
        if isinstance(s, lp.Block):
            new = tuple(self.visit_stmt(x) for x in s.stmts)
            if all(a is b for a, b in zip(new, s.stmts)):
                return s
            return lp.block(*new)
        if isinstance(s, lp.Store):
            idx = tuple(self.visit(i) for i in s.index)
            val = self.visit(s.value)
            if val is s.value and all(a is b for a, b in zip(idx, s.index)):
                return s
            return lp.Store(s.buffer, idx, val)
        if isinstance(s, lp.Let):
            val = self.visit(s.value)
            return s if val is s.value else lp.Let(s.var, val)
        if isinstance(s, lp.For):
            start, extent, body = self.visit(s.start), self.visit(s.extent), self.visit_stmt(s.body)
            if start is s.start and extent is s.extent and body is s.body:
                return s
            return replace(s, start=start, extent=extent, body=body)
        if isinstance(s, lp.If):
            cond, then = self.visit(s.cond), self.visit_stmt(s.then)
            orelse = None if s.orelse is None else self.visit_stmt(s.orelse)
            if cond is s.cond and then is s.then and orelse is s.orelse:
                return s
            return lp.If(cond, then, orelse)
        if isinstance(s, lp.Alloc):
            return s
        raise TypeError(f"unknown statement {type(s).__name__}")

    def visit_kernel(self, k: lp.Kernel) -> lp.Kernel:
        body = self.visit_stmt(k.body)
        return k if body is k.body else replace(k, body=body)
