"""The real SmolLM2-135M-Instruct GGUF against transformers loading the same file, and
malformed GGUF files."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np
import pytest
import torch
from torch import nn

from torchburn.llm.model.gguf_loader import GGUFError, load_gguf_model, unpermute_rows
from torchburn.quant import Int4Weight, QuantizedLinear, dequantize_int4

from .conftest import full_logits, smollm_gguf, smollm_missing, transformers

GGUF = smollm_gguf()
needs_gguf = pytest.mark.skipif(GGUF is None, reason=smollm_missing())
MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


def float_copy(model: nn.Module) -> nn.Module:
    """Every QuantizedLinear replaced by an nn.Linear holding its exact float32 dequantization
    (fast eager reference of the same weights)."""
    from torchburn.quant import dequantize_int8

    for name, module in list(model.named_modules()):
        if isinstance(module, QuantizedLinear):
            w = module.quantized_weight()
            dense = dequantize_int8(w) if module.quant_type == "int8" else dequantize_int4(w)
            linear = nn.Linear(module.in_features, module.out_features, bias=module.bias is not None)
            linear.weight = nn.Parameter(dense, requires_grad=False)
            if module.bias is not None:
                linear.bias = nn.Parameter(module.bias.float(), requires_grad=False)
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, linear)
    return model


@pytest.fixture(scope="module")
def smollm():  # type: ignore[no-untyped-def]
    if GGUF is None:
        pytest.skip(smollm_missing())
    from torchburn.llm import LLM

    return LLM.from_pretrained(GGUF, device="cpu", max_context=160, compile=False)


@needs_gguf
def test_gguf_weights_stay_quantized(smollm) -> None:
    m = smollm.model
    kinds = {(mod.quant_type, mod.group_size, getattr(mod, "mins", None) is not None)
             for mod in m.modules() if isinstance(mod, QuantizedLinear)}
    assert kinds == {("int4", 32, True), ("int8", 32, False)}  # Q4_1 layers, Q8_0 tied head
    assert m.lm_head.qweight is m.embed_tokens.qweight
    attn = m.layers[0].self_attn  # q, k and v fused on loading, as stored (nothing requantized)
    assert attn.q_proj is None and attn.qkv_proj.scales.dtype == torch.float16
    assert attn.qkv_proj.out_features == 576 + 2 * 192 and m.layers[0].mlp.gate_up_proj.out_features == 2 * 1536


@needs_gguf
def test_unpermuted_rows_are_the_gguf_rows() -> None:
    """Our Q rows are exactly the file's rows, reordered (nothing requantized)."""
    import gguf

    from torchburn.quant import import_gguf_q4_1

    reader = gguf.GGUFReader(str(GGUF))
    t = next(t for t in reader.tensors if t.name == "blk.0.attn_q.weight")
    raw = import_gguf_q4_1(np.asarray(t.data), (576, 576))
    model, _ = load_gguf_model(GGUF, None)
    ours = model.layers[0].self_attn.qkv_proj  # q's rows first
    perm = unpermute_rows(576, 9)
    assert torch.equal(ours.packed[:576], raw.packed[perm])
    assert torch.equal(ours.scales[:576], raw.scales[perm]) and torch.equal(ours.mins[:576], raw.mins[perm])


@needs_gguf
def test_greedy_tokens_match_transformers_on_the_same_gguf(smollm) -> None:
    """Float activations: the first 32 greedy tokens equal transformers' (it dequantizes the
    file to float32; our float copy holds the same dequantized values)."""
    ids = smollm.encode_prompt(MESSAGES)
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, dtype=torch.float32).eval()
    expected = ref.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                            eos_token_id=None, min_new_tokens=32)[0, len(ids):].tolist()
    model = float_copy(smollm.model)
    smollm.model = model
    smollm.eos_ids = frozenset()
    from torchburn.llm.runtime.sampling import SamplingParams

    got = [s[0] for s in smollm.generate_ids([ids], 32, SamplingParams(temperature=0.0))]
    assert got == expected
    with torch.no_grad():
        ours = full_logits(model, torch.tensor([ids]))
        torch.testing.assert_close(ours, ref(torch.tensor([ids])).logits, atol=1e-3, rtol=0)


@pytest.mark.skipif(os.environ.get("TORCHBURN_LLM_SLOW") != "1",
                    reason="compiles the 30-layer model (minutes); set TORCHBURN_LLM_SLOW=1")
