"""`explain(..., html=...)`: the report as an HTML page with the FX graph, the subgraphs and
their kernels (each timed), what ran in PyTorch and why; it renders in headless Chromium
(Debian's `chromium`, which `.ci/run` installs) with no console message."""
from __future__ import annotations

import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
import torch

import torchburn

pytest.importorskip("jinja2")


class _Text(HTMLParser):
    """The page's visible text, and the text of each `<pre>` (the FX code)."""

    def __init__(self) -> None:
        super().__init__()
        self.text: list[str] = []
        self.pre: list[str] = []
        self._in_pre = False

    def handle_starttag(self, tag: str, attrs: list) -> None:  # type: ignore[type-arg]
        self._in_pre |= tag == "pre"

    def handle_endtag(self, tag: str) -> None:
        if tag == "pre":
            self._in_pre = False

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._in_pre:
            self.pre.append(data)


def _mlp() -> tuple[torch.nn.Module, torch.Tensor]:
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32))
    return model, torch.randn(8, 64)


def _fallback(x: torch.Tensor) -> torch.Tensor:
    y = torch.sin(x) * 2
    return torch.fft.fft(y).real + 1  # complex: no lowering, runs in PyTorch


@pytest.fixture(scope="module")
def pages(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("explain_html")
    model, x = _mlp()
    torchburn.explain(model, x, html=out / "mlp.html")
    torchburn.explain(_fallback, torch.randn(16), html=str(out / "fallback.html"))
    return {"mlp": out / "mlp.html", "fallback": out / "fallback.html"}


def _parsed(path: Path) -> _Text:
    p = _Text()
    p.feed(path.read_text(encoding="utf-8"))
    return p


def test_the_page_shows_the_fx_graph_the_kernels_and_their_times(pages: dict[str, Path]) -> None:
    page = _parsed(pages["mlp"])
    text = " ".join(page.text)
    assert "torchburn explain: 1 Dynamo graph(s)" in text
    fx = "".join(page.pre)
    assert "def forward" in fx and "gelu" in fx and "linear" in fx
    kernels = re.findall(r"(k\d+): aten\.[^<]*?@", text)
    assert len(kernels) >= 2, text
    times = re.findall(r"(\d+\.\d{3}) ms", pages["mlp"].read_text())
    assert times and all(float(t) >= 0 for t in times)
    assert re.search(r"\d+ kernel\(s\) timed one by one in the explained call", text)


def test_the_page_says_what_ran_in_pytorch_and_why(pages: dict[str, Path]) -> None:
    text = " ".join(_parsed(pages["fallback"]).text)
    assert "fft" in text and re.search(r"ran in PyTorch: .*fft|fft.*(no lowering|complex)", text, re.S), text


def test_text_from_the_graph_is_escaped(tmp_path: Path) -> None:
    def f(x: torch.Tensor) -> torch.Tensor:
        return x * 2 + 1

    torchburn.explain(f, torch.randn(4), html=tmp_path / "r.html")
    page = (tmp_path / "r.html").read_text()
    assert "<script" not in page  # no script at all: nothing to fail in a browser
    from torchburn.backend import explain_html
    from torchburn.backend.explainer import ExplainReport

    report = ExplainReport([], fx_graphs=["x = '<script>alert(1)</script>'"])
    assert "<script>alert" not in explain_html.render(report)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in explain_html.render(report)


def test_an_unwritable_path_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(OSError, match="cannot write the report"):
        torchburn.explain(lambda x: x + 1, torch.randn(3), html=tmp_path / "missing" / "r.html")


def _chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip("headless Chromium is not installed (apt-get install chromium; .ci/run does)")
    return found


def _render(chromium: str, page: Path, tmp_path: Path) -> tuple[str, list[str]]:
    """(the DOM Chromium built, its console messages)."""
    done = subprocess.run([chromium, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr",
                           "--v=0", "--dump-dom", page.resolve().as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def test_chromium_renders_the_pages_with_no_console_message(pages: dict[str, Path], tmp_path: Path) -> None:
    chromium = _chromium()
    bad = tmp_path / "bad.html"  # the check itself: a page with an error is caught
    bad.write_text("<!DOCTYPE html><html><body><script>undefined_function();</script></body></html>")
    assert any("undefined_function" in line for line in _render(chromium, bad, tmp_path)[1])
    for name, page in pages.items():
        dom, console = _render(chromium, page, tmp_path)
        assert console == [], f"{name}: {console}"
        assert '<p id="summary">torchburn explain:' in dom
        assert "FX graphs" in dom and "Kernel times" in dom


def test_without_jinja2_it_says_so_before_compiling(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "jinja2", None)
    compiled: list[int] = []

    def f(x: torch.Tensor) -> torch.Tensor:
        compiled.append(1)
        return x + 1

    with pytest.raises(ImportError, match="renders with jinja2"):
        torchburn.explain(f, torch.randn(3), html=tmp_path / "r.html")
    assert compiled == [] and not (tmp_path / "r.html").exists()
