"""The strides a compiled training forward's outputs really have, told to AOTAutograd.

AOTAutograd compiles the backward graph for the strides the forward's outputs had when it
traced them: eager's strides. A compiled subgraph writes each result into a new contiguous
tensor, so a saved activation whose eager layout is not contiguous (CPU flash attention's
output, `[b, h, s, d]` laid out as `[b, s, h, d]`) reached the backward with other strides
than the ones it was compiled for, and the backward's launcher then ran the whole backward in
PyTorch on every step (the tiny Llama's training step: 2.5x slower). (`view_outputs.py`
already keeps the eager strides of outputs that are views; this covers every other output.)

AOTAutograd lets the forward's compiler say the real strides (`TracingContext.output_strides`,
which Inductor fills after its own layout choices) and compiles the backward for those. They
are found by running the compiled graph module on the fake example inputs, each launcher call
replaced by what it returns (`LauncherSpec.results`): a new contiguous tensor per computed
result, or an input (itself, or a clone). The rest of the module (PyTorch fallbacks, output
views) runs as it will at run time, on fake tensors. AOTAutograd then hands the backward
compiler example inputs with those strides, while the graph's placeholders keep the traced
ones in their metadata: `restride_placeholders` puts the example inputs' strides there.

The same holds inside one graph cut by library calls (`compile_in_order`): each subgraph is
compiled for the layouts that the launchers and library calls before it really produce.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx
from torch._guards import TracingContext, detect_fake_mode
from torch.fx.experimental.symbolic_shapes import statically_known_true

from ..runtime.config import get_config

log = logging.getLogger("torchburn")


def report_forward_output_strides(module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Tell AOTAutograd the strides `module`'s outputs will have, when it asks for them (a
    training forward being compiled); an output whose strides are not known is left out (None),
    and AOTAutograd then keeps the traced ones."""
    context = TracingContext.try_get()
    if context is None or context.output_strides is None:
        return
    try:
        strides = output_strides(module, example_inputs)
    except Exception as err:  # noqa: BLE001 - the traced strides stay: the backward may run in PyTorch
        if get_config().strict or get_config().debug:
            raise
        log.warning("torchburn: the strides of the forward's outputs are not known (%s: %s); the backward "
                    "is compiled for the traced ones", type(err).__name__, err)
        return
    if strides is not None:
        context.output_strides.extend(strides)


