"""GGUF files quantized by a real llama.cpp quantizer (ik_llama.cpp's, from the
`ik-llama-cpp-python` wheel; `ik_fixtures.py`) load with every weight kept quantized in the
file's block types, and `torchburn.LLM` agrees with ik_llama.cpp on them.

**Agreement**: ik_llama.cpp reads a fixed prompt of varied tokens and decodes greedily from it;
fed the same tokens (teacher forcing), our top token at each position, from one prefill of the
whole sequence (the GEMM kernels, ragged M) and from one decode step per token (the GEMV
kernels), equals ik_llama.cpp's top token there, unless ik's own top-2 logit gap at that
position is under `MARGIN`: its quantized matrix products multiply by 8-bit activations, which
moved its logits of these models (standard deviation about 4) by up to 0.41 from the exact
float32 product of the file's weights. At least half the positions must be clear of the margin,
so the test cannot pass vacuously. Where the file is float, and for the files whose quantized
weights are all `BlockWeight`s run again with f32 activations
(`TORCHBURN_QLINEAR_ACTIVATIONS=f32`: by default their kernels take int8 ones, as
ik_llama.cpp's), our logits must also equal, to f32 rounding, an eager float twin of the model
holding gguf-py's dequantized weights."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.llm import ik_fixtures as ik
from tests.llm.conftest import full_logits
from tests.llm.test_gguf_block_loading import float_twin
from torchburn.quant import QuantizedLinear

pytestmark = pytest.mark.skipif(ik.ik_available() is not None, reason=str(ik.ik_available()))

#: A position is checked only where ik_llama.cpp's top-2 logit gap is at least this.
MARGIN = 0.5
PROMPT = [72, 101, 108, 108, 111, 44, 32, 119, 274, 5, 301, 97, 160, 33, 259, 288, 12, 199, 64, 300,
          141, 88, 270, 3]
STEPS = 8

#: name -> (tied embedding, llama-quantize type, options, tensor types the file must hold)
FIXTURES: dict[str, tuple[bool, str, tuple[str, ...], set[str]]] = {
    "Q4_K_M": (False, "Q4_K_M", (), {"Q4_K", "Q6_K", "F32"}),
    "Q4_0-tied": (True, "Q4_0", (), {"Q4_0", "Q6_K", "F32"}),
    "Q4_1": (False, "Q4_1", (), {"Q4_1", "Q6_K", "F32"}),
    "Q5_0": (False, "Q5_0", ("--pure",), {"Q5_0", "F32"}),
    "Q5_1": (False, "Q5_1", ("--pure",), {"Q5_1", "F32"}),
    "Q8_0": (True, "Q8_0", (), {"Q8_0", "F32"}),
    "Q2_K": (False, "Q2_K", ("--pure",), {"Q2_K", "F32"}),
    "Q3_K_M": (False, "Q3_K_M", (), {"Q3_K", "Q4_K", "Q5_K", "Q6_K", "F32"}),
    "Q5_K_M-tied": (True, "Q5_K_M", (), {"Q5_K", "Q6_K", "F32"}),
    "Q6_K": (False, "Q6_K", ("--pure",), {"Q6_K", "F32"}),
    "F16": (False, "F16", (), {"F16", "F32"}),
    "BF16": (True, "BF16", (), {"BF16", "F32"}),
}


@pytest.fixture(scope="session")
def fixtures_dir(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The base files (written once per session) and the quantized ones made so far."""
    folder = tmp_path_factory.mktemp("ik-gguf")
    return {"dir": folder, "base": {tied: ik.write_base(folder / f"base-{int(tied)}.gguf", tied) for tied in (False, True)}}


def fixture_file(store: dict[str, Any], name: str) -> Path:
    tied, ftype, options, expected = FIXTURES[name]
    path = store["dir"] / f"{name}.gguf"
    if not path.is_file():
        ik.quantize(store["base"][tied], path, ftype, options)
    found = set(ik.tensor_types(path).values())
    assert found == expected, f"llama-quantize wrote {sorted(found)} for {name}, the test expects {sorted(expected)}"
    return path


def _check_quantized(llm: Any, name: str) -> None:
    """No float copy of a quantized weight: every linear and the embedding hold the file's
    blocks (or our INT4/INT8 layouts, for Q4_0/Q4_1/Q8_0 linears)."""
    from torch import nn

    floats = [n for n, m in llm.model.named_modules() if isinstance(m, (nn.Linear, nn.Embedding))]
    if name in ("F16", "BF16"):
        assert floats
        return
    assert not floats, f"float weights in a quantized file: {floats}"


