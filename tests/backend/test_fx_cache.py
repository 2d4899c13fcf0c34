"""The FX-graph cache (`torchburn/backend/fx_cache.py`): a warm process maps the ATen graph straight to
loaded code without importing the compiler, and nothing about correctness changes."""
from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from torchburn.runtime import config
from torchburn.compiler import driver
from torchburn.backend import fx_cache
from torchburn.backend.entry import torchburn_backend
from torchburn.runtime.disk_cache import DiskCache

ROOT = Path(__file__).resolve().parents[2]

CHILD = textwrap.dedent("""
    import json, sys, torch
    from torchburn.backend import report
    from torchburn.compiler import driver
    from torchburn.backend import torchburn_backend

    def f(x, y):
        return torch.sigmoid(x) * y + 1.0

    def views(x):  # outputs that alias the input, and one that is the input
        return x.t(), x[1:], x, x * 2

    def mutate(x, y):  # an in-place change of an input, written back
        x.add_(y)
        return x * 3

    torch.manual_seed(0)
    x, y = torch.randn(8, 16), torch.randn(8, 16)
    records = report.start_recording()
    out = torch.compile(f, backend=torchburn_backend)(x, y)
    torch.testing.assert_close(out, f(x, y))
    a, b, c, d = torch.compile(views, backend=torchburn_backend)(x)
    assert a.data_ptr() == x.data_ptr() and a.shape == (16, 8) and c is x, "views must alias the input"
    assert b.data_ptr() == x[1:].data_ptr()
    torch.testing.assert_close(d, x * 2)
    x1, x2 = x.clone(), x.clone()
    r1 = torch.compile(mutate, backend=torchburn_backend)(x1, y)
    r2 = mutate(x2, y)
    torch.testing.assert_close(x1, x2)
    torch.testing.assert_close(r1, r2)
    s = driver.STATS
    print(json.dumps({
        "compiled": s.compiled, "disk_hits": s.disk_hits, "memory_hits": s.memory_hits,
        "graph_hits": [r.graph_cache_hit for r in records],
        "compiled_subgraphs": sum(1 for r in records for sub in r.subgraphs if sub.compiled),
        "loaded": sorted({m.split(".")[1] + ("." + m.split(".")[2] if m.count(".") > 1 else "")
                          for m in sys.modules if m.startswith("torchburn.")}),
    }))
""")


def run_child(cache_dir: Path) -> tuple[dict[str, Any], str]:
    env = dict(os.environ, TORCHBURN_CACHE_DIR=str(cache_dir))
    env.pop("TORCHBURN_DUMP", None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    p = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


def test_warm_process_skips_the_compiler_and_corrupt_manifests_are_rebuilt(tmp_path: Path) -> None:
    cold, _ = run_child(tmp_path)
    assert cold["compiled"] >= 3 and not any(cold["graph_hits"])
    # a CPU compile (TORCHBURN_DEVICE=cpu, the default) compiles none of the GPU engine's source
    for name in ("codegen.wgsl", "runtime.gpu", "backend.gpu_launcher", "passes.gpu_map", "passes.gpu_lower"):
        assert name not in cold["loaded"], f"torchburn.{name} was imported by a CPU compile"
    assert "passes.lower_to_loops" in cold["loaded"]  # (the names are listed as these are)
    graphs = [p for p in DiskCache(tmp_path).graph_files() if p.name.startswith("fx")]
    assert len(graphs) == len(cold["graph_hits"])

    warm, _ = run_child(tmp_path)
    assert all(warm["graph_hits"]) and warm["compiled"] == 0
    assert warm["disk_hits"] == cold["compiled"]  # each program loaded from disk, none compiled
    assert warm["compiled_subgraphs"] == cold["compiled_subgraphs"]
    # the warm path needs no IR, pass, lowering, partitioner or code generator
    heavy = ["ir", "passes", "frontend.lowerings", "frontend.partition", "frontend.importer",
             "codegen.llvm", "codegen.wgsl", "backend.gpu_launcher", "backend.launcher_gen"]
    if shutil.which("ld"):  # programs come as shared libraries: not even LLVM is loaded
        heavy.append("runtime.jit")
    for name in heavy:
        assert name not in warm["loaded"], f"torchburn.{name} was imported on the warm path"

    good = graphs[0].read_bytes()
    graphs[0].write_bytes(good[:-5] + b"xxxxx")  # a flipped tail: the digest no longer matches
    again, log = run_child(tmp_path)
    assert "is corrupt" in log
    assert again["compiled"] == 0  # the programs are still on disk: only the manifest is rebuilt
    assert again["graph_hits"].count(False) == 1
    assert graphs[0].read_bytes() == good  # rebuilt, identical


def test_missing_program_is_a_miss_that_rebuilds_it(tmp_path: Path) -> None:
    cold, _ = run_child(tmp_path)
    programs = DiskCache(tmp_path).files()
    programs[0].unlink()
    again, _ = run_child(tmp_path)
    assert again["compiled"] == 1 and again["graph_hits"].count(False) == 1
    assert len(DiskCache(tmp_path).files()) == len(programs)


def _gm(fn: Any, *args: torch.Tensor) -> torch.fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*args)


