"""The OpenAI-compatible HTTP API as a Starlette application over a `Scheduler`.

Routes: ``POST /v1/chat/completions``, ``POST /v1/completions`` (server-sent events with
``"stream": true``), ``GET /v1/models`` (and ``/v1/models/{id}``), ``GET /health``,
``GET /metrics``.  Every error is OpenAI's JSON error shape (`errors.py`), never a traceback.
A streaming client that goes away cancels its request: its row is freed at the next step.
"""
from __future__ import annotations

import asyncio
import collections
import json
import logging
import threading
from typing import TYPE_CHECKING, Any, AsyncIterator, Optional

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from ..model.chat_template import ChatTemplateError
from ..runtime.scheduler import Finish, QueueFull, Request as GenRequest, ShuttingDown, Text
from . import protocol
from .errors import ApiError, bad_request
from .metrics import render_metrics

if TYPE_CHECKING:
    from ..runtime.engine import LLM
    from ..runtime.scheduler import Event, Scheduler

log = logging.getLogger("torchburn")

#: Request bodies larger than this are refused (413) before parsing.
MAX_BODY = 8 << 20
#: Seconds between checks that the client of a whole (not streamed) response is still there.
DISCONNECT_POLL = 0.5


class Outbox:
    """Events from the scheduler's thread to the requests' queues on the event loop, with one
    wake-up of the loop (`call_soon_threadsafe`: a write to its self-pipe, then the loop's
    thread taking the GIL) for all the events emitted before the loop gets to them: a decode
    turn's tokens of every running stream arrive together instead of one wake-up each."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self._items: collections.deque[tuple[asyncio.Queue[Event], Event]] = collections.deque()
        self._lock = threading.Lock()
        self._woken = False          # a delivery is scheduled and has not yet taken the items

    def put(self, queue: "asyncio.Queue[Event]", event: "Event") -> None:
        """(any thread) ``event`` for ``queue``, delivered on the loop's thread."""
        with self._lock:
            self._items.append((queue, event))
            if self._woken:
                return
            self._woken = True
        self.loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            items, self._items = self._items, collections.deque()
            self._woken = False
        for queue, event in items:
            queue.put_nowait(event)


class ServerState:
    """What the routes share: the model, its scheduler, its public name and the key."""

    def __init__(self, llm: "LLM", scheduler: "Scheduler", model_name: str,
                 api_key: Optional[str] = None) -> None:
        self.llm = llm
        self.scheduler = scheduler
        self.model_name = model_name
        self.api_key = api_key
        self.created = protocol.now()
        self.draining = False
        self._outbox: Optional[Outbox] = None

    def outbox(self) -> Outbox:
        """The event loop's `Outbox` (made by its first request, on the loop's thread)."""
        loop = asyncio.get_running_loop()
        if self._outbox is None or self._outbox.loop is not loop:
            self._outbox = Outbox(loop)
        return self._outbox


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status)


def _check_key(state: ServerState, request: Request) -> None:
    if state.api_key is None:
        return
    header = request.headers.get("authorization", "")
    if header != f"Bearer {state.api_key}":
        raise ApiError(401, "Incorrect API key provided." if header else
                       "You didn't provide an API key (Authorization: Bearer KEY).",
                       code="invalid_api_key")


async def _body(request: Request) -> Any:
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise ApiError(413, f"the request body is {len(raw)} bytes; the limit is {MAX_BODY}")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError) as e:
        raise bad_request(f"the request body is not valid JSON: {e}") from None


def _prompt_ids(state: ServerState, req: protocol.GenerationRequest) -> list[int]:
    llm = state.llm
    if req.kind == "chat":
        if not llm.tokenizer.chat_template:
            raise bad_request("this model has no chat template; use /v1/completions", "messages")
        try:
            return llm.encode_prompt(req.messages)  # type: ignore[arg-type]
        except ChatTemplateError as e:
            raise bad_request(f"the chat template failed on these messages: {e}", "messages") from None
    if isinstance(req.prompt, str):
        return llm.tokenizer.encode(req.prompt)
    vocab = llm.config.vocab_size
    bad = [t for t in req.prompt or [] if t >= vocab]
    if bad:
        raise bad_request(f"token id {bad[0]} is outside the vocabulary ({vocab} tokens)", "prompt")
    return list(req.prompt or [])


def _fit(state: ServerState, ids: list[int], max_tokens: Optional[int]) -> int:
    """The token budget, or a 400 ``context_length_exceeded`` when the prompt leaves no room."""
    context = state.llm.max_context
    if not ids:
        raise bad_request("the prompt is empty (no tokens)", "messages")
    if len(ids) >= context:
        raise bad_request(f"This model's maximum context length is {context} tokens. However, "
                          f"your messages resulted in {len(ids)} tokens (at least one more is "
                          "needed for the answer).", "messages", "context_length_exceeded")
    return min(max_tokens or context, context - len(ids))


