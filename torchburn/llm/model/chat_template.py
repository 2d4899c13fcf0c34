"""Chat templates: the model's own Jinja template, rendered in jinja2's immutable sandbox, with
bounds on time and size.

A template comes from the model (``tokenizer_config.json``, ``chat_template.jinja`` or the GGUF
key ``tokenizer.chat_template``) and is untrusted text: the sandbox refuses attribute access
to Python internals (``__class__``, ``__globals__``, ...) and mutation of the inputs
(jinja2 >= 3.1.6: earlier 3.1 releases have known sandbox escapes).  The sandbox does not bound
work, so a rendering here also has (`TemplateLimits`, `DEFAULT_LIMITS`):

- a **time limit** (``seconds``, default 2 s): checked on every line the template's compiled
  code runs (a trace function set for the rendering thread only, on template frames only), so
  loops with or without output stop;
- an **output limit** (``max_chars``, default 4,000,000 characters), checked as the output is
  produced; the same bound caps every string built by repetition (``'x' * n``), ``%``/format
  widths, and integer arguments of filters and methods (``center``, ``ljust``, ...);
- ``range`` capped at ``max_range`` items (default 100,000) and list/tuple repetition too;
  ``**`` refused beyond ``max_pow_bits`` result bits (default 4,096), which ``7 ** (10 ** 9)``
  would otherwise compute for minutes.

Every failure, refusal, recursion too deep (a recursive macro) or exception of the template is a
`ChatTemplateError` that names its cause.  ``render_chat(..., limits=TemplateLimits(...))``
and ``LLM.template_limits`` raise the bounds.  The environment offers what Hugging Face
templates expect: ``trim_blocks``/``lstrip_blocks``, ``loop controls``, ``raise_exception``,
``strftime_now`` and a ``tojson`` filter.
"""
from __future__ import annotations

import functools
import json
import re
import sys
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any, Callable, Optional, Sequence

Message = dict[str, Any]


class ChatTemplateError(ValueError):
    """A template that is missing, does not parse, or failed (or was refused) while rendering."""


@dataclass(frozen=True)
class TemplateLimits:
    """Bounds on one rendering (module docstring); raise them for unusual templates."""

    seconds: float = 2.0
    max_chars: int = 4_000_000
    max_range: int = 100_000
    max_pow_bits: int = 4096


DEFAULT_LIMITS = TemplateLimits()


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the chat template raised: {message}")


def _tojson(value: Any, indent: Optional[int] = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


#: A width or precision in a format string (``%9999999d``, ``{:>9999999}``): digit runs.
_NUMBER = re.compile(r"\d+")


class _Bounds:
    """The checks of one rendering (the environment's hooks read the current one)."""

    def __init__(self, limits: TemplateLimits) -> None:
        self.limits = limits
        self.deadline = time.monotonic() + limits.seconds

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the chat template ran longer than its time limit of "
                                    f"{self.limits.seconds:g} s (TemplateLimits.seconds)")

    def check_int(self, value: Any, what: str) -> None:
        if type(value) is int and abs(value) > self.limits.max_chars:
            raise ChatTemplateError(f"the chat template passed {value} to {what}, above the output "
                                    f"limit of {self.limits.max_chars} (TemplateLimits.max_chars)")

    def check_format(self, fmt: Any, what: str) -> None:
        if isinstance(fmt, str):
            for m in _NUMBER.finditer(fmt):
                if len(m.group()) > 7 or int(m.group()) > self.limits.max_chars:
                    raise ChatTemplateError(f"the chat template's {what} has a width of {m.group()}, "
                                            f"above the output limit of {self.limits.max_chars}")

    def repeat(self, seq: Any, n: Any) -> None:
        """``seq * n`` of a string, list or tuple stays within the limits."""
        if type(n) is not int or not isinstance(seq, (str, list, tuple)):
            return
        cap = self.limits.max_chars if isinstance(seq, str) else self.limits.max_range
        if len(seq) * max(n, 0) > cap:
            kind = "string" if isinstance(seq, str) else "list"
            raise ChatTemplateError(f"the chat template repeats a {kind} of {len(seq)} to "
                                    f"{len(seq) * n} items, above the limit of {cap}")

    def replaced(self, text: str, old: str, new: str) -> None:
        """``text.replace(old, new)`` stays within the output limit (checked before it runs)."""
        hits = text.count(old) if old else len(text) + 1
        if len(text) + hits * max(len(new) - len(old), 0) > self.limits.max_chars:
            raise ChatTemplateError(f"the chat template's replace() would pass the output limit of "
                                    f"{self.limits.max_chars} characters")

    def power(self, base: Any, exp: Any) -> None:
        if type(base) is int and type(exp) is int and exp > 0 and abs(base) > 1:
            bits = exp * abs(base).bit_length()
            if bits > self.limits.max_pow_bits:
                raise ChatTemplateError(f"the chat template computes {base} ** {exp} (about {bits} bits), "
                                        f"above the limit of {self.limits.max_pow_bits} bits")


#: The bounds of the rendering running on this thread (`_generate` sets them).
_local = threading.local()


