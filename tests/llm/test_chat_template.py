"""Chat templates render as transformers' apply_chat_template does, and run sandboxed."""
from __future__ import annotations

import pytest

from torchburn.llm.model.chat_template import ChatTemplateError, render_chat
from torchburn.llm.model.tokenizer import tokenizer_from_folder

from .conftest import smollm_gguf, smollm_missing, transformers

CONVERSATIONS = [
    [{"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there!"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
     {"role": "assistant", "content": "4"}, {"role": "user", "content": "and 3+3? 🎉"}],
]


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_tiny_template_matches_transformers(tiny_checkpoint, messages, generation_prompt) -> None:
    _, folder = tiny_checkpoint("llama")
    ours = tokenizer_from_folder(folder)
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    expected = ref.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=generation_prompt)
    assert render_chat(ours.chat_template, messages, generation_prompt) == expected


@pytest.fixture(scope="module")
def gguf_templates():  # type: ignore[no-untyped-def]
    """(our template text, transformers' tokenizer), read once: both parse the whole file."""
    path = smollm_gguf()
    if path is None:
        pytest.skip(smollm_missing())
    from torchburn.llm.model.gguf_loader import field, open_gguf

    template = field(open_gguf(path), "tokenizer.chat_template")
    return template, transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


@pytest.mark.parametrize("generation_prompt", [True, False])
@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_gguf_template_matches_transformers(gguf_templates, messages, generation_prompt) -> None:
    template, ref = gguf_templates
    expected = ref.apply_chat_template(messages, tokenize=False,
                                       add_generation_prompt=generation_prompt)
    assert render_chat(template, messages, generation_prompt) == expected


@pytest.mark.parametrize("evil", [
    "{{ messages.__class__.__mro__[1].__subclasses__() }}",
    "{{ ''.__class__.__base__.__subclasses__() }}",
    "{{ raise_exception.__globals__['os'].system('echo pwned') }}",
    "{% do messages.append({'role': 'x'}) %}",
])
def test_template_reaching_for_internals_is_refused(evil: str) -> None:
    with pytest.raises(ChatTemplateError):
        render_chat(evil, CONVERSATIONS[0])


def test_template_errors_are_clear() -> None:
    with pytest.raises(ChatTemplateError, match="no chat template"):
        render_chat(None, CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat("{% for %}", CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="raised: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", CONVERSATIONS[0])
    with pytest.raises(ChatTemplateError, match="role"):
        render_chat("{{ messages }}", [{"content": "no role"}])


# ---- hostile templates (issue 28): bounded time and size, every failure a ChatTemplateError ----

HI = [{"role": "user", "content": "hi"}]
HOSTILE = {
    "huge range": ("{% for i in range(10**9) %}x{% endfor %}", "range"),
    "nested loops, no output": ("{% for i in range(10**5) %}{% for j in range(10**5) %}{% endfor %}{% endfor %}",
                                "time limit"),
    "nested loops with output": ("{% for i in range(10**5) %}{% for j in range(10**5) %}x{% endfor %}{% endfor %}",
                                 "limit"),
    "power": ("{{ 7**(10**9) }}", r"7 \*\* 1000000000"),
    "string repetition": ("{{ 'x'*10**10 }}", "repeats a string"),
    "list repetition": ("{{ ([1]*10**9)|length }}", "repeats a list"),
    "recursive macro": ("{% macro f(n) %}{{ f(n+1) }}{% endmacro %}{{ f(0) }}", "recursed too deeply"),
    "center filter": ("{{ 'x'|center(10**10) }}", "filter 'center'"),
    "ljust method": ("{{ 'x'.ljust(10**10) }}", "ljust"),
    "%-format width": ("{{ '%999999999d' % 1 }}", "width of 999999999"),
    "format width": ("{{ '{:>999999999}'.format(1) }}", "width of 999999999"),
    "replace growth": ("{% set s = 'x'*1000 %}{% set t = s.replace('x', s) %}{{ t.replace('x', s) }}", "replace"),
    "division by zero": ("{{ 1/0 }}", "ZeroDivisionError"),
    "undefined call": ("{{ foo() }}", "undefined"),
    "sandbox": ("{{ ''.__class__.__mro__ }}", "chat template"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_templates_fail_fast_with_a_named_cause(name: str) -> None:
    import time

    source, cause = HOSTILE[name]
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match=cause):
        out = render_chat(source, HI)
        if name == "sandbox" and "object" not in out:  # rendered harmlessly is fine for this one
            raise ChatTemplateError("chat template: harmless")
    assert time.monotonic() - start < 8  # the 2 s time limit, plus a loaded machine's slack


def test_limits_can_be_raised_and_real_templates_are_far_below_them() -> None:
    import time

    from torchburn.llm.model.chat_template import TemplateLimits

    loop = "{% for i in range(200000) %}x{% endfor %}"
    with pytest.raises(ChatTemplateError, match="max_range"):
        render_chat(loop, HI)
    # (a time limit far above the default 2 s: 200,000 iterations took longer on a loaded CI machine)
    assert render_chat(loop, HI, limits=TemplateLimits(max_range=200_000, seconds=60)) == "x" * 200_000
    with pytest.raises(ChatTemplateError, match="max_chars"):
        render_chat(loop, HI, limits=TemplateLimits(max_range=200_000, max_chars=1000, seconds=60))
    slow = "{% for i in range(30000) %}{% for j in range(30000) %}{% endfor %}{% endfor %}"
    start = time.monotonic()
    with pytest.raises(ChatTemplateError, match="0.2 s"):
        render_chat(slow, HI, limits=TemplateLimits(seconds=0.2))
    assert time.monotonic() - start < 5
    long = [{"role": "user", "content": "word " * 20000}] * 20  # 2 MB of conversation renders
    text = render_chat("{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}", long)
    assert len(text) > 2_000_000


def test_the_time_limit_leaves_the_callers_tracer_alone() -> None:
    import sys

    seen: list[str] = []

    def tracer(frame, event, arg):  # type: ignore[no-untyped-def]
        seen.append(event)
        return None

    sys.settrace(tracer)
    try:
        render_chat("{{ messages[0].content }}", HI)
        assert sys.gettrace() is tracer
    finally:
        sys.settrace(None)


def test_jinja2_requirement_excludes_the_sandbox_escapes() -> None:
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text()
    assert re.search(r'"jinja2>=3\.1\.6"', text)