def _prefill_and_decode(llm: Any, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    starts = torch.zeros(1, dtype=torch.long)
    with torch.no_grad():
        prefill = llm.run_step(llm.cache_for(1), torch.tensor([tokens[:-1]]), 0, starts)[0]
        cache = llm.cache_for(1)
        decode = torch.stack([llm.run_step(cache, torch.tensor([[t]]), i, starts)[0, -1]
                              for i, t in enumerate(tokens[:-1])])
    return prefill, decode


@pytest.mark.parametrize("name", list(FIXTURES))
def test_agrees_with_ik_llama_cpp(fixtures_dir: dict[str, Any], name: str,
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from torchburn.llm import LLM
    from torchburn.runtime.config import reload_config

    path = fixture_file(fixtures_dir, name)
    ref = ik.ik_logits(path, PROMPT, STEPS)
    tokens, ik_rows = ref["tokens"], torch.from_numpy(ref["logits"])
    llm = LLM.from_pretrained(path, device="cpu", max_context=64)
    _check_quantized(llm, name)
    prefill, decode = _prefill_and_decode(llm, tokens)
    quantized = [m for m in llm.model.modules() if isinstance(m, QuantizedLinear)]
    if all(m.block_type is not None for m in quantized):
        exact_run = (prefill, decode)
        if quantized:
            monkeypatch.setenv("TORCHBURN_QLINEAR_ACTIVATIONS", "f32")
            reload_config()
            torch._dynamo.reset()  # compile the step again, under the new setting
            try:
                exact_run = _prefill_and_decode(LLM.from_pretrained(path, device="cpu", max_context=64), tokens)
            finally:
                monkeypatch.undo()
                reload_config()
                torch._dynamo.reset()
        with torch.no_grad():
            exact = full_logits(float_twin(llm.model), torch.tensor([tokens[:-1]]))[0]
        torch.testing.assert_close(exact_run[0], exact, rtol=0, atol=2e-3)
        torch.testing.assert_close(exact_run[1], exact, rtol=0, atol=2e-3)
    top2 = ik_rows.topk(2, dim=-1)
    best = top2.indices[:, 0].tolist()
    gaps = (top2.values[:, 0] - top2.values[:, 1]).tolist()
    clear = [g >= MARGIN for g in gaps]
    assert sum(clear) >= len(clear) // 2, f"only {sum(clear)} of {len(clear)} positions have a top-2 gap of {MARGIN}"
    assert len(set(b for b, c in zip(best, clear) if c)) > 4, "the reference's top tokens hardly vary"
    for form, rows in (("prefill", prefill), ("decode", decode)):
        ours = rows.argmax(-1).tolist()
        for i, ok in enumerate(clear):
            if ok:
                assert ours[i] == best[i], (
                    f"{form} position {i}: ours {ours[i]}, ik_llama.cpp {best[i]} (its gap {gaps[i]:.3f}; "
                    f"our logit of its token {float(rows[i, best[i]]):.3f}, of ours {float(rows[i, ours[i]]):.3f})")


def test_i_quants_and_fork_types_are_refused(fixtures_dir: dict[str, Any]) -> None:
    """An i-quant (IQ4_XS, mainline) and a type only ik_llama.cpp writes (Q6_0): errors that
    name the type and the tensor."""
    from torchburn.llm.model.gguf_loader import GGUFError, load_gguf_model

    base = fixtures_dir["base"][False]
    iq = ik.quantize(base, fixtures_dir["dir"] / "iq4xs.gguf", "IQ4_XS", ("--pure",))
    assert "IQ4_XS" in ik.tensor_types(iq).values()
    with pytest.raises(GGUFError, match=r"tensor '[a-z_.0-9]+' has ggml type IQ4_XS.*i-quant"):
        load_gguf_model(iq, None)
    fork = ik.quantize(base, fixtures_dir["dir"] / "q6_0.gguf", "Q4_K_M", ("--token-embedding-type", "q6_0"))
    with pytest.raises(GGUFError, match=r"tensor 'token_embd.weight' has ggml type \d+, which mainline llama.cpp does not define"):
        load_gguf_model(fork, None)
