"""PyTorch's OpInfo database through TorchBurn: forward results equal eager's, and no op runs
in PyTorch except those that stay there by design (`NOT_COMPILED`, complex/sparse tensors).

The procedure is `tests/opinfo_harness.py`'s. CI runs a fixed sample to stay within its time
budget (about 3.5 minutes on two cores): float32 on every op, first sample only, and a second
pass in float16, bfloat16 and int64 on a stable hash-selected share of the (op, dtype) pairs
the op supports. `TORCHBURN_OPINFO_FULL=1` runs every op, every supported dtype of those
four, and every sample.
"""
from __future__ import annotations

import os
import zlib
from typing import Any

import pytest
import torch

from tests.opinfo_harness import EXPECTED_FALLBACK, GRAPH_BREAK, PASS, op_database, op_name, run_op

FULL = os.environ.get("TORCHBURN_OPINFO_FULL", "") == "1"
#: Percent of the ops run in float32 / of (op, dtype) pairs run in the second pass, in CI
#: (a stable choice by hash of the name, so the sample does not move when op_db grows).
F32_SHARE, OTHER_SHARE = 100, 15
SAMPLES = None if FULL else 1
OTHER_DTYPES = (torch.float16, torch.bfloat16, torch.int64)

#: The only skips besides NOT_COMPILED: OpInfos whose sample inputs themselves cannot be made
#: or compared here, whoever compiles them.
SKIP: dict[str, str] = {}

_NN = "nn lowerings in progress (frontend/lowerings/nn.py)"
_INDEXING = "indexing lowerings in progress (frontend/lowerings/indexing.py)"

#: Ops TorchBurn does not compile yet, with why and where the lowering belongs: keyed by
#: OpInfo name (every dtype) or "name|dtype". They run as non-strict xfails (not skips):
#: delete an entry when its lowering lands.
PENDING: dict[str, str] = {
    **dict.fromkeys(("nn.functional.linear_cross_entropy.chunked",
                     "nn.functional.linear_cross_entropy.chunked_none"), _NN),
    **{f"{conv}|int64": "integer convolution is not lowered (nn.py)"
       for conv in ("nn.functional.conv1d", "nn.functional.conv2d", "nn.functional.conv3d",
                    "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d",
                    "nn.functional.conv_transpose3d")},
}


def _selected(key: str, share: int) -> bool:
    """A stable choice of `share` percent of the keys (independent of op_db's order)."""
    return FULL or zlib.crc32(key.encode()) % 100 < share


def _marks(name: str, dtype: str) -> list[Any]:
    if name in SKIP:
        return [pytest.mark.skip(reason=SKIP[name])]
    why = PENDING.get(name) or PENDING.get(f"{name}|{dtype}")
    return [pytest.mark.xfail(reason=why, strict=False)] if why else []


def _params() -> tuple[list[Any], list[Any]]:
    f32, other = [], []
    for op in op_database():
        name = op_name(op)
        if op.supports_dtype(torch.float32, "cpu") and _selected(name, F32_SHARE):
            f32.append(pytest.param(op, id=name, marks=_marks(name, "float32")))
        for dtype in OTHER_DTYPES:
            dname = str(dtype).replace("torch.", "")
            if op.supports_dtype(dtype, "cpu") and _selected(f"{name}|{dtype}", OTHER_SHARE):
                other.append(pytest.param(op, dtype, id=f"{name}-{dname}", marks=_marks(name, dname)))
    return f32, other


F32_PARAMS, OTHER_PARAMS = _params()


def _check(op: Any, dtype: torch.dtype) -> None:
    results = run_op(op, dtype, SAMPLES)
    bad = [r for r in results if r.status not in (PASS, EXPECTED_FALLBACK, GRAPH_BREAK)]
    assert not bad, "\n".join(f"sample {r.index}: {r.status}: {r.detail} {r.fallbacks}" for r in bad)


@pytest.mark.parametrize("op", F32_PARAMS)
def test_opinfo_float32(op: Any) -> None:
    _check(op, torch.float32)


@pytest.mark.parametrize("op, dtype", OTHER_PARAMS)
def test_opinfo_other_dtypes(op: Any, dtype: torch.dtype) -> None:
    _check(op, dtype)


def test_sample_is_large_enough() -> None:
    """The CI sample covers a good part of op_db in each pass."""
    assert len(F32_PARAMS) >= 250 or FULL
    assert len(OTHER_PARAMS) >= 100 or FULL
