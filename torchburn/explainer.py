"""`torchburn.explain(fn, *args)`: compile and run `fn` once, then report what happened."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable

from . import report as rep
from .driver import memory_cache


@dataclass
class ExplainReport:
    """The graphs compiled for one call, as data (`graphs`) and as text (`str(report)`)."""

    graphs: list[rep.GraphReport]
    cache_hits: int
    cache_misses: int

    @property
    def fallback_ops(self) -> list[str]:
        return [op for g in self.graphs for op in g.fallback_ops]

    @property
    def internal_errors(self) -> list[rep.SubgraphReport]:
        """Subgraphs left to PyTorch by a compiler bug (not by a missing lowering)."""
        return [s for g in self.graphs for s in g.internal_errors]

    @property
    def compiled_subgraphs(self) -> list[rep.SubgraphReport]:
        return [s for g in self.graphs for s in g.subgraphs if s.compiled]

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def __str__(self) -> str:
        lines = [f"torchburn explain: {len(self.graphs)} graph(s), "
                 f"{len(self.compiled_subgraphs)} compiled subgraph(s), "
                 f"{len(self.fallback_ops)} op(s) in PyTorch; cache {self.cache_hits} hit(s), "
                 f"{self.cache_misses} miss(es)"]
        errors = self.internal_errors
        if errors:  # a compiler bug: first and loud, not one reason among the fallbacks
            lines.append(f"!! {len(errors)} INTERNAL COMPILER ERROR(S): a torchburn bug, not a missing "
                         f"lowering; {sum(len(s.ops) for s in errors)} op(s) ran in PyTorch because of it "
                         f"(TORCHBURN_STRICT=1 raises it; please report it)")
            for s in errors:
                lines.append(f"!!   {s.name}: {s.internal_error}" + (f" (at {s.error_where})" if s.error_where else ""))
        for g in self.graphs:
            lines.append(f"[{g.kind} graph]")
            for s in g.subgraphs:
                if s.compiled:
                    status = "cache hit" if s.cache_hit else "compiled " + ", ".join(
                        f"{k} {v * 1e3:.1f} ms" for k, v in s.timings.items())
                    lines.append(f"  {s.name}: {len(s.ops)} ops -> {len(s.kernels)} kernel(s) on {s.engine} ({status})")
                    if s.engine_note:
                        lines.append(f"    note: {s.engine_note}")
                    for k in s.kernels:
                        lines.append(f"    {k}")
                elif s.internal_error is not None:
                    lines.append(f"  {s.name}: {len(s.ops)} ops run in PyTorch after an INTERNAL COMPILER "
                                 f"ERROR: {s.internal_error}")
                else:
                    lines.append(f"  {s.name}: {len(s.ops)} ops run in PyTorch: {s.reason}")
            for op, why in g.fallbacks:
                lines.append(f"  fallback {op}: {why}")
        return "\n".join(lines)


def explain(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> ExplainReport:
    """Compile `fn` with the torchburn backend, run it on `args`, and report.

    Dynamo's caches are reset first so that the report covers a full compilation.
    """
    import torch

    from .backend import torchburn_backend

    torch._dynamo.reset()
    cache = memory_cache()
    hits0, misses0 = cache.hits, cache.misses
    records = rep.start_recording()
    try:
        torch.compile(fn, backend=torchburn_backend)(*args, **kwargs)
    finally:
        rep.stop_recording()
    return ExplainReport(list(records), cache.hits - hits0, cache.misses - misses0)
