"""Portable SIMD: with `TORCHBURN_TARGET`, the README's MLP and a transformer block compile for
x86-64 AVX2, x86-64 AVX-512 and aarch64 NEON on this machine. The assembly shows each target's
vector registers (ymm, zmm, v-registers), the LLVM IR its f32 lane count (8, 16, 4). Code a
CPU can run (AVX2 here, on any x86-64-v3 machine) runs and matches eager; code for another CPU
is emitted only, and calling it raises `TargetError` with the reason."""
from __future__ import annotations

import re
from pathlib import Path
from typing import Callable, Iterator

import pytest
import torch
import torch.nn as nn

from tests.helpers import assert_fully_compiled, run_compiled
from torchburn.codegen.target import TargetError, host_target, named_target, runs_here
from torchburn.compiler import driver
from torchburn.runtime.config import ConfigError, reload_config

#: target name -> (a vector register in its assembly, f32 lanes, registers that must not appear)
TARGETS = {
    "avx2": (r"%ymm\d+", 8, r"%zmm\d+"),
    "avx512": (r"%zmm\d+", 16, r"\bv\d+\.4s"),
    "neon": (r"\bv\d+\.4s\b", 4, r"%[xyz]mm\d+"),
}


def readme_mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 256)).eval()
    return model, torch.randn(32, 512)


def gpt_block() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True, norm_first=True).eval()
    return model, torch.randn(2, 16, 64)


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {"mlp": readme_mlp, "gpt_block": gpt_block}


@pytest.fixture
def target_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """`use(name)`: TORCHBURN_TARGET=name with a fresh dump folder and no disk cache."""

    def use(name: str) -> Path:
        dump = tmp_path / name
        monkeypatch.setenv("TORCHBURN_TARGET", name)
        monkeypatch.setenv("TORCHBURN_DUMP", str(dump))
        monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
        monkeypatch.delenv("TORCHBURN_DEVICE", raising=False)
        monkeypatch.delenv("TORCHBURN_ENGINE", raising=False)
        reload_config()
        driver.memory_cache().clear()
        return dump

    yield use
    monkeypatch.undo()
    reload_config()
    driver.memory_cache().clear()


def _stage(dump: Path, name: str) -> str:
    files = sorted(dump.rglob(name))
    assert files, f"no {name} written under {dump}"
    return "\n".join(f.read_text() for f in files)


@pytest.mark.parametrize("model_name", sorted(MODELS))
@pytest.mark.parametrize("target", sorted(TARGETS))
def test_emits_the_targets_vectors(target_env: Callable[[str], Path], target: str, model_name: str) -> None:
    dump = target_env(target)
    model, x = MODELS[model_name]()
    register, lanes, foreign = TARGETS[target]
    runnable = runs_here(named_target(target))
    with torch.no_grad():
        if runnable:
            out, reports = run_compiled(model, x)
            torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)
            assert_fully_compiled(reports)
        else:
            with pytest.raises(TargetError, match="cannot run"):
                run_compiled(model, x)
    asm, llvm_ir = _stage(dump, "module.s"), _stage(dump, "module.ll")
    assert re.search(register, asm), f"no {register} in the {target} assembly"
    assert not re.search(foreign, asm), f"{foreign} in the {target} assembly"
    assert f"<{lanes} x float>" in llvm_ir
    wider = {4: "<8 x float>", 8: "<16 x float>", 16: "<32 x float>"}[lanes]
    assert wider not in llvm_ir, f"vectors wider than {target}'s in its LLVM IR"
    expected = named_target(target)
    assert f'target triple = "{expected.triple}"' in llvm_ir


def test_avx2_runs_here_and_avx512_only_on_avx512_hosts() -> None:
    host = host_target()
    if host.arch != "x86_64":
        pytest.skip("an x86-64 host runs x86 code")
    assert runs_here(named_target("avx2")) == all(host.has_feature(f) for f in ("avx2", "fma", "f16c"))
    assert runs_here(named_target("avx512")) == host.has_feature("avx512f")
    assert not runs_here(named_target("neon"))


def test_compile_graph_for_a_target_gives_object_code_and_assembly() -> None:
    """The driver's Python face: `compile_graph(graph, target=...)` for a CPU that is not this
    one keeps the object code and the assembly, and says why its entry cannot be called."""
    from torchburn.ir.parser import parse_graph

    def graph():  # tensor passes edit the graph they are given: a fresh one per compilation
        return parse_graph("""graph @g(%x: f32[64, 64]) {
          %0 = exp(%x) : f32[64, 64]
          return %0
        }""")

    neon = named_target("neon")
    compiled, hit = driver.compile_graph(graph(), target=neon)
    assert not hit and compiled.native is None and compiled.object.triple == neon.triple
    assert compiled.object.data[:4] == b"\x7fELF"
    assert re.search(r"\bv\d+\.4s\b", compiled.assembly())
    with pytest.raises(TargetError, match="neoverse-n1"):
        compiled.entry(None, None, None)
    again, hit = driver.compile_graph(graph(), target=neon)
    assert hit and again is compiled
    native, _ = driver.compile_graph(graph(), target=host_target())
    assert native.key != compiled.key  # the target is part of the key


def test_unknown_target_names_are_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_TARGET", "pentium4")
    with pytest.raises(ConfigError, match="TORCHBURN_TARGET='pentium4'.*avx2.*neon"):
        reload_config()
    monkeypatch.setenv("TORCHBURN_TARGET", "aarch64-unknown-linux-gnu:generic:+neon")
    assert reload_config().target == "aarch64-unknown-linux-gnu:generic:+neon"
    monkeypatch.delenv("TORCHBURN_TARGET")
    assert reload_config().target == "host"


def test_the_target_is_part_of_the_fx_graph_cache_key() -> None:
    """A warm process with another TORCHBURN_TARGET must not reuse an FX-graph cache entry."""
    from torchburn.backend import fx_cache
    from torchburn.runtime.config import Config

    host, avx2 = Config.from_env({}), Config.from_env({"TORCHBURN_TARGET": "AVX2"})
    assert avx2.target == "avx2" and host.target == "host"
    assert fx_cache._config_part(host) != fx_cache._config_part(avx2)


def test_target_as_a_backend_option(target_env: Callable[[str], Path]) -> None:
    """`options={"target": ...}` does what TORCHBURN_TARGET does, for one compiled function."""
    dump = target_env("host")
    f = lambda x: torch.exp(x) * 2.0  # noqa: E731
    x = torch.randn(64, 64)
    torch._dynamo.reset()
    with pytest.raises(TargetError, match="cannot run"):
        torch.compile(f, backend="torchburn", options={"target": "neon"})(x)
    assert re.search(r"\bv\d+\.4s\b", _stage(dump, "module.s"))
    if runs_here(named_target("avx2")):
        torch._dynamo.reset()
        out = torch.compile(f, backend="torchburn", options={"target": "avx2"})(x)
        torch.testing.assert_close(out, f(x))
    torch._dynamo.reset()
    with pytest.raises(Exception, match="option target='pentium4'"):
        torch.compile(f, backend="torchburn", options={"target": "pentium4"})(x)