def test_key_covers_input_metadata_kind_and_pipeline() -> None:
    cfg = config.Config.from_env({"TORCHBURN_CACHE_DIR": "/tmp/unused"})

    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    def key(gm: torch.fx.GraphModule, kind: str = "forward", pipeline: str = "p", c: Any = cfg) -> str:
        k = fx_cache.graph_key(gm, kind, c, pipeline)
        assert k is not None
        return k

    base = key(_gm(f, torch.randn(4, 8)))
    assert base == key(_gm(f, torch.randn(4, 8)))  # stable
    assert base != key(_gm(f, torch.randn(4, 9)))  # shape
    assert base != key(_gm(f, torch.randn(4, 8, dtype=torch.float64)))  # dtype
    assert base != key(_gm(f, torch.randn(8, 4).t()))  # strides
    assert base != key(_gm(lambda x: x * 3 + 1, torch.randn(4, 8)))  # code
    assert base != key(_gm(f, torch.randn(4, 8)), kind="backward")
    assert base != key(_gm(f, torch.randn(4, 8)), pipeline="q")
    # configuration that shapes code is in the key; where the cache lives is not
    assert base != key(_gm(f, torch.randn(4, 8)), c=dataclasses.replace(cfg, wgpu_backend="vulkan"))
    assert base == key(_gm(f, torch.randn(4, 8)), c=dataclasses.replace(cfg, cache_dir=Path("/elsewhere")))
    gpu = config.Config.from_env({"TORCHBURN_CACHE_DIR": "/tmp/unused", "TORCHBURN_DEVICE": "gpu"})
    assert not fx_cache.enabled(gpu) and fx_cache.enabled(cfg)
    assert not fx_cache.enabled(config.Config.from_env({"TORCHBURN_CACHE_DIR": "off"}))


def test_key_covers_constant_contents() -> None:
    cfg = config.Config.from_env({"TORCHBURN_CACHE_DIR": "/tmp/unused"})
    gm = _gm(lambda x: x + 1, torch.randn(4))
    gm.register_buffer("_c", torch.ones(4))
    with gm.graph.inserting_before(next(n for n in gm.graph.nodes if n.op == "output")):
        gm.graph.get_attr("_c")
    gm.recompile()
    first = fx_cache.graph_key(gm, "forward", cfg, "p")
    gm._c.fill_(2.0)
    assert first is not None and first != fx_cache.graph_key(gm, "forward", cfg, "p")
    gm.register_buffer("_c", torch.ones(fx_cache.MAX_CONSTANT_BYTES))  # too large to hash: not cached
    assert fx_cache.graph_key(gm, "forward", cfg, "p") is None


