"""Tensor-parallel LLM: a tiny random Llama split across 2 ranks (attention heads, MLP
columns/rows; quantized weights by whole groups), each rank's step compiled by torchburn,
generates the single-process greedy tokens; and `torchrun ... -m torchburn.llm generate --tp 2`."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from torchburn.frontend.partition import COLLECTIVE_REASON  # noqa: E402
from torchburn.llm.runtime.tensor_parallel import TensorParallelError, _columns, _rows  # noqa: E402

from .launch import run_ranks  # noqa: E402
from .tp_worker import NEW_TOKENS, PROMPT, greedy_ids, tp_generate  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama (4 heads, 2 KV heads, MLP 128: halves of whole 32-groups)."""
    from tests.llm.conftest import COMMON, tiny_tokenizer

    torch.manual_seed(1234)
    model = transformers.AutoModelForCausalLM.from_config(
        transformers.LlamaConfig(**{**COMMON, "intermediate_size": 128})).eval()
    folder = tmp_path_factory.mktemp("tiny_llama_tp")
    model.save_pretrained(folder, safe_serialization=True)
    tiny_tokenizer(folder)
    return folder


# float: each rank's steps compiled by torchburn; int4: the split by whole groups, eagerly (the
# compiled quantized linears are tests/quant's and tests/llm's), to keep the file's time small
@pytest.mark.parametrize("quant,compile", [(None, True), ("int4", False)])
def test_two_ranks_generate_the_single_process_tokens(checkpoint: Path, tmp_path: Path, quant: Any,
                                                      compile: bool) -> None:
    single = greedy_ids(str(checkpoint), quant, compile=False, tp=None)
    assert len(single) == NEW_TOKENS
    ranks = run_ranks(tp_generate, tmp_path, str(checkpoint), quant, compile)
    for r in ranks:
        assert r["ids"] == single
        assert bool(r["reports"]) == compile
        for g in r["reports"]:
            assert g["compiled"] and not g["not_compiled"] and not g["internal_errors"], g
            # only the all-reduces of the row-split projections stay in PyTorch
            assert all(why == COLLECTIVE_REASON for _, why in g["fallbacks"]), g["fallbacks"]
            assert any("all_reduce" in op for op, _ in g["fallbacks"]), g


def test_torchrun_cli(checkpoint: Path) -> None:
    """The command's plumbing (torchrun's group, --tp, rank 0 printing); eager, since the
    compiled ranks are the test above."""
    args = ["generate", PROMPT, "--model", str(checkpoint), "--tokens", str(NEW_TOKENS), "--raw"]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    single = subprocess.run([sys.executable, "-m", "torchburn.llm", *args, "--eager"], env=env, cwd=ROOT,
                            capture_output=True, timeout=300)
    assert single.returncode == 0, single.stderr.decode()[-2000:]
    tp = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                         "-m", "torchburn.llm", *args, "--tp", "2", "--eager"], env=env, cwd=ROOT, capture_output=True, timeout=300)
    assert tp.returncode == 0, _why(tp.stderr.decode())
    assert tp.stdout == single.stdout  # rank 0 prints, rank 1 stays quiet


def _why(stderr: str) -> str:
    """A failed torchrun's own report is its stderr's tail; what made a rank abort (a C++
    `terminate called ...`, a Python traceback) comes earlier: keep those lines too (a
    SIGABRT of rank 0 seen once under a loaded CI, 2026-12-07, left only the report)."""
    cause = [line for line in stderr.splitlines()
             if any(k in line for k in ("terminate called", "what():", "Error", "error:", "Traceback"))]
    return "\n".join(cause[:30]) + "\n...\n" + stderr[-1500:]


def test_cli_tp_without_torchrun_is_a_clear_error(checkpoint: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE")}
    out = subprocess.run([sys.executable, "-m", "torchburn.llm", "generate", "hi", "--model", str(checkpoint),
                          "--tp", "2"], env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT, capture_output=True, timeout=120)
    assert out.returncode == 1 and b"needs torchrun" in out.stderr


def test_quantized_split_only_at_whole_groups() -> None:
    from torchburn.quant import QuantizedLinear

    torch.manual_seed(0)
    dense = torch.nn.Linear(64, 8)
    q = QuantizedLinear.from_float(dense, quant_type="int4", group_size=32)
    x = torch.randn(3, 64)
    halves = [_columns(q, 0, 32), _columns(q, 32, 64)]
    torch.testing.assert_close(halves[0](x[:, :32]) + halves[1](x[:, 32:]) + q.bias, q(x), rtol=1e-4, atol=1e-4)
    rows = _rows(q, 2, 6)
    torch.testing.assert_close(rows(x), q(x)[:, 2:6], rtol=0, atol=0)
    with pytest.raises(TensorParallelError, match="whole groups"):
        _columns(q, 0, 16)
