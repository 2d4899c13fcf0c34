"""``device="gpu"``: the same model compiled for the wgpu engine (the software adapter in CI)
gives transformers' logits."""
from __future__ import annotations

import os

import pytest
import torch

from .conftest import VOCAB, assert_same_logits, hf_logits, our_logits


def _gpu() -> bool:
    try:
        from torchburn.runtime.gpu import gpu_available

        return gpu_available()
    except Exception:
        return False


@pytest.mark.skipif(not _gpu(), reason="no WebGPU adapter on this machine")
def test_gpu_device_matches_transformers(tiny_checkpoint, monkeypatch) -> None:
    from torchburn.runtime.config import reload_config
    from torchburn.llm import LLM

    monkeypatch.setenv("TORCHBURN_DEVICE", os.environ.get("TORCHBURN_DEVICE", "cpu"))
    hf, folder = tiny_checkpoint("llama")
    try:
        llm = LLM.from_pretrained(folder, device="gpu", max_context=64)
        assert llm.device == "gpu" and os.environ["TORCHBURN_DEVICE"] == "gpu"
        rows = [[5, 17, 99, 250, 3, 41, 7, 8]]
        steps = torch.randint(3, VOCAB, (1, 4), generator=torch.Generator().manual_seed(0))
        got = our_logits(llm._step, llm.model, rows, steps, dynamic=llm.compiled)
        assert_same_logits(got, hf_logits(hf, rows, steps), rows)
    finally:
        monkeypatch.undo()
        reload_config()


def test_unknown_device_is_refused() -> None:
    from torchburn.llm.runtime.device import select_device

    with pytest.raises(ValueError, match="device must be one of auto, cpu, gpu"):
        select_device("tpu", None)


@pytest.mark.skipif(not _gpu(), reason="no WebGPU adapter on this machine")
@pytest.mark.parametrize("quant", [None, "int8"])
def test_gpu_greedy_equals_cpu_engine_and_the_cache_stays_on_the_gpu(tiny_checkpoint, monkeypatch, quant) -> None:
    """Greedy decoding on the GPU engine gives the CPU engine's tokens; the KV cache is owned by
    the GPU (nothing of it comes down per step) and reads back equal to the CPU engine's. The
    decode step runs on the GPU engine too: per step a few bytes of positions go up, the
    token picked on the device comes down, and each layer's attention is one flash-attention kernel (no kernel is
    one invocation for the whole op)."""
    from torchburn.backend import gpu_launcher, gpu_resident
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_DEVICE", os.environ.get("TORCHBURN_DEVICE", "cpu"))
    # the GPU's quantized kernels take float activations; on a CPU with VNNI the CPU engine's
    # default is int8 activations (another rounding), so both are held to float activations
    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")
    _, folder = tiny_checkpoint("llama")
    greedy = SamplingParams(temperature=0.0)
    try:
        results = {}
        for device in ("cpu", "gpu"):
            torch._dynamo.reset()
            llm = LLM.from_pretrained(folder, device=device, max_context=32,
                                      **({"quant": quant} if quant else {}))
            llm.eos_ids = frozenset()
            before = {id(x) for x in gpu_launcher.recent_launchers()}
            tokens = [s[0] for s in llm.generate_ids([[5, 17, 99]], 5, greedy)]
            (cache,) = llm.kv.idle()
            if device == "gpu":
                assert gpu_resident.is_owned(cache.tensor)
                new = [x for x in gpu_launcher.recent_launchers() if id(x) not in before]
                assert new and all(x.eager_fallbacks == 0 for x in new)
                prefill = new[0].transfers
                # the prefill's in-place cache write stays on the device: only the logits come down
                assert prefill.last_down == VOCAB * 4, prefill
                # the decode step: one GPU program, called once per generated token after the first
                assert len(new) == 2, [x.program.name for x in new]
                decode = new[1].transfers
                # 4 steps, and the step cache's check of the step it learned (the first again);
                # greedy: only the token comes down (`LLM._decode_greedy`), not the logits
                assert decode.calls == 5 and decode.last_down == 4 and decode.last_up <= 32, decode
                kernels = new[1].compiled.kernel_summary()
                attention = [k for k in kernels if "torchburn.attention" in k]
                # one flash-attention kernel per layer (2), the decode form (a workgroup per row)
                assert 1 <= len(attention) <= 2 and all(": attention/decode" in k for k in attention), attention
                assert not any(": single" in k for k in kernels), kernels
                gpu_resident.to_host(cache.tensor)
            results[device] = (tokens, cache.tensor[..., :7, :].clone())
        assert results["gpu"][0] == results["cpu"][0]
        torch.testing.assert_close(results["gpu"][1], results["cpu"][1], rtol=1e-4, atol=1e-4)
    finally:
        monkeypatch.undo()
        reload_config()


@pytest.mark.skipif(not _gpu(), reason="no WebGPU adapter on this machine")
def test_q8_0_gguf_decodes_on_the_gpu_like_the_cpu_engine(tmp_path, monkeypatch) -> None:
    """A Q8_0 GGUF (weights stay quantized, dequantized in the WGSL kernels): the decode step
    runs on the GPU engine with only the greedy token coming down, the CPU's tokens."""
    from torchburn.backend import gpu_launcher
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams
    from torchburn.runtime.config import reload_config

    from .test_gguf_loader import _small_gguf

    path = _small_gguf(tmp_path / "q8.gguf")
    monkeypatch.setenv("TORCHBURN_DEVICE", os.environ.get("TORCHBURN_DEVICE", "cpu"))
    monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")  # as above: the GPU takes float activations
    try:
        tokens = {}
        for device in ("cpu", "gpu"):
            torch._dynamo.reset()
            llm = LLM.from_pretrained(str(path), device=device, max_context=32)
            llm.eos_ids = frozenset()
            before = {id(x) for x in gpu_launcher.recent_launchers()}
            tokens[device] = [s[0] for s in llm.generate_ids([[5, 17, 99]], 4, SamplingParams(temperature=0.0))]
            if device == "gpu":
                new = [x for x in gpu_launcher.recent_launchers() if id(x) not in before]
                assert len(new) == 2 and all(x.eager_fallbacks == 0 for x in new)
                # 3 steps and the step cache's check of the first
                assert new[1].transfers.calls == 4 and new[1].transfers.last_down == 4
        assert tokens["gpu"] == tokens["cpu"]
    finally:
        monkeypatch.undo()
        reload_config()
