"""Convolutions the tuner gives to ATen (`torchburn/backend/library_calls.py`), and the graph cut
around them (`frontend/partition.layered_partition`).

Which candidate wins is forced by slowing the other one down inside its runner (a real
measurement, on a known margin), so the tests do not depend on the machine's load; torch runs
one thread meanwhile (on a loaded machine a 2-thread OpenMP region of ATen's can wait tens of
milliseconds for its second thread, more than the margin)."""
from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import torch
import torch.nn as nn

import torchburn
from torchburn.backend import library_calls
from torchburn.backend import report as rep
from torchburn.runtime.config import reload_config
from torchburn.runtime.tuner import records


class ResidualConvs(nn.Module):
    """conv -> BN -> ReLU -> conv (+ x) -> ReLU: a library call on each convolution cuts the
    graph into layers, and the residual reaches across both."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(16)
        self.c2 = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c2(torch.relu(self.bn(self.c1(x)))) + x)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tuning(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The tuner in search mode, fresh records, and no minimum size for a measured convolution."""
    monkeypatch.setenv("TORCHBURN_TUNE", "search")
    monkeypatch.setattr(library_calls, "MIN_MACS", 0)
    records().clear()
    reload_config()
    torch._dynamo.reset()
    yield
    records().clear()
    monkeypatch.undo()
    reload_config()
    torch._dynamo.reset()


def slow_down(monkeypatch: pytest.MonkeyPatch, loser: str, seconds: float = 0.02) -> list[str]:
    """Every runner of candidate `loser` (names separated by commas) spends `seconds` more of
    CPU time; returns the names prepared."""
    losers = loser.split(",")
    prepared: list[str] = []
    original = library_calls.candidates

    def candidates(*args: Any, **kwargs: Any) -> list[Any]:
        out = []
        for c in original(*args, **kwargs):
            def prepare(c: Any = c) -> Any:
                prepared.append(c.name)
                run = c.prepare()
                if c.name not in losers:
                    return run

                def slow() -> Any:
                    # busy: the tuner times one thread's rounds in CPU time, where a sleep is free
                    end = time.process_time() + seconds
                    while time.process_time() < end:
                        pass
                    return run()
                return slow
            out.append(type(c)(c.name, c.kind, prepare, c.default, c.overhead_s))
        return out
    monkeypatch.setattr(library_calls, "candidates", candidates)
    return prepared


def _train_step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    out = model(x)
    out.square().sum().backward()
    return out, [p.grad for p in model.parameters()]


