"""The FX importer: symbolic integer arguments become symbols the launcher binds."""
from __future__ import annotations

import torch

import torchburn  # noqa: F401  (registers the backend)
from tests.helpers import run_compiled


def test_a_python_int_made_dynamic_is_an_argument_of_its_own() -> None:
    """Dynamo makes an int that changes between calls dynamic (`k + 1` arrives as a symbolic
    argument over a symbol no tensor shape carries); it must be bound from the argument."""
    fns = [lambda x, k=k: torch.sin(x) * (k + 1) + x.sum(-1, keepdim=True) for k in range(4)]
    x = torch.randn(8, 16)
    dynamic_seen = False
    for i, f in enumerate(fns):  # one Dynamo cache: the second call on recompiles with k dynamic
        out, reports = run_compiled(f, x, dynamic=None, reset=i == 0)
        torch.testing.assert_close(out, f(x))
        assert all(not s.internal_error for r in reports for s in r.subgraphs)
        dynamic_seen |= any(s.compiled for r in reports for s in r.subgraphs) and i > 0
    assert dynamic_seen, "the later calls must have compiled a graph with k symbolic"


def test_a_derived_size_argument_still_needs_no_input() -> None:
    f = lambda x: x.reshape(-1) * x.shape[0] * 2  # noqa: E731
    for n in (3, 5, 7):
        x = torch.randn(n, 4)
        out, _ = run_compiled(f, x, dynamic=True)
        torch.testing.assert_close(out, f(x))
