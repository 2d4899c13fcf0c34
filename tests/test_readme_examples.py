"""Every ```python block of README.md, and of the docs/ pages it links, runs as written, from a
folder outside the repository: a documented example that breaks fails CI.

The blocks of one page run in order in one fresh process, sharing one namespace (a page reads
top to bottom like a notebook). A block preceded by the line
`<!-- doc-test: skip: REASON -->` is not run; the reason must say why (it needs a GPU or the
network, or it is generated output or a signature listing rather than an example).
docs/writing-a-pass.md is run by tests/test_docs_tutorial.py, which also writes its files and
checks its console output.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```\s*$", re.S | re.M)
SKIP = re.compile(r"<!-- doc-test: skip: (.+?) -->\s*$")
RUN_ELSEWHERE = {"docs/writing-a-pass.md": "tests/test_docs_tutorial.py"}

RUNNER = r"""
import json, sys
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for where, code in blocks:
    print(f"--- running {where}", flush=True)
    exec(compile(code, where.rsplit(":", 1)[0], "exec"), namespace)
"""


def linked_pages() -> list[str]:
    """README.md and every docs/*.md page it names."""
    named = re.findall(r"\b(docs/[\w.-]+\.md)\b", (ROOT / "README.md").read_text())
    return ["README.md", *dict.fromkeys(p for p in named if (ROOT / p).exists())]


def python_blocks(page: str) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(blocks to run as (`page:line`, code), skipped blocks as (`page:line`, reason))."""
    text = (ROOT / page).read_text()
    run, skipped = [], []
    for m in FENCE.finditer(text):
        if m.group(1) != "python":
            continue
        line = text.count("\n", 0, m.start()) + 1
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        if skip:
            skipped.append((f"{page}:{line}", skip.group(1)))
        else:
            run.append((f"{page}:{line + 1}", "\n" * line + m.group(2)))  # tracebacks show the page's lines
    return run, skipped


def test_the_readme_links_the_docs_and_has_examples() -> None:
    pages = linked_pages()
    assert "docs/quantization.md" in pages and "docs/architecture.md" in pages
    assert python_blocks("README.md")[0], "the README's example must be a ```python block"


def test_skipped_blocks_say_why() -> None:
    for page in linked_pages():
        for where, reason in python_blocks(page)[1]:
            assert len(reason.split()) >= 3, f"{where}: give the reason a block is not run"


@pytest.mark.parametrize("page", [p for p in linked_pages() if p not in RUN_ELSEWHERE])
def test_python_blocks_run_as_written(page: str, tmp_path: Path) -> None:
    blocks, _ = python_blocks(page)
    if not blocks:
        pytest.skip(f"{page} has no ```python block to run")
    (tmp_path / "blocks.json").write_text(json.dumps(blocks))
    (tmp_path / "run.py").write_text(RUNNER)
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    done = subprocess.run([sys.executable, "run.py", "blocks.json"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{page}: a documented example fails\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"


def test_ci_runs_the_readmes_set_up_and_test_blocks() -> None:
    """`.ci/run` reads its commands from the README (so they cannot drift apart) and runs
    them in a fresh virtual environment; this checks it extracts the README's blocks."""
    script = (ROOT / ".ci" / "run").read_text()
    assert "python3 -m venv" in script
    function = script[script.index("readme_block() {"):]
    function = function[:function.index("\n}\n") + 3]
    readme = (ROOT / "README.md").read_text()
    for heading, must in (("## Set-up", "pip install"), ("## Tests", "pytest")):
        done = subprocess.run(["bash", "-c", function + f'readme_block "{heading}"'], cwd=ROOT,
                              capture_output=True, text=True, check=True)
        lines = done.stdout.splitlines()
        assert lines and any(must in ln for ln in lines), (heading, done.stdout)
        section = readme.split(heading + "\n", 1)[1]
        assert all(ln in section.split("```")[1] for ln in lines)
