"""Resident state on the GPU engine (`backend/gpu_resident.py`): a mutated input stays on the
device across calls, the host copy is never silently stale, host writes are seen."""
from __future__ import annotations

import pytest
import torch

from torchburn.backend import gpu_launcher as gl
from torchburn.backend import gpu_resident as gr


class Counter(torch.nn.Module):
    """A module buffer updated in forward with an in-place slot write."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.zeros(2, 8, 4))

    def forward(self, slot: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        out = (self.state * x).sum(-1)  # reads the old values
        self.state[:, slot] = x.expand(2, 1, 4) * 2 + out.sum(-1)[:, None, None]  # writes one slot
        return out


def _run(gpu, owned: bool, steps: int = 5) -> None:  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    model, ref = Counter(), Counter()
    if owned:
        gr.keep_on_gpu(model.state)
    fast = torch.compile(model, backend="torchburn")
    xs = [torch.randn(4) for _ in range(steps)]
    for k, x in enumerate(xs):
        slot = torch.tensor([k + 1], dtype=torch.int32)
        torch.testing.assert_close(fast(slot, x), ref(slot, x))
    launcher = gl.recent_launchers()[-1]
    assert launcher.calls == steps and launcher.eager_fallbacks == 0 and launcher.inplace_results
    # no call after the first uploads the buffer again: only slot and x (4 + 16 bytes) go up
    assert launcher.transfers.last_up == 4 + 16
    assert launcher.transfers.resident >= model.state.numel() * 4
    if owned:
        assert gr.is_stale(model.state) and launcher.transfers.last_down == 2 * 8 * 4  # only the output
        gr.to_host(model.state)
    else:
        assert launcher.transfers.last_down == 2 * 8 * 4 + model.state.numel() * 4
    assert not gr.is_stale(model.state)
    torch.testing.assert_close(model.state, ref.state)
    # a host write between calls is seen by the next call
    model.state[1, 0] += 3.0
    ref.state[1, 0] += 3.0
    slot, x = torch.tensor([7], dtype=torch.int32), torch.randn(4)
    torch.testing.assert_close(fast(slot, x), ref(slot, x))
    gr.to_host(model.state)
    torch.testing.assert_close(model.state, ref.state)
    gr.release(model.state)


def test_mutated_buffer_written_back_each_call_equals_eager(gpu) -> None:  # type: ignore[no-untyped-def]
    _run(gpu, owned=False)


def test_gpu_owned_buffer_read_on_the_host_after_steps_equals_eager(gpu) -> None:  # type: ignore[no-untyped-def]
    _run(gpu, owned=True)


def test_host_write_into_a_stale_owned_tensor_is_an_error(gpu) -> None:  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    model = Counter()
    gr.keep_on_gpu(model.state)
    fast = torch.compile(model, backend="torchburn")
    fast(torch.tensor([1], dtype=torch.int32), torch.randn(4))
    assert gr.is_stale(model.state)
    model.state.zero_()
    with pytest.raises(gr.GpuStateError, match="to_host"):
        fast(torch.tensor([2], dtype=torch.int32), torch.randn(4))
    gr.release(model.state)


class Shift(torch.nn.Module):
    """The written values read the buffer itself: not in place (a copy), still eager's result."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("state", torch.arange(24.0).reshape(2, 3, 4))

    def forward(self, slot: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        self.state[:, slot] = self.state[:, slot - 1] + x
        return self.state.sum(1)


def test_write_reading_its_own_input_is_not_in_place_and_equals_eager(gpu) -> None:  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    model, ref = Shift(), Shift()
    fast = torch.compile(model, backend="torchburn")
    for k in (1, 2, 1):
        slot, x = torch.tensor([k], dtype=torch.int32), torch.randn(4)
        torch.testing.assert_close(fast(slot, x), ref(slot, x))
        torch.testing.assert_close(model.state, ref.state)
    assert not gl.recent_launchers()[-1].inplace_results


def test_quantized_weight_is_uploaded_once_across_programs(gpu) -> None:  # type: ignore[no-untyped-def]
    """Int4 codes and f16 scales (stored converted on the device) stay resident: a second
    program (another batch size) uploads only its activation."""
    from torchburn.quant import QuantizedLinear

    torch.manual_seed(0)
    layer = QuantizedLinear.from_float(torch.nn.Linear(64, 24), "int4", 32, False, torch.float16)
    torch._dynamo.reset()
    fast = torch.compile(layer, backend="torchburn", dynamic=False)
    with torch.no_grad():
        for batch in (3, 5):
            x = torch.randn(batch, 64)
            torch.testing.assert_close(fast(x), layer(x), rtol=1e-4, atol=1e-4)
            tr = gl.recent_launchers()[-1].transfers
            if batch == 5:
                assert tr.last_up == batch * 64 * 4, tr  # only x
            assert tr.resident > batch * 64 * 4
