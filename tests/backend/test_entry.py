"""The spine end to end: the backend by name, the MLP forward and a training step, dynamic
shapes, fallback, explain, and inputs that differ from the compiled ones."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn as nn

import torchburn
from torchburn.compiler.driver import memory_cache
from tests.helpers import assert_fully_compiled, check, run_compiled


def mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 256))


def test_backend_found_by_name_after_plain_import_torch() -> None:
    code = ("import torch\n"
            "f = torch.compile(lambda x: x * 2 + 1, backend='torchburn')\n"
            "x = torch.randn(5)\n"
            "torch.testing.assert_close(f(x), x * 2 + 1)\n"
            "import torchburn.backend.report as r\n"
            "assert any(s.compiled for g in r.recent_reports() for s in g.subgraphs)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_mlp_forward_matches_eager() -> None:
    model = mlp()
    x = torch.randn(32, 512)
    with torch.no_grad():
        check(model, x, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_variants(approximate: str) -> None:
    x = torch.randn(64, 33) * 4
    check(lambda t: torch.nn.functional.gelu(t, approximate=approximate), x)


def test_mlp_training_step_gradients_match_eager() -> None:
    model = mlp()
    ref = mlp()
    ref.load_state_dict(model.state_dict())
    x = torch.randn(32, 512)
    target = torch.randn(32, 256)

    def loss_fn(m: nn.Module) -> torch.Tensor:
        return ((m(x) - target) ** 2).mean()

    compiled = torch.compile(model, backend="torchburn")
    torch._dynamo.reset()
    from torchburn.backend import report as rep

    records = rep.start_recording()
    try:
        loss = ((compiled(x) - target) ** 2).mean()
        loss.backward()
    finally:
        rep.stop_recording()
    ref_loss = loss_fn(ref)
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-4, atol=1e-5)
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")
    kinds = {r.kind for r in records}
    assert {"forward", "backward"} <= kinds
    assert_fully_compiled([r for r in records if r.kind == "backward"])


def test_dynamic_batch_compiles_once() -> None:
    torch._dynamo.reset()
    model = mlp()
    compiled = torch.compile(model, backend="torchburn", dynamic=True)
    from torchburn.backend import report as rep

    records = rep.start_recording()
    try:
        with torch.no_grad():
            for batch in (2, 3, 7, 32, 65):  # Dynamo specializes size 1 by design
                x = torch.randn(batch, 512)
                torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    finally:
        rep.stop_recording()
    assert len(records) == 1, f"expected one compilation, got {len(records)}"


def test_unsupported_op_falls_back_and_is_explained() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        y = torch.exp(x)
        z = torch.fft.fft(y).real  # complex: no lowering
        return z + 1

    x = torch.randn(16)
    out, reports = run_compiled(fn, x)
    torch.testing.assert_close(out, fn(x))
    report = torchburn.explain(fn, x)
    assert report.fallback_ops, "the FFT must be reported as a fallback"
    assert report.compiled_subgraphs, "the elementwise parts must still compile"
    text = str(report)
    assert "fft" in text


def test_non_contiguous_input_never_reads_wrong_memory() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda a: a * 2 + 1, backend="torchburn", dynamic=False)
    x = torch.randn(8, 6)
    torch.testing.assert_close(f(x), x * 2 + 1)
    xt = torch.randn(6, 8).t()  # same shape, transposed strides
    torch.testing.assert_close(f(xt), xt * 2 + 1)
    xs = torch.randn(8, 12)[:, ::2]  # same shape, strided
    torch.testing.assert_close(f(xs), xs * 2 + 1)


def _compiled_launchers(fn, *args):
    """Compile `fn` and return its launchers (the objects that guard and call native code)."""
    launchers = []
    import torchburn.backend.entry as be

    original = be._install

    def spy(module, name, sub, launcher):
        launchers.append(launcher)
        original(module, name, sub, launcher)

    be._install = spy
    try:
        run_compiled(fn, *args)
    finally:
        be._install = original
    assert launchers, "nothing was compiled"
    return launchers


def test_launcher_guard_runs_eager_on_layout_mismatch() -> None:
    x = torch.randn(4, 6)
    (launcher,) = _compiled_launchers(lambda a: a.exp() + 1, x)
    assert launcher.stats.eager_fallbacks == 0
    # Reach the launcher directly with inputs Dynamo would have re-guarded on.
    for bad in (torch.randn(6, 4).t(), torch.randn(4, 7), torch.randn(4, 6, dtype=torch.float64)):
        before = launcher.stats.eager_fallbacks
        (out,) = launcher(bad)
        torch.testing.assert_close(out, bad.exp() + 1)
        assert launcher.stats.eager_fallbacks == before + 1
    (out,) = launcher(x)
    torch.testing.assert_close(out, x.exp() + 1)


def test_dtype_change_recompiles() -> None:
    torch._dynamo.reset()
    f = torch.compile(lambda a: a + a, backend="torchburn")
    for dtype in (torch.float32, torch.float64, torch.int64):
        x = torch.arange(10, dtype=dtype)
        torch.testing.assert_close(f(x), x + x)


def test_identical_graph_compiles_nothing_second_time() -> None:
    cache = memory_cache()
    x = torch.randn(10, 10)
    run_compiled(lambda a: torch.tanh(a) * 3, x)
    misses = cache.misses
    hits = cache.hits
    run_compiled(lambda b: torch.tanh(b) * 3, x)
    assert cache.misses == misses
    assert cache.hits == hits + 1


def _break_codegen(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every compilation of a subgraph hit an internal error (a stand-in compiler bug)."""
    import torchburn.compiler.driver as driver

    def broken(*args: object, **kwargs: object) -> None:
        raise KeyError("stand-in compiler bug")

    monkeypatch.setattr(driver, "compile_graph", broken)
    memory_cache().clear()


