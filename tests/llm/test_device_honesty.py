"""The GPU engine's decode against the CPU engine's, over many tokens and through the path the
engine takes per token (the step cache's direct call, one submission per token, the native
dispatch loop): f32 greedy tokens equal over 128 tokens; quantized weights, fed the CPU
engine's tokens, pick the CPU engine's top token at every step where the CPU's top two logits
are at least `MARGIN` apart."""
from __future__ import annotations

import os

import pytest
import torch

from .test_device import _gpu

#: Quantized decodes may pick another top token only where the CPU engine's top two logits are
#: closer than this (the two engines sum the same quantized products in different orders).
MARGIN = 1e-3
PROMPT = [5, 17, 99]


@pytest.fixture
def engines(monkeypatch):  # type: ignore[no-untyped-def]
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_DEVICE", os.environ.get("TORCHBURN_DEVICE", "cpu"))
    # both engines' quantized kernels with float activations (the CPU's default on VNNI is int8)
    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")
    monkeypatch.delenv("TORCHBURN_LLM_STEP_CACHE", raising=False)
    yield
    monkeypatch.undo()
    reload_config()


def _load(folder, device: str, quant=None):  # type: ignore[no-untyped-def]
    from torchburn.llm import LLM

    torch._dynamo.reset()
    llm = LLM.from_pretrained(folder, device=device, max_context=160, **({"quant": quant} if quant else {}))
    llm.eos_ids = frozenset()
    return llm


def _forced_logits(llm, tokens: list[int]) -> torch.Tensor:  # type: ignore[no-untyped-def]
    """[len(tokens), V]: the logits before each of `tokens`, each step fed the one before."""
    cache = llm.cache_for(1)
    starts = torch.zeros(1, dtype=torch.long)
    try:
        with torch.no_grad():
            out = [llm._prefill([PROMPT], cache, starts)[0]]
            for i, t in enumerate(tokens[:-1]):
                out.append(llm.run_step(cache, torch.tensor([[t]]), len(PROMPT) + i, starts)[0, -1])
    finally:
        llm.release_cache(cache)
    return torch.stack(out)


def _assert_picks_the_clear_top_tokens(ref: torch.Tensor, got: torch.Tensor, tokens: list[int]) -> None:
    """`got`'s top token is the CPU engine's at every step whose top two logits in `ref` are at
    least `MARGIN` apart, and at least half the steps are such steps."""
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[:, 0] - top2[:, 1]) >= MARGIN
    assert clear.sum() >= len(tokens) // 2, "too few steps with a clear top token to test anything"
    picked = got.argmax(-1)
    bad = [i for i in range(len(tokens)) if clear[i] and picked[i] != tokens[i]]
    assert not bad, f"steps {bad}: GPU {picked[bad].tolist()} vs CPU {[tokens[i] for i in bad]}"


def _decode_launcher(before: set[int]):  # type: ignore[no-untyped-def]
    from torchburn.backend import gpu_launcher

    new = [x for x in gpu_launcher.recent_launchers() if id(x) not in before]
    return new[-1]


@pytest.mark.skipif(not _gpu(), reason="no WebGPU adapter on this machine")
def test_f32_greedy_equals_the_cpu_engine_over_128_tokens(tiny_checkpoint, engines) -> None:
    from torchburn.backend import gpu_launcher
    from torchburn.llm.runtime.sampling import SamplingParams

    _, folder = tiny_checkpoint("llama")
    greedy = SamplingParams(temperature=0.0)
    cpu = [s[0] for s in _load(folder, "cpu").generate_ids([PROMPT], 128, greedy)]
    llm = _load(folder, "gpu")
    before = {id(x) for x in gpu_launcher.recent_launchers()}
    gpu = [s[0] for s in llm.generate_ids([PROMPT], 128, greedy)]
    assert len(cpu) == 128 and gpu == cpu
    decode = _decode_launcher(before)
    # every decode step ran as one GPU program, called by the step cache without Dynamo, its
    # dispatches encoded by the native loop where there is one
    # (127 steps, and the step cache's check of the step it learned: the first step again)
    assert decode.calls == 128 and decode.eager_fallbacks == 0
    # the prefill through the logits step, the decode through the greedy step: its token picked
    # on the device and fed to the next step there (all steps but the first, which compiled it
    # and was checked), each step submitted while the one before it was still out, and only
    # the token (and the fault flag) read back
    assert llm.steps is not None and llm.steps.stats.recorded == 1, llm.steps.stats
    assert llm.greedy_steps is not None and llm.greedy_steps.stats.recorded == 1, llm.greedy_steps.stats
    assert decode.fed_calls == 126 and decode.gpu.most_in_flight == 2
    assert decode.transfers.last_down <= 8
    from torchburn.runtime.gpu_encode import NativeEncoder

    if NativeEncoder.get() is not None:
        assert decode.gpu.native_encodes >= 127


@pytest.mark.skipif(not _gpu(), reason="no WebGPU adapter on this machine")
@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_quantized_decode_fed_the_cpu_tokens_picks_the_cpu_top_token(tiny_checkpoint, engines, quant) -> None:
    from torchburn.llm.runtime.sampling import SamplingParams

    _, folder = tiny_checkpoint("llama")
    cpu_llm = _load(folder, "cpu", quant)
    tokens = [s[0] for s in cpu_llm.generate_ids([PROMPT], 48, SamplingParams(temperature=0.0))]
    ref = _forced_logits(cpu_llm, tokens)
    assert ref.argmax(-1).tolist() == tokens  # the forced run is the greedy run
    got = _forced_logits(_load(folder, "gpu", quant), tokens)
    _assert_picks_the_clear_top_tokens(ref, got, tokens)
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3)


@pytest.mark.skipif(not _gpu(), reason="no WebGPU adapter on this machine")
def test_f16_decode_fed_the_cpu_tokens_picks_the_cpu_top_token(tiny_checkpoint, engines, tmp_path) -> None:
    """`quant="f16"` on the GPU (float16 storage where the adapter has `shader-f16`, f32
    arithmetic) against the CPU engine's float32 decode of the same weights rounded to f16."""
    from torchburn.llm.model.decoder import HalfLinear
    from torchburn.llm.runtime.sampling import SamplingParams
    from .test_f16_weights import _rounded_checkpoint

    folder = _rounded_checkpoint(tiny_checkpoint, tmp_path)
    cpu_llm = _load(folder, "cpu")
    tokens = [s[0] for s in cpu_llm.generate_ids([PROMPT], 48, SamplingParams(temperature=0.0))]
    ref = _forced_logits(cpu_llm, tokens)
    gpu_llm = _load(folder, "gpu", "f16")
    assert type(gpu_llm.model.layers[0].mlp.down_proj) is HalfLinear
    got = _forced_logits(gpu_llm, tokens)
    _assert_picks_the_clear_top_tokens(ref, got, tokens)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    greedy = [s[0] for s in gpu_llm.generate_ids([PROMPT], 48, SamplingParams(temperature=0.0))]
    assert greedy == tokens
