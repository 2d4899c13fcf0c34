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


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _operand_fields(node: ex.Expr) -> list[tuple[str, int]]:
    """The fields of `node` that hold operands, with how many each holds (-1: one Expr, n: a
    tuple of n Exprs), in field order: the order `generic_visit` visits them."""
    names = _FIELD_NAMES.get(type(node))
    if names is None:
        names = _FIELD_NAMES[type(node)] = tuple(f.name for f in fields(node))  # type: ignore[arg-type]
    slots: list[tuple[str, int]] = []
    for name in names:
        v = getattr(node, name)
        if isinstance(v, ex.Expr):
            slots.append((name, -1))
        elif isinstance(v, tuple) and v and isinstance(v[0], ex.Expr):
            slots.append((name, len(v)))
    return slots


class ExprMutator:
    """Rebuild an expression bottom-up; override `visit_<Node>` to change some nodes.

    Nodes without a `visit_<Node>` are rebuilt with an explicit stack rather than by recursion,
    so a mutator that overrides only a few node kinds handles trees of any depth."""

    def visit(self, e: ex.Expr) -> ex.Expr:
        method = getattr(self, "visit_" + type(e).__name__, None)
        if method is not None:
            return self.leave(method(e))
        return self.leave(self.generic_visit(e))

    def leave(self, e: ex.Expr) -> ex.Expr:
        """Called with every visited node once its operands are rebuilt (bottom-up rewrites
        hook in here rather than override `visit`, which would make the walk recursive)."""
        return e

    def generic_visit(self, e: ex.Expr) -> ex.Expr:
        """`e` rebuilt from its visited operands (the same object when none changed)."""
        if type(self).visit is not ExprMutator.visit:  # an overridden `visit` sees every node
            return self._recursive_generic_visit(e)
        results: list[ex.Expr] = []
        # (node, None): visit it; (node, slots): its operands' results are on `results`.
        stack: list[tuple[ex.Expr, Any]] = [(e, _operand_fields(e))]
        for name, n in reversed(stack[0][1]):
            stack.extend(self._operands_of(e, name, n))
        while stack:
            node, slots = stack.pop()
            if slots is None:
                method = getattr(self, "visit_" + type(node).__name__, None)
                if method is not None:
                    results.append(self.leave(method(node)))
                    continue
                slots = _operand_fields(node)
                if not slots:
                    results.append(self.leave(node))
                    continue
                stack.append((node, slots))
                for name, n in reversed(slots):
                    stack.extend(self._operands_of(node, name, n))
                continue
            rebuilt = self._rebuild(node, slots, results)
            results.append(rebuilt if node is e else self.leave(rebuilt))
        return results[0]

    def _recursive_generic_visit(self, e: ex.Expr) -> ex.Expr:
        changes: dict[str, Any] = {}
        for name, n in _operand_fields(e):
            v = getattr(e, name)
            if n < 0:
                nv = self.visit(v)
                if nv is not v:
                    changes[name] = nv
            else:
                nt = tuple(self.visit(x) for x in v)
                if any(a is not b for a, b in zip(nt, v)):
                    changes[name] = nt
        return replace(e, **changes) if changes else e  # type: ignore[type-var]

    @staticmethod
    def _operands_of(node: ex.Expr, name: str, n: int) -> list[tuple[ex.Expr, None]]:
        """Stack entries visiting the operands of one field, the first on top."""
        v = getattr(node, name)
        items = [v] if n < 0 else list(v)
        return [(x, None) for x in reversed(items)]

    @staticmethod
    def _rebuild(node: ex.Expr, slots: list[tuple[str, int]], results: list[ex.Expr]) -> ex.Expr:
        """Pop the visited operands of `node` off `results` and rebuild it if any changed."""
        total = sum(1 if n < 0 else n for _, n in slots)
        new = results[len(results) - total:]
        del results[len(results) - total:]
        changes: dict[str, Any] = {}
        pos = 0
        for name, n in slots:
            old = getattr(node, name)
            if n < 0:
                if new[pos] is not old:
                    changes[name] = new[pos]
                pos += 1
            else:
                part = tuple(new[pos:pos + n])
                if any(a is not b for a, b in zip(part, old)):
                    changes[name] = part
                pos += n
        return replace(node, **changes) if changes else node  # type: ignore[type-var]


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
