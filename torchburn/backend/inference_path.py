"""The inference fast path: hand Dynamo the launcher itself instead of AOTAutograd's wrapper.

AOTAutograd wraps every compiled forward in a runtime wrapper that replays input mutations,
regenerates outputs that alias inputs or intermediates, threads effect tokens and RNG state,
unwraps tensor subclasses, dedupes arguments and turns grad mode off around the call. On a
graph that needs none of that it only costs time: a few microseconds a call, as much as our
whole launcher. So when AOTAutograd's own metadata for the forward (`ViewAndMutationMeta`) says
that the graph

- is an inference graph (no tangents; no input requires grad, or grad mode was off when it was
  compiled: nothing for autograd to record),
- mutates no input, returns no alias of an input or intermediate, and no `_unsafe_view`,
- uses no effect tokens or functionalized RNG, and no tensor subclass,

and the compiled graph is a single launcher taking the graph's inputs in order (no PyTorch op
around it, so grad mode cannot matter; the launcher's own eager fallback runs under
`no_grad`), and autocast is off and the inputs are distinct plain tensors and numbers (nothing
for AOTAutograd to dedupe), the backend returns that launcher. Dynamo's guards (grad mode,
`requires_grad` of each input, autocast state) keep it from being called in any other
situation. Anything else keeps AOTAutograd's wrapper.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx


@dataclass
class Compilations:
    """What the backend's compilers produced for one Dynamo graph."""

    forward: list[tuple[torch.fx.GraphModule, Callable[..., Any], Any]] = field(default_factory=list)
    backward: int = 0


def fw_metadata() -> Any:
    """AOTAutograd's metadata of the forward being compiled (None outside of a compile)."""
    ctx = torch._guards.TracingContext.try_get()
    return getattr(ctx, "fw_metadata", None) if ctx is not None else None


def _plain_inputs(example_inputs: Sequence[Any], grad_enabled: bool) -> bool:
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    if any(type(x) not in (torch.Tensor, torch.nn.Parameter) or (grad_enabled and x.requires_grad)
           for x in tensors):
        return False
    if len({id(x) for x in tensors}) != len(tensors):
        return False
    return all(isinstance(x, (torch.Tensor, int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool))
               for x in example_inputs)


def _meta_is_trivial(meta: Any, grad_enabled: bool, graph_mutations_ok: bool = False) -> bool:
    """Whether AOTAutograd's runtime wrapper has nothing to do for this forward.
    `graph_mutations_ok`: data mutations of inputs that the graph itself performs (its
    `copy_` into the input, `keep_inference_input_mutations`) are allowed: a caller that runs
    the graph module itself runs those copies (the LLM's step cache)."""
    from torch._functorch._aot_autograd.schemas import OutputType

    try:
        in_graph = set(meta.mutated_graph_handled_indices) if graph_mutations_ok else set()
        return (not meta.traced_tangents
                and not any((grad_enabled and i.requires_grad) or (i.mutates_data and k not in in_graph)
                            or i.mutates_metadata for k, i in enumerate(meta.input_info))
                and not meta.mutated_inp_runtime_indices
                and (graph_mutations_ok or not meta.mutated_graph_handled_indices)
                and meta.num_intermediate_bases == 0 and meta.num_outputs_aliased == 0
                and meta.num_unsafe_view_outputs == 0 and not meta.tokens
                and not meta.is_rng_op_functionalized and meta.num_outputs_rng_offset == 0
                and all(o.output_type == OutputType.non_alias for o in meta.output_info)
                and all(type(m).__name__ == "PlainTensorMeta" or isinstance(m, int)
                        for m in meta.subclass_inp_meta))
    except AttributeError:  # a torch whose metadata looks different: keep AOTAutograd's path
        return False


def direct_callable(compiled: Compilations, example_inputs: Sequence[Any],
                    grad_enabled: bool) -> Optional[Callable[..., Any]]:
    """The launcher to hand Dynamo directly, or None to keep AOTAutograd's runtime wrapper.
    `grad_enabled`: grad mode when Dynamo called the backend (its guards keep it so)."""
    if compiled.backward or len(compiled.forward) != 1:
        return None
    graph, fn, meta = compiled.forward[0]
    launch = getattr(fn, "unboxed", None)
    if launch is None or meta is None or torch._C._is_any_autocast_enabled():
        return None
    if not _plain_inputs(example_inputs, grad_enabled) or not _meta_is_trivial(meta, grad_enabled):
        return None
    placeholders = [n for n in graph.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs) or getattr(launch, "n_results", None) != meta.num_outputs:
        return None
    return launch
