"""``python -m torchburn.llm benchmark``: prefill and decode speed, llama-bench style.

Tests, as llama-bench names them: ``pp<N>`` runs an N-token prompt through prefill (tokens/s
of prompt processing), ``tg<N>`` generates N tokens one decode step at a time after a
one-token prompt (tokens/s of generation).  Each is repeated and given as mean +- standard
deviation.  Decode is bound by the bytes of weights read per token, so the report also says
how many bytes a decode step reads (`decode_weight_bytes`) and what rate that makes, next to
the machine's read bandwidth measured in the same run (`read_bandwidth`).
"""
from __future__ import annotations

import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional, Sequence

import torch
from torch import nn

from ..runtime.sampling import SamplingParams

#: Bytes of the buffer `read_bandwidth` sums (well past any cache).
BANDWIDTH_BYTES = 1 << 30
#: Rows of the compiled sum in `read_bandwidth` (a parallel loop over rows: many per thread).
READ_ROWS = 64


log = logging.getLogger("torchburn")

@dataclass
class TestResult:
    """One llama-bench row: ``test`` (``pp512``, ``tg128``) and its tokens/s over repeats."""

    test: str
    tokens_per_s: list[float]
    #: The engine of this row when it is not the report's own (a peer: "llama.cpp", ...).
    engine: Optional[str] = None

    @property
    def mean(self) -> float:
        return statistics.mean(self.tokens_per_s)

    @property
    def std(self) -> float:
        return statistics.stdev(self.tokens_per_s) if len(self.tokens_per_s) > 1 else 0.0


@dataclass
class BenchReport:
    """What ``benchmark`` prints (`table`) and writes with ``--json`` (`as_dict`)."""

    model: str
    size_bytes: int
    params: int
    quant: str
    engine: str
    threads: int
    results: list[TestResult] = field(default_factory=list)
    load_s: float = 0.0
    warmup_s: float = 0.0
    #: Seconds from a pp prompt's submission to its first generated token, per repeat.
    time_to_first_token_s: list[float] = field(default_factory=list)
    decode_weight_bytes: int = 0
    #: GB/s of the machine's reads (a float32 sum over `BANDWIDTH_BYTES`, same threads).
    read_bandwidth_gbs: float = 0.0
    #: Multiply-adds per prompt token in the layers' linears (the weights' element count;
    #: attention's own products and the vocabulary projection of the last row left out).
    prefill_macs_per_token: int = 0
    #: G ops/s of the host's int8 dot products, same threads (`runtime/peak.py`), 0 if unmeasured.
    int8_peak_gops: float = 0.0

    def prefill_gops(self) -> Optional[float]:
        """G ops/s (2 per multiply-add) the pp test's linears did."""
        pp = [r for r in self.results if r.test.startswith("pp") and not r.engine]
        return pp[0].mean * 2 * self.prefill_macs_per_token / 1e9 if pp and self.prefill_macs_per_token else None

    def decode_gbs(self) -> Optional[float]:
        """GB/s of weight reads at the measured decode speed."""
        tg = [r for r in self.results if r.test.startswith("tg")]
        return tg[0].mean * self.decode_weight_bytes / 1e9 if tg else None

    def table(self) -> str:
        head = "| model | size | params | quant | engine | threads | test | t/s |"
        lines = [head, "|---|---:|---:|---|---|---:|---|---:|"]
        for r in self.results:
            lines.append(f"| {self.model} | {self.size_bytes / 2**20:.2f} MiB | "
                         f"{self.params / 1e6:.2f} M | {self.quant} | {r.engine or self.engine} | "
                         f"{self.threads} | {r.test} | {r.mean:.2f} +- {r.std:.2f} |")
        for test in sorted({r.test for r in self.results if r.engine}):
            ours = [r.mean for r in self.results if r.test == test and not r.engine]
            best = max((r for r in self.results if r.test == test and r.engine), key=lambda r: r.mean)
            if ours and best.mean > 0:
                lines.append(f"{test}: {ours[0] / best.mean:.2f}x the faster peer ({best.engine})")
        if self.time_to_first_token_s:
            lines.append(f"time to first token ({self.results[0].test} prompt): "
                         f"{statistics.mean(self.time_to_first_token_s) * 1e3:.1f} ms")
        gbs = self.decode_gbs()
        if gbs is not None and self.read_bandwidth_gbs:
            lines.append(f"decode reads {self.decode_weight_bytes / 1e6:.1f} MB of weights per token: "
                         f"{gbs:.2f} GB/s, {100 * gbs / self.read_bandwidth_gbs:.0f}% of the "
                         f"{self.read_bandwidth_gbs:.2f} GB/s read bandwidth measured now")
        gops = self.prefill_gops()
        if gops is not None and self.int8_peak_gops:
            lines.append(f"prefill does {gops:.0f} G ops/s in the linears ({self.prefill_macs_per_token / 1e6:.0f} M "
                         f"multiply-adds a token): {100 * gops / self.int8_peak_gops:.0f}% of the "
                         f"{self.int8_peak_gops:.0f} G ops/s int8 peak measured now (a generated byte-dot loop)")
        lines.append(f"load {self.load_s:.1f} s, warm-up (compiles) {self.warmup_s:.1f} s")
        return "\n".join(lines)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["results"] = [dict(test=r.test, engine=r.engine or self.engine, tokens_per_s=r.tokens_per_s,
                             mean=r.mean, std=r.std) for r in self.results]
        d["decode_gbs"] = self.decode_gbs()
        d["prefill_gops"] = self.prefill_gops()
        return d

    def write_json(self, path: str) -> None:
        with open(path, "w") as f:
            json.dump(self.as_dict(), f, indent=2)


