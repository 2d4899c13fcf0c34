"""`python -m torchburn demo`: dump folder (TORCHBURN_DUMP, --dump, temporary and removed),
what the folder holds per engine, the busy-machine and software-adapter warnings, timings."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from torchburn.cli import demo

ROOT = Path(__file__).resolve().parents[2]


def test_busy_warning_compares_load_with_cpus() -> None:
    assert demo.busy_warning(0.3, cpus=4) is None
    warning = demo.busy_warning(5.8, cpus=2)
    assert warning is not None and "load average 5.8 on 2 CPU(s)" in warning
    assert demo.busy_warning(None, cpus=2) is None


@pytest.mark.parametrize("info, software", [
    ({"name": "llvmpipe (LLVM 15.0.6, 256 bits)", "backend": "OpenGL", "device_type": "CPU"}, True),
    ({"name": "Vulkan lavapipe", "backend": "Vulkan", "device_type": "Other"}, True),
    ({"name": "SwiftShader Device (Subzero)", "backend": "Vulkan", "device_type": "Other"}, True),
    ({"name": "NVIDIA GeForce RTX 4090", "backend": "Vulkan", "device_type": "DiscreteGPU"}, False),
    (None, False),
])
def test_software_adapter_warning(info: dict | None, software: bool) -> None:
    warning = demo.software_adapter_warning(info)
    assert (warning is not None) == software
    if software:
        assert "software renderer" in warning and info["name"] in warning


def test_describe_dump_names_what_was_written(tmp_path: Path) -> None:
    gpu_graph = tmp_path / "000_abc"
    gpu_graph.mkdir()
    for name in ("01_tensor_ir.tbir", "02_after_fuse.tbir", "program.tbir", "kernel_k0.wgsl"):
        (gpu_graph / name).write_text("")
    text = demo.describe_dump(tmp_path)
    assert "WGSL" in text and "LLVM" not in text and "assembly" not in text
    (gpu_graph / "module.ll").write_text("")
    assert "LLVM IR" in demo.describe_dump(tmp_path)
    assert "nothing was written" in demo.describe_dump(tmp_path / "missing")


def test_resolve_dump_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHBURN_DUMP", str(tmp_path / "env"))
    assert demo.resolve_dump(str(tmp_path / "arg")) == (tmp_path / "arg", False)
    assert demo.resolve_dump(None) == (tmp_path / "env", False)
    monkeypatch.delenv("TORCHBURN_DUMP")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    folder, temporary = demo.resolve_dump(None)
    assert temporary and folder.parent == tmp_path and folder.name.startswith("torchburn-dump-")


def test_compile_split_adds_up() -> None:
    from torchburn.backend.report import GraphReport, SubgraphReport

    sub = SubgraphReport("fused_0", ["aten.addmm"], timings={"passes": 0.1, "codegen": 0.05, "llvm": 0.2})
    hit = SubgraphReport("fused_1", ["aten.gelu"], timings={"disk_load": 0.01})
    split = demo.compile_split(1.0, [GraphReport("inference", [sub, hit], import_seconds=0.5)], 0.02)
    assert split.ours == pytest.approx(0.52) and split.dynamo == pytest.approx(0.48)
    assert split.stages == pytest.approx({"passes": 0.1, "codegen": 0.05, "llvm": 0.2, "load": 0.01})
    text = "\n".join(split.lines())
    assert "Dynamo and AOTAutograd" in text and ": 480 ms" in text
    assert "TorchBurn: 520 ms: our passes 100 ms, code generation 50 ms, LLVM 200 ms" in text
    assert "the rest (partition, import to IR, caches, launchers, set-up) 160 ms" in text


def test_time_interleaved_alternates() -> None:
    order: list[str] = []
    a, b = demo.time_interleaved([lambda: order.append("a"), lambda: order.append("b")], repeats=3, inner=2)
    assert order == ["a", "a", "b", "b"] * 3
    assert len(a.samples) == len(b.samples) == 3
    assert "median of 3; min..max" in a.describe()


def _run_demo(tmp_path: Path, *args: str, **env: str) -> str:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TORCHBURN_")}
    environ.update(TMPDIR=str(tmp_path / "tmp"), TORCHBURN_CACHE_DIR=str(tmp_path / "cache"),
                   PYTHONPATH=str(ROOT), **env)
    (tmp_path / "tmp").mkdir(exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "torchburn", "demo", "--batch", "2", "--repeats", "2",
                           "--inner", "1", *args], env=environ, cwd=tmp_path, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_demo_honours_torchburn_dump_and_cleans_its_temporary_folder(tmp_path: Path) -> None:
    out = _run_demo(tmp_path, TORCHBURN_DUMP=str(tmp_path / "dump"))
    assert f"IR of every stage in {tmp_path / 'dump'}: 1 compiled graph(s)" in out
    assert "LLVM IR (module.ll)" in out and "WGSL" not in out
    assert list((tmp_path / "dump").glob("*/module.ll"))
    assert "median of 2; min..max" in out and "per repetition" in out
    assert not list((tmp_path / "tmp").glob("torchburn-dump-*"))  # no stray temporary folder

    # the first call's time split by stage, each figure a number of milliseconds
    first = int(re.search(r"first call \(compile \+ run\): (\d+) ms", out).group(1))
    dynamo = int(re.search(r"Dynamo and AOTAutograd \(.*\): (\d+) ms", out).group(1))
    ours = re.search(r"TorchBurn: (\d+) ms: our passes (\d+) ms, code generation (\d+) ms, LLVM (\d+) ms", out)
    assert ours and abs(dynamo + int(ours.group(1)) - first) <= 1, out
    assert f"the IR of every stage of it is written to {tmp_path / 'dump'}" in out

    out = _run_demo(tmp_path, "--html", str(tmp_path / "report.html"))
    assert "removed on exit" in out
    assert f"the report as a web page: {tmp_path / 'report.html'}" in out
    assert "torchburn explain" in (tmp_path / "report.html").read_text()
    assert not list((tmp_path / "tmp").glob("torchburn-dump-*"))  # created, then removed


def test_demo_on_the_gpu_engine_says_wgsl_and_software_adapter(tmp_path: Path) -> None:
    from torchburn.runtime import gpu

    if not gpu.gpu_available():
        pytest.skip(f"no WebGPU adapter: {gpu.gpu_unavailable_reason()}")
    software = demo.software_adapter_warning(gpu.gpu_info()) is not None
    out = _run_demo(tmp_path, "--keep-dump", TORCHBURN_DEVICE="gpu")
    assert "engine wgpu" in out and "WGSL compute shaders" in out
    assert "LLVM IR (module.ll)" not in out
    assert ("software renderer" in out) == software
    kept = list((tmp_path / "tmp").glob("torchburn-dump-*"))
    assert len(kept) == 1 and list(kept[0].glob("*/kernel_*.wgsl"))
