"""`benchmarks/bench_llm_gpu.py`'s GGUF writer (the `gpu-q4km` row): the tensor types of
llama.cpp's Q4_K_M, with its fallbacks where a row is not a multiple of 256 long, and a file
our loader reads with every matrix kept quantized in those types."""
from __future__ import annotations

import collections
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import bench_llm_gpu  # noqa: E402


def test_q4_k_m_types_follow_llama_cpps_rule() -> None:
    pick = bench_llm_gpu._q4_k_m_type
    # 16 layers: the first two and last two, and every third from layer 2 + 2, get more bits
    more = [layer for layer in range(16) if pick("ffn_down", layer, 16, 1536) == "Q6_K"]
    assert more == [0, 1, 4, 7, 10, 13, 14, 15]
    assert pick("attn_q", 0, 16, 1536) == "Q4_K" and pick("output", 5, 16, 2048) == "Q6_K"
    # a 576-long row takes no 256-weight block: Q4_K's and Q6_K's fallbacks
    assert pick("attn_q", 5, 16, 576) == "Q5_0" and pick("token_embd", 0, 16, 576) == "Q8_0"
    assert pick("token_embd", 0, 16, 2048, tied=False) == "Q4_K"  # the head is `output` then


def test_the_file_loads_quantized_in_its_types(tmp_path: Path) -> None:
    gguf = pytest.importorskip("gguf")
    pytest.importorskip("transformers")
    import torch

    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams

    config = dict(bench_llm_gpu.QUICK, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                  num_key_value_heads=2, num_hidden_layers=2, vocab_size=320)
    folder = bench_llm_gpu.make_checkpoint(tmp_path, config)
    path = bench_llm_gpu.make_gguf(folder)
    types = collections.Counter(t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors)
    assert set(types) == {"F32", "Q4_K", "Q6_K"}, types  # 256- and 512-long rows: no fallback
    assert bench_llm_gpu.make_gguf(folder) == path  # kept: written once
    llm = LLM.from_pretrained(str(path), device="cpu", max_context=32)
    floats = [n for n, m in llm.model.named_modules() if isinstance(m, (torch.nn.Linear, torch.nn.Embedding))]
    assert not floats, floats
    llm.eos_ids = frozenset()
    steps = [s[0] for s in llm.generate_ids([[5, 17, 99]], 4, SamplingParams(temperature=0.0))]
    assert len(steps) == 4 and all(0 <= t < 320 for t in steps)