def _unique(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if t.data_ptr() not in seen:
            seen.add(t.data_ptr())
            out.append(t)
    return out


def _tensors(module: nn.Module) -> list[torch.Tensor]:
    return list(module.parameters()) + list(module.buffers())


def parameter_count(model: nn.Module) -> int:
    """Weights counted as elements of the float model (packed INT4 bytes count twice)."""
    from ...quant import QuantizedLinear

    total = 0
    for m in model.modules():
        if isinstance(m, QuantizedLinear):
            total += m.in_features * m.out_features + (m.bias.numel() if m.bias is not None else 0)
        elif type(m).__name__ == "QuantizedEmbedding":
            total += m.qweight.numel()
        elif type(m).__name__ == "BlockEmbedding":
            total += m.weight_blocks().in_features * m.blocks.shape[0]
        elif not any(True for _ in m.children()):
            total += sum(p.numel() for p in m.parameters(recurse=False))
    tied = getattr(model, "lm_head", None)
    embed = getattr(model, "embed_tokens", None)
    if tied is not None and embed is not None and _shares_bytes(tied, embed):
        if isinstance(embed, nn.Embedding):
            total -= embed.weight.numel()
        elif type(embed).__name__ == "BlockEmbedding":
            total -= embed.weight_blocks().in_features * embed.blocks.shape[0]
        else:
            total -= embed.qweight.numel()
    return total


def _shares_bytes(a: nn.Module, b: nn.Module) -> bool:
    pa = {t.data_ptr() for t in _tensors(a)}
    return any(t.data_ptr() in pa for t in _tensors(b))


def decode_weight_bytes(model: nn.Module) -> int:
    """Bytes of weights one decode step reads: every layer, the final norm and the output
    head once, and one row of the token embedding (all of it when the head shares it)."""
    reads = _tensors(model.layers) + _tensors(model.norm) + _tensors(model.lm_head)
    total = sum(t.numel() * t.element_size() for t in _unique(reads))
    head = {t.data_ptr() for t in _tensors(model.lm_head)}
    for t in _tensors(model.embed_tokens):
        if t.data_ptr() not in head and t.dim() == 2:
            total += t.shape[1] * t.element_size()
    return total


def prefill_macs_per_token(model: nn.Module) -> int:
    """Weights of the linears a prompt token passes through (every `nn.Linear` and quantized
    linear but the vocabulary projection, which prefill runs on the last row only)."""
    total = 0
    for name, mod in model.named_modules():
        if name.split(".")[-1] == "lm_head":
            continue
        if isinstance(mod, nn.Linear) or type(mod).__name__ == "QuantizedLinear":
            total += int(mod.in_features) * int(mod.out_features)
    return total


def int8_peak(threads: int) -> float:
    """The host's int8 multiply-accumulate peak (G ops/s), or 0 where it cannot be measured
    (no LLVM code generation on this machine)."""
    try:
        from ...runtime.peak import int8_peak as measure

        return measure(threads)
    except (ImportError, RuntimeError, OSError) as e:
        log.warning("int8 peak not measured: %s", e)
        return 0.0


def read_bandwidth(threads: int, repeats: int = 3) -> float:
    """GB/s of a streaming read with ``threads`` threads, here and now: the higher of a numpy
    sum and a float32 sum compiled by TorchBurn, each over `BANDWIDTH_BYTES` (best of
    ``repeats``). A numpy sum alone underestimates what a tuned reader gets (one thread, and
    pairwise summation). The compiled sum is of `READ_ROWS` rows, a parallel loop over rows:
    a reduction to one scalar ran on one thread before the `split-reductions` pass (13.8 GB/s
    here, where two threads read 26.5), and rows keep the figure independent of that pass's
    thresholds."""
    import numpy as np

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(BANDWIDTH_BYTES // 4)
        arr = buf.numpy()
        from ...backend import torchburn_backend

        compiled = torch.compile(lambda t: t.view(READ_ROWS, -1).sum(1), backend=torchburn_backend,
                                 dynamic=False)
        best = float("inf")
        for run in (lambda: np.add.reduce(arr), lambda: compiled(buf)):
            run()
            for _ in range(repeats):
                t0 = time.perf_counter()
                run()
                best = min(best, time.perf_counter() - t0)
        return BANDWIDTH_BYTES / best / 1e9
    finally:
        torch.set_num_threads(before)


def run_benchmark(llm: Any, prompt_tokens: int = 512, gen_tokens: int = 128, repeats: int = 3,
                  threads: Optional[int] = None, load_s: float = 0.0, peers: Sequence[str] = (),
                  gguf: Optional[str] = None) -> BenchReport:
    """Time ``pp<prompt_tokens>`` and ``tg<gen_tokens>`` on a loaded `LLM` (greedy, EOS
    ignored so every run makes exactly the tokens asked). ``peers`` (names of `peers.PEER_MODULES`)
    run the same tests on the same ``gguf`` file, each in a process of its own, in the same
    rounds (ours, then each peer, every round), with the same thread count."""
    from ..runtime.engine import model_size_bytes

    greedy = SamplingParams(temperature=0.0)
    llm.eos_ids = frozenset()
    vocab = llm.config.vocab_size
    prompt = [(100 + i * 7919) % vocab for i in range(prompt_tokens)]
    if prompt_tokens + 1 > llm.max_context or gen_tokens + 1 > llm.max_context:
        raise ValueError(f"pp{prompt_tokens}/tg{gen_tokens} do not fit max_context={llm.max_context}")
    t0 = time.perf_counter()
    for _ in llm.generate_ids([prompt], 2, greedy):  # compiles the prefill buckets, decode
        pass
    for _ in llm.generate_ids([prompt[:1]], 2, greedy):
        pass
    warmup_s = time.perf_counter() - t0
    used = threads or torch.get_num_threads()
    contenders = []
    if peers:
        from .peers import PeerProcess

        if gguf is None:
            raise ValueError("peers run on a GGUF file: give --model a .gguf path")
        context = max(prompt_tokens, gen_tokens) + 16
        contenders = [PeerProcess(name, Path(gguf), used, context) for name in peers]
        for peer in contenders:  # warm-up
            peer.pp(prompt_tokens), peer.tg(4)
    peer_rows = {p.name: ([], []) for p in contenders}
    pp, ttft, tg = [], [], []
    for _ in range(max(1, repeats)):
        for peer in contenders:
            peer_rows[peer.name][0].append(prompt_tokens / peer.pp(prompt_tokens))
            peer_rows[peer.name][1].append(gen_tokens / peer.tg(gen_tokens))
        t0 = time.perf_counter()
        steps = llm.generate_ids([prompt], 1, greedy)
        next(steps)
        dt = time.perf_counter() - t0
        steps.close()
        ttft.append(dt)
        pp.append(prompt_tokens / dt)
        steps = llm.generate_ids([prompt[:1]], gen_tokens + 1, greedy)
        next(steps)  # the one-token prefill is not generation
        t0 = time.perf_counter()
        count = sum(1 for _ in steps)
        tg.append(count / (time.perf_counter() - t0))
    for peer in contenders:
        peer.close()
    c = llm.config
    engine = f"torchburn {llm.device}" + ("" if llm.compiled else " eager")
    return BenchReport(
        model=f"{llm.name} ({c.architecture}, {c.num_hidden_layers} layers)",
        size_bytes=model_size_bytes(llm.model), params=parameter_count(llm.model),
        quant=llm.quant or "as stored", engine=engine, threads=used,
        results=[TestResult(f"pp{prompt_tokens}", pp), TestResult(f"tg{gen_tokens}", tg)]
        + [TestResult(test, rows[i], name) for name, rows in peer_rows.items()
           for i, test in enumerate((f"pp{prompt_tokens}", f"tg{gen_tokens}"))],
        load_s=load_s, warmup_s=warmup_s, time_to_first_token_s=ttft,
        decode_weight_bytes=decode_weight_bytes(llm.model),
        read_bandwidth_gbs=read_bandwidth(used), prefill_macs_per_token=prefill_macs_per_token(llm.model),
        int8_peak_gops=int8_peak(used) if llm.device == "cpu" else 0.0)
