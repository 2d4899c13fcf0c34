"""The layering of DESIGN.md, for every import of every module (function-local ones included):
each layer imports only the layers beneath it, and no two files import each other in a cycle."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "torchburn"

#: Layer -> the torchburn layers it may import (besides itself). `config` is the runtime's
#: environment reader, which every torch-facing layer may read.
ALLOWED: dict[str, set[str]] = {
    "ir": set(),
    "frontend": {"ir"},
    "passes": {"ir"},
    "codegen": {"ir"},
    "runtime": {"ir", "codegen"},
    "compiler": {"ir", "passes", "codegen", "runtime"},
    "quant": {"ir", "frontend", "runtime"},
    "backend": {"ir", "frontend", "passes", "codegen", "runtime", "compiler", "quant"},
    "llm": {"quant", "backend", "runtime", "ir", "frontend", "passes", "codegen", "compiler"},
    "cli": {"ir", "frontend", "passes", "codegen", "runtime", "compiler", "quant", "backend", "llm"},
}
#: Modules at the package root: the public face (lazy names only) and `python -m torchburn`.
ROOT_MODULES = {"torchburn": {"cli"}, "torchburn.__main__": {"cli"}}


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _type_only_lines(tree: ast.AST) -> set[int]:
    """Lines of imports under `if TYPE_CHECKING:` (never executed: no cycle at run time)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", getattr(node.test, "attr", "")) == "TYPE_CHECKING":
            for sub in node.body:
                for inner in ast.walk(sub):
                    if isinstance(inner, (ast.Import, ast.ImportFrom)):
                        lines.add(inner.lineno)
    return lines


def _imports(name: str, path: Path, runtime_only: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module) of every torchburn import in the file (`runtime_only`: not those
    under `if TYPE_CHECKING:`)."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    tree = ast.parse(path.read_text(), str(path))
    skip = _type_only_lines(tree) if runtime_only else set()
    for node in ast.walk(tree):
        if getattr(node, "lineno", None) in skip:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target.startswith("torchburn"):
                for alias in node.names:  # `from . import report` imports a module
                    found.append((node.lineno, f"{target}.{alias.name}"))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names if a.name.startswith("torchburn")]
    return found


def _resolve(target: str, modules: dict[str, Path]) -> str:
    """The module a dotted import name lands in (`a.b.name` -> `a.b` when `name` is an attribute)."""
    while target not in modules and "." in target:
        target = target.rsplit(".", 1)[0]
    return target


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else module


MODULES = _modules()

#: Known departures being mended (each must still exist: a mended one fails until removed here).
PENDING_LAYER: dict[str, set[str]] = {}
#: File-level cycles (function-local imports that break a cycle at run time still count):
PENDING_CYCLES: list[list[str]] = []


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_follow_the_layers(name: str) -> None:
    layer = _layer(name)
    allowed = ROOT_MODULES.get(name, ALLOWED.get(layer))
    assert allowed is not None, f"{name} sits at the package root; modules belong in a layer package"
    bad = []
    for line, target in _imports(name, MODULES[name]):
        other = _layer(_resolve(target, MODULES))
        if other != layer and other != "torchburn" and other not in allowed:
            bad.append(f"{MODULES[name].name}:{line} imports {target} ({other})")
        if other == "torchburn" and name != "torchburn" and target != "torchburn.__version__":
            bad.append(f"{MODULES[name].name}:{line} imports the package root ({target}); import the module")
    pending = PENDING_LAYER.get(name, set())
    assert set(bad) - pending == set(), f"{name} ({layer}) may import only {sorted(allowed)}:\n" + "\n".join(sorted(set(bad) - pending))
    assert pending - set(bad) == set(), f"{name}: PENDING_LAYER lists imports that are gone; remove them"


#: The rooms of `torchburn.passes` (its __init__ registers them all, so it is in none) -> the rooms
#: each may import. `framework` is the pass machinery at the root (base, pattern, pipeline);
#: `lower_to_loops`, the pass between the levels, ties the rule rooms together.
PASS_ROOMS: dict[str, set[str]] = {
    "framework": set(),
    "loop": {"framework"},
    "loopgen": {"framework"},
    "quant": {"framework", "loopgen"},
    "tensor": {"framework", "loopgen", "quant"},
    "lower_to_loops": {"framework", "loopgen", "quant"},
    "gpu": {"framework", "loop", "loopgen", "tensor", "lower_to_loops"},
}