def restride_placeholders(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> None:
    """Give each tensor placeholder of `gm` the strides of its example input where they differ
    (the saved activations of a backward graph, see the module docstring)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return
    for node, example in zip(placeholders, example_inputs):
        val = node.meta.get("val")
        if (isinstance(val, torch.Tensor) and isinstance(example, torch.Tensor) and val.dtype == example.dtype
                and _known_equal(val.shape, example.shape) and not _known_equal(val.stride(), example.stride())):
            node.meta["val"] = example
            node.meta.pop("tensor_meta", None)  # the traced strides too; nothing here reads it


def _known_equal(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Whether two sizes or strides are equal without guarding: a data-dependent size (the
    result of `masked_select`, `nonzero`) compares unequal unless it is the same symbol."""
    return len(a) == len(b) and all(statically_known_true(x == y) for x, y in zip(a, b))


def output_strides(module: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Optional[list[Any]]:
    """The strides of each output of `module` (None for a non-tensor output), or None when the
    module cannot run on fake tensors (no fake inputs, a launcher whose results are not
    described)."""
    fake_mode = detect_fake_mode(list(example_inputs))
    if fake_mode is None:
        return None
    with fake_mode:
        try:
            outputs = _FakeRun(module, fake_mode).run(*example_inputs)
        except _Unknown:
            return None
    if not isinstance(outputs, (tuple, list)):
        outputs = (outputs,)
    return [tuple(o.stride()) if isinstance(o, torch.Tensor) else None for o in outputs]


class _Unknown(Exception):
    """A launcher whose results are not described (a spec loaded from an older cache entry)."""


class _FakeRun(torch.fx.Interpreter):
    """Runs the module on fake tensors, launchers replaced by their results' layouts."""

    def __init__(self, module: torch.fx.GraphModule, fake_mode: Any) -> None:
        super().__init__(module)
        self.fake_mode = fake_mode

    def get_attr(self, target: Any, args: Any, kwargs: Any) -> Any:
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor) and not isinstance(value, torch._subclasses.FakeTensor):
            return self.fake_mode.from_tensor(value)
        return value

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        gpu = getattr(target, "gpu_launcher", None)
        if gpu is not None:
            return _launcher_results(gpu.program.name, gpu.result_kinds, gpu.eager, args)
        launcher = getattr(target, "launcher", None)
        if launcher is None:
            return super().call_function(target, args, kwargs)
        kinds = getattr(getattr(launcher, "spec", None), "results", ())
        return _launcher_results(launcher.name, kinds, launcher.eager, args)


def _launcher_results(name: str, kinds: Sequence[str], eager: Any, args: Sequence[Any]) -> tuple[Any, ...]:
    """Fake results of a launcher call: a new contiguous tensor of the subgraph's traced shape
    per computed result, the argument itself or a clone of it per result that is an input."""
    sub = getattr(eager, "__self__", None)
    if not kinds or not isinstance(sub, torch.fx.GraphModule):
        raise _Unknown(name)
    out_node = next(n for n in sub.graph.nodes if n.op == "output")
    returned = out_node.args[0] if isinstance(out_node.args[0], (tuple, list)) else (out_node.args[0],)
    results = []
    for kind, node in zip(kinds, returned):
        if kind == "new":
            meta = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
            if not isinstance(meta, torch.Tensor):
                raise _Unknown(name)
            results.append(torch.empty(meta.shape, dtype=meta.dtype))
        else:
            how, i = kind.split()
            results.append(args[int(i)] if how == "input" else args[int(i)].clone())
    return tuple(results)


def compile_in_order(module: torch.fx.GraphModule, names: Sequence[str],
                     compile_one: Callable[[str, Sequence[Any]], Optional[Any]]) -> set[str]:
    """Compile the subgraphs `names` of a partitioned `module` in the order it calls them, each
    for the strides its inputs will have at run time; returns the names compiled.

    Between subgraphs run library calls (the tuner's) or ops left to PyTorch, which read one
    subgraph's results and feed another. A subgraph's placeholders carry the traced (eager)
    strides, but a launcher writes each computed result into a new contiguous tensor, and a
    library call's result follows its inputs' layout (oneDNN's `convolution_backward` on a
    channels-last gradient): compiled for the traced strides, the next subgraph found other
    ones at every call and ran in PyTorch (ConvNeXt-T's tuned training step: 1067 backward ops
    in PyTorch, 1.15x eager's time). So the module runs once on fake tensors, in order: at each
    subgraph call `compile_one(name, fake_args)` gives the placeholders the arguments' strides
    (`restride_placeholders`) and compiles it, returning the launcher (None: it stays in
    PyTorch), whose results' layouts (`LauncherSpec.results`) the run continues with. A module
    that cannot run on fake tensors keeps the traced strides for the subgraphs not yet
    compiled (the caller compiles them); an error of `compile_one` itself propagates."""
    placeholders = [n for n in module.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val") for n in placeholders]
    fake_mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
    run = _CompilingRun(module, fake_mode, set(names), compile_one)
    if fake_mode is None:
        return run.done
    try:
        with fake_mode:
            run.run(*vals)
    except Exception as err:  # noqa: BLE001 - the rest is compiled for the traced strides
        if run.compiling or get_config().debug:
            raise
        # Not an error of ours to raise in strict mode: an op between subgraphs that fake
        # tensors cannot run (a data-dependent size) costs at most a launcher's slow path.
        log.info("torchburn: the subgraphs' input strides are not known (%s: %s); %d subgraph(s) are "
                 "compiled for the traced ones", type(err).__name__, err, len(names) - len(run.done))
    return run.done


class _CompilingRun(_FakeRun):
    """`_FakeRun` that compiles each subgraph when the run reaches its call (`compile_in_order`)."""

    def __init__(self, module: torch.fx.GraphModule, fake_mode: Any, names: set[str],
                 compile_one: Callable[[str, Sequence[Any]], Optional[Any]]) -> None:
        super().__init__(module, fake_mode)
        self.names = names
        self.compile_one = compile_one
        self.done: set[str] = set()
        self.compiling = False

    def call_module(self, target: Any, args: Any, kwargs: Any) -> Any:
        if target not in self.names or target in self.done:
            return super().call_module(target, args, kwargs)
        self.compiling = True
        launcher = self.compile_one(target, args)
        self.compiling = False
        self.done.add(target)
        sub = self.fetch_attr(target)
        if launcher is None:  # it runs in PyTorch: eager's layouts
            return super().call_module(target, args, kwargs)
        results = _launcher_results(target, launcher.spec.results, sub.forward, args)
        out_node = next(n for n in sub.graph.nodes if n.op == "output")
        return results if isinstance(out_node.args[0], (tuple, list)) else results[0]