async def generate(request: Request) -> Response:
    state: ServerState = request.app.state.server
    kind = "chat" if request.url.path.endswith("/chat/completions") else "text"
    _check_key(state, request)
    req = protocol.parse(await _body(request), kind)
    if req.model != state.model_name:
        raise ApiError(404, f"The model '{req.model}' does not exist (this server serves "
                       f"'{state.model_name}').", param="model", code="model_not_found")
    ids = _prompt_ids(state, req)
    budget = _fit(state, ids, req.max_tokens)
    events: asyncio.Queue[Event] = asyncio.Queue()
    outbox = state.outbox()

    def emit(event: "Event") -> None:  # on the scheduler's thread
        outbox.put(events, event)

    job = GenRequest(prompt_ids=ids, max_tokens=budget, params=req.params, emit=emit,
                     seed=req.seed, stop=req.stop)
    try:
        state.scheduler.submit(job)
    except QueueFull as e:
        raise ApiError(503, str(e), code="queue_full") from None
    except ShuttingDown as e:
        raise ApiError(503, str(e), code="shutting_down") from None
    rid, created = protocol.new_id(kind), protocol.now()
    if req.stream:
        return StreamingResponse(_stream(state, req, job, events, rid, created),
                                 media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
    return await _whole(state, req, job, events, rid, created, request)


async def _whole(state: ServerState, req: protocol.GenerationRequest, job: GenRequest,
                 events: "asyncio.Queue[Event]", rid: str, created: int,
                 request: Request) -> Response:
    pieces: list[str] = []
    loop = asyncio.get_running_loop()
    check = loop.time() + DISCONNECT_POLL
    try:
        while True:
            try:
                event: Optional[Event] = await asyncio.wait_for(events.get(), DISCONNECT_POLL)
            except asyncio.TimeoutError:
                event = None
            if loop.time() >= check:
                check = loop.time() + DISCONNECT_POLL
                if await request.is_disconnected():   # nobody waits for the answer any more
                    job.cancel()
            if event is None:
                continue
            if isinstance(event, Text):
                pieces.append(event.text)
                continue
            if event.reason == "error":
                raise ApiError(503 if "shutting down" in (event.error or "") else 500,
                               event.error or "generation failed")
            body = protocol.completion(req.kind, rid, state.model_name, created, "".join(pieces),
                                       event.reason, event.prompt_tokens, event.completion_tokens)
            return JSONResponse(body)
    finally:
        job.cancel()   # a client gone (the task cancelled) frees its row; no-op once finished


async def _stream(state: ServerState, req: protocol.GenerationRequest, job: GenRequest,
                  events: "asyncio.Queue[Event]", rid: str, created: int) -> AsyncIterator[bytes]:
    name = state.model_name

    def sse(obj: Any) -> bytes:
        return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n".encode()

    # a text chunk is this request's one JSON text with only the piece changing: rendered once
    # around a placeholder, then per token only the piece is encoded (the same bytes as `sse`)
    head, _, tail = json.dumps(protocol.chunk(req.kind, rid, name, created, "\0"),
                               ensure_ascii=False).rpartition('"\\u0000"')  # the text is last
    head, tail = "data: " + head, tail + "\n\n"
    dumps = json.dumps
    try:
        if req.kind == "chat":
            yield sse(protocol.chunk("chat", rid, name, created, "", role=True))
        while True:
            event = await events.get()
            if type(event) is Text:
                yield (head + dumps(event.text, ensure_ascii=False) + tail).encode()
                continue
            assert isinstance(event, Finish)
            use = protocol.usage(event.prompt_tokens, event.completion_tokens)
            if event.reason == "error":
                yield sse(ApiError(500, event.error or "generation failed").body())
            else:
                yield sse(protocol.chunk(req.kind, rid, name, created, None, event.reason, use=use))
                if req.include_usage:
                    yield sse(protocol.usage_chunk(req.kind, rid, name, created, use))
            yield b"data: [DONE]\n\n"
            return
    finally:
        job.cancel()   # the client went away mid-stream: free the row at the next step


async def models(request: Request) -> Response:
    state: ServerState = request.app.state.server
    _check_key(state, request)
    entry = {"id": state.model_name, "object": "model", "created": state.created,
             "owned_by": "torchburn"}
    wanted = request.path_params.get("model_id")
    if wanted is not None:
        if wanted != state.model_name:
            raise ApiError(404, f"The model '{wanted}' does not exist.", param="model",
                           code="model_not_found")
        return JSONResponse(entry)
    return JSONResponse({"object": "list", "data": [entry]})


async def health(request: Request) -> Response:
    state: ServerState = request.app.state.server
    if state.draining:
        return JSONResponse({"status": "shutting down"}, status_code=503)
    return JSONResponse({"status": "ok"})


async def metrics(request: Request) -> Response:
    state: ServerState = request.app.state.server
    return PlainTextResponse(render_metrics(state.scheduler, state.model_name),
                             media_type="text/plain; version=0.0.4")


async def _api_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ApiError)
    return _error(exc)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    what = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on "
            f"{request.url.path}"}.get(exc.status_code, str(exc.detail))
    return _error(ApiError(exc.status_code, what))


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.exception("torchburn: internal error on %s", request.url.path, exc_info=exc)
    return _error(ApiError(500, f"internal error: {type(exc).__name__}"))


def create_app(state: ServerState) -> Starlette:
    routes = [
        Route("/v1/chat/completions", generate, methods=["POST"]),
        Route("/v1/completions", generate, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/models/{model_id:path}", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    app = Starlette(routes=routes, exception_handlers={
        ApiError: _api_error, HTTPException: _http_error, Exception: _internal_error})
    app.state.server = state
    return app
