"""A warm second process: with the first one's disk cache it compiles nothing (no Dynamo, no
LLVM code generation), converts no weights, and gives the same tokens. No timing asserted
(`benchmarks/bench_warm_start.py` measures it)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
from torchburn.llm import LLM
from torchburn.llm.model import weight_cache
from torchburn.llm.runtime.sampling import SamplingParams
from torchburn.compiler import driver

llm = LLM.from_pretrained(sys.argv[1], quant="int4", device="cpu", max_context=64)
llm.eos_ids = frozenset()
rows = [[5, 17, 99, 250, 3, 41, 7]]
tokens = [s[0] for s in llm.generate_ids(rows, 5, SamplingParams(temperature=0.0))]
print(json.dumps({
    "tokens": tokens,
    "llvm_compiled": driver.STATS.compiled,
    "dynamo_imported": "torch._dynamo" in sys.modules,
    "compile_called": llm._step.compiled is not None,
    "step_disk_hits": llm.steps.stats.disk_hits,
    "step_stored": llm.steps.stats.stored,
    "weight_hits": weight_cache.STATS.hits,
    "weight_stores": weight_cache.STATS.stores,
}))
"""


def _run(folder: Path, cache: Path, script: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHBURN_CACHE_DIR=str(cache), TORCHBURN_DEBUG="0")
    done = subprocess.run([sys.executable, str(script), str(folder)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_warm_process_compiles_nothing_and_gives_the_same_tokens(tiny_checkpoint, tmp_path: Path) -> None:
    _, folder = tiny_checkpoint("llama")
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    cache = tmp_path / "cache"
    cold = _run(folder, cache, script)
    # the cold process did the work (so the warm figures below can tell a difference)
    assert cold["llvm_compiled"] > 0 and cold["dynamo_imported"] and cold["compile_called"]
    assert cold["step_stored"] == 2 and cold["weight_stores"] == 1 and cold["weight_hits"] == 0
    warm = _run(folder, cache, script)
    assert warm["tokens"] == cold["tokens"]
    assert warm["llvm_compiled"] == 0          # no code generation: programs came from disk
    assert not warm["dynamo_imported"]         # no Dynamo trace: Dynamo was never even imported
    assert not warm["compile_called"]
    assert warm["step_disk_hits"] == 2         # the prefill and the decode step
    assert warm["weight_hits"] == 1 and warm["weight_stores"] == 0  # no int4 quantization again
