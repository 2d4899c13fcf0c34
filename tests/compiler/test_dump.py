"""TORCHBURN_DUMP writes every stage (FX graph included) and the loop IR says where each loop
nest came from; TORCHBURN_DEBUG=1 turns on logging."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest
import torch

from torchburn.runtime import config
from torchburn.compiler import driver
from torchburn.backend.entry import torchburn_backend
from torchburn.ir import loop as lp
from torchburn.ir.parser import parse_graph, parse_program

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture()
def dump_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setenv("TORCHBURN_DUMP", str(tmp_path / "dump"))
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    config.reload_config()
    driver.memory_cache().clear()
    torch._dynamo.reset()
    yield tmp_path / "dump"
    monkeypatch.undo()
    config.reload_config()
    driver.memory_cache().clear()


def top_loops(k: lp.Kernel) -> list[lp.For]:
    stmts = k.body.stmts if isinstance(k.body, lp.Block) else (k.body,)
    return [s for s in stmts if isinstance(s, lp.For)]


def only_folder(root: Path) -> Path:
    (folder,) = [p for p in root.iterdir() if p.is_dir()]
    return folder


def f(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = torch.exp(x) + y  # LINE-EXP
    return z.sum(dim=1)  # LINE-SUM


def line_of(marker: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, ln in enumerate(lines, 1) if ln.endswith(marker) and "def " not in ln)


def test_dump_has_every_stage_and_source_lines(dump_dir: Path) -> None:
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    torch.compile(f, backend=torchburn_backend)(x, y)
    folder = only_folder(dump_dir)
    names = sorted(p.name for p in folder.iterdir())
    assert names[:3] == ["00_fx_graph.py", "01_tensor_ir.tbir", "02_after_canonicalize.tbir"]
    assert {"program.tbir", "module.ll", "module.s"} <= set(names)
    fx = (folder / "00_fx_graph.py").read_text()
    assert "torch.ops.aten.exp.default" in fx and "test_dump.py" in fx
    graph = parse_graph((folder / "01_tensor_ir.tbir").read_text())
    assert all(op.loc and "@ " in op.loc for op in graph.ops)
    program = parse_program((folder / "program.tbir").read_text())
    exp_line, sum_line = line_of("# LINE-EXP"), line_of("# LINE-SUM")
    for k in program.kernels:
        loops = top_loops(k)
        assert loops, k.name
        for loop in loops:
            origin = loop.annotation("origin")
            assert origin, f"loop {loop.var.name} of @{k.name} has no origin"
            assert f"test_dump.py:{sum_line}" in origin
    assert any(f"test_dump.py:{exp_line}" in (lp_.annotation("origin") or "")
               for k in program.kernels for lp_ in top_loops(k))


def test_module_without_user_lines_names_the_module(dump_dir: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU())
    with torch.no_grad():
        torch.compile(model, backend=torchburn_backend)(torch.randn(2, 8))
    program = parse_program((only_folder(dump_dir) / "program.tbir").read_text())
    origins = " ".join(k.attrs[0][1] for k in program.kernels if k.attrs)
    assert "aten.addmm.default @ 0 (Linear)" in origins or "aten.mm.default @ 0 (Linear)" in origins, origins


def test_debug_logging() -> None:
    env = dict(os.environ, TORCHBURN_DEBUG="1", TORCHBURN_CACHE_DIR="off",
               PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("TORCHBURN_DUMP", None)
    code = ("import torch\nfrom torchburn.backend import torchburn_backend\n"
            "torch.compile(lambda x: x * 2 + 1, backend=torchburn_backend)(torch.randn(8))\n")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "[torchburn DEBUG] torchburn: compiled" in p.stderr
    quiet = subprocess.run([sys.executable, "-c", code], env=dict(env, TORCHBURN_DEBUG="0"), capture_output=True,
                           text=True, timeout=300)
    assert "[torchburn" not in quiet.stderr


def _compile_two_graphs() -> None:
    from tests.helpers import assert_fully_compiled, run_compiled

    for fn in (lambda x: x.exp() + 1.0, lambda x: x.tanh() * 3.0):
        x = torch.randn(4, 8)
        out, reports = run_compiled(fn, x)
        torch.testing.assert_close(out, fn(x))
        assert_fully_compiled(reports)


def _dump_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "TORCHBURN_DUMP" in r.getMessage()]


def test_unwritable_dump_folder_warns_once_and_compiles(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")  # so even root cannot create the dump folder under it
    monkeypatch.setenv("TORCHBURN_DUMP", str(blocker / "dump"))
    monkeypatch.setenv("TORCHBURN_CACHE_DIR", "off")
    config.reload_config()
    driver.memory_cache().clear()
    try:
        with caplog.at_level("WARNING", logger="torchburn"):
            _compile_two_graphs()
        assert len(_dump_warnings(caplog)) == 1, caplog.text
        assert str(blocker / "dump") in _dump_warnings(caplog)[0]
    finally:
        monkeypatch.undo()
        config.reload_config()
        driver.memory_cache().clear()


def test_full_disk_while_dumping_warns_once_and_compiles(dump_dir: Path, monkeypatch: pytest.MonkeyPatch,
                                                         caplog: pytest.LogCaptureFixture) -> None:
    real_write = Path.write_text

    def full_disk(self: Path, *args: object, **kwargs: object) -> int:
        if str(self).startswith(str(dump_dir)) and self.name != "00_fx_graph.py":
            raise OSError(28, "No space left on device")
        return real_write(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "write_text", full_disk)
    with caplog.at_level("WARNING", logger="torchburn"):
        _compile_two_graphs()
    assert len(_dump_warnings(caplog)) == 1, caplog.text
    assert "No space left" in _dump_warnings(caplog)[0]
