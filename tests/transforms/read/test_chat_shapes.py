"""Each chat shape (OpenAI tool calling, Responses API, Anthropic Messages) parsed and rendered
through real tokenizers and real chat templates from ../shared, as vLLM's server renders them."""

from __future__ import annotations

import json

import pytest

from helpers import OPENAI_TOOL_TURN, SHAPES, shared_path
from kvtrace.transforms.encode.tokenize import load_tokenizer, render_chat
from kvtrace.transforms.read.records import ParseOptions, parse_record


def render(tokenizer_dir, record, **kwargs) -> str:
    request = parse_record(json.dumps(record).encode(), "t.jsonl", ParseOptions())
    return render_chat(load_tokenizer(tokenizer_dir), request.messages, request.tools, kwargs)


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("tokenizer", ["deepseek-r1", "qwen3"])
def test_shapes_render_with_the_shipped_tokenizers(tokenizer, shape):
    text = render(str(shared_path("tokenizers", tokenizer)), SHAPES[shape])
    assert "Weather in Paris?" in text and "get_weather" in text and "21" in text
    assert (
        "Paris" in text.split("Weather in Paris?", 1)[1]
    )  # the call's arguments, after the question


def test_qwen3_renders_arguments_as_vllm_passes_them():
    text = render(str(shared_path("tokenizers", "qwen3")), OPENAI_TOOL_TURN)
    assert '{"name": "get_weather", "arguments": {"city": "Paris"}}' in text
    assert '<tool_response>\n{"temp_c": 21}\n</tool_response>' in text


def test_deepseek_r1_gets_the_arguments_as_the_json_string_its_template_concatenates():
    text = render(str(shared_path("tokenizers", "deepseek-r1")), OPENAI_TOOL_TURN)
    assert '```json\n{"city": "Paris"}\n```' in text


def test_arguments_as_strings_are_json_dumps_text_unescaped():
    """json.dumps(arguments, ensure_ascii=False), as the wire form spells them."""
    arguments = {"city": "Zürich", "days": [1, 2.5, True, None], "note": 'say "hi"\n'}
    turn = json.loads(json.dumps(OPENAI_TOOL_TURN))
    turn["messages"][1]["tool_calls"][0]["function"]["arguments"] = json.dumps(arguments)
    text = render(str(shared_path("tokenizers", "deepseek-r1")), turn)
    assert f"```json\n{json.dumps(arguments, ensure_ascii=False)}\n```" in text
    assert '{"city": "Zürich", "days": [1, 2.5, true, null], "note": "say \\"hi\\"\\n"}' in text


@pytest.mark.parametrize(
    "template",
    [
        "Qwen-Qwen2.5-7B-Instruct.jinja",
        "Qwen-Qwen3-0.6B.jinja",
        "meta-llama-Llama-3.1-8B-Instruct.jinja",
        "openai-gpt-oss-120b.jinja",
        "deepseek-ai-DeepSeek-V3.1.jinja",
    ],
)
@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shapes_render_with_real_templates(deepseek_tokenizer, template, shape):
    source = shared_path("templates", template).read_text()
    text = render(
        deepseek_tokenizer, SHAPES[shape], chat_template=source, date_string="21 Nov 2026"
    )
    assert "Weather in Paris?" in text and "get_weather" in text
