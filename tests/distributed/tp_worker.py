"""What each rank runs for test_tensor_parallel.py: the tiny checkpoint loaded, split across
the 2 ranks (`shard_llm`), greedy ids generated; quantized and not."""
from __future__ import annotations

from typing import Any, Optional

import torch

PROMPT = "hello world, the quick"
NEW_TOKENS = 8


def greedy_ids(folder: str, quant: Optional[str], compile: bool, tp: Optional[int]) -> list[int]:
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams

    llm = LLM.from_pretrained(folder, quant=quant, device="cpu", compile=compile)
    if tp:
        from torchburn.llm.runtime.tensor_parallel import shard_llm

        shard_llm(llm, tp)
    rows = [llm.encode_prompt(PROMPT)]
    steps = llm.generate_ids(rows, NEW_TOKENS, SamplingParams(temperature=0.0), seed=0)
    return [s[0] for s in steps if s[0] is not None]


def tp_generate(rank: int, folder: str, quant: Optional[str], compile: bool) -> dict[str, Any]:
    from torchburn.backend import report as rep

    from .models import report_summary

    before = len(rep.recent_reports())
    ids = greedy_ids(folder, quant, compile=compile, tp=2)
    return {"ids": ids, "reports": report_summary(rep.recent_reports()[before:])}
