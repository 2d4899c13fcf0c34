"""llama.cpp and ik_llama.cpp on the same GGUF file, each in a process of its own, for
``torchburn benchmark --peers`` and ``benchmarks/bench_llm.py``.

Both peers bundle their own libllama/libggml (with the same symbol names), so one process can
hold only one of them, and neither should share a process (or its OpenMP threads) with us.
`PeerProcess` starts ``python -m torchburn.llm.cli.peers ENGINE FILE THREADS CONTEXT`` and drives it
over its standard input and output, one JSON line each way:

    -> {"test": "pp", "n": 512}          <- {"seconds": 0.41, "cpu_s": 0.80}
    -> {"test": "tg", "n": 128}          <- {"seconds": 0.62, "cpu_s": 1.21}

``pp N`` evaluates an N-token prompt as one batch from an empty cache; ``tg N`` evaluates a
one-token prompt, then N single-token steps, each on the previous step's greedy token, as
llama-bench's tests do. ``cpu_s`` is the peer process's CPU time over the test (all threads).
Neither peer is a dependency: `available()` says which are installed (llama.cpp is
``llama-cpp-python``, in the ``bench`` extra; ik_llama.cpp is ``ik-llama-cpp-python``, in ``dev``).
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

#: Peer name -> the Python module that holds it.
PEER_MODULES = {"llama.cpp": "llama_cpp", "ik_llama.cpp": "ik_llama_cpp"}


def available() -> list[str]:
    """The peers whose packages are installed, in `PEER_MODULES`' order."""
    return [name for name, module in PEER_MODULES.items() if importlib.util.find_spec(module) is not None]


def bench_prompt(n: int) -> list[int]:
    """The token ids every engine gets for an n-token prompt (the same for all of them)."""
    return [100 + (i * 7919) % 1000 for i in range(n)]


class PeerError(RuntimeError):
    """A peer process failed to start or to answer; the message holds its standard error."""


class PeerProcess:
    """One peer engine on one file in a child process; `pp(n)` and `tg(n)` return seconds,
    and `last_cpu_s` the child's CPU time over the last test."""

    def __init__(self, name: str, gguf: Path, threads: int, context: int, timeout_s: float = 600.0) -> None:
        if name not in PEER_MODULES:
            raise ValueError(f"unknown peer {name!r}; known: {', '.join(PEER_MODULES)}")
        self.name = name
        self.last_cpu_s = 0.0
        self.timeout_s = timeout_s
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "torchburn.llm.cli.peers", name, str(gguf), str(threads), str(context)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        ready = self._read()
        self.load_s = float(ready["load_s"])

    def _read(self) -> dict[str, Any]:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            err = self._proc.stderr.read() if self._proc.stderr else ""
            self._proc.wait(timeout=10)
            raise PeerError(f"{self.name} exited (status {self._proc.returncode}): {err.strip()[-2000:]}")
        answer = json.loads(line)
        if "error" in answer:
            raise PeerError(f"{self.name}: {answer['error']}")
        return answer

    def _test(self, test: str, n: int) -> float:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"test": test, "n": n}) + "\n")
        self._proc.stdin.flush()
        answer = self._read()
        self.last_cpu_s = float(answer["cpu_s"])
        return float(answer["seconds"])

    def pp(self, n: int) -> float:
        return self._test("pp", n)

    def tg(self, n: int) -> float:
        return self._test("tg", n)

    def close(self) -> None:
        if self._proc.poll() is None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def __enter__(self) -> "PeerProcess":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---- the child's side ------------------------------------------------------------------------

class _IkLlama:
    """ik_llama.cpp through the wheel's own ctypes wrappers (flash attention on, its default)."""

    def __init__(self, gguf: str, threads: int, context: int) -> None:
        import numpy as np
        from ik_llama_cpp import _ctypes_api as C
        from ik_llama_cpp._internals import IkContext, IkModel

        self._np, self._C = np, C
        self.model = IkModel(gguf, use_mmap=True)
        self.ctx = IkContext(self.model, n_ctx=context, n_threads=threads)

    def _decode(self, tokens: list[int], start: int) -> None:
        from ik_llama_cpp._internals import make_batch_range

        batch = make_batch_range(tokens, pos_start=start, logits_last=True)
        try:
            if self.ctx.decode(batch) != 0:
                raise RuntimeError(f"llama_decode failed ({len(tokens)} tokens at {start})")
        finally:
            self._C.llama_batch_free(batch)

    def pp(self, n: int) -> None:
        self.ctx.kv_cache_clear()
        self._decode(bench_prompt(n), 0)

    def tg(self, n: int) -> None:
        self.ctx.kv_cache_clear()
        self._decode([100], 0)
        vocab = self.model.n_vocab
        for pos in range(1, n + 1):
            logits = self._np.ctypeslib.as_array(self.ctx.get_logits(-1), shape=(vocab,))
            self._decode([int(logits.argmax())], pos)


class _LlamaCpp:
    """llama.cpp through llama-cpp-python's `Llama` (its batch of 512, flash attention on)."""

    def __init__(self, gguf: str, threads: int, context: int) -> None:
        from llama_cpp import Llama

        self.model = Llama(gguf, n_threads=threads, n_threads_batch=threads, n_ctx=context,
                           n_batch=512, flash_attn=True, verbose=False)

    def pp(self, n: int) -> None:
        self.model.reset()
        self.model.eval(bench_prompt(n))

    def tg(self, n: int) -> None:
        self.model.reset()
        self.model.eval([100])
        for _ in range(n):
            self.model.eval([int(self.model.scores[self.model.n_tokens - 1].argmax())])


def _serve(name: str, gguf: str, threads: int, context: int) -> int:
    # The protocol keeps its own copy of standard output; the libraries' own prints (to file
    # descriptor 1, from C) go to standard error instead of into the protocol.
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    t0 = time.perf_counter()
    try:
        engine: Any = _IkLlama(gguf, threads, context) if name == "ik_llama.cpp" else _LlamaCpp(gguf, threads, context)
    except Exception as err:  # reported to the parent, which raises PeerError with it
        out.write(json.dumps({"error": f"{type(err).__name__}: {err}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"load_s": time.perf_counter() - t0}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        run = engine.pp if request["test"] == "pp" else engine.tg
        c0, w0 = time.process_time(), time.perf_counter()
        try:
            run(int(request["n"]))
        except Exception as err:
            out.write(json.dumps({"error": f"{type(err).__name__}: {err}"}) + "\n")
            out.flush()
            return 1
        out.write(json.dumps({"seconds": time.perf_counter() - w0, "cpu_s": time.process_time() - c0}) + "\n")
        out.flush()
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    name, gguf, threads, context = (argv if argv is not None else sys.argv[1:])[:4]
    if name not in PEER_MODULES:
        print(f"unknown peer {name!r}; known: {', '.join(PEER_MODULES)}", file=sys.stderr)
        return 2
    return _serve(name, gguf, int(threads), int(context))


if __name__ == "__main__":
    raise SystemExit(main())
