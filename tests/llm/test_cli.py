"""``python -m torchburn.llm generate|benchmark`` as a user runs them."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHBURN_DEBUG="0")
    return subprocess.run([sys.executable, "-m", "torchburn.llm", *args], input=stdin,
                          capture_output=True, text=True, env=env, timeout=300)


def test_generate_reads_stdin_and_streams(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("qwen2")
    common = ["--model", str(folder), "--eager", "--device", "cpu", "--tokens", "6",
              "--temperature", "1", "--seed", "0"]
    plain = _run("generate", *common, stdin="hello world\n")
    streamed = _run("generate", "hello world\n", "--stream", *common)
    assert plain.returncode == 0 and streamed.returncode == 0, plain.stderr + streamed.stderr
    assert plain.stdout.strip() and plain.stdout == streamed.stdout


def test_missing_model_is_a_clear_error(tmp_path: Path) -> None:
    result = _run("generate", "hi", "--model", str(tmp_path / "nothing.gguf"))
    assert result.returncode == 1
    assert "error:" in result.stderr and "does not exist" in result.stderr
    assert "Traceback" not in result.stderr


def test_benchmark_prints_the_table_and_writes_json(tiny_checkpoint, tmp_path: Path) -> None:
    import json

    _, folder = tiny_checkpoint("llama")
    out = tmp_path / "bench.json"
    result = _run("benchmark", "--model", str(folder), "--eager", "--device", "cpu",
                  "--prompt-tokens", "20", "--tokens", "5", "--repeats", "2", "--threads", "1",
                  "--json", str(out))
    assert result.returncode == 0, result.stderr
    assert "| model | size | params | quant | engine | threads | test | t/s |" in result.stdout
    assert "| pp20 |" in result.stdout and "| tg5 |" in result.stdout
    assert "time to first token" in result.stdout and "read bandwidth" in result.stdout
    report = json.loads(out.read_text())
    assert [r["test"] for r in report["results"]] == ["pp20", "tg5"]
    assert all(len(r["tokens_per_s"]) == 2 and r["mean"] > 0 for r in report["results"])
    assert report["threads"] == 1 and report["read_bandwidth_gbs"] > 0
    assert report["decode_weight_bytes"] > 0


def test_the_command_freezes_what_imports_made() -> None:
    """`run` (the `torchburn` command, `python -m torchburn.llm`) moves the objects alive at
    start out of the cyclic collector's reach (`gc.freeze`): full collections over torch's
    ~1M objects had cost ~0.1 s each before the first token."""
    code = ("import gc, torchburn.llm.cli.main as c\n"
            "c.main = lambda: print('frozen', gc.get_freeze_count()) or 0\n"
            "c.run()\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout.split()[-1]) > 100_000


def test_tune_measures_the_quantized_linears_and_keeps_the_records(tiny_checkpoint, tmp_path: Path) -> None:
    """`torchburn tune` on a tiny int4 model: each quantized linear of the prefill is measured
    (every form named), and a second run measures nothing: its graphs come from the disk
    cache, which keeps their choices."""
    _, folder = tiny_checkpoint("llama")
    env_cache = {"TORCHBURN_CACHE_DIR": str(tmp_path / "cache")}
    args = ("tune", "--model", str(folder), "--quant", "int4", "--device", "cpu", "--threads", "1",
            "--prompt-tokens", "40", "--budget", "60", "--quiet")
    first = _run_env(env_cache, *args)
    assert first.returncode == 0, first.stderr[-3000:]
    lines = [line for line in first.stdout.splitlines() if line.strip().startswith("qlinear ")]
    assert lines and all("(measured:" in line for line in lines), first.stdout
    assert all(f"{form} " in line for line in lines for form in ("auto", "rows", "panel")), lines
    second = _run_env(env_cache, *args)
    assert second.returncode == 0, second.stderr[-3000:]
    again = [line for line in second.stdout.splitlines() if line.strip().startswith("qlinear ")]
    assert "(0.0 s measuring" in second.stdout, second.stdout
    assert again == lines or "came from the disk cache: nothing was compiled" in second.stdout, second.stdout


def test_tune_rejects_a_bad_budget(tiny_checkpoint) -> None:
    _, folder = tiny_checkpoint("llama")
    result = _run("tune", "--model", str(folder), "--budget", "0")
    assert result.returncode == 2 and "--budget must be positive" in result.stderr


def _run_env(extra: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), TORCHBURN_DEBUG="0", **extra)
    return subprocess.run([sys.executable, "-m", "torchburn.llm", *args], capture_output=True, text=True,
                          env=env, timeout=600)
