"""The model suite (`tests/models/zoo.py`) through the backend against eager, with nothing in
PyTorch outside `NOT_COMPILED`: in `eval` under `no_grad`, in `eval` with grad (outputs and
gradients), a training step (`train()`, loss.backward, every parameter's gradient), with and
without attention masks, a KV cache (`use_cache=True`, `DynamicCache`) through prefill and
decode steps, two batch sizes and a dynamic sequence length.

Every model runs in the default run in at least one mode; compiling a model costs seconds,
so the other combinations run with `TORCHBURN_MODELS_FULL=1`.

Tolerances: compiled and eager code sum in different orders (blocked GEMMs, split
reductions); these models are two layers deep, in float32. Outputs agree to ~1e-6 absolute
(logits of size ~1); gradients are compared relative to their largest entry, since a
gradient of 1e-9 entries is rounding noise on both sides.

The default run (13 tests) took 174 CPU-seconds (user time; 19 minutes of wall time on a
2-core machine at load 8-13, shared with other work); `TORCHBURN_MODELS_FULL=1` runs all 53.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Callable

import pytest
import torch
import torch.nn as nn

from torchburn.backend import report as rep
from torchburn.frontend.partition import is_deliberate
from tests.models import zoo

FULL = os.environ.get("TORCHBURN_MODELS_FULL", "") == "1"
full_only = pytest.mark.skipif(not FULL, reason="costly combination: TORCHBURN_MODELS_FULL=1 runs it")

OUT_TOL = dict(rtol=1e-4, atol=2e-5)
#: Gradients: relative to the largest entry of each gradient (see the module docstring).
GRAD_REL = 2e-4

ALL = list(zoo.CASES)
HF = list(zoo.TRANSFORMERS)
LOCAL = [n for n in ALL if n not in HF]
DECODERS = [n for n in HF if zoo.CASES[n].kv_cache]


def cases(names: list[str], default: set[str]) -> list[Any]:
    """`names` as parameters; those not in `default` only run with TORCHBURN_MODELS_FULL=1."""
    return [pytest.param(n, marks=() if n in default else full_only) for n in names]


def assert_compiled_whole(records: list[rep.GraphReport]) -> None:
    """Every subgraph compiled; nothing in PyTorch but what `NOT_COMPILED` keeps there."""
    assert records, "no graph reached the backend"
    uncompiled = [(s.name, s.reason) for r in records for s in r.subgraphs if not s.compiled]
    assert not uncompiled, f"subgraphs left to PyTorch: {uncompiled}"
    stray = [(op, why) for r in records for op, why in r.fallbacks if not is_deliberate(op, why)]
    assert not stray, f"ops in PyTorch outside NOT_COMPILED: {stray}"
    assert any(s.compiled for r in records for s in r.subgraphs), "no subgraph was compiled"


def compiled(model: nn.Module, dynamic: Any = None) -> Callable[..., Any]:
    torch._dynamo.reset()
    return torch.compile(model, backend="torchburn", dynamic=dynamic)


def recording(fn: Callable[[], Any]) -> tuple[Any, list[rep.GraphReport]]:
    records = rep.start_recording()
    try:
        out = fn()
    finally:
        rep.stop_recording()
    return out, list(records)


def projection(out: torch.Tensor) -> torch.Tensor:
    """A fixed random direction to take the loss along: `(out * w).sum()` has gradients of
    size ~1 everywhere (a loss like `out.pow(2).mean()` of a layer-normalized output is
    constant, and its gradients are rounding noise)."""
    return torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)


def assert_grads_close(model: nn.Module, eager: nn.Module) -> None:
    """Every parameter's gradient equals eager's, up to GRAD_REL of the largest gradient entry
    of the model (a gradient that is zero in exact arithmetic, such as an attention key's
    bias, is rounding noise of different sizes on both sides)."""
    pairs = list(zip(model.named_parameters(), eager.parameters()))
    scale = max(q.grad.abs().max().item() for _, q in pairs if q.grad is not None)
    checked = 0
    for (name, p), q in pairs:
        if q.grad is None:  # not on the loss's path: the compiled graph may still hand zeros
            assert p.grad is None or not p.grad.any(), f"{name}: gradient where eager has none"
            continue
        assert p.grad is not None, f"{name}: no gradient"
        torch.testing.assert_close(p.grad, q.grad, rtol=GRAD_REL, atol=GRAD_REL * scale,
                                   msg=lambda m: f"{name}: {m}")
        checked += 1
    assert checked, "no parameter got a gradient"


def run_eval_no_grad(name: str, mask: bool) -> None:
    case = zoo.CASES[name]
    eager = zoo.build(name)
    batch, seq = case.shape
    kw = case.inputs(eager, batch, seq, mask)
    f = compiled(eager)
    with torch.no_grad():
        out, records = recording(lambda: case.pick(f(**kw)))
        torch.testing.assert_close(out, case.pick(eager(**kw)), **OUT_TOL)
    assert {r.kind for r in records} == {"forward"}
    assert_compiled_whole(records)


def run_with_grad(name: str, train: bool, mask: bool) -> None:
    case = zoo.CASES[name]
    eager = zoo.build(name).train(train)
    model = copy.deepcopy(eager)
    batch, seq = case.shape
    kw = case.inputs(eager, batch, seq, mask)
    f = compiled(model)

    def step() -> torch.Tensor:
        out = case.pick(f(**kw))
        (out * projection(out)).sum().backward()
        return out

    out, records = recording(step)
    expected = case.pick(eager(**kw))
    (expected * projection(expected)).sum().backward()
    torch.testing.assert_close(out, expected, **OUT_TOL)
    assert_grads_close(model, eager)
    for (bname, b), ref in zip(model.named_buffers(), eager.buffers()):  # batch norm's running stats
        torch.testing.assert_close(b, ref, **OUT_TOL, msg=lambda m: f"{bname}: {m}")
    assert {r.kind for r in records} >= {"forward", "backward"}
    assert_compiled_whole(records)


@pytest.mark.parametrize("name", cases(ALL, default={"llama", "qwen3", "mistral", "gpt2", "t5", "resnet18", "vit"}))
def test_eval_no_grad(name: str) -> None:
    run_eval_no_grad(name, mask=zoo.CASES[name].sequence and name != "audio1d")


@pytest.mark.parametrize("name", cases([n for n in HF if n != "t5"], default={"qwen2"}) + [
    pytest.param("t5", marks=full_only)])
def test_eval_no_grad_without_mask(name: str) -> None:
    run_eval_no_grad(name, mask=False)


@pytest.mark.parametrize("name", cases(ALL, default={"bert"}))
def test_eval_with_grad(name: str) -> None:
    run_with_grad(name, train=False, mask=zoo.CASES[name].sequence and name != "audio1d")


@pytest.mark.parametrize("name", cases(ALL, default={"mobilenetv3", "audio1d", "qwen2"}))
def test_training_step(name: str) -> None:
    run_with_grad(name, train=True, mask=False)


@pytest.mark.parametrize("name", cases(DECODERS, default=set()))
def test_kv_cache_prefill_and_decode(name: str) -> None:
    """Prefill 6 tokens, then decode 3 one at a time through the cache; each step's logits
    and the cache's keys and values equal eager's."""
    eager = zoo.build(name)
    ids = torch.randint(0, zoo.VOCAB, (2, 9), generator=torch.Generator().manual_seed(5))

    def generate(m: Callable[..., Any]) -> tuple[list[torch.Tensor], Any]:
        out = m(input_ids=ids[:, :6], use_cache=True)
        logits, past = [out.logits], out.past_key_values
        for t in range(6, 9):
            out = m(input_ids=ids[:, t:t + 1], past_key_values=past, use_cache=True)
            logits.append(out.logits)
            past = out.past_key_values
        return logits, past

    f = compiled(eager)
    with torch.no_grad():
        (got, cache), records = recording(lambda: generate(f))
        expected, ref_cache = generate(eager)
    for step, (a, b) in enumerate(zip(got, expected)):
        torch.testing.assert_close(a, b, **OUT_TOL, msg=lambda m: f"step {step}: {m}")
    for layer, (a, b) in enumerate(zip(cache.layers, ref_cache.layers)):
        torch.testing.assert_close(a.keys, b.keys, **OUT_TOL, msg=lambda m: f"layer {layer} keys: {m}")
        torch.testing.assert_close(a.values, b.values, **OUT_TOL, msg=lambda m: f"layer {layer} values: {m}")
    assert_compiled_whole(records)


@pytest.mark.parametrize("name", cases([n for n in ALL if zoo.CASES[n].sequence], default={"llama"}))
def test_two_batch_sizes_and_dynamic_sequence(name: str) -> None:
    """One compilation with dynamic shapes serves batch 2 and 3 and three sequence lengths."""
    case = zoo.CASES[name]
    eager = zoo.build(name)
    batch, seq = case.shape
    f = compiled(eager, dynamic=True)
    shapes = [(batch, seq), (batch + 1, seq), (batch, seq + 8), (batch + 1, seq - 4)]
    with torch.no_grad():
        def run_all() -> list[tuple[torch.Tensor, torch.Tensor]]:
            pairs = []
            for b, s in shapes:
                kw = case.inputs(eager, b, s, name != "audio1d")
                pairs.append((case.pick(f(**kw)), case.pick(eager(**kw))))
            return pairs

        pairs, records = recording(run_all)
    for (b, s), (got, expected) in zip(shapes, pairs):
        torch.testing.assert_close(got, expected, **OUT_TOL, msg=lambda m: f"batch {b}, length {s}: {m}")
    assert len([r for r in records if r.kind == "forward"]) <= 2, "dynamic shapes should not recompile per shape"
    assert_compiled_whole(records)


def test_decoder_attention_is_one_kernel_per_layer() -> None:
    """transformers' Llama (sdpa attention, padding mask) compiles each layer's attention to one
    `attention` kernel: no softmax or score-matrix kernels (the LLM engine's decode step counts
the calls, `tests/llm/test_model.py`)."""
    case = zoo.CASES["llama"]
    torch.manual_seed(0)
    model = case.build()
    inputs = case.inputs(model, 2, 12, True)
    with torch.no_grad():
        expected = case.pick(model(**inputs))
        out, records = recording(lambda: case.pick(compiled(model)(**inputs)))
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    assert_compiled_whole(records)
    kernels = [k for r in records for s in r.subgraphs for k in s.kernels]
    # the layers' kernels are the same kernel (`dedup-kernels`), called once per layer
    assert any("torchburn.attention" in k for k in kernels), kernels
    assert not [k for k in kernels if "softmax" in k or "aten.amax" in k], kernels
