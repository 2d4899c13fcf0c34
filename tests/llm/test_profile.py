"""`torchburn.llm.cli.profile`: a compiled decode step timed kernel by kernel."""
from __future__ import annotations

import torch

from torchburn.llm import LLM


def test_profile_times_every_kernel_and_keeps_the_results(tiny_checkpoint) -> None:
    from torchburn.llm.cli.profile import profile_decode

    _, folder = tiny_checkpoint("llama")
    llm = LLM.from_pretrained(folder, device="cpu", max_context=96)
    cache = llm.cache_for(1)
    starts = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        llm.run_step(cache, torch.tensor([[7] * 16]), 0, starts)
        expected = llm.run_step(cache, torch.tensor([[100]]), 16, starts)
    prof = profile_decode(llm, steps=3, filled=16)
    assert prof.calls == 3
    assert len(prof.kernels) == len(prof.program.calls) > 5
    assert all(k.seconds > 0 for k in prof.kernels)
    with torch.no_grad(), prof.active():  # the one-kernel programs compute the same logits
        got = llm.run_step(cache, torch.tensor([[100]]), 16, starts)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=0)
    table = prof.table()
    assert "decode step:" in table and "model.lm_head" in table
    assert "llm/model/decoder.py:" in table and "Attention.forward" in table
