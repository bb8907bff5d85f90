"""The log shapes providers keep, each held to an independent reference of what the serving
engine would tokenize: the messages and tools vLLM's server builds from the request, written
out here by hand from its conversion code, rendered and encoded by transformers' AutoTokenizer
on the shipped tokenizers; kvtrace's own reading of the raw record, through its own renderer,
must give the same token ids."""

from __future__ import annotations

import json
from typing import Any

import pytest

from helpers import shared_path
from kvtrace.transforms.encode.tokenize import encode_texts, load_tokenizer, render_chat
from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import ParseOptions, Request, parse_record

TS = {"timestamp": 1_700_000_000_000}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}}


def parse(record: dict[str, Any]) -> Request:
    return parse_record(json.dumps(record).encode(), "t.jsonl", ParseOptions())


def rejection(record: dict[str, Any]) -> Rejected:
    with pytest.raises(Rejected) as caught:
        parse(record)
    return caught.value


@pytest.fixture(scope="module", params=["deepseek-r1", "qwen3"])
def tokenizers(request):
    """(kvtrace's tokenizer, transformers' AutoTokenizer) of one shipped model."""
    from transformers import AutoTokenizer

    folder = str(shared_path("tokenizers", request.param))
    return load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)


def kvtrace_ids(tokenizer, record: dict[str, Any]) -> list[int]:
    request = parse(record)
    return encode_texts(tokenizer, [render_chat(tokenizer, request.messages, request.tools, {})])[0]


def engine_ids(auto, messages: list[dict], tools: list[dict] | None = None) -> list[int]:
    text = auto.apply_chat_template(
        messages, tools=tools, tokenize=False, add_generation_prompt=True
    )
    return auto.encode(text, add_special_tokens=False)


def function(name: str, description: str | None, parameters: dict | None) -> dict:
    """A tool as vLLM's ChatCompletionToolsParam dumps it."""
    return {
        "type": "function",
        "function": {"name": name, "description": description, "parameters": parameters},
    }


# ---- Anthropic Messages -----------------------------------------------------------------------


def test_anthropic_tools_without_a_system_prompt_render_as_vllms_anthropic_server(tokenizers):
    """Tools defined by input_schema make the request Anthropic's, with no system prompt or
    tool block: vLLM's Anthropic server turns each into a function (not the raw tool)."""
    ours, auto = tokenizers
    record = {
        **TS,
        "model": "m",
        "max_tokens": 64,
        "tools": [
            {
                "name": "get_weather",
                "description": "Weather in a city",
                "input_schema": WEATHER_SCHEMA,
            }
        ],
        "messages": [{"role": "user", "content": "Weather in Paris?"}],
    }
    expected = engine_ids(
        auto,
        [{"role": "user", "content": "Weather in Paris?"}],
        [function("get_weather", "Weather in a city", WEATHER_SCHEMA)],
    )
    assert kvtrace_ids(ours, record) == expected


def test_an_anthropic_tool_schema_without_type_gets_type_object_last_as_vllm_adds_it(tokenizers):
    ours, auto = tokenizers
    schema = {"properties": {"city": {"type": "string"}}, "required": ["city"]}
    record = {
        **TS,
        "tools": [{"name": "get_weather", "input_schema": schema}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Weather?"}]}],
    }
    typed = {**schema, "type": "object"}  # the validator sets the key: it comes last
    expected = engine_ids(
        auto, [{"role": "user", "content": "Weather?"}], [function("get_weather", None, typed)]
    )
    assert kvtrace_ids(ours, record) == expected
    assert list(parse(record).tools[0]["function"]["parameters"]) == [
        "properties",
        "required",
        "type",
    ]


def test_an_anthropic_conversation_renders_as_vllms_anthropic_server_builds_it(tokenizers):
    """Empty text blocks are skipped and a user turn of tool results alone becomes tool
    messages only, as vLLM's Anthropic server converts them (qwen3: its template takes the
    arguments as objects, as vLLM hands them; DeepSeek-R1's needs strings, vLLM fails it)."""
    ours, auto = tokenizers
    if "deepseek" in auto.name_or_path:
        pytest.skip("DeepSeek-R1's template fails on tool calls as vLLM passes them")
    record = {
        **TS,
        "tools": [{"name": "get_weather", "input_schema": WEATHER_SCHEMA}],
        "messages": [
            {
                "role": "user",
                "content": [{"type": "text", "text": ""}, {"type": "text", "text": "Paris?"}],
            },
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Let me check."},
                    {
                        "type": "tool_use",
                        "id": "t1",
                        "name": "get_weather",
                        "input": {"city": "Paris"},
                    },
                ],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "21C"}],
            },
        ],
    }
    call = {
        "id": "t1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris"}},
    }
    expected = engine_ids(
        auto,
        [
            {"role": "user", "content": "Paris?"},
            {"role": "assistant", "content": "Let me check.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "t1", "content": "21C"},
        ],
        [function("get_weather", None, WEATHER_SCHEMA)],
    )
    assert kvtrace_ids(ours, record) == expected


def test_an_anthropic_tool_without_input_schema_is_refused_as_vllm_refuses_it():
    record = {
        **TS,
        "system": "s",
        "tools": [{"name": "web_search", "type": "web_search_20250305"}],
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert rejection(record).reason == "invalid_request"
