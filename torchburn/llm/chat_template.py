"""Chat templates: the model's own Jinja template, rendered in jinja2's immutable sandbox.

A template comes from the model (``tokenizer_config.json``, ``chat_template.jinja`` or the GGUF
key ``tokenizer.chat_template``) and is untrusted text: the sandbox refuses attribute access
to Python internals (``__class__``, ``__globals__``, ...) and mutation of the inputs.  The
environment offers what Hugging Face templates expect: ``trim_blocks``/``lstrip_blocks``,
``loop controls``, ``raise_exception``, ``strftime_now`` and a ``tojson`` filter.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, Optional, Sequence

Message = dict[str, Any]


class ChatTemplateError(ValueError):
    """A template that is missing, does not parse, or failed (or was refused) while rendering."""


def _raise(message: str) -> None:
    raise ChatTemplateError(f"the chat template raised: {message}")


def _tojson(value: Any, indent: Optional[int] = None, ensure_ascii: bool = False) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


@lru_cache(maxsize=8)
def _compile(source: str) -> Any:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template does not parse: {e}") from None


def render_chat(
    template: Optional[str],
    messages: Sequence[Message],
    add_generation_prompt: bool = True,
    **context: Any,
) -> str:
    """The prompt text for ``messages`` (``[{"role": ..., "content": ...}, ...]``)."""
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
        return str(compiled.render(messages=list(messages),
                                   add_generation_prompt=add_generation_prompt, **context))
    except SecurityError as e:
        raise ChatTemplateError(f"the chat template was refused by the sandbox: {e}") from None
    except ChatTemplateError:
        raise
    except TemplateError as e:
        raise ChatTemplateError(f"the chat template failed: {e}") from None
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as e:
        raise ChatTemplateError(f"the chat template failed: {type(e).__name__}: {e}") from None
