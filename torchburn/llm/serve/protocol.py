"""The OpenAI request bodies the server takes, checked field by field, and the response bodies
it sends (``chat.completion``, ``text_completion`` and their streamed chunks).

A field we do not implement is refused with a 400 naming it (as OpenAI refuses an unknown
argument), never accepted and ignored: tools, logprobs, penalties, ``n`` > 1 and the like.
"""
from __future__ import annotations

import math
import time
import uuid
from dataclasses import dataclass
from typing import Any, Optional, Union

from ..runtime.sampling import SamplingParams
from .errors import bad_request

#: Chat roles the chat templates know; "developer" is OpenAI's newer name for "system".
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
#: Fields that change nothing a local model does (``user`` is an end-user id for OpenAI's abuse
#: monitoring); accepted for clients that always send them.
NO_EFFECT = {"user"}
#: OpenAI's default ``max_tokens`` of /v1/completions (chat's default is the rest of the context).
COMPLETIONS_MAX_TOKENS = 16
MAX_STOPS = 4


@dataclass
class GenerationRequest:
    """What a chat or text completion request asks for, checked."""

    kind: str                                     # "chat" or "text"
    model: str
    messages: Optional[list[dict[str, str]]]      # chat
    prompt: Optional[Union[str, list[int]]]       # text: a string or token ids
    max_tokens: Optional[int]
    params: SamplingParams
    seed: Optional[int]
    stop: list[str]
    stream: bool
    include_usage: bool


def _number(body: dict[str, Any], key: str, low: float, high: float, default: float) -> float:
    value = body.get(key)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad_request(f"'{key}' must be a number; got {value!r}", key)
    if not low <= value <= high:
        raise bad_request(f"'{key}' must be between {low} and {high}; got {value}", key)
    return float(value)


def _integer(body: dict[str, Any], key: str, low: int) -> Optional[int]:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise bad_request(f"'{key}' must be an integer; got {value!r}", key)
    if value < low:
        raise bad_request(f"'{key}' must be >= {low}; got {value}", key)
    return value


def _unsupported(body: dict[str, Any], key: str, allowed: tuple[Any, ...]) -> None:
    if key in body and body[key] not in allowed:
        raise bad_request(f"'{key}' is not supported by this server (got {body[key]!r})", key)


def _stop(body: dict[str, Any]) -> list[str]:
    value = body.get("stop")
    if value is None:
        return []
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request(f"'stop' must be a string or a list of strings; got {value!r}", "stop")
    if len(stops) > MAX_STOPS:
        raise bad_request(f"'stop' takes at most {MAX_STOPS} strings; got {len(stops)}", "stop")
    return [s for s in stops if s]


def _content(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text":
                raise bad_request(f"messages[{i}].content[{j}]: content of type {kind!r} is not "
                                  "supported (only 'text')", f"messages.[{i}].content")
            if not isinstance(part.get("text"), str):
                raise bad_request(f"messages[{i}].content[{j}].text must be a string",
                                  f"messages.[{i}].content")
            texts.append(part["text"])
        return "".join(texts)
    raise bad_request(f"messages[{i}].content must be a string or a list of text parts; got "
                      f"{type(content).__name__}", f"messages.[{i}].content")


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list", "messages")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise bad_request(f"messages[{i}] must be an object", f"messages.[{i}]")
        role = m.get("role")
        if role not in ROLES:
            raise bad_request(f"messages[{i}].role: unknown role {role!r} (this server takes "
                              f"{', '.join(sorted(ROLES))})", f"messages.[{i}].role")
        extra = set(m) - {"role", "content"}
        if extra:
            raise bad_request(f"messages[{i}]: {', '.join(sorted(extra))} not supported by this "
                              "server", f"messages.[{i}]")
        out.append({"role": ROLES[role], "content": _content(m, i)})
    return out


def _prompt(body: dict[str, Any]) -> Union[str, list[int]]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]            # a batch of one
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool)
                                                   and t >= 0 for t in prompt):
        return prompt
    raise bad_request("'prompt' must be a string, a list of one string, or token ids "
                      "(batches of several prompts are not supported)", "prompt")


