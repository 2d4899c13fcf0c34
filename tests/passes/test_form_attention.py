"""`form-attention` (`passes/tensor/form_attention.py`): hand-written `softmax(q @ k^T * c + m) @ v`
becomes the one `attention` op, with the numbers eager computes, and is left alone where the
rewrite would change what the graph returns."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch

from torchburn.backend.entry import torchburn_backend
from torchburn.compiler import driver
from torchburn.ir.parser import parse_graph
from torchburn.ir.printer import print_ir
from torchburn.ir.verifier import verify
from torchburn.passes.tensor import form_attention
from torchburn.passes.tensor.form_attention import FormAttention
from torchburn.runtime import config


def _docstring_graph(part: str) -> str:
    doc = form_attention.__doc__ or ""
    text = doc.split("Before:\n\n")[1].split("\n\nAfter")[0] if part == "before" else doc.split("After:\n\n")[1]
    lines = [line[4:] for line in text.splitlines()]
    return "\n".join(lines[:lines.index("}") + 1])


def test_docstring_example() -> None:
    g = FormAttention().run(parse_graph(_docstring_graph("before")))
    verify(g)
    assert print_ir(g).strip() == _docstring_graph("after").strip()


@pytest.fixture()
def stages(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[], str]]:
    """The tensor IR after `form-attention` of everything compiled in the test."""
    root = tmp_path / "dump"
    monkeypatch.setenv("TORCHBURN_DUMP", str(root))
    config.reload_config()
    driver.memory_cache().clear()
    torch._dynamo.reset()

    def read() -> str:
        return "\n".join(p.read_text() for p in sorted(root.glob("*/*_after_form-attention.tbir")))

    yield read
    monkeypatch.undo()
    config.reload_config()
    driver.memory_cache().clear()
    torch._dynamo.reset()


def _run(fn: Callable[..., torch.Tensor], *args: torch.Tensor) -> None:
    compiled = torch.compile(fn, backend=torchburn_backend, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), fn(*args), rtol=1e-5, atol=1e-5)


def _qkv(*shape: int, heads_kv: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    kv = list(shape)
    if heads_kv is not None:
        kv[-3] = heads_kv
    return torch.randn(*shape), torch.randn(*kv), torch.randn(*kv)


def div_by_root_d_plus_mask(q, k, v, m):  # type: ignore[no-untyped-def]
    s = torch.matmul(q, k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    return torch.matmul(torch.softmax(s + m, dim=-1), v)


def mask_first_times_scale(q, k, v, m):  # type: ignore[no-untyped-def]
    s = m + (q @ k.transpose(2, 3)) * 0.3
    return torch.softmax(s, dim=-1) @ v


def test_masked_attention_becomes_one_op(stages: Callable[[], str]) -> None:
    q, k, v = _qkv(2, 4, 13, 8)
    m = torch.randn(2, 1, 13, 13)
    for fn in (div_by_root_d_plus_mask, mask_first_times_scale):
        _run(fn, q, k, v, m)
    text = stages()
    assert text.count("attention(") == 2 and "masked = true" in text and "reduce_max" not in text
    assert "scale = 0.3" in text and f"scale = {1 / math.sqrt(8)}" in text


def test_unscaled_and_three_dim_attention(stages: Callable[[], str]) -> None:
    def plain(q, k, v):  # type: ignore[no-untyped-def]
        return torch.softmax(torch.bmm(q, k.transpose(1, 2)), dim=-1) @ v

    q, k, v = _qkv(6, 9, 5)
    v = torch.randn(6, 9, 7)  # a value dim other than the key dim
    _run(plain, q, k, v)
    text = stages()
    assert "attention(" in text and "scale = 1.0" in text and "masked = false" in text


def test_causal_mask_with_minus_inf(stages: Callable[[], str]) -> None:
    t = 11
    causal = torch.full((t, t), float("-inf")).triu(1).view(1, 1, t, t)
    q, k, v = _qkv(1, 2, t, 16)
    _run(div_by_root_d_plus_mask, q, k, v, causal)
    assert "attention(" in stages()


def test_grouped_query_heads_read_the_unrepeated_keys(stages: Callable[[], str]) -> None:
    def repeat_kv(x: torch.Tensor, n: int) -> torch.Tensor:
        b, h, t, d = x.shape
        return x[:, :, None, :, :].expand(b, h, n, t, d).reshape(b, h * n, t, d)

    def gqa(q, k, v):  # type: ignore[no-untyped-def]
        k, v = repeat_kv(k, 3), repeat_kv(v, 3)
        return torch.softmax(q @ k.transpose(-2, -1) * 0.25, dim=-1) @ v

    q, k, v = _qkv(2, 6, 10, 8, heads_kv=2)
    _run(gqa, q, k, v)
    text = stages()
    (line,) = [ln for ln in text.splitlines() if "attention(" in ln]
    assert "expand" not in text and "attention(" in line


def test_transformers_eager_attention_becomes_the_op(stages: Callable[[], str]) -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 100, (2, 12))

    def logits(i: torch.Tensor) -> torch.Tensor:
        return model(input_ids=i, use_cache=False).logits

    _run(logits, ids)
    text = stages()
    assert text.count("= attention(") == 2 and "masked = true" in text


def test_returned_probabilities_are_kept(stages: Callable[[], str]) -> None:
    def with_probs(q, k, v):  # type: ignore[no-untyped-def]
        p = torch.softmax(q @ k.transpose(-2, -1), dim=-1)
        return p @ v, p

    q, k, v = _qkv(1, 2, 6, 4)
    compiled = torch.compile(with_probs, backend=torchburn_backend, dynamic=False)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v), with_probs(q, k, v))
    assert "attention(" not in stages()


def test_softmax_over_another_dim_is_not_attention(stages: Callable[[], str]) -> None:
    def cols(q, k, v):  # type: ignore[no-untyped-def]
        return torch.softmax(q @ k.transpose(-2, -1), dim=-2) @ v

    _run(cols, *_qkv(1, 2, 6, 4))
    assert "attention(" not in stages()


def test_training_keeps_the_chain_and_its_gradients(stages: Callable[[], str]) -> None:
    q, k, v = (t.requires_grad_() for t in _qkv(1, 2, 7, 4))
    ref = [t.detach().clone().requires_grad_() for t in (q, k, v)]

    def f(q, k, v):  # type: ignore[no-untyped-def]
        return (torch.softmax(q @ k.transpose(-2, -1) * 0.5, dim=-1) @ v).square().sum()

    torch.compile(f, backend=torchburn_backend, dynamic=False)(q, k, v).backward()
    f(*ref).backward()
    for got, want in zip((q, k, v), ref):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-5)
    assert "= attention(" not in stages()  # the forward saves the probabilities for the backward
