"""The `torch.compile` entry point: `torch.compile(model, backend="torchburn")`.

Dynamo hands us an FX graph; AOTAutograd turns it into functional ATen graphs (forward and,
when training, backward) decomposed with our table. Each graph is partitioned: compilable
subgraphs go through the compiler and are replaced by launchers; the rest stays PyTorch.
"""
from __future__ import annotations

import logging
import operator
import time
import types
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
from .gpu_launcher import compile_subgraph, gpu_requested
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
    use_gpu = gpu_requested()
    for name in result.subgraphs:
        sub: torch.fx.GraphModule = getattr(module, name)
        sub_report = rep.SubgraphReport(name, _op_names(sub))
        report.subgraphs.append(sub_report)
        if use_gpu:  # the wgpu engine; what it cannot run goes on to the CPU engine below
            gpu_launcher = compile_subgraph(sub, name, pipeline, sub_report)
            if gpu_launcher is not None:
                _install(module, name, sub, gpu_launcher)
                continue
        try:
            graph = import_graph(sub, name=name)
            compiled, hit = compile_graph(graph, pipeline, fx_source=lambda sub=sub: _fx_source(sub))
            launcher = Launcher(graph, compiled.program, compiled.entry, sub.forward, keepalive=compiled)
        except Unsupported as err:
            sub_report.compiled = False
            sub_report.reason = str(err)
            log.info("torchburn: %s stays in PyTorch: %s", name, err)
            continue
        except Exception as err:  # noqa: BLE001 - a compiler bug must not break the user's model
            if get_config().debug:
                raise
            sub_report.compiled = False
            sub_report.reason = f"internal compiler error ({type(err).__name__}: {err})"
            log.warning("torchburn: %s stays in PyTorch after an internal error: %s: %s "
                        "(TORCHBURN_DEBUG=1 raises it)", name, type(err).__name__, err)
            continue
        sub_report.cache_hit = hit
        sub_report.kernels = compiled.kernel_summary()
        sub_report.timings = dict(compiled.timings)
        sub_report.pass_times = list(compiled.pass_times)
        _install(module, name, sub, launcher)
    report.import_seconds = time.perf_counter() - t0
    rep.record(report)
    if report.fallback_ops:
        log.info("torchburn: %d op(s) run in PyTorch: %s", len(report.fallback_ops),
                 ", ".join(sorted(set(report.fallback_ops))))
    return make_boxed_func(_fast_callable(module))


def _fx_source(sub: torch.fx.GraphModule) -> str:
    """The ATen subgraph as Python, with each node's source line (for `00_fx_graph.py`)."""
    return sub.print_readable(print_output=False, include_stride=True, include_device=True)


def _install(module: torch.fx.GraphModule, name: str, sub: torch.fx.GraphModule, launcher: Launcher) -> None:
    """Replace the call of submodule `name` by a direct call of the launcher's function, so a
    call costs no nn.Module dispatch."""
    out_node = next(n for n in sub.graph.nodes if n.op == "output")
    single = not isinstance(out_node.args[0], (tuple, list))
    graph = module.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == name:
            with graph.inserting_before(node):
                call = graph.call_function(launcher.launch, node.args, node.kwargs)
                call.meta = dict(node.meta)
                replacement = call
                if single:
                    with graph.inserting_after(call):
                        replacement = graph.call_function(operator.getitem, (call, 0))
                        replacement.meta = dict(node.meta)
            node.replace_all_uses_with(replacement)
            graph.erase_node(node)
    delattr(module, name)


def _fast_callable(module: torch.fx.GraphModule) -> Callable[..., Any]:
    """The graph as a plain function. When the whole graph is one launcher call taking the
    graph's inputs in order, that launcher's function itself."""
    module.graph.lint()
    nodes = list(module.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_function"]
    output = nodes[-1]
    if (len(calls) == 1 and isinstance(calls[0].target, types.FunctionType)
            and calls[0].target.__name__ == "launch" and list(calls[0].args) == placeholders
            and not calls[0].kwargs and isinstance(output.args[0], (tuple, list))
            and all(isinstance(o, torch.fx.Node) for o in output.args[0])):
        # outputs are `getitem(call, k)` nodes or the call itself in order
        return _direct(calls[0].target, output.args[0], calls[0])
    plain = torch.fx.GraphModule(module, module.graph)
    return plain.forward


def _direct(launch: Callable[..., Any], outputs: Sequence[torch.fx.Node], call: torch.fx.Node) -> Callable[..., Any]:
    picks = []
    for o in outputs:
        if o.op == "call_function" and o.target is operator.getitem and o.args[0] is call:
            picks.append(o.args[1])
        else:
            return torch.fx.GraphModule(torch.nn.Module(), call.graph).forward
    if picks == list(range(len(picks))):
        return launch

    def pick(*args: Any) -> Any:
        out = launch(*args)
        return tuple(out[k] for k in picks)

    return pick


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
