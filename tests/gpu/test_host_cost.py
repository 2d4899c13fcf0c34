"""The host side of a GPU run (`runtime/gpu.py`): a warm run creates no wgpu object. Buffers,
bind groups and the staging buffers are kept across calls and symbol values (buffers sized by a
symbol grow to powers of two), so a decode step whose length grows by one costs writes, one
encoder and one submission, counted by `runtime/gpu_calls.py`."""
from __future__ import annotations

import torch

from torchburn.backend import gpu_launcher as gl
from torchburn.runtime.gpu_calls import count_calls

CREATORS = ("create_buffer", "create_bind_group", "create_compute_pipeline", "create_shader_module",
            "create_bind_group_layout")


def _created(calls) -> dict[str, int]:  # type: ignore[no-untyped-def]
    return {k: calls[k] for k in CREATORS if calls[k]}


def test_a_growing_length_reuses_buffers_and_bind_groups(gpu) -> None:  # type: ignore[no-untyped-def]
    """A dynamic length: after a call at the longest length, shorter and equal lengths run on
    the same buffers and bind groups (one submission each), with eager's results."""
    def f(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * w, dim=-1) + 1.0

    torch._dynamo.reset()
    fast = torch.compile(f, backend="torchburn", dynamic=True)
    w = torch.tensor(3.0)
    with torch.no_grad():
        fast(torch.randn(2, 100), w)  # the longest length: buffers sized for it
        fast(torch.randn(2, 7), w)  # compiles the dynamic graph (Dynamo specialises sizes first)
        fast(torch.randn(2, 100), w)
        launcher = gl.recent_launchers()[-1]
        before = launcher.calls
        with count_calls() as calls:
            for n in range(40, 101, 3):
                x = torch.randn(2, n)
                torch.testing.assert_close(fast(x, w), f(x, w))
        runs = launcher.calls - before
    assert runs == len(range(40, 101, 3)), "the dynamic graph did not run on the GPU engine"
    assert _created(calls) == {}, dict(calls)
    assert calls["create_command_encoder"] >= runs and calls["dispatch_workgroups"] >= runs


def test_growth_past_the_largest_length_reallocates_log2_times(gpu) -> None:  # type: ignore[no-untyped-def]
    """Lengths growing one at a time make new buffers only at powers of two."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.exp(x) * 2.0

    torch._dynamo.reset()
    fast = torch.compile(f, backend="torchburn", dynamic=True)
    with torch.no_grad():
        fast(torch.randn(5))
        fast(torch.randn(6))
        with count_calls() as calls:
            for n in range(7, 300):
                x = torch.randn(n)
                torch.testing.assert_close(fast(x), f(x))
    # 28 to 1196 bytes: the input's resident copy, the output and the two staging buffers (used
    # in turn, `GpuProgram._stagings`) each grow through at most 7 powers of two (32 ... 2048)
    # in 293 calls
    assert calls["create_buffer"] <= 4 * 7, dict(calls)
    assert calls["create_bind_group"] <= 2 * 7, dict(calls)


def test_a_warm_decode_step_creates_no_wgpu_object(gpu, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """LLM greedy decode on the GPU engine: after a warm-up that reached the same lengths, each
    decode step writes its position, slot and symbols, encodes every kernel once and submits
    once, its token fed to the next step on the device (`LLM._decode_greedy`); it creates no
    buffer, bind group or pipeline (the step's tensors are the same every step, written in
    place), and gives the warm-up's tokens."""
    import transformers

    from tests.llm.conftest import hf_config, tiny_tokenizer
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams

    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(hf_config("llama")).eval().save_pretrained(
        tmp_path, safe_serialization=True)
    tiny_tokenizer(tmp_path)
    torch._dynamo.reset()
    llm = LLM.from_pretrained(tmp_path, device="gpu", max_context=32)
    llm.eos_ids = frozenset()
    greedy = SamplingParams(temperature=0.0)
    prompt = [[5, 17, 99]]
    # two warm-ups: the first compiles the steps (its first decode step runs through Dynamo and
    # again as the step cache's check, with tensors of their own)
    warm = [s[0] for s in llm.generate_ids(prompt, 7, greedy)]
    assert [s[0] for s in llm.generate_ids(prompt, 7, greedy)] == warm
    decode = gl.recent_launchers()[-1]
    calls_before, dispatches_before, fed_before = decode.calls, decode.gpu.dispatches, decode.fed_calls
    ahead_before = decode.gpu.ahead_runs
    with count_calls() as calls:  # the whole generation, its prefill included
        tokens = [s[0] for s in llm.generate_ids(prompt, 7, greedy)]
    n = decode.calls - calls_before
    assert n == 6 and decode.eager_fallbacks == 0 and decode.fed_calls - fed_before == n
    assert tokens == warm
    assert _created(calls) == {}, dict(calls)
    # one compute pass of every kernel call per step, then copies of the token into the staging
    # buffer and into the next step's ids, and of the fault flag (the embedding checks its ids);
    # each step's commands encoded once, from the third on while the step before ran
    # (`GpuProgram.encode_ahead`), and the last step encodes one for a next step that does not
    # come. The prefill adds its own run (a pass, two copies, a map).
    assert decode.gpu.fault is not None
    ahead = decode.gpu.ahead_runs - ahead_before
    assert ahead >= n - 2
    submitted = decode.gpu.dispatches - dispatches_before
    assert submitted % n == 0 and submitted <= n * len(decode.program.calls)
    passes = calls["begin_compute_pass"]
    assert passes <= 2 * n - ahead + 1 + 2, dict(calls)
    assert calls["map_sync"] == n + 1 and calls["submit"] <= 2 * (n + 1), dict(calls)
    # per step the position, the slot and the symbols (the ids are fed on the device); the
    # prefill's token ids, positions, slots and symbols, and the first step's ids
    assert calls["write_buffer"] <= 3 * n + 6, dict(calls)


def test_a_pool_full_of_other_sizes_does_not_stop_reuse(gpu) -> None:  # type: ignore[no-untyped-def]
    """Freed small buffers are pooled most recent first: after another workload filled the pool
    with buffers of its own size, a growing length still reuses its own buffers (the oldest
    pooled ones make room) instead of making new ones every call."""
    from torchburn.backend import gpu_resident

    def g(x: torch.Tensor) -> torch.Tensor:
        return x + 1.0

    torch._dynamo.reset()
    other = torch.compile(g, backend="torchburn", dynamic=True)
    with torch.no_grad():
        alive = [torch.randn(9000 + n) for n in range(2 * gpu_resident._FREE_KEPT)]
        for t in alive:
            other(t)
        del alive
        other(torch.randn(9000))  # a new entry: the expired ones go to the pool
    assert sum(len(p) for p in gpu_resident._free.values()) >= gpu_resident._FREE_KEPT - 1  # one taken again
    test_growth_past_the_largest_length_reallocates_log2_times(gpu)