def test_strict_mode_raises_an_internal_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from torchburn.backend import InternalCompilerError
    from torchburn.runtime.config import get_config

    assert get_config().strict, "tests/conftest.py runs the suite in strict mode"
    _break_codegen(monkeypatch)
    with pytest.raises(Exception) as info:
        run_compiled(lambda x: x * 2 + 1, torch.randn(8))
    chain = []
    err: BaseException | None = info.value
    while err is not None:
        chain.append(err)
        err = err.__cause__ or err.__context__
    ice = [e for e in chain if isinstance(e, InternalCompilerError)]
    assert ice, f"no InternalCompilerError in {chain!r}"
    assert "stand-in compiler bug" in str(ice[0]) and isinstance(ice[0].__cause__, KeyError)


def test_internal_error_falls_back_and_explain_shows_it(monkeypatch: pytest.MonkeyPatch, strict_off: None) -> None:
    _break_codegen(monkeypatch)
    fn = lambda x: torch.exp(x) + 1  # noqa: E731
    x = torch.randn(8)
    report = torchburn.explain(fn, x)
    errors = report.internal_errors
    assert len(errors) == 1 and errors[0].internal_error == "KeyError: 'stand-in compiler bug'"
    # the innermost torchburn frame (the stand-in bug itself lives in this test file)
    assert errors[0].error_where is not None and errors[0].error_where.startswith("torchburn/backend/entry.py:")
    text = str(report)
    assert "INTERNAL COMPILER ERROR" in text.splitlines()[1], text
    out, _ = run_compiled(fn, x)
    torch.testing.assert_close(out, fn(x))


def test_capability_miss_falls_back_even_in_strict_mode() -> None:
    # the FFT has no lowering: a capability miss, reported as a fallback, never raised
    fn = lambda x: torch.fft.fft(torch.exp(x)).real + 1  # noqa: E731
    x = torch.randn(16)
    report = torchburn.explain(fn, x)
    assert report.fallback_ops and not report.internal_errors
    assert "INTERNAL" not in str(report)


def test_strict_variable_is_parsed() -> None:
    from torchburn.runtime.config import Config

    assert Config.from_env({"TORCHBURN_STRICT": "1"}).strict
    assert not Config.from_env({"TORCHBURN_STRICT": "0"}).strict
    assert not Config.from_env({}).strict


def test_collector_is_paused_over_the_whole_graph_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """`compile_fx_graph` pauses the cyclic collector over partition, import, compile and
    launchers (their objects must not set off full collections of the whole process), and
    turns it back on before returning."""
    import gc

    from torchburn.frontend import importer, partition

    seen: list[bool] = []
    part, imp = partition.partition, importer.import_graph

    def watched_partition(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return part(*args, **kwargs)

    def watched_import(*args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(gc.isenabled())
        return imp(*args, **kwargs)

    monkeypatch.setattr(partition, "partition", watched_partition)
    monkeypatch.setattr(importer, "import_graph", watched_import)
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    was = gc.isenabled()
    gc.enable()
    try:
        torch._dynamo.reset()
        memory_cache().clear()
        x = torch.randn(4, 8)
        out = torch.compile(lambda a: torch.tanh(a) * 3 + 1, backend="torchburn")(x)
        torch.testing.assert_close(out, torch.tanh(x) * 3 + 1)
        assert gc.isenabled()
    finally:
        if not was:
            gc.disable()
    assert seen and not any(seen)
