"""The seed README's LLM examples and commands, run as written, offline.

They name a Hugging Face Hub model (``Qwen/Qwen2.5-0.5B-Instruct``). The tests place a tiny random
Qwen2 checkpoint in a private Hugging Face cache under that id and set ``HF_HUB_OFFLINE=1``, so
``from_pretrained("Qwen/Qwen2.5-0.5B-Instruct")`` takes the Hub path (``huggingface_hub``'s cache
lookup) exactly as a user's second run would, with no network. The Python blocks are read from
docs/seed-compatibility.md, so the page and what runs cannot drift apart.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pexpect = pytest.importorskip("pexpect")
pytest.importorskip("huggingface_hub")
ROOT = Path(__file__).resolve().parents[2]
SEED_ID = "Qwen/Qwen2.5-0.5B-Instruct"
PAGE = ROOT / "docs" / "seed-compatibility.md"
FENCE = re.compile(r"^```python\n(.*?)^```\s*$", re.S | re.M)


def seed_llm_blocks() -> list[str]:
    """The page's Python blocks that load the seed's Hub model."""
    return [code for code in FENCE.findall(PAGE.read_text()) if SEED_ID in code]


@pytest.fixture(scope="module")
def hub_env(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """An environment whose Hugging Face cache holds the tiny Qwen2 model under the seed's id."""
    _, folder = tiny_checkpoint("qwen2")
    home = tmp_path_factory.mktemp("hf_home")
    commit = "0123456789abcdef0123456789abcdef01234567"
    repo = home / "hub" / ("models--" + SEED_ID.replace("/", "--"))
    snapshot = repo / "snapshots" / commit
    shutil.copytree(folder, snapshot)
    config = json.loads((snapshot / "config.json").read_text())
    config["max_position_embeddings"] = 1024  # room for the benchmark's pp512 + tg128, as the real model has
    (snapshot / "config.json").write_text(json.dumps(config))
    (snapshot / "generation_config.json").write_text(json.dumps(
        {"max_new_tokens": 12, "do_sample": False, "eos_token_id": 2}))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    cache = tmp_path_factory.mktemp("torchburn_cache")  # shared: later processes start warm
    return dict(os.environ, PYTHONPATH=str(ROOT), HF_HOME=str(home), HF_HUB_OFFLINE="1",
                TORCHBURN_CACHE_DIR=str(cache), TORCHBURN_DEBUG="0")


def test_the_page_has_the_seeds_three_examples() -> None:
    blocks = seed_llm_blocks()
    assert len(blocks) == 3
    assert "llm.generate(" in blocks[0] and "llm.stream(" in blocks[1] and "llm.chat(" in blocks[2]


def test_seed_generate_and_stream_examples_run_as_written(hub_env: dict[str, str],
                                                          tmp_path: Path) -> None:
    """Both blocks in one process, one after the other, as a reader runs the page."""
    generate, stream = seed_llm_blocks()[:2]
    marker = "\n----\n"
    (tmp_path / "example.py").write_text(generate + f"print({marker!r})\n" + stream)
    done = subprocess.run([sys.executable, "example.py"], cwd=tmp_path, env=hub_env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    generated, streamed = done.stdout.split(marker)
    # Each printed something beyond print()'s own newline (a random model may print newlines).
    assert len(generated) > 1 and len(streamed) > 1, done.stdout


def _chat(hub_env: dict[str, str], argv: list[str], cwd: Path):  # type: ignore[no-untyped-def]
    return pexpect.spawn(sys.executable, argv, env=hub_env, cwd=str(cwd), timeout=600,
                         encoding="utf-8")


def test_seed_chat_example_runs_in_a_terminal(hub_env: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "chat.py").write_text(seed_llm_blocks()[2])
    child = _chat(hub_env, ["chat.py"], tmp_path)
    child.expect(">>> ")
    child.sendline("hello")
    child.expect(">>> ")
    assert child.before.strip()
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_seed_chat_command(hub_env: dict[str, str], tmp_path: Path) -> None:
    child = _chat(hub_env, ["-m", "torchburn.llm", "chat", "--model", SEED_ID, "--quant", "int4"],
                  tmp_path)
    child.expect(">>> ")
    child.sendline("hello")
    child.expect(">>> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def _cli(hub_env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "torchburn.llm", *args], env=hub_env,
                          capture_output=True, text=True, timeout=600)


def test_seed_generate_command_streams(hub_env: dict[str, str]) -> None:
    streamed = _cli(hub_env, "generate", "Explain neural ODEs", "--model", SEED_ID, "--stream")
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    whole = _cli(hub_env, "generate", "Explain neural ODEs", "--model", SEED_ID)
    assert whole.returncode == 0, whole.stderr[-3000:]
    assert streamed.stdout and streamed.stdout == whole.stdout  # greedy: the same text either way


def test_seed_benchmark_command(hub_env: dict[str, str]) -> None:
    done = _cli(hub_env, "benchmark", "--model", SEED_ID, "--device", "auto", "--tokens", "128")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith(f"| {SEED_ID} ")]
    assert [r.split("|")[7].strip() for r in rows] == ["pp512", "tg128"], done.stdout


def test_hub_id_offline_without_a_cache_is_a_clear_error(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HOME=str(tmp_path), HF_HUB_OFFLINE="1")
    done = subprocess.run([sys.executable, "-m", "torchburn.llm", "generate", "hi", "--model",
                           SEED_ID], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "HF_HUB_OFFLINE" in done.stderr and "Traceback" not in done.stderr
