"""The OpenAI-compatible server (`torchburn/llm/serve/`), run as users run it
(``python -m torchburn.llm serve``) on 127.0.0.1 on a free port, with a tiny generated model,
driven by the official ``openai`` client and by plain HTTP (httpx)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import pytest

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")
pytest.importorskip("starlette")
pytest.importorskip("uvicorn")

ROOT = Path(__file__).resolve().parents[2]
KEY = "sk-test-key"
NAME = "tiny"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """A ``serve`` process; ``url`` once /health answers."""

    def __init__(self, folder: Path, *args: str, startup: float = 600.0) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.log = open(folder.parent / f"serve_{self.port}.log", "w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "torchburn.llm", "serve", "--model", str(folder),
             "--model-name", NAME, "--port", str(self.port), "--quiet", *args],
            env=env, stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + startup
        while True:
            assert self.proc.poll() is None, f"the server exited:\n{self.output()}"
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, f"the server did not start:\n{self.output()}"
            time.sleep(0.25)

    def output(self) -> str:
        self.log.flush()
        self.log.seek(0)
        return self.log.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


@pytest.fixture(scope="module")
def folder(tiny_checkpoint) -> Path:
    return tiny_checkpoint("llama")[1]


@pytest.fixture(scope="module")
def server(folder: Path) -> Iterator[Server]:
    """Compiled, 4 rows, an API key, max_context 128 (short prompts: the 16-token prefill)."""
    s = Server(folder, "--parallel", "4", "--max-context", "128", "--api-key", KEY, "--no-warmup")
    yield s
    assert s.stop() == 0, s.output()


def client(server: Server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


def post(server: Server, path: str, body: object, key: str | None = KEY) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    data = body if isinstance(body, (bytes, str)) else json.dumps(body)
    return httpx.post(server.url + path, content=data, headers=headers, timeout=300)


def metrics(server: Server) -> dict[str, float]:
    out = {}
    for line in httpx.get(server.url + "/metrics", timeout=10).text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_openai_client_chat_and_completions(server: Server) -> None:
    c = client(server)
    assert [m.id for m in c.models.list().data] == [NAME]
    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "hello"}]
    whole = c.chat.completions.create(model=NAME, messages=messages, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    assert whole.choices[0].finish_reason in ("stop", "length")
    assert whole.usage.completion_tokens >= 1 and whole.usage.prompt_tokens > 5
    assert whole.usage.total_tokens == whole.usage.prompt_tokens + whole.usage.completion_tokens
    chunks = list(c.chat.completions.create(model=NAME, messages=messages, max_tokens=8,
                                            temperature=0, stream=True,
                                            stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text
    finishes = [ch.choices[0].finish_reason for ch in chunks if ch.choices and ch.choices[0].finish_reason]
    assert finishes == [whole.choices[0].finish_reason]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    done = c.completions.create(model=NAME, prompt="the quick brown", max_tokens=6, temperature=0)
    assert done.object == "text_completion" and done.usage.completion_tokens <= 6
    pieces = list(c.completions.create(model=NAME, prompt="the quick brown", max_tokens=6,
                                       temperature=0, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == done.choices[0].text
    # a stop string cuts the text; seed makes sampling repeat
    sampled = [c.completions.create(model=NAME, prompt="hello", max_tokens=12, temperature=1.0,
                                    top_p=0.9, seed=7).choices[0].text for _ in range(2)]
    assert sampled[0] == sampled[1]
    if len(text) > 2:
        cut = c.chat.completions.create(model=NAME, messages=messages, max_tokens=8,
                                        temperature=0, stop=[text[1:3]])
        assert cut.choices[0].message.content == text[:text.index(text[1:3])]
        assert cut.choices[0].finish_reason == "stop"


#: Tokens per request of `test_same_greedy_text_alone_and_beside_others`.
TOGETHER_TOKENS = 32


def test_same_greedy_text_alone_and_beside_others(server: Server, folder: Path) -> None:
    """A request's greedy answer is the same alone, beside 3 others (one batch), and from
    `LLM.generate` in this process. 32 tokens each: long enough that the four requests, which
    reach the server a few steps apart, overlap for most of their steps on a loaded machine
    (at 10 tokens, CI once decoded 40 rows in 30 steps)."""
    from torchburn.llm import LLM

    prompts = ["hello world", "the quick brown fox jumps over the lazy dog", "def add(a, b):", "Grüße"]
    c = client(server)

    def ask(p: str) -> str:
        return c.completions.create(model=NAME, prompt=p, max_tokens=TOGETHER_TOKENS, temperature=0).choices[0].text

    alone = [ask(p) for p in prompts]
    llm = LLM.from_pretrained(folder, device="cpu", max_context=128, compile=False)
    assert alone == [llm.generate(p, max_new_tokens=TOGETHER_TOKENS, temperature=0) for p in prompts]

    async def together() -> list[str]:
        ac = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
        outs = await asyncio.gather(*(ac.completions.create(model=NAME, prompt=p, max_tokens=TOGETHER_TOKENS,
                                                            temperature=0) for p in prompts))
        return [o.choices[0].text for o in outs]

    before = metrics(server)
    assert asyncio.run(together()) == alone
    after = metrics(server)
    rows = after[f'torchburn_decode_rows_total{{model="{NAME}"}}'] - before[f'torchburn_decode_rows_total{{model="{NAME}"}}']
    steps = after[f'torchburn_decode_steps_total{{model="{NAME}"}}'] - before[f'torchburn_decode_steps_total{{model="{NAME}"}}']
    assert rows > 1.5 * steps, (rows, steps)   # they were decoded together


def test_errors_have_openai_shape_and_status(server: Server) -> None:
    chat = "/v1/chat/completions"
    user = [{"role": "user", "content": "hi"}]
    cases = [
        (post(server, chat, b"{not json"), 400, None),
        (post(server, chat, {"model": NAME, "messages": [{"role": "robot", "content": "x"}]}), 400, None),
        (post(server, chat, {"model": NAME, "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://x/y.png"}}]}]}), 400, None),
        (post(server, chat, {"model": NAME, "messages": [{"role": "user", "content": 5}]}), 400, None),
        (post(server, chat, {"model": NAME, "messages": user, "n": 2}), 400, None),
        (post(server, chat, {"model": NAME, "messages": user, "tools": []}), 400, None),
        (post(server, chat, {"model": NAME, "messages": user, "temperature": "hot"}), 400, None),
        (post(server, chat, {"model": NAME, "messages": user, "max_tokens": 0}), 400, None),
        (post(server, chat, {"model": NAME, "messages": user}, key="wrong"), 401, "invalid_api_key"),
        (post(server, chat, {"model": NAME, "messages": user}, key=None), 401, "invalid_api_key"),
        (post(server, chat, {"model": "gpt-5", "messages": user}), 404, "model_not_found"),
        (post(server, chat, {"model": NAME, "messages": [{"role": "user", "content": "hello " * 200}]}),
         400, "context_length_exceeded"),
        (post(server, "/v1/completions", {"model": NAME, "prompt": [10 ** 6]}), 400, None),
        (httpx.get(server.url + "/v1/nothing", timeout=10), 404, None),
        (httpx.get(server.url + chat, timeout=10), 405, None),
    ]
    for i, (r, status, code) in enumerate(cases):
        assert r.status_code == status, (i, r.status_code, r.text)
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["message"], (i, err)
        assert "Traceback" not in r.text
        if code:
            assert err["code"] == code, (i, err)
    c = client(server)
    with pytest.raises(openai.NotFoundError):
        c.chat.completions.create(model="nope", messages=user)
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=server.url + "/v1", api_key="bad", max_retries=0).models.list()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hello " * 200}])
    assert e.value.code == "context_length_exceeded"


def test_disconnect_frees_the_row(server: Server) -> None:
    before = metrics(server)
    key = f'torchburn_requests_total{{model="{NAME}",finish_reason="cancelled"}}'
    with httpx.stream("POST", server.url + "/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                      json={"model": NAME, "prompt": "hello", "max_tokens": 100, "temperature": 0,
                            "stream": True}, timeout=60) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        assert next(line for line in lines if line.startswith("data: "))
    deadline = time.monotonic() + 30   # the client went away: cancelled at the next step
    while metrics(server)[key] == before[key]:
        assert time.monotonic() < deadline, "the row was not freed"
        time.sleep(0.1)
    assert metrics(server)[f'torchburn_running_requests{{model="{NAME}"}}'] == 0


def test_sixteen_streaming_clients(server: Server) -> None:
    """16 concurrent streams (4 rows: the rest wait and join as rows free up), bounded in time:
    each ends with a finish_reason and its usage."""
    async def one(ac: "openai.AsyncOpenAI", i: int) -> tuple[str, str, int]:
        stream = await ac.chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": f"count to {i}"}], max_tokens=16,
            temperature=0.7, seed=i, stream=True, stream_options={"include_usage": True})
        text, finish, used = "", "", -1
        async for ch in stream:
            if ch.choices:
                text += ch.choices[0].delta.content or ""
                finish = ch.choices[0].finish_reason or finish
            if ch.usage:
                used = ch.usage.completion_tokens
        return text, finish, used

    async def run() -> list[tuple[str, str, int]]:
        ac = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)
        return await asyncio.wait_for(asyncio.gather(*(one(ac, i) for i in range(16))), 300)

    t0 = time.monotonic()
    results = asyncio.run(run())
    assert all(f in ("stop", "length") for _, f, _ in results), results
    assert all(1 <= n <= 16 for _, _, n in results), results
    assert time.monotonic() - t0 < 300
    m = metrics(server)
    assert m[f'torchburn_queue_length{{model="{NAME}"}}'] == 0


def test_health_metrics_and_prefix_cache(server: Server) -> None:
    assert httpx.get(server.url + "/health", timeout=10).json() == {"status": "ok"}
    system = {"role": "system", "content": "the quick brown fox jumps over the lazy dog " * 3}
    c = client(server)
    before = metrics(server)
    for q in ("hello", "world"):
        c.chat.completions.create(model=NAME, messages=[system, {"role": "user", "content": q}],
                                  max_tokens=2, temperature=0)
    after = metrics(server)
    prompt = after[f'torchburn_prompt_tokens_total{{model="{NAME}"}}'] - before[f'torchburn_prompt_tokens_total{{model="{NAME}"}}']
    run = after[f'torchburn_prefill_tokens_total{{model="{NAME}"}}'] - before[f'torchburn_prefill_tokens_total{{model="{NAME}"}}']
    assert run < prompt - 20, (run, prompt)   # the second reused the system prompt's keys
    text = httpx.get(server.url + "/metrics", timeout=10).text
    for name in ("requests_total", "completion_tokens_total", "queue_length", "tokens_per_second",
                 "prefill_chunks_total", "prefill_chunks_beside_decode_total"):
        assert f"# TYPE torchburn_{name} " in text


def test_queue_limit_and_graceful_shutdown(folder: Path) -> None:
    """One row, one waiting place. A whole (not streamed) answer whose client gives up is
    cancelled; with a stream running and one waiting, a third request gets 503; the running
    stream's client going away frees the row for the waiting one; SIGTERM lets the running
    stream and the waiting one finish (finish_reason "length" and [DONE]) and the process
    exits 0.

    No step races a clock: each waits for what the server did (a first token, a metric), the
    requests that hold the row ask for 30000 tokens, which no machine generates while the
    test takes its next steps (they end by their clients going away), and those that must
    finish ask for 16 tokens with 600 s to do so."""
    s = Server(folder, "--parallel", "1", "--max-queue", "1", "--eager", "--max-context", "32768",
               "--shutdown-timeout", "600")
    endless = {"model": NAME, "prompt": "hello", "max_tokens": 30000, "temperature": 0}
    short = {"model": NAME, "prompt": "hello", "max_tokens": 16, "temperature": 0, "stream": True}
    cancelled = f'torchburn_requests_total{{model="{NAME}",finish_reason="cancelled"}}'

    def data(lines: Iterator[str]) -> list[str]:
        return [line for line in lines if line.startswith("data: ")]

    def finished_by_length(rest: list[str]) -> None:
        assert rest[-1] == "data: [DONE]", rest[-3:]
        last = json.loads(rest[-2][6:])
        assert last["choices"][0]["finish_reason"] == "length", (last, s.output()[-1500:])
        assert last["usage"]["completion_tokens"] == 16

    try:
        with pytest.raises(httpx.ReadTimeout):   # the client of a whole answer gives up
            httpx.post(s.url + "/v1/completions", json=endless, timeout=1.0)
        deadline = time.monotonic() + 120        # a hang guard, not a race: it is cancelled
        while metrics(s)[cancelled] < 1:
            assert time.monotonic() < deadline, "the abandoned request was not cancelled"
            time.sleep(0.1)
        with httpx.Client(base_url=s.url, timeout=120) as h:
            with h.stream("POST", "/v1/completions", json={**endless, "stream": True}) as first:
                running = first.iter_lines()     # kept: a dropped line iterator closes the stream
                assert next(line for line in running if line.startswith("data: "))
                # the response started, so the request is queued (the row is the first's)
                with h.stream("POST", "/v1/completions", json=short) as second:
                    third = httpx.post(s.url + "/v1/completions", json=short, timeout=30)
                    assert third.status_code == 503, third.text
                    assert third.json()["error"]["code"] == "queue_full"
                    first.close()                # its client goes away: the second takes the row
                    lines = second.iter_lines()
                    assert next(line for line in lines if line.startswith("data: "))
                    with h.stream("POST", "/v1/completions", json=short) as fourth:   # waits
                        s.proc.send_signal(signal.SIGTERM)
                        finished_by_length(data(lines))
                        finished_by_length(data(fourth.iter_lines()))
        assert s.proc.wait(90) == 0, s.output()
    finally:
        s.stop()


def test_the_docs_client_example(server: Server, capsys: pytest.CaptureFixture[str]) -> None:
    """docs/serve.md's client block, run as written against this server (its URL and key)."""
    import re

    text = (ROOT / "docs" / "serve.md").read_text()
    block = re.search(r"^## A client\n.*?^```python\n(.*?)^```", text, re.S | re.M)
    assert block, "docs/serve.md has no client example"
    code = block.group(1).replace("http://127.0.0.1:8000/v1", server.url + "/v1")
    code = code.replace('api_key="unused"', f'api_key="{KEY}"')
    assert server.url in code and KEY in code
    exec(compile(code, "docs/serve.md", "exec"), {"__name__": "__main__"})
    out = capsys.readouterr().out
    assert re.search(r"\d+ tokens\n$", out), out
