"""Progress the user can see (`torchburn.llm.model.progress`): slow steps announced through logging,
fast ones silent, the command's ``--quiet``."""
from __future__ import annotations

import logging
import re
import time

import pytest
import torch

from torchburn.llm.cli import main as cli

from torchburn.llm.model import progress


@pytest.fixture
def restore_progress():  # type: ignore[no-untyped-def]
    yield
    if progress._handler is not None:
        progress.log.removeHandler(progress._handler)
        progress._handler = None
    progress.log.propagate = True
    progress.log.setLevel(logging.NOTSET)
    progress.set_quiet(False)


def test_a_slow_step_is_announced_and_its_end_reported(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torchburn.progress")
    with progress.Step("compiling the decode step", after=0.05) as step:
        time.sleep(0.3)
        step.note = "7 kernels"
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == "torchburn: compiling the decode step ..."  # while it ran
    assert lines[1].startswith("torchburn: compiling the decode step: done (7 kernels, 0.")
    assert step.seconds >= 0.3


def test_a_fast_step_says_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="torchburn.progress")
    with progress.Step("reading the decode step from the disk cache", after=5.0):
        pass
    assert caplog.records == []


def test_bars_count_bytes_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch, capsys, restore_progress) -> None:  # type: ignore[no-untyped-def]
    items = [b"x" * 3000, b"y" * 5000]
    monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
    got = list(progress.progress(items, "loading", total=8000, size=len))
    assert got == items
    err = capsys.readouterr().err
    assert "loading" in err and "7.81k" in err  # 8000 B in KiB units: tqdm's unit_divisor 1024
    progress.set_quiet(True)
    assert list(progress.progress(items, "loading", total=8000, size=len)) == items
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("quiet", [False, True])
def test_the_command_shows_compiling_unless_quiet(tiny_checkpoint, capsys, monkeypatch: pytest.MonkeyPatch,
                                                   restore_progress, quiet: bool) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(progress, "ANNOUNCE_AFTER_S", 0.0)  # every step counts as slow here
    _, folder = tiny_checkpoint("llama")
    capsys.readouterr()  # the fixture's own output
    args = ["generate", "hello", "--model", str(folder), "--device", "cpu", "--tokens", "3",
            "--threads", "1"] + (["--quiet"] if quiet else [])
    threads = torch.get_num_threads()
    try:
        assert cli.main(args) == 0
    finally:  # `--threads 1` sets torch's count for the process: later tests in this worker count on it
        torch.set_num_threads(threads)
    err = capsys.readouterr().err
    if quiet:
        assert err == ""
        return
    assert re.search(r"^torchburn: compiling the prefill step \(\d+ tokens; 2 layers\) \.\.\.$", err, re.M)
    done = re.search(r"^torchburn: compiling the decode step \(2 layers\): done \(1 graph, (\d+) distinct kernels, "
                     r"\d+\.\d s\)$", err, re.M)
    assert done and int(done.group(1)) > 0, err
    assert "disk cache" not in err  # off in the tests: nothing is read from it
