"""torch's core-ATen decomposition table, rebuilt from the disk cache instead of recomputed.

Our backend hands AOTAutograd a decomposition table built on torch's `core_aten_decompositions()`.
In torch 2.13 that call scans the dispatcher of every operator namespace for composite
(CompositeImplicitAutograd) ops: ~80 ms in a new process, more than everything else a warm
compile of ours costs. The table's contents are fixed by torch's version, the set of composite
registrations and the decomposition registry, so its recipe is cached on disk:

- each entry is either the registry's own function for that op (`"r"`), or what torch's
  `_get_decomp_for_cia(op)` returns for a composite op (`"c"`);
- the key covers torch's version, torchburn's source digest, the composite registrations and
  the registry's ops, so a process where any of them differs builds the table anew.

A recipe is stored only after rebuilding it reproduced the real table exactly (same ops; the
same functions, or for composite ops partials of the same code and kernel); a stored recipe
whose rebuild fails (an op that does not resolve) is ignored and the table computed as usual.
Files go through the disk cache (BLAKE3-checked, atomic), so `cache clear` removes them.
"""
from __future__ import annotations

import functools
import logging
from typing import Any, Callable, Optional

import torch
from blake3 import blake3

from ..runtime.config import Config
from ..runtime.disk_cache import DiskCache, disk_cache, source_digest

log = logging.getLogger("torchburn")

FORMAT = "decomp1"
Table = dict[Any, Callable[..., Any]]


def decomposition_table(config: Config) -> Table:
    """Our decomposition table, its torch part from the disk cache where possible."""
    from ..frontend import decompositions as dec

    if dec.is_built() or config.cache_dir is None:
        return dec.decomposition_table()
    disk = disk_cache(config.cache_dir)
    assert disk is not None
    try:
        key = _key()
    except Exception as err:  # noqa: BLE001 - torch internals moved: compute the table instead
        log.debug("torchburn: decomposition table not cached: %s", err)
        return dec.decomposition_table()
    core = _load(disk, key)
    if core is None:
        core = dec.core_table()
        _store(disk, key, core)
    return dec.decomposition_table(core)


def _key() -> str:
    h = blake3()
    cia = torch._C._dispatch_get_registrations_for_dispatch_key("CompositeImplicitAutograd")
    registry = torch._decomp.decomposition_table
    for part in (FORMAT, torch.__version__, source_digest(), "\n".join(sorted(cia)),
                 "\n".join(sorted(str(op) for op in registry))):
        h.update(part.encode("utf-8"))
        h.update(b"\0")
    return "dt" + h.hexdigest()


def _cia_decomp(op: Any) -> Callable[..., Any]:
    from torch._export.utils import _get_decomp_for_cia

    return _get_decomp_for_cia(op)


def _same(a: Any, b: Any) -> bool:
    """The same decomposition: one function, or partials of the same code and arguments
    (`_get_decomp_for_cia` makes a new closure each time)."""
    if a is b:
        return True
    if isinstance(a, functools.partial) and isinstance(b, functools.partial):
        return (getattr(a.func, "__code__", None) is getattr(b.func, "__code__", 0)
                and a.args == b.args and a.keywords == b.keywords)
    return False


def _recipe(core: Table) -> Optional[list[list[str]]]:
    """How to rebuild each entry, or None when some entry is neither kind."""
    registry = torch._decomp.decomposition_table
    out = []
    for op, fn in core.items():
        if not isinstance(op, torch._ops.OpOverload):
            return None
        if registry.get(op) is fn:
            kind = "r"
        elif _same(fn, _cia_decomp(op)):
            kind = "c"
        else:
            return None
        out.append([op.namespace, op._opname, op._overloadname, kind])
    return sorted(out)  # torch's order varies by process; the file should not


def _rebuild(recipe: list[list[str]]) -> Table:
    """Raises (AttributeError, KeyError, ValueError, RuntimeError) when it does not resolve."""
    registry = torch._decomp.decomposition_table
    table: Table = {}
    for ns, name, overload, kind in recipe:
        op = getattr(getattr(getattr(torch.ops, ns), name), overload)
        if kind == "r":
            table[op] = registry[op]
        elif kind == "c":
            table[op] = _cia_decomp(op)
        else:
            raise ValueError(f"unknown recipe kind {kind!r}")
    return table


def _load(disk: DiskCache, key: str) -> Optional[Table]:
    raw = disk.load_graph(key)
    if raw is None:
        return None
    try:
        return _rebuild(raw["ops"])
    except (AttributeError, KeyError, TypeError, ValueError, RuntimeError) as err:
        log.info("torchburn: cached decomposition table does not rebuild (%s); computing it", err)
        return None


def _store(disk: DiskCache, key: str, core: Table) -> None:
    try:
        recipe = _recipe(core)
        if recipe is None:
            return
        rebuilt = _rebuild(recipe)
    except Exception as err:  # noqa: BLE001 - caching is an optimization; never fail for it
        log.debug("torchburn: decomposition table not cached: %s", err)
        return
    if set(rebuilt) != set(core) or not all(_same(rebuilt[op], core[op]) for op in core):
        log.debug("torchburn: decomposition table does not reproduce; not cached")
        return
    disk.store_graph(key, {"ops": recipe})
