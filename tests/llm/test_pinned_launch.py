"""`pinned_launch.pin`: a launcher with some tensors pinned checks and addresses only the
others per call, gives the same results, and still sends a bad argument to PyTorch."""
from __future__ import annotations

import torch

from torchburn.backend import torchburn_backend
from torchburn.llm.runtime.pinned_launch import pin
from torchburn.llm.cli.profile import capture_launchers


def _launcher(x: torch.Tensor, w: torch.Tensor):  # type: ignore[no-untyped-def]
    torch._dynamo.reset()
    f = torch.compile(lambda x, w: torch.relu(x @ w) + 1.0, backend=torchburn_backend, dynamic=False)
    with torch.no_grad(), capture_launchers() as made:
        f(x, w)
    assert made, "the function compiled to one native launcher"
    return made[-1]


def test_pinned_launcher_matches_and_takes_only_the_rest() -> None:
    torch.manual_seed(0)
    x, w = torch.randn(3, 8), torch.randn(8, 4)
    launcher = _launcher(x, w)
    pinned = pin(launcher.launch, {1: w}, [x, w])
    assert pinned is not None
    assert pinned.__code__.co_argcount == 1
    for _ in range(3):
        x = torch.randn(3, 8)
        torch.testing.assert_close(pinned(x)[0], torch.relu(x @ w) + 1.0, rtol=1e-5, atol=1e-5)
    assert launcher.stats.eager_fallbacks == 0
    # the guards of what is not pinned stay: another shape runs in PyTorch, correctly
    x5 = torch.randn(5, 8)
    torch.testing.assert_close(pinned(x5)[0], torch.relu(x5 @ w) + 1.0, rtol=1e-5, atol=1e-5)
    assert launcher.stats.eager_fallbacks == 1


def test_pin_refuses_a_tensor_its_guard_rejects() -> None:
    x, w = torch.randn(3, 8), torch.randn(8, 4)
    launcher = _launcher(x, w)
    other = torch.randn(4, 8).t()  # the same shape, strides the program was not built for
    assert pin(launcher.launch, {1: other}, [x, other]) is None
    assert pin(launcher.launch, {1: w}, [x, w]) is not None


def test_llm_decode_step_runs_pinned(tiny_checkpoint) -> None:
    from torchburn.llm import LLM
    from torchburn.llm.runtime.sampling import SamplingParams

    _, folder = tiny_checkpoint("llama")
    rows = [[5, 17, 99, 250, 3, 41, 7]]
    eager = LLM.from_pretrained(folder, device="cpu", max_context=64, compile=False)
    llm = LLM.from_pretrained(folder, device="cpu", max_context=64)
    eager.eos_ids = llm.eos_ids = frozenset()
    greedy = SamplingParams(temperature=0.0)
    torch._dynamo.reset()
    got = [s[0] for s in llm.generate_ids(rows, 8, greedy)]
    assert got == [s[0] for s in eager.generate_ids(rows, 8, greedy)]
    assert llm.steps is not None
    steps = [s for s in llm.steps.entries.values() if s is not None]
    assert steps and all(s.pinned and s.pinned[0] is not None for s in steps)  # type: ignore[attr-defined]


def test_a_pinned_launchers_build_is_kept_on_disk_and_reused(monkeypatch, tmp_path) -> None:
    """What pinning makes from a launcher's source is stored once; a later process (here: the
    memo cleared) reads it back instead of rewriting the source, and the launcher it gives
    computes the same; a damaged record is built again."""
    from torchburn.llm.runtime import pinned_launch
    from torchburn.runtime.config import reload_config

    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path))
    reload_config()
    try:
        _build_kept_and_reused(pinned_launch, monkeypatch, tmp_path)
    finally:
        monkeypatch.undo()
        reload_config()


def _build_kept_and_reused(pinned_launch, monkeypatch, tmp_path) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    x, w = torch.randn(3, 8), torch.randn(8, 4)
    launcher = _launcher(x, w)
    monkeypatch.setattr(pinned_launch, "_BUILDS", {})
    built: list[int] = []
    real_build = pinned_launch._build
    monkeypatch.setattr(pinned_launch, "_build", lambda *a: built.append(1) or real_build(*a))
    assert pin(launcher.launch, {1: w}, [x, w]) is not None and built == [1]
    records = list(tmp_path.rglob("pn*.tbfx"))
    assert len(records) == 1
    monkeypatch.setattr(pinned_launch, "_BUILDS", {})
    w2 = torch.randn(8, 4)  # another tensor of the same layout: its own address is filled in
    again = pin(launcher.launch, {1: w2}, [x, w2])
    assert again is not None and built == [1]  # read back, not rebuilt
    torch.testing.assert_close(again(x)[0], torch.relu(x @ w2) + 1.0, rtol=1e-5, atol=1e-5)
    records[0].write_bytes(records[0].read_bytes()[:-7] + b"garbage")
    monkeypatch.setattr(pinned_launch, "_BUILDS", {})
    assert pin(launcher.launch, {1: w}, [x, w]) is not None and built == [1, 1]
