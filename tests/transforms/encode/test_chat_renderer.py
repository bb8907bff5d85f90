"""ChatRenderer: render_chat's text, with tool-call arguments as strings first once a template has
refused them as objects, and back to objects first when a template takes them."""

from __future__ import annotations

import json

import pytest
from conftest import OPENAI_TOOL_TURN, chat

from transforms.encode.fast_tokenizer import FastTokenizer
from transforms.encode.tokenize import (ORDER_CHECK_EVERY, ChatRenderer, load_tokenizer,
                                        render_chat)
from transforms.read.records import parse_record

TOOL_TURN = parse_record(json.dumps(OPENAI_TOOL_TURN).encode(), "t")  # as the job reads it


@pytest.mark.parametrize("name", ["deepseek_tokenizer", "qwen3_tokenizer"])
def test_the_renderer_renders_as_render_chat_on_the_shipped_templates(name, request):
    tokenizer = load_tokenizer(request.getfixturevalue(name))
    renderer = ChatRenderer(tokenizer, {})
    turns = [(TOOL_TURN.messages, TOOL_TURN.tools), (chat(3, 3)["messages"], None)] * 70
    for messages, tools in turns:
        assert renderer.render(messages, tools) == render_chat(tokenizer, messages, tools, {})


# Concatenates arguments (objects fail) when the call's message says so, else prints them as JSON
# (objects and strings both render, differently): the case strings-first could get wrong.
PICKY = ("{% for m in messages %}{% for c in m.tool_calls or [] %}{% if m.content == 'concat' %}"
         "{{ 'args: ' + c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}"
         "{% endif %}{% endfor %}{% endfor %}")


def test_a_template_that_takes_objects_again_gets_them_within_the_check_interval(tiny_tokenizer):
    tokenizer = load_tokenizer(tiny_tokenizer)
    picky = FastTokenizer(tokenizer.backend_tokenizer, PICKY, tokenizer.special_tokens_map)
    renderer = ChatRenderer(picky, {})

    def call(content: str) -> list[dict]:
        return [{"role": "assistant", "content": content, "tool_calls": [{
            "id": "c", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]}]

    assert renderer.render(call("concat"), None) == render_chat(picky, call("concat"), None, {})
    takes_objects = [renderer.render(call("json"), None) for _ in range(ORDER_CHECK_EVERY)]
    expected = render_chat(picky, call("json"), None, {})
    assert takes_objects[-1] == expected  # the check rendered objects first: the order reverted
    assert renderer.render(call("json"), None) == expected