def _pass_room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["torchburn", "passes"] or len(parts) == 2:
        return None
    if parts[2] in ("base", "pattern", "pipeline"):
        return "framework"
    return parts[2]


@pytest.mark.parametrize("name", sorted(m for m in MODULES if _pass_room(m)))
def test_pass_rooms(name: str) -> None:
    """Passes by level: a loop pass never reaches into tensor passes, the rules never into passes
    that use them, and only the GPU room sees everything below it."""
    room = _pass_room(name)
    assert room in PASS_ROOMS, f"{name}: torchburn.passes has no room {room!r}; add it to PASS_ROOMS"
    bad = []
    for line, target in _imports(name, MODULES[name]):
        other = _pass_room(_resolve(target, MODULES))
        if other is not None and other != room and other not in PASS_ROOMS[room]:
            bad.append(f"{MODULES[name].name}:{line} imports {target} ({other})")
    assert not bad, f"{name} ({room}) may import only {sorted(PASS_ROOMS[room])} of the passes' rooms:\n" + "\n".join(bad)


def test_no_import_cycles() -> None:
    """Function-local imports count (they only hide a cycle); type-only imports do not."""
    graph = {name: {_resolve(t, MODULES) for _, t in _imports(name, path, runtime_only=True)} - {name}
             for name, path in MODULES.items()}
    for name in graph:  # a package's __init__ re-exporting its own submodules is no cycle
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    found = {frozenset(zip(c, c[1:])) for c in cycles}
    pending = {frozenset(zip(c, c[1:])) for c in PENDING_CYCLES}
    assert not found - pending, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles if frozenset(zip(c, c[1:])) not in pending)
    assert not pending - found, "a cycle listed in PENDING_CYCLES is gone: remove it from the list"


#: The rooms of `torchburn/llm/` (DESIGN.md) -> the rooms each may import (besides itself).
LLM_ROOMS: dict[str, set[str]] = {
    "model": set(),
    "runtime": {"model"},
    "serve": {"model", "runtime"},
    "cli": {"model", "runtime", "serve"},
}


def _llm_room(module: str) -> str | None:
    parts = module.split(".")
    if parts[:2] != ["torchburn", "llm"]:
        return None
    return parts[2] if len(parts) > 2 and parts[2] in LLM_ROOMS else "llm"


LLM_MODULES = sorted(n for n in MODULES if _llm_room(n) not in (None, "llm"))


def test_llm_modules_live_in_rooms() -> None:
    """Only the package's face (`__init__`, lazy names) and `__main__` sit at `torchburn/llm/`."""
    loose = sorted(n for n in MODULES if _llm_room(n) == "llm")
    assert loose == ["torchburn.llm", "torchburn.llm.__main__"], loose


@pytest.mark.parametrize("name", LLM_MODULES)
def test_llm_rooms_follow_their_order(name: str) -> None:
    """model/ imports no other room; runtime/ only model/; serve/ model/ and runtime/; cli/ any.
    Type-only imports count too (a room should not even name what sits above it)."""
    room = _llm_room(name)
    bad = []
    for line, target in _imports(name, MODULES[name]):
        other = _llm_room(_resolve(target, MODULES))
        if other is None or other == room:
            continue
        if other == "llm":
            bad.append(f"{MODULES[name].name}:{line} imports the llm package face ({target}); import the module")
        elif other not in LLM_ROOMS[room]:
            bad.append(f"{MODULES[name].name}:{line} imports {target} ({other}/)")
    assert not bad, f"{name} ({room}/) may import only {sorted(LLM_ROOMS[room])}:\n" + "\n".join(bad)


def test_llm_rooms_have_no_cycle() -> None:
    """The rooms' import graph (every import, type-only ones included) has no cycle."""
    edges = {room: set() for room in LLM_ROOMS}
    for name in LLM_MODULES:
        for _, target in _imports(name, MODULES[name]):
            other = _llm_room(_resolve(target, MODULES))
            if other in LLM_ROOMS and other != _llm_room(name):
                edges[_llm_room(name)].add(other)
    order: list[str] = []
    while edges:
        free = [r for r, out in edges.items() if not out - set(order)]
        assert free, f"cycle among the llm rooms: {edges}"
        order += sorted(free)
        for r in free:
            del edges[r]


def test_version_is_defined_once() -> None:
    hits = [p for p in MODULES.values() if re.search(r"^\s*(__version__|[A-Z_]*VERSION)\s*=\s*['\"]", p.read_text(), re.M)]
    assert [p.relative_to(PACKAGE.parent).as_posix() for p in hits] == ["torchburn/__init__.py"]
