"""`torchburn.llm.model.fuse`: q/k/v and gate/up as one linear each once loaded, for every family
and weight kind, the same logits as the separate projections; alike linears only."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from torchburn.llm import LLM
from torchburn.llm.model.fuse import can_fuse, fuse_projections, split_linear, stack_linears, unfuse_projections
from torchburn.quant import QuantizedLinear


@pytest.mark.parametrize("arch,quant", [("llama", None), ("qwen2", "int4"), ("qwen3", "int8"),
                                        ("mistral", "int4")])
def test_loaded_layers_are_fused_and_compute_the_same(tiny_checkpoint, arch: str, quant) -> None:
    """from_pretrained fuses every layer (qwen2: with the q/k/v biases; qwen3: q/k norms after
    the split); splitting back gives the same logits in eager mode."""
    _, folder = tiny_checkpoint(arch)
    llm = LLM.from_pretrained(folder, quant=quant, device="cpu", compile=False)
    for layer in llm.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        assert attn.qkv_proj is not None and attn.q_proj is None and attn.k_proj is None and attn.v_proj is None
        assert mlp.gate_up_proj is not None and mlp.gate_proj is None and mlp.up_proj is None
        kind = QuantizedLinear if quant else nn.Linear
        assert isinstance(attn.qkv_proj, kind) and isinstance(mlp.gate_up_proj, kind)
    separate = copy.deepcopy(llm.model)
    unfuse_projections(separate)
    assert separate.layers[0].self_attn.qkv_proj is None and separate.layers[0].mlp.up_proj is not None
    ids = torch.tensor([[5, 17, 99, 250, 3, 8]])
    with torch.no_grad():
        a = _logits(llm.model, llm.model.new_cache(1, 16), ids)
        b = _logits(separate, separate.new_cache(1, 16), ids)
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    fuse_projections(separate)  # and fused again: the same
    with torch.no_grad():
        torch.testing.assert_close(_logits(separate, separate.new_cache(1, 16), ids), a, atol=1e-5, rtol=1e-5)


def _logits(model: nn.Module, cache, ids: torch.Tensor) -> torch.Tensor:  # type: ignore[no-untyped-def]
    t = ids.shape[1]
    logits, _ = model(ids, torch.arange(t)[None], torch.arange(t), torch.zeros(1, dtype=torch.long),
                      cache.tensor[:, :, :, :t])
    return logits


def test_only_alike_linears_fuse() -> None:
    torch.manual_seed(0)
    a, b = nn.Linear(64, 32), nn.Linear(64, 16)
    assert can_fuse([a, b])
    assert not can_fuse([a, nn.Linear(64, 16, bias=False)])  # one bias missing
    assert not can_fuse([a, nn.Linear(32, 16)])  # other inputs
    q4 = [QuantizedLinear.from_float(m, "int4", 32, False, torch.float16) for m in (a, b)]
    q8 = QuantizedLinear.from_float(b, "int8", 32)
    assert can_fuse(q4) and not can_fuse([q4[0], q8]) and not can_fuse([q4[0], b])
    assert not can_fuse([q4[0], QuantizedLinear.from_float(b, "int4", 32, True, torch.float16)])
    x = torch.randn(3, 64)
    for parts in ([a, b], q4):
        fused = stack_linears(parts)
        with torch.no_grad():
            torch.testing.assert_close(fused(x), torch.cat([m(x) for m in parts], -1), atol=1e-5, rtol=1e-5)
            back = split_linear(fused, [32, 16])
            for m, n in zip(back, parts):
                torch.testing.assert_close(m(x), n(x), atol=0, rtol=0)
