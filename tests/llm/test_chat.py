"""The interactive chat in a real pseudo-terminal: two turns, /reset, Ctrl-C during an answer,
/exit."""
from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")
ROOT = Path(__file__).resolve().parents[2]


def _spawn(folder: Path, *extra: str):  # type: ignore[no-untyped-def]
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHBURN_DEBUG="0")
    args = ["-m", "torchburn.llm", "chat", "--model", str(folder), "--eager", "--device", "cpu",
            "--temperature", "1", "--seed", "0", *extra]
    return pexpect.spawn(sys.executable, args, env=env, timeout=180, encoding="utf-8")


def test_two_turns_reset_and_exit(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")
    child = _spawn(folder, "--tokens", "6", "--system", "Be brief.")
    child.expect("torchburn chat")
    child.expect(">>> ")
    child.sendline("hello there")
    child.expect(">>> ")
    first = child.before
    child.sendline("and again")
    child.expect(">>> ")
    child.sendline("/reset")
    child.expect(r"\[conversation reset\]")
    child.expect(">>> ")
    child.sendline("hello there")
    child.expect(">>> ")
    assert child.before.split("\n", 1)[-1] == first.split("\n", 1)[-1]  # same answer after reset
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _without_end_of_sequence(folder: Path, into: Path) -> Path:
    """A copy of the checkpoint that names no end-of-sequence token: the random tiny model
    otherwise samples one within a few dozen tokens, and an answer that has already ended
    cannot be interrupted (a race with the Ctrl-C that the test lost on a loaded machine)."""
    shutil.copytree(folder, into)
    for name in ("config.json", "generation_config.json"):
        path = into / name
        if path.exists():
            cfg = json.loads(path.read_text())
            cfg.pop("eos_token_id", None)
            path.write_text(json.dumps(cfg))
    tok = json.loads((into / "tokenizer_config.json").read_text())
    tok["eos_token"] = "<|no-such-token|>"
    (into / "tokenizer_config.json").write_text(json.dumps(tok))
    return into


def test_ctrl_c_stops_the_answer_not_the_chat(tiny_checkpoint, tmp_path: Path) -> None:
    _, folder = tiny_checkpoint("qwen2")
    folder = _without_end_of_sequence(folder, tmp_path / "no_eos")
    child = _spawn(folder, "--tokens", "3500", "--max-context", "4096")
    child.expect(">>> ")
    child.sendline("tell me a long story")
    child.expect("story\r\n")       # our line, echoed
    child.expect(r"\S\S")            # the answer has started streaming
    child.sendintr()
    child.expect(r"\[stopped\]", timeout=60)
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0
