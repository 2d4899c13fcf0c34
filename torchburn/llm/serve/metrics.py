"""``GET /metrics``: the scheduler's counters in Prometheus' text exposition format (version
0.0.4), for a scraper or a glance with curl."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..runtime.scheduler import Scheduler


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render_metrics(scheduler: "Scheduler", model: str) -> str:
    s = scheduler.stats
    m = f'model="{_label(model)}"'
    lines: list[str] = []

    def metric(name: str, kind: str, help_: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP torchburn_{name} {help_}")
        lines.append(f"# TYPE torchburn_{name} {kind}")
        for labels, value in samples:
            lines.append(f"torchburn_{name}{{{labels}}} {value:g}" if labels
                         else f"torchburn_{name} {value:g}")

    reasons = ("stop", "length", "cancelled", "error")
    metric("requests_total", "counter", "Requests ended, by finish reason.",
           [(f'{m},finish_reason="{r}"', s.requests[r]) for r in reasons])
    metric("prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
           [(m, s.prompt_tokens)])
    metric("prefill_tokens_total", "counter",
           "Prompt tokens run through the model (the rest came from the prefix cache).",
           [(m, s.prefilled_tokens)])
    metric("completion_tokens_total", "counter", "Tokens generated.", [(m, s.completion_tokens)])
    metric("decode_steps_total", "counter", "Batched decode steps run.", [(m, s.decode_steps)])
    metric("decode_rows_total", "counter", "Requests served by those steps (rows, summed).",
           [(m, s.decode_rows)])
    metric("prefill_chunks_total", "counter", "Prefill steps run (chunks of prompts).",
           [(m, s.prefill_chunks)])
    metric("prefill_chunks_beside_decode_total", "counter",
           "Prefill chunks run in a turn that also decoded the running rows (chunked prefill).",
           [(m, s.interleaved_chunks)])
    metric("queue_length", "gauge", "Requests waiting for a row.", [(m, len(scheduler.waiting))])
    metric("running_requests", "gauge", "Requests in the running batch.",
           [(m, len(scheduler.running))])
    metric("batch_rows", "gauge", "Rows of the batch (--parallel).", [(m, scheduler.parallel)])
    metric("tokens_per_second", "gauge", "Generated tokens per second over the last 10 s.",
           [(m, round(s.tokens_per_second(), 3))])
    return "\n".join(lines) + "\n"