@needs_gguf
def test_default_activations_agree_with_float_over_256_steps() -> None:
    """Compiled with the default quantized kernels (int8 activations where the CPU has VNNI):
    top-1 agreement with float greedy decoding over 256 steps stays above 95%."""
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams

    fast = LLM.from_pretrained(GGUF, device="cpu", max_context=320)
    fast.eos_ids = frozenset()
    ids = fast.encode_prompt(MESSAGES)
    ref = float_copy(load_gguf_model(GGUF, None)[0])
    tokens = [s[0] for s in fast.generate_ids([ids], 256, SamplingParams(temperature=0.0))]
    seq = torch.tensor([ids + tokens])
    with torch.no_grad():
        logits = full_logits(ref, seq)
    best = logits[0, len(ids) - 1:-1].argmax(-1).tolist()
    agreement = sum(a == b for a, b in zip(best, tokens)) / len(tokens)
    print(f"top-1 agreement over 256 greedy steps: {agreement:.3f}")
    assert agreement > 0.95


def _small_gguf(path: Path, q_rows: int = 64, header_rows: Optional[int] = None,
                float_v: bool = False) -> Path:
    """A one-layer llama GGUF with Q8_0 and F32 tensors, written by the gguf package
    (``float_v``: attn_v stored as F32, unlike attn_q and attn_k)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(64)
    w.add_feed_forward_length(96)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("gpt2")
    tokens = [chr(ord("a") + i % 26) * (1 + i // 26) for i in range(128)]
    w.add_token_list(tokens)
    w.add_token_types([1] * 128)
    rng = np.random.default_rng(0)

    def q8(shape: tuple[int, int]) -> np.ndarray:
        return gguf.quants.quantize(rng.standard_normal(shape).astype(np.float32) * 0.1,
                                    gguf.GGMLQuantizationType.Q8_0)

    w.add_tensor("token_embd.weight", q8((128, 64)), raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for name, shape in [("attn_q", (q_rows, 64)), ("attn_k", (32, 64)), ("attn_v", (32, 64)),
                        ("attn_output", (64, 64)), ("ffn_gate", (96, 64)), ("ffn_up", (96, 64)),
                        ("ffn_down", (64, 96))]:
        if float_v and name == "attn_v":
            w.add_tensor(f"blk.0.{name}.weight", rng.standard_normal(shape).astype(np.float32) * 0.1)
            continue
        header = (header_rows, 2 * 34) if name == "attn_q" and header_rows else None  # bytes
        w.add_tensor(f"blk.0.{name}.weight", q8(shape), raw_dtype=gguf.GGMLQuantizationType.Q8_0,
                     raw_shape=header)
    for name in ("blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"):
        w.add_tensor(name, np.ones(64, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_small_gguf_loads(tmp_path: Path) -> None:
    model, _ = load_gguf_model(_small_gguf(tmp_path / "ok.gguf"), None)
    assert model.config.num_hidden_layers == 1 and model.config.tie_word_embeddings


def test_truncated_gguf_is_a_clear_error(tmp_path: Path) -> None:
    good = _small_gguf(tmp_path / "ok.gguf").read_bytes()
    for size in (10, len(good) // 3, len(good) - 100):
        bad = tmp_path / f"cut{size}.gguf"
        bad.write_bytes(good[:size])
        with pytest.raises(GGUFError, match="GGUF|truncated"):
            load_gguf_model(bad, None)


def test_gguf_tensor_disagreeing_with_config_is_a_clear_error(tmp_path: Path) -> None:
    from torchburn.llm.model.weights import WeightError

    with pytest.raises(WeightError, match=r"self_attn.q_proj.weight.*\[32, 64\].*\[64, 64\]"):
        load_gguf_model(_small_gguf(tmp_path / "bad.gguf", q_rows=32), None)


def test_gguf_tensor_size_disagreeing_with_its_header_is_a_clear_error(tmp_path: Path) -> None:
    """attn_q's header says 64 rows but only 32 rows of data were written: read by its header
    it would run into attn_k's bytes."""
    with pytest.raises(GGUFError, match=r"blk.0.attn_q.weight.*runs into 'blk.0.attn_k.weight'"):
        load_gguf_model(_small_gguf(tmp_path / "bad.gguf", q_rows=32, header_rows=64), None)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"this is not gguf at all" * 10)
    with pytest.raises(GGUFError, match="not a readable GGUF"):
        load_gguf_model(bad, None)
