"""render_chat on a stream of requests: each request's text depends on that request alone, even
under a template that takes tool-call arguments as objects for some requests and refuses them
for others; a template's error is the request's letter in the error's own words."""

from __future__ import annotations

import pytest
from jinja2.exceptions import TemplateSyntaxError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from kvtrace.transforms.encode.encode_requests import EncodeOptions, RequestEncoder
from kvtrace.transforms.encode.fast_tokenizer import FastTokenizer
from kvtrace.transforms.encode.salt import SaltSource
from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import Request

# Concatenates arguments (objects fail) when the call's message says so, else prints them as JSON
# (objects and strings both render, differently).
PICKY = (
    "{% for m in messages %}{% for c in m.tool_calls or [] %}{% if m.content == 'concat' %}"
    "{{ 'args: ' + c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}"
    "{% endif %}{% endfor %}{% endfor %}"
)


def _call(content: str) -> list[dict]:
    return [
        {
            "role": "assistant",
            "content": content,
            "tool_calls": [
                {"id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
            ],
        }
    ]


def test_a_requests_text_does_not_depend_on_the_requests_before_it(tiny_tokenizer):
    tokenizer = load_tokenizer(tiny_tokenizer)
    picky = FastTokenizer(tokenizer.backend_tokenizer, PICKY, tokenizer.special_tokens_map)
    alone = render_chat(picky, _call("json"), None, {})
    assert alone == '{"a": 1}' and render_chat(picky, _call("concat"), None, {}) == 'args: {"a": 1}'
    encoder = RequestEncoder(
        picky, b"s" * 16, EncodeOptions("picky", SaltSource("random"), block_size=4)
    )
    requests = [
        Request("t", b"", 0, "chat", messages=_call(content))
        for content in ["concat"] * 3 + ["json"]
    ]
    rendered, rejected = encoder.render(requests)
    assert not rejected and rendered[-1][1] == alone  # objects first, after strings were needed


def _letter(tokenizer, template: str) -> str:
    chat = FastTokenizer(tokenizer.backend_tokenizer, template, tokenizer.special_tokens_map)
    with pytest.raises(Rejected) as caught:
        render_chat(chat, _call("x"), None, {})
    assert caught.value.reason == "template_error"
    return caught.value.message


def test_a_template_s_runtime_error_is_its_own_text(tiny_tokenizer):
    """Raised as it is (its traceback not rewritten into template lines): the same words,
    after the retry with arguments as strings failed too."""
    tokenizer = load_tokenizer(tiny_tokenizer)
    with pytest.raises(TypeError) as python:
        "assistant" + 1  # noqa: B018
    assert _letter(tokenizer, "{{ messages[0].role + 1 }}") == f"TypeError: {python.value}"
    assert _letter(tokenizer, "{{ raise_exception('no ' ~ messages[0].role) }}") == (
        "TemplateError: no assistant"
    )


def test_a_template_s_syntax_error_is_jinja_s_own_text(tiny_tokenizer):
    bad = "line one\n{% for m in messages %}{{ m.role }}"
    with pytest.raises(TemplateSyntaxError) as jinja:
        ImmutableSandboxedEnvironment().from_string(bad)
    assert _letter(load_tokenizer(tiny_tokenizer), bad) == f"TemplateSyntaxError: {jinja.value}"
