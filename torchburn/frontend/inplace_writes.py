"""Mark the write-back of a mutated graph input whose new value writes only a few elements.

AOTAutograd (with `keep_inference_input_mutations`) turns `cache.index_copy_(3, slots, new)`
inside a compiled function into a functional update and a write-back at the end of the graph:

    %index_copy = aten.index_copy(%cache, 3, %slots, %new)      (an index_put when decomposed)
    %copy_ = aten.copy_(%cache, %index_copy)

Compiled as is, that is two copies of the whole cache per call (compute the new cache, copy it
back). `mark_slot_writes` tags such an `index_copy`, `index_put` (or `scatter`) node; the importer turns the
tag into the `inplace` attribute of the IR op, and `lower-to-loops` then stores only the
written elements into the input's own memory when that is safe (it drops the mark otherwise).
The `copy_` stays in the graph: after an in-place call its source is the input itself, which
`copy_` skips; after a call that ran in PyTorch it writes the new value back as before.
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.fx

aten = torch.ops.aten

#: The node meta key set on a marked node.
MARK = "torchburn_inplace_write"

_WRITES = (aten.index_put.default, aten._unsafe_index_put.default, aten.index_copy.default,
           aten.scatter.src, aten.scatter.value)


def _written_input(node: torch.fx.Node) -> Optional[torch.fx.Node]:
    """The placeholder `node` writes back into when it is a marked candidate, else None."""
    if node.target not in _WRITES or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return None
    x = node.args[0]
    if x.op != "placeholder":
        return None
    if node.target in (aten.index_put.default, aten._unsafe_index_put.default):
        accumulate: Any = node.args[3] if len(node.args) > 3 else node.kwargs.get("accumulate", False)
        if accumulate:
            return None
    users = list(node.users)
    if len(users) != 1:
        return None
    copy = users[0]
    if copy.target is not aten.copy_.default or copy.args[0] is not x or copy.args[1] is not node:
        return None
    return x


def mark_slot_writes(gm: torch.fx.GraphModule) -> int:
    """Tag every `index_put`/`scatter` whose only use is writing its result back into its
    own input (module docstring); returns how many were tagged."""
    n = 0
    for node in gm.graph.nodes:
        if node.op == "call_function" and _written_input(node) is not None:
            node.meta[MARK] = True
            n += 1
    return n


def is_marked(node: torch.fx.Node) -> bool:
    return bool(node.meta.get(MARK))
