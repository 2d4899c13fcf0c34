"""The benchmarks' plots (`benchmarks/common.py`): speed-ups over eager per workload, a PNG
beside the JSON, and `bench_cpu.py` writing both from a real (one-round) run."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import common  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


def test_speedup_panel_divides_eager_by_each_contender() -> None:
    rows = [("gelu", {"eager": 2.0, "inductor": 1.0, "torchburn": 0.5}),
            ("mlp", {"eager": 3.0, "torchburn": 6.0})]
    panel = common.speedup_panel("t", rows, ["eager", "inductor", "torchburn"])
    assert panel.groups == ["gelu", "mlp"]
    assert panel.series == {"inductor": [2.0, None], "torchburn": [4.0, 0.5]}
    assert panel.reference == 1.0 and panel.log
    plain = common.speedup_panel("t", rows, ["torchburn"])  # no eager: milliseconds
    assert plain.series == {"torchburn": [500.0, 6000.0]} and plain.reference is None


def test_the_plot_goes_beside_the_json_unless_given() -> None:
    assert common.plot_path("out/x.json", "") == "out/x.png"
    assert common.plot_path("out/x.json", "p.png") == "p.png"
    assert common.plot_path(None, "") is None


def test_plot_panels_writes_a_png(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    rows = [("gelu", {"eager": 2.0, "inductor": 1.0, "torchburn": 0.5})]
    cold = common.Panel("cold compile", ["gelu"], {"inductor": [3.0], "torchburn": [None]}, "s", log=True)
    out = common.plot_panels(str(tmp_path / "sub" / "p.png"), "title",
                             [common.speedup_panel("steady", rows, ["eager", "inductor", "torchburn"]), cold])
    assert out == str(tmp_path / "sub" / "p.png")
    data = Path(out).read_bytes()
    assert data.startswith(PNG) and len(data) > 5000


def test_without_matplotlib_there_is_no_plot_and_it_says_so(monkeypatch: pytest.MonkeyPatch, capsys,
                                                            tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    panel = common.Panel("t", ["a"], {"torchburn": [1.0]}, "x")
    assert common.plot_panels(str(tmp_path / "p.png"), "t", [panel]) is None
    assert "matplotlib is not installed" in capsys.readouterr().err
    assert not (tmp_path / "p.png").exists()


def test_bench_cpu_writes_json_and_plot(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("matplotlib")
    from benchmarks import bench_cpu

    out = tmp_path / "cpu.json"
    assert bench_cpu.main(["--cases", "overhead", "--contenders", "eager,torchburn", "--rounds", "1",
                           "--no-compile-row", "--json", str(out)]) == 0
    payload = json.loads(out.read_text())
    assert [r["case"] for r in payload["results"]] == ["overhead"]
    assert set(payload["results"][0]["timings"]) == {"eager", "torchburn"}
    assert (tmp_path / "cpu.png").read_bytes().startswith(PNG)
    assert f"plot: {tmp_path / 'cpu.png'}" in capsys.readouterr().out


def test_bench_llm_plots_tokens_per_second_per_test() -> None:
    from benchmarks.bench_llm import tokens_panel

    results = {"torchburn": {"pp64": {"mean": 95.0}, "tg16": {"mean": 40.0}},
               "llama.cpp": {"pp64": {"mean": 120.0}, "tg16": {"mean": 45.0}}}
    panel = tokens_panel("GGUF", results)
    assert panel.groups == ["pp64", "tg16"]
    assert panel.series == {"torchburn": [95.0, 40.0], "llama.cpp": [120.0, 45.0]}


def test_bench_models_plots_speedup_and_cold_compile(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import argparse

    from benchmarks.bench_models import plot

    def timing(s: float) -> common.Timing:
        return common.Timing("x", s, s, s, 1, 1)

    results = [{"model": "gpt2", "mode": "forward",
                "timings": {"eager": timing(2.0), "inductor": timing(1.0), "torchburn": timing(0.5)},
                "compile": {"inductor": {"cold_s": 30.0}, "torchburn": {"cold_s": 3.0}}}]
    args = argparse.Namespace(clock="wall", rounds=3)
    out = plot(str(tmp_path / "m.png"), results, ["eager", "inductor", "torchburn"],
               {"cpu": "cpu", "torch_threads": 2}, args)
    assert out and Path(out).read_bytes().startswith(PNG)


def _row_json(path: Path, model: str, engines: dict[str, tuple[list[float], list[float]]]) -> str:
    results = [{"test": test, "engine": engine, "tokens_per_s": values}
               for engine, (pp, tg) in engines.items() for test, values in (("pp512", pp), ("tg128", tg))]
    path.write_text(json.dumps({"model": f"{model} (llama, 2 layers)", "quant": "as stored", "results": results}))
    return str(path)


def test_plot_llm_rows_tabulates_each_file_against_the_faster_peer(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    from benchmarks import plot_llm_rows

    a = _row_json(tmp_path / "a.json", "a.gguf", {"torchburn cpu": ([30.0, 50.0], [12.0, 12.0]),
                                                  "llama.cpp": ([20.0, 20.0], [10.0, 10.0]),
                                                  "ik_llama.cpp": ([25.0, 25.0], [8.0, 8.0])})
    b = _row_json(tmp_path / "b.json", "b.gguf", {"torchburn cpu": ([10.0], [3.0])})
    labels, tests = plot_llm_rows.load_rows([a, b])
    assert labels == ["a.gguf", "b.gguf"]
    assert tests["tg128"]["torchburn"] == {"a.gguf": [12.0, 12.0], "b.gguf": [3.0]}
    text = plot_llm_rows.table(labels, tests)
    assert "| a.gguf | pp512 | 40.00 +- 14.14 | 25.00 +- 0.00 | 20.00 +- 0.00 | 1.60x |" in text
    assert "| a.gguf | tg128 | 12.00 +- 0.00 | 8.00 +- 0.00 | 10.00 +- 0.00 | 1.20x |" in text
    assert "| b.gguf | tg128 | 3.00 +- 0.00 | - | - | - |" in text
    (pp, tg) = plot_llm_rows.panels(labels, tests)
    assert pp.title == "pp512" and pp.series["llama.cpp"] == [20.0, None] and pp.log
    assert list(tg.series)[0] == "torchburn"
    if __import__("importlib").util.find_spec("matplotlib") is not None:
        out = common.plot_panels(str(tmp_path / "rows.png"), "t", [pp, tg])
        assert out is not None and Path(out).read_bytes().startswith(PNG)
