"""docs/writing-a-pass.md is executable: its ```python blocks run, its files are written, and
its shell examples run with the output shown after each `torchburn-opt` command checked.

Conventions of the tutorial: a block whose first line is `# file: NAME` (or `// file: NAME`)
is a file written to the working folder; the other ```python blocks run in order as one
script there; in ```console blocks, `$ command` lines run with bash and the lines after a
`torchburn-opt` command, up to the next `$`, are its expected output.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "writing-a-pass.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```\s*$", re.S | re.M)
FILE_MARK = re.compile(r"^(?:#|//) file: (\S+)\n")


def blocks() -> list[tuple[str, str]]:
    return [(m.group(1), m.group(2)) for m in FENCE.finditer(DOC.read_text())]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tutorial")
    for _, body in blocks():
        m = FILE_MARK.match(body)
        if m:
            (d / m.group(1)).write_text(body)
    return d


def env(workdir: Path) -> dict[str, str]:
    e = dict(os.environ)
    e.pop("TORCHBURN_DUMP", None)
    e["TORCHBURN_CACHE_DIR"] = str(workdir / "cache")
    e["PYTHONPATH"] = os.pathsep.join([str(workdir), str(ROOT), e.get("PYTHONPATH", "")])
    return e


def test_tutorial_has_code() -> None:
    kinds = [k for k, _ in blocks()]
    assert kinds.count("python") >= 4 and "console" in kinds and "tbir" in kinds


def test_python_blocks_run(workdir: Path) -> None:
    script = "\n\n".join(body for kind, body in blocks() if kind == "python" and not FILE_MARK.match(body))
    (workdir / "tutorial_script.py").write_text(script)
    p = subprocess.run([sys.executable, "tutorial_script.py"], cwd=workdir, env=env(workdir),
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr


def commands() -> list[tuple[str, list[str]]]:
    out: list[tuple[str, list[str]]] = []
    for kind, body in blocks():
        if kind != "console":
            continue
        for line in body.splitlines():
            if line.startswith("$ "):
                out.append((line[2:], []))
            elif out:
                out[-1][1].append(line)
    return out


@pytest.mark.parametrize("command,expected", commands(), ids=[c for c, _ in commands()])
def test_shell_examples(workdir: Path, command: str, expected: list[str]) -> None:
    run = command
    if shutil.which("torchburn-opt") is None:  # not pip-installed: same tool through -m
        run = re.sub(r"(^|\| )torchburn-opt\b", rf"\1{sys.executable} -m torchburn.cli.opt", run)
    if "python " in run:
        run = run.replace("python ", f"{sys.executable} ", 1)
    p = subprocess.run(["bash", "-c", run], cwd=workdir, env=env(workdir), stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    if "|| echo" not in command:
        assert p.returncode == 0, p.stdout
    if command.startswith("torchburn-opt"):
        got = p.stdout.strip().splitlines()
        assert got == expected, "\n".join(got)
    elif command.startswith("ls "):
        assert p.stdout.strip().splitlines() == expected
