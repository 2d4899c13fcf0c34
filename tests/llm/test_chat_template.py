"""Chat templates render as transformers' apply_chat_template does, and run sandboxed."""
from __future__ import annotations

import pytest

from torchburn.llm.chat_template import ChatTemplateError, render_chat
from torchburn.llm.tokenizer import tokenizer_from_folder

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
    from torchburn.llm.gguf_loader import field, open_gguf

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
