"""`pip install .` (not editable) gives a working install: the wheel holds every module of the
source tree and its entry points, and the README's example runs from the installed copy, from a
folder outside the repository."""
from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # No build isolation and no dependencies: the test environment already has setuptools, and
    # the suite must not need the network.
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                           "-q", "-w", str(out), str(ROOT)], capture_output=True, text=True,
                          timeout=600, cwd=out)
    if done.returncode != 0 and "No module named pip" in done.stderr:
        pytest.skip("pip is not available in this environment")
    assert done.returncode == 0, done.stderr[-3000:]
    (found,) = out.glob("torchburn-*.whl")
    return found


def test_wheel_holds_every_module_and_the_entry_points(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    source = {p.relative_to(ROOT).as_posix() for p in (ROOT / "torchburn").rglob("*.py")}
    assert source - names == set(), "modules missing from the wheel"
    (entry,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
    text = zipfile.ZipFile(wheel).read(entry).decode()
    for line in ("torchburn = torchburn.backend:torchburn_backend", "torchburn-opt = torchburn.cli.opt:main",
                 "torchburn = torchburn.llm.cli.main:run"):
        assert line in text, f"entry point {line!r} missing"
    (metadata,) = [n for n in names if n.endswith(".dist-info/METADATA")]
    meta = zipfile.ZipFile(wheel).read(metadata).decode()
    assert re.search(r"^License: Apache-2.0$", meta, re.M) or "Apache" in meta
    assert "Provides-Extra: llm" in meta and "Provides-Extra: all" in meta


def test_installed_copy_runs_the_readme_example_from_outside(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target",
                           str(target), str(wheel)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    readme = (ROOT / "README.md").read_text()
    example = re.search(r"^```python\n(.*?)^```", readme, re.S | re.M)
    assert example, "the README has a python example"
    script = tmp_path / "work" / "example.py"
    script.parent.mkdir()
    script.write_text("import torchburn, sys\n"
                      f"assert torchburn.__file__.startswith({str(target)!r}), torchburn.__file__\n"
                      + example.group(1))
    env = dict(os.environ, PYTHONPATH=str(target), TORCHBURN_CACHE_DIR="off")
    ran = subprocess.run([sys.executable, str(script)], cwd=script.parent, env=env,
                         capture_output=True, text=True, timeout=600)
    assert ran.returncode == 0, ran.stderr[-3000:]