def _bounds() -> _Bounds:
    b = getattr(_local, "bounds", None)
    if b is None:  # rendered outside render_chat (no limits given): the defaults
        b = _Bounds(DEFAULT_LIMITS)
    return b


def _bounded_range(*args: Any) -> range:
    b = _bounds()
    try:
        r = range(*args)
    except (TypeError, ValueError) as e:
        raise ChatTemplateError(f"the chat template called range{args}: {e}") from None
    if len(r) > b.limits.max_range:
        raise ChatTemplateError(f"the chat template asked for range{args} of {len(r)} items, above "
                                f"the limit of {b.limits.max_range} (TemplateLimits.max_range)")
    return r


def _checked_filter(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """A filter whose integer arguments are bounded (``center(10**10)``) and whose format
    strings have bounded widths."""
    @functools.wraps(fn)  # keeps jinja's pass_context/pass_environment marks
    def run(*args: Any, **kwargs: Any) -> Any:
        b = _bounds()
        b.check_time()
        for a in (*args, *kwargs.values()):
            b.check_int(a, f"the filter {name!r}")
        if name == "format" and args:
            b.check_format(next((a for a in args if isinstance(a, str)), None), "format filter")
        return fn(*args, **kwargs)

    return run


def _environment() -> Any:
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedEnvironment(ImmutableSandboxedEnvironment):
        """The sandbox, with repetition, powers, formats and calls bounded (`_Bounds`)."""

        intercepted_binops = frozenset({"*", "**", "%"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            b = _bounds()
            b.check_time()
            if operator == "*":
                b.repeat(left, right)
                b.repeat(right, left)
            elif operator == "**":
                b.power(left, right)
            elif operator == "%" and isinstance(left, str):
                b.check_format(left, "%-format")
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805
            b = _bounds()
            b.check_time()
            inner = getattr(__obj, "__wrapped__", __obj)  # the sandbox wraps str.format
            owner = getattr(inner, "__self__", None)
            name = getattr(inner, "__name__", "")
            if __obj is not _bounded_range:  # range says why itself
                for a in (*args, *kwargs.values()):
                    b.check_int(a, f"{name or 'a function'}()")
            if isinstance(owner, str):
                if name in ("format", "format_map"):
                    b.check_format(owner, "format string")
                elif name == "replace" and len(args) >= 2 and all(isinstance(a, str) for a in args[:2]):
                    b.replaced(owner, args[0], args[1])
            return super().call(__context, __obj, *args, **kwargs)

    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.filters = {k: _checked_filter(k, f) for k, f in env.filters.items()}
    env.globals["range"] = _bounded_range
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    import jinja2

    env = _environment()
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not parse: {e}") from None
    except RecursionError:
        raise ChatTemplateError("the chat template nests too deeply to parse") from None


#: The file name jinja gives a template's compiled code (`Environment.from_string`).
_TEMPLATE_FILE = "<template>"


def _generate(compiled: Any, bounds: _Bounds, context: dict[str, Any]) -> str:
    """Render with the time limit traced on the template's own frames and the output limit
    checked chunk by chunk."""
    def on_line(frame: Any, event: str, arg: Any) -> Any:
        if event == "line":
            bounds.check_time()
        return on_line

    def on_call(frame: Any, event: str, arg: Any) -> Any:
        return on_line if frame.f_code.co_filename == _TEMPLATE_FILE else None

    previous = sys.gettrace()
    parts: list[str] = []
    size = 0
    _local.bounds = bounds
    sys.settrace(on_call)
    try:
        for chunk in compiled.generate(**context):
            size += len(chunk)
            if size > bounds.limits.max_chars:
                raise ChatTemplateError(f"the chat template's output passed the limit of "
                                        f"{bounds.limits.max_chars} characters (TemplateLimits.max_chars)")
            parts.append(chunk)
    finally:
        sys.settrace(previous)
        _local.bounds = None
    return "".join(parts)


def render_chat(
    template: Optional[str],
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    *,
    limits: TemplateLimits = DEFAULT_LIMITS,
    **context: Any,
) -> str:
    """The prompt text for ``messages`` (``[{"role": ..., "content": ...}, ...]``), rendered
    within ``limits``."""
    from jinja2.exceptions import SecurityError, TemplateError

    if not template:
        raise ChatTemplateError(
            "this model has no chat template; pass chat_template=... to LLM.from_pretrained, "
            "or call generate() with a plain prompt string")
    for m in messages:
        if not isinstance(m, dict) or "role" not in m or "content" not in m:
            raise ChatTemplateError(f"a message must be a dict with 'role' and 'content'; got {m!r}")
    compiled = _compile(template)
    try:
        return _generate(compiled, _Bounds(limits),
                         dict(messages=list(messages), add_generation_prompt=add_generation_prompt, **context))
    except ChatTemplateError:
        raise
    except SecurityError as e:
        raise ChatTemplateError(f"the chat template was refused by the sandbox: {e}") from None
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template failed: {e}") from None
    except RecursionError:
        raise ChatTemplateError("the chat template recursed too deeply (a recursive macro?)") from None
    except MemoryError:
        raise ChatTemplateError("the chat template ran out of memory") from None
    except Exception as e:  # noqa: BLE001 - any other failure of untrusted code, named
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