COMMON = {"model", "max_tokens", "temperature", "top_p", "stop", "seed", "n", "stream",
          "stream_options"} | NO_EFFECT
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens"}
TEXT_FIELDS = COMMON | {"prompt", "echo", "suffix", "logprobs", "best_of"}


def parse(body: Any, kind: str) -> GenerationRequest:
    """Check a request body of /v1/chat/completions (``kind`` "chat") or /v1/completions
    ("text"); raises `ApiError` (400) naming the first problem."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    known = CHAT_FIELDS if kind == "chat" else TEXT_FIELDS
    unknown = sorted(set(body) - known)
    if unknown:
        raise bad_request(f"unrecognized request argument supplied: {', '.join(unknown)} (not "
                          "supported by this server)", unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("you must provide a model parameter", "model")
    _unsupported(body, "n", (1, None))
    if kind == "text":
        _unsupported(body, "echo", (False, None))
        _unsupported(body, "suffix", (None, ""))
        _unsupported(body, "logprobs", (None,))
        _unsupported(body, "best_of", (1, None))
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise bad_request(f"'stream' must be a boolean; got {stream!r}", "stream")
    options = body.get("stream_options")
    include_usage = False
    if options is not None:
        if not stream:
            raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
        if not isinstance(options, dict) or set(options) - {"include_usage"}:
            raise bad_request("'stream_options' takes only 'include_usage'", "stream_options")
        include_usage = options.get("include_usage", False)
        if not isinstance(include_usage, bool):
            raise bad_request("'stream_options.include_usage' must be a boolean", "stream_options")
    max_tokens = _integer(body, "max_tokens", 1)
    if kind == "chat":
        newer = _integer(body, "max_completion_tokens", 1)
        max_tokens = newer if newer is not None else max_tokens
    elif max_tokens is None:
        max_tokens = COMPLETIONS_MAX_TOKENS
    seed = _integer(body, "seed", -(2 ** 63))
    params = SamplingParams(temperature=_number(body, "temperature", 0.0, 2.0, 1.0),
                            top_p=_number(body, "top_p", 0.0, 1.0, 1.0) or 1e-9)
    return GenerationRequest(
        kind=kind, model=model,
        messages=_messages(body) if kind == "chat" else None,
        prompt=_prompt(body) if kind == "text" else None,
        max_tokens=max_tokens, params=params,
        seed=None if seed is None else seed % (2 ** 63), stop=_stop(body),
        stream=stream, include_usage=include_usage)


# ---------------------------------------------------------------------- responses
def new_id(kind: str) -> str:
    return ("chatcmpl-" if kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def completion(kind: str, rid: str, model: str, created: int, text: str, finish: str,
               prompt_tokens: int, completion_tokens: int) -> dict[str, Any]:
    """A whole (not streamed) response."""
    if kind == "chat":
        choice: dict[str, Any] = {"index": 0, "message": {"role": "assistant", "content": text},
                                  "logprobs": None, "finish_reason": finish}
        obj = "chat.completion"
    else:
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [choice],
            "usage": usage(prompt_tokens, completion_tokens)}


def chunk(kind: str, rid: str, model: str, created: int, text: Optional[str],
          finish: Optional[str] = None, role: bool = False,
          use: Optional[dict[str, int]] = None) -> dict[str, Any]:
    """One streamed chunk: a piece of text, the role (chat's first chunk), or the finish."""
    if kind == "chat":
        delta: dict[str, Any] = {}
        if role:
            delta["role"] = "assistant"
        if text is not None:
            delta["content"] = text
        choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": None,
                                  "finish_reason": finish}
        obj = "chat.completion.chunk"
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        obj = "text_completion"
    out: dict[str, Any] = {"id": rid, "object": obj, "created": created, "model": model,
                           "choices": [choice]}
    if use is not None:
        out["usage"] = use
    return out


def usage_chunk(kind: str, rid: str, model: str, created: int, use: dict[str, int]) -> dict[str, Any]:
    """The last chunk of a stream with ``stream_options.include_usage``: no choices, the usage."""
    obj = "chat.completion.chunk" if kind == "chat" else "text_completion"
    return {"id": rid, "object": obj, "created": created, "model": model, "choices": [],
            "usage": use}


def now() -> int:
    return int(time.time())
