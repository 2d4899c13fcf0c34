"""The `torch.compile` entry point: `torch.compile(model, backend="torchburn")`.

Dynamo hands us an FX graph; AOTAutograd turns it into functional ATen graphs (forward and,
when training, backward) decomposed with our table. Each graph is partitioned: compilable
subgraphs go through the compiler and are replaced by launchers; the rest stays PyTorch.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
import torch.fx
from torch._dynamo.backends.common import aot_autograd
from functorch.compile import make_boxed_func

from . import report as rep
from .config import get_config
from .driver import compile_graph
from .frontend.decompositions import decomposition_table
from .frontend.importer import import_graph
from .frontend.partition import partition
from .frontend.registry import Unsupported
from .launcher import Launcher
from .passes.pipeline import Pipeline

log = logging.getLogger("torchburn")

KNOWN_OPTIONS = ("passes",)


def _pipeline(options: Optional[Mapping[str, Any]]) -> Pipeline:
    options = dict(options or {})
    unknown = set(options) - set(KNOWN_OPTIONS)
    if unknown:
        raise ValueError(f"torchburn: unknown option(s) {sorted(unknown)}; known: {list(KNOWN_OPTIONS)}")
    return Pipeline.default(options.get("passes"))


def _op_names(gm: torch.fx.GraphModule) -> list[str]:
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def compile_fx_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
                     pipeline: Pipeline, kind: str) -> Callable[..., Any]:
    """Compile an ATen graph: partition it and replace each compilable part by a launcher."""
    report = rep.GraphReport(kind)
    t0 = time.perf_counter()
    result = partition(gm)
    report.fallbacks = result.fallbacks
    module = result.module
    for name in result.subgraphs:
        sub: torch.fx.GraphModule = getattr(module, name)
        sub_report = rep.SubgraphReport(name, _op_names(sub))
        report.subgraphs.append(sub_report)
        try:
            graph = import_graph(sub, name=name)
            launcher_graph = graph
            compiled, hit = compile_graph(graph, pipeline)
        except Unsupported as err:
            sub_report.compiled = False
            sub_report.reason = str(err)
            log.info("torchburn: %s stays in PyTorch: %s", name, err)
            continue
        sub_report.cache_hit = hit
        sub_report.kernels = [f"{k.name}: {dict(k.attrs).get('origin', '')}" for k in compiled.program.kernels]
        sub_report.timings = dict(compiled.timings)
        sub_report.pass_times = list(compiled.pass_times)
        launcher = Launcher(launcher_graph, compiled.program, compiled.entry, sub.forward, keepalive=compiled)
        _install(module, name, sub, launcher)
    report.import_seconds = time.perf_counter() - t0
    rep.record(report)
    if report.fallback_ops:
        log.info("torchburn: %d op(s) run in PyTorch: %s", len(report.fallback_ops),
                 ", ".join(sorted(set(report.fallback_ops))))
    module.recompile()
    return make_boxed_func(module.forward)


class _Compiled(torch.nn.Module):
    """Stands in for a partition submodule; returns what the submodule returned."""

    def __init__(self, launcher: Launcher, single: bool) -> None:
        super().__init__()
        self.launcher = launcher
        self.launch = launcher.launch
        self.single = single

    def forward(self, *args: Any) -> Any:
        out = self.launch(*args)
        return out[0] if self.single else out


def _install(module: torch.fx.GraphModule, name: str, sub: torch.fx.GraphModule, launcher: Launcher) -> None:
    out_node = next(n for n in sub.graph.nodes if n.op == "output")
    single = not isinstance(out_node.args[0], (tuple, list))
    setattr(module, name, _Compiled(launcher, single))


def torchburn_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], **kwargs: Any) -> Callable[..., Any]:
    """The backend Dynamo calls (registered as "torchburn" through an entry point)."""
    options = kwargs.get("options")
    get_config()  # fail early on a bad TORCHBURN_* variable
    pipeline = _pipeline(options)

    def fw(g: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        return compile_fx_graph(g, inputs, pipeline=pipeline, kind="forward")

    def bw(g: torch.fx.GraphModule, inputs: Sequence[Any]) -> Callable[..., Any]:
        return compile_fx_graph(g, inputs, pipeline=pipeline, kind="backward")

    return aot_autograd(fw_compiler=fw, bw_compiler=bw, decompositions=decomposition_table(),
                        keep_inference_input_mutations=True)(gm, example_inputs)