def test_library_calls_chosen_run_between_our_subgraphs(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = slow_down(monkeypatch, loser="ours")
    eager = ResidualConvs().train()
    model = copy.deepcopy(eager)
    x = torch.randn(2, 16, 12, 12)
    reports = rep.start_recording()
    try:
        got, got_grads = _train_step(torch.compile(model, backend="torchburn"), x)
    finally:
        rep.stop_recording()
    want, want_grads = _train_step(eager, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
    forward, backward = reports
    assert [op for op, _ in forward.library_calls] == ["aten.convolution.default"] * 2
    assert [op for op, _ in backward.library_calls] == ["aten.convolution_backward.default"] * 2
    assert all("aten (measured" in why for _, why in forward.library_calls + backward.library_calls)
    # the graph runs as our subgraphs between the library calls (BN and the ReLUs compiled)
    assert len(forward.subgraphs) >= 2 and all(s.compiled for s in forward.subgraphs)
    assert not forward.fallbacks and not backward.fallbacks
    assert {"ours", "aten"} <= set(prepared)


def test_our_kernels_stay_when_they_win(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_down(monkeypatch, loser="aten")
    model = ResidualConvs().eval()
    x = torch.randn(2, 16, 12, 12)
    report = torchburn.explain(model, x)
    (graph,) = report.graphs
    assert not graph.library_calls and len(graph.subgraphs) == 1
    assert len(graph.tuning) == 2 and all(": ours (measured: ours" in t for t in graph.tuning)
    text = str(report)
    assert "tuner (2 choice(s)" in text and "x the next" in text


def test_explain_names_the_library_calls(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    slow_down(monkeypatch, loser="ours")
    text = str(torchburn.explain(ResidualConvs().eval(), torch.randn(2, 16, 12, 12)))
    assert "library call aten.convolution.default (chosen by the tuner): convolution f32[2,16,12,12] * " \
           "f32[16,16,3,3] stride [1, 1] pad [1, 1]: aten (measured" in text
    assert "fallback" not in text


def test_off_mode_measures_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(library_calls, "MIN_MACS", 0)
    prepared = slow_down(monkeypatch, loser="ours")
    report = torchburn.explain(ResidualConvs().eval(), torch.randn(2, 16, 12, 12))
    (graph,) = report.graphs
    assert prepared == [] and not graph.tuning and not graph.library_calls


def test_cached_mode_applies_a_search_made_earlier(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = slow_down(monkeypatch, loser="ours")
    model = ResidualConvs().eval()
    x = torch.randn(2, 16, 12, 12)
    with torch.no_grad():  # the workload names the weights as constants in inference: as below
        torchburn.explain(model, x)
    prepared.clear()
    with torch.no_grad():
        fast = torch.compile(model, backend="torchburn", options={"tune": "cached"})
        reports = rep.start_recording()
        try:
            got = fast(x)
        finally:
            rep.stop_recording()
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    assert prepared == []
    assert [why.rsplit("(", 1)[1][:6] for _, why in reports[0].library_calls] == ["record"] * 2


def test_small_convolutions_are_not_measured(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_TUNE", "search")
    reload_config()
    try:
        prepared = slow_down(monkeypatch, loser="ours")
        (graph,) = torchburn.explain(ResidualConvs().eval(), torch.randn(1, 16, 4, 4)).graphs
        assert prepared == [] and not graph.tuning
    finally:
        monkeypatch.undo()
        reload_config()


def test_the_graph_cache_replays_library_calls(tuning: None, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from torchburn.compiler.driver import memory_cache

    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path))
    reload_config()
    memory_cache().clear()  # programs compiled by earlier tests would not be written to disk
    prepared = slow_down(monkeypatch, loser="ours")
    model = ResidualConvs().eval()
    x = torch.randn(2, 16, 12, 12)
    first = torchburn.explain(model, x).graphs[0]
    assert len(first.library_calls) == 2 and not first.graph_cache_hit
    prepared.clear()
    again = torchburn.explain(model, x).graphs[0]
    assert again.graph_cache_hit and again.library_calls == first.library_calls and prepared == []
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="torchburn")(x), model(x), rtol=1e-4, atol=1e-4)


class SmallImageConvs(nn.Module):
    """A 1x1 strided convolution and a dilated 3x3 one on a 6x6 image: the GEMM form's cases."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(8, 16, 1, stride=2)
        self.c2 = nn.Conv2d(16, 12, 3, padding=2, dilation=2, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.c2(torch.relu(self.c1(x))))


def test_the_gemm_form_when_it_wins(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = slow_down(monkeypatch, loser="ours,aten")
    model = SmallImageConvs().eval()
    x = torch.randn(3, 8, 12, 12)
    with torch.no_grad():
        reports = rep.start_recording()
        try:
            got = torch.compile(model, backend="torchburn")(x)
        finally:
            rep.stop_recording()
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    (graph,) = reports
    assert [t.split(": ")[1].split(" (")[0] for t in graph.tuning] == ["ours-gemm", "ours-gemm"]
    assert not graph.library_calls and "ours-gemm" in prepared
    # both convolutions became matrix products (no direct convolution kernel is left)
    assert len(graph.subgraphs) == 1


def test_the_gemm_form_is_not_proposed_for_large_images(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    prepared = slow_down(monkeypatch, loser="ours")
    torchburn.explain(ResidualConvs().eval(), torch.randn(2, 16, 12, 12))
    assert "ours-gemm" not in prepared and "ours" in prepared


def test_the_gemm_form_is_not_proposed_where_ours_is_a_product(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """An unpadded 1x1 convolution with 24 input and 16 output channels and more is a packed
    product in our own kernel (`loopgen/conv_pointwise.py`): im2col and our GEMM would compute the same product
    without its epilogue, so it is not compiled and measured (a 6x6 image would otherwise
    qualify by its 36 positions)."""
    prepared = slow_down(monkeypatch, loser="ours")
    model = nn.Sequential(nn.Conv2d(256, 256, 1, stride=2), nn.ReLU()).eval()
    torchburn.explain(model, torch.randn(2, 256, 12, 12))
    assert "ours-gemm" not in prepared and "ours" in prepared


@pytest.mark.parametrize("options, message", [({"tune": "fast"}, "option tune='fast'"),
                                              ({"tune_budget_s": -1}, "tune_budget_s=-1"),
                                              ({"tune_budget_s": "10"}, "tune_budget_s='10'")])
def test_bad_tune_options_are_refused(options: dict[str, Any], message: str) -> None:
    from torch._dynamo.exc import BackendCompilerFailed

    with pytest.raises(BackendCompilerFailed, match=message):  # Dynamo wraps the backend's ValueError
        torch.compile(nn.Linear(2, 2), backend="torchburn", options=options)(torch.randn(1, 2))


def test_a_library_call_is_charged_for_the_cut() -> None:
    """The `aten` candidate's overhead: the fixed cost and its result's bytes, written and read back."""
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x, w: torch.ops.aten.convolution(x, w, None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1),
                 tracing_mode="fake")(torch.randn(2, 16, 12, 12), torch.randn(8, 16, 3, 3))
    (node,) = [n for n in gm.graph.nodes if n.target is torch.ops.aten.convolution.default]
    expected = library_calls.CUT_FIXED_S + library_calls.CUT_SECONDS_PER_BYTE * 2 * 8 * 12 * 12 * 4
    assert library_calls.cut_overhead(node) == pytest.approx(expected)
    (aten_candidate,) = [c for c in library_calls.candidates(node, torch.Generator(), lambda g: None)
                         if c.name == "aten"]
    assert aten_candidate.overhead_s == pytest.approx(expected) and aten_candidate.kind == "library"


class TwoSizes(nn.Module):
    """A small 3x3 convolution (16 channels at 12x12), then a large one (64 channels at
    56x56, 115M multiply-adds)."""

    def __init__(self) -> None:
        super().__init__()
        self.small = nn.Conv2d(16, 16, 3, padding=1, bias=False)
        self.large = nn.Conv2d(16, 64, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.small(x).sum() + self.large(y).sum()


def _tuning_lines(model: nn.Module, *args: torch.Tensor) -> list[str]:
    with torch.no_grad():
        (graph,) = torchburn.explain(model, *args).graphs
    return list(graph.tuning)


def test_the_largest_convolution_is_measured_first(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The budget goes to the convolutions that cost the most, whatever their order in the graph."""
    slow_down(monkeypatch, loser="aten")
    lines = _tuning_lines(TwoSizes().eval(), torch.randn(1, 16, 12, 12), torch.randn(1, 16, 56, 56))
    assert [line.split(" * ")[0] for line in lines] == ["convolution f32[1,16,56,56]", "convolution f32[1,16,12,12]"]


def test_a_spent_budget_keeps_our_kernel(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no budget, nothing is measured and every convolution, the large one too, stays
    ours: no library call is taken on a guess."""
    monkeypatch.setenv("TORCHBURN_TUNE_BUDGET", "0")
    reload_config()
    prepared = slow_down(monkeypatch, loser="ours")
    model = TwoSizes().eval()
    with torch.no_grad():
        (graph,) = torchburn.explain(model, torch.randn(1, 16, 12, 12), torch.randn(1, 16, 56, 56)).graphs
    assert prepared == [] and not graph.library_calls
    assert [line.rsplit(" ", 2)[1:] for line in graph.tuning] == [["ours", "(budget)"]] * 2


def test_grouped_convolutions_are_not_given_to_the_library(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A depthwise forward convolution has no library candidate (`library_ruled_out`): with
    only ours left, nothing is compiled or measured, even where ATen would be faster."""
    prepared = slow_down(monkeypatch, loser="ours")
    model = nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU()).eval()
    x = torch.randn(1, 32, 24, 24)
    assert _tuning_lines(model, x) == [] and prepared == []
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model, backend="torchburn")(x), model(x), rtol=1e-4, atol=1e-4)


def test_subgraphs_between_library_calls_are_compiled_for_their_inputs_real_strides(
        tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """A subgraph after a library call is compiled for the layouts the launchers and the call
    really produce, not the traced ones: a launcher writes new contiguous tensors where eager's
    were permuted (ConvNeXt's NHWC blocks). Compiled for the traced strides, the subgraphs
    after the calls ran in PyTorch at every step (6 calls here; ConvNeXt-T's tuned training
    step ran 1067 backward ops in PyTorch, 1.15x eager's time)."""
    from torchburn.backend.launcher import Launcher

    slow_down(monkeypatch, loser="ours")
    slow_calls: list[str] = []
    original = Launcher._slow

    def _slow(self: Launcher, *args: Any, why: str) -> Any:
        slow_calls.append(f"{self.name}: {why}")
        return original(self, *args, why=why)

    monkeypatch.setattr(Launcher, "_slow", _slow)
    from tests.models import conv_zoo

    eager = conv_zoo.build("convnext_t", "tiny").train()
    model = copy.deepcopy(eager)
    x = conv_zoo.inputs("convnext_t", "tiny")["x"]
    reports = rep.start_recording()
    try:
        compiled = torch.compile(model, backend="torchburn")
        for _ in range(2):
            model.zero_grad(set_to_none=True)
            got, got_grads = _train_step(compiled, x)
    finally:
        rep.stop_recording()
    want, want_grads = _train_step(eager, x)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for g, w in zip(got_grads, want_grads):
        torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
    forward, backward = reports
    assert backward.library_calls and len(backward.subgraphs) >= 2
    assert all(s.compiled for s in forward.subgraphs + backward.subgraphs)
    assert slow_calls == []


def test_a_record_made_in_training_is_not_applied_in_inference(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """In inference our candidate keeps its packed weight between runs (`keep-constant-prep`):
    it is measured so, under its own record, not by one measured packing every run."""
    prepared = slow_down(monkeypatch, loser="ours")
    model = ResidualConvs().eval()
    x = torch.randn(2, 16, 12, 12)
    torchburn.explain(model, x)  # grad mode on, weights requiring grad: no constant inputs
    prepared.clear()
    with torch.no_grad():
        fast = torch.compile(model, backend="torchburn", options={"tune": "cached"})
        reports = rep.start_recording()
        try:
            got = fast(x)
        finally:
            rep.stop_recording()
        torch.testing.assert_close(got, model(x), rtol=1e-4, atol=1e-4)
    assert prepared == [] and reports[0].library_calls == []  # no record for it: ours, unmeasured


def test_a_dynamic_batch_is_measured_at_its_hint(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a second batch size Dynamo compiles the graph again with a symbolic batch: its
    convolutions are still measured (at the size of the call being compiled, read without a
    guard), the choice holds for every batch size, and the graph stays dynamic."""
    prepared = slow_down(monkeypatch, loser="ours")
    eager = ResidualConvs().train()
    model = copy.deepcopy(eager)
    compiled = torch.compile(model, backend="torchburn")
    reports = rep.start_recording()
    try:
        for batch in (2, 3, 5):  # 3 compiles the dynamic graph; 5 reuses it
            for p in model.parameters():
                p.grad = None
            for p in eager.parameters():
                p.grad = None
            x = torch.randn(batch, 16, 12, 12)
            got, got_grads = _train_step(compiled, x)
            want, want_grads = _train_step(eager, x)
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
            for g, w in zip(got_grads, want_grads):
                torch.testing.assert_close(g, w, rtol=1e-3, atol=1e-3)
    finally:
        rep.stop_recording()
    assert len(reports) == 4, [r.kind for r in reports]  # forward and backward, static then dynamic
    dynamic = reports[2:]
    for graph in dynamic:
        assert graph.library_calls and all("aten (measured" in why or "aten (record" in why
                                           for _, why in graph.library_calls), graph.library_calls
    lines = [t for graph in dynamic for t in graph.tuning]
    assert lines and all("f32[~3,16,12,12]" in t for t in lines), lines
    assert "aten" in prepared


def test_the_gemm_form_is_not_proposed_at_symbolic_sizes(tuning: None, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lowering's GEMM form takes static sizes only: a symbolic convolution is not offered
    it (a choice the lowering would ignore), while the same layer at static sizes is."""
    slow_down(monkeypatch, loser="aten")
    model = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, stride=2, padding=1)).eval()
    compiled = torch.compile(model, backend="torchburn")
    reports = rep.start_recording()
    try:
        with torch.no_grad():
            for batch in (2, 3):
                x = torch.randn(batch, 8, 12, 12)
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    finally:
        rep.stop_recording()
    static, dynamic = reports
    assert any("ours-gemm" in t for t in static.tuning), static.tuning
    assert dynamic.tuning and not any("ours-gemm" in t for t in dynamic.tuning), dynamic.tuning
