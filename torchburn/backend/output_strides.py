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
"""
from __future__ import annotations

import logging
from typing import Any, Optional, Sequence

import torch
import torch.fx
from torch._guards import TracingContext, detect_fake_mode

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
        if (isinstance(val, torch.Tensor) and isinstance(example, torch.Tensor) and val.shape == example.shape
                and val.dtype == example.dtype and val.stride() != example.stride()):
            node.meta["val"] = example
            node.meta.pop("tensor_meta", None)  # the traced strides too; nothing here reads it


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