USER_PASS = '''
from dataclasses import dataclass
from typing import ClassVar
from torchburn.passes import TensorPass

@dataclass(frozen=True)
class UserPass(TensorPass):
    name: ClassVar[str] = "fx-cache-test-pass"
    def run(self, graph):
        return {body}
'''


def test_key_changes_when_a_user_pass_source_changes() -> None:
    def user_pass(body: str) -> Any:
        ns: dict[str, Any] = {}
        exec(compile(USER_PASS.format(body=body), "<typed in a REPL>", "exec"), ns)
        return ns["UserPass"]()

    a = fx_cache.pipeline_key({"after-fusion": [user_pass("graph")]})
    b = fx_cache.pipeline_key({"after-fusion": [user_pass("[graph][0]")]})
    assert a != b
    assert a == fx_cache.pipeline_key({"after-fusion": [user_pass("graph")]})
    assert fx_cache.pipeline_key(None) == fx_cache.DEFAULT_PIPELINE_TAG  # built-in passes only


@pytest.fixture()
def disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", str(tmp_path))
    config.reload_config()
    driver.memory_cache().clear()
    yield tmp_path
    monkeypatch.undo()
    config.reload_config()


def test_in_process_hit_reports_like_a_compilation(disk: Path) -> None:
    import torchburn

    def g(x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x) * 2 + torch.nn.functional.gelu(x)

    x = torch.randn(6, 10)
    first = torchburn.explain(g, x)
    second = torchburn.explain(g, x)  # Dynamo is reset: the FX graph comes from the cache
    assert [s.kernels for s in first.compiled_subgraphs] == [s.kernels for s in second.compiled_subgraphs]
    assert all(s.cache_hit for s in second.compiled_subgraphs)
    assert all(gr.graph_cache_hit for gr in second.graphs)
    assert second.fallback_ops == first.fallback_ops
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(g, backend=torchburn_backend)(x), g(x))


def test_fallbacks_survive_the_cache(disk: Path) -> None:
    import torchburn

    def h(x: torch.Tensor) -> torch.Tensor:
        return torch.fft.fft(x.exp()).abs() + 1  # the FFT stays in PyTorch

    x = torch.randn(4, 8)
    first = torchburn.explain(h, x)
    second = torchburn.explain(h, x)
    assert first.fallback_ops and second.fallback_ops == first.fallback_ops
    assert all(gr.graph_cache_hit for gr in second.graphs)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(h, backend=torchburn_backend)(x), h(x))


def test_graph_with_a_constant_tensor_compiles_and_hits(disk: Path) -> None:
    """A constant captured from the function (a real tensor while AOTAutograd traces in fake
    mode) is keyed by its contents, not refused; a second compile hits."""
    const = torch.tensor([1.0, -2.0, 3.0, 0.5], dtype=torch.float16)

    def k(x: torch.Tensor) -> torch.Tensor:
        return torch.amax(x * const, dim=-1)

    x = torch.randn(3, 4, dtype=torch.float16)
    for _ in range(2):
        torch._dynamo.reset()
        torch.testing.assert_close(torch.compile(k, backend=torchburn_backend)(x), k(x))
    assert driver.STATS.disk_hits or driver.STATS.memory_hits


def test_a_warm_hit_still_says_what_is_kept(disk: Path) -> None:
    """The kept-temporaries line is written with the manifest: the warm path reports it without
    parsing the program's IR."""
    import torchburn

    torch.manual_seed(0)
    conv = torch.nn.Conv1d(8, 16, 3).eval()
    x = torch.randn(2, 8, 32)
    with torch.no_grad():
        first = torchburn.explain(conv, x)
        second = torchburn.explain(conv, x)
    assert all(gr.graph_cache_hit for gr in second.graphs)
    kept = [s.kept for s in first.compiled_subgraphs]
    assert any(kept) and [s.kept for s in second.compiled_subgraphs] == kept
