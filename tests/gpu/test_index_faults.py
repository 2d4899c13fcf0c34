"""Indices read from tensors are checked on the GPU engine too (issue 28): a shader that meets
an index out of range sets the program's fault flag (`codegen/wgsl/ops.py`, `tb_checked`), the
flag comes back with the results, and the launcher runs the call in PyTorch, which raises eager's
own error; in-range calls run on the GPU with eager's values and no fallback."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from torchburn.backend import gpu_launcher as gl
from tests.backend.test_index_checks import OPS, X, outcome

#: The ops whose compiled form stays on the GPU engine (int64 indices stored as int32).
GPU_OPS = ("embedding", "embedding_2d", "index_select", "getitem", "take", "gather", "index_copy", "scatter")


@pytest.mark.parametrize("name", GPU_OPS)
def test_out_of_range_raises_eagers_error_on_the_gpu(gpu, name: str) -> None:  # type: ignore[no-untyped-def]
    fn = OPS[name]
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend="torchburn", dynamic=False)
    before = {id(x) for x in gl.recent_launchers()}
    ran_on_gpu = False
    for i in (2, 4, 3, -1, -4, -5, 1):
        idx = torch.tensor([i])
        kind, expected = outcome(fn, idx, X)
        got_kind, got = outcome(compiled, idx, X)
        assert got_kind == kind, (i, expected, got)
        if kind == "value":
            torch.testing.assert_close(got, expected, rtol=0, atol=0)
        else:
            assert got == expected, i
        launchers = [x for x in gl.recent_launchers() if x.calls and id(x) not in before]
        ran_on_gpu |= bool(launchers)
    assert ran_on_gpu, f"{name} never ran on the GPU engine"


def test_embedding_id_equal_to_vocabulary_size_raises_on_the_gpu(gpu) -> None:  # type: ignore[no-untyped-def]
    """The issue's case on the GPU engine: an id equal to the vocabulary size among many valid
    ones raises eager's IndexError (it returned the last row: the clamp); the next in-range call
    runs on the GPU again with eager's values (the flag was reset)."""
    torch._dynamo.reset()
    weight = torch.randn(50, 64)
    ids = torch.randint(0, 50, (4, 128))
    compiled = torch.compile(lambda t, w: F.embedding(t, w) + 1, backend="torchburn", dynamic=False)
    torch.testing.assert_close(compiled(ids, weight), F.embedding(ids, weight) + 1)
    launcher = gl.recent_launchers()[-1]
    assert launcher.calls == 1 and launcher.gpu.fault is not None
    bad = ids.clone()
    bad[2, 100] = 50
    with pytest.raises(IndexError, match="index out of range in self"):
        compiled(bad, weight)
    assert launcher.gpu.faults == 1 and launcher.eager_fallbacks == 1
    torch.testing.assert_close(compiled(ids, weight), F.embedding(ids, weight) + 1)
    assert launcher.calls == 2 and launcher.eager_fallbacks == 1 and launcher.gpu.faults == 1


@pytest.mark.parametrize("n", [3, 100])
def test_int64_values_past_32_bits_run_in_pytorch(gpu, n: int) -> None:  # type: ignore[no-untyped-def]
    """The GPU stores int64 as int32: a call whose int64 input holds a value past 32 bits runs
    in PyTorch (eager's numbers), a few values checked through a list, many by reductions; the
    next call with small values runs on the GPU again."""
    from torchburn.backend import gpu_launcher

    def f(x: torch.Tensor, i: torch.Tensor) -> torch.Tensor:
        return x + (i * 2).float()

    x = torch.randn(n)
    small = torch.arange(n, dtype=torch.long)
    big = small.clone()
    big[n // 2] = 3 << 32
    compiled = torch.compile(f, backend="torchburn", fullgraph=True)
    torch._dynamo.reset()
    torch.testing.assert_close(compiled(x, small), f(x, small))
    launcher = gpu_launcher.recent_launchers()[-1]
    assert launcher.eager_fallbacks == 0
    torch.testing.assert_close(compiled(x, big), f(x, big))
    assert launcher.eager_fallbacks == 1
    torch.testing.assert_close(compiled(x, small), f(x, small))
    assert launcher.eager_fallbacks == 1
