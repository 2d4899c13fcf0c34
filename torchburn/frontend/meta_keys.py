"""Keys the backend sets in FX nodes' `meta` for the import to read. Imports nothing, so the
backend's warm path (an FX graph from the cache, `backend/fx_cache.py`) can set them without
loading the IR."""
from __future__ import annotations

#: A placeholder whose tensor is a constant input (`ir.tensor.Value.constant`): set by the
#: backend on a module's parameters and buffers in an inference graph (`backend/entry.py`
#: `constant_inputs`); part of the FX-graph cache key.
CONSTANT_META = "torchburn_constant"
