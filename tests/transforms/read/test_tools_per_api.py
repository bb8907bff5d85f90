"""Tools read per API (records.API_FIELDS' tools readers): each API's request model takes only
its own tool forms (anything else the engine's 400: an invalid_request letter), and every
function tool reaches the template as the engine's Chat Completions tool model dumps it."""

from __future__ import annotations

import json

import pytest

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import Request, parse_record

TS = {"timestamp": 1_700_000_000_000}
USER = [{"role": "user", "content": "hi"}]
SCHEMA = {"type": "object", "properties": {"place": {"type": "string"}}}
FLAT = {"type": "function", "name": "tide", "description": "d", "parameters": SCHEMA}
NESTED = {
    "type": "function",
    "function": {"name": "tide", "description": "d", "parameters": SCHEMA},
}
SERVED = {
    "type": "function",
    "function": {"name": "tide", "description": "d", "parameters": SCHEMA},
}


def parse(record: dict) -> Request:
    return parse_record(json.dumps(record).encode(), "f")


def refused(record: dict) -> Rejected:
    with pytest.raises(Rejected) as caught:
        parse(record)
    return caught.value


def chat(*tools: object) -> dict:
    return {**TS, "messages": USER, "tools": list(tools)}


def responses(*tools: object) -> dict:
    return {**TS, "input": "hi", "tools": list(tools)}


@pytest.mark.parametrize(
    "tool",
    [
        FLAT,  # the Responses API's form
        {"type": "web_search"},  # a built-in tool
        {"type": "function"},  # no function
        {"function": {"description": "no name"}},
        {"type": "custom", "function": {"name": "f"}},
        {"type": "function", "function": {"name": "f"}, "defer_loading": "yes"},
    ],
)
def test_a_chat_completions_tool_its_model_refuses_is_a_letter(tool):
    error = refused(chat(NESTED, tool))
    assert error.reason in ("invalid_request", "wrong_type")
    assert "\n" not in error.message


def test_a_chat_completions_tool_is_dumped_as_the_engines_model_dumps_it():
    """Keys neither model declares are dropped, a top-level tool's too; its defer_loading is the
    function's when the function gives none; null flags are left out; a missing type is
    "function", the model's default."""
    tool = {
        "function": {"name": "tide", "strict": True, "x-note": 1, "description": "d"},
        "defer_loading": True,
        "x-tag": 2,
    }
    assert parse(chat(NESTED, tool)).tools == [
        SERVED,
        {
            "type": "function",
            "function": {
                "name": "tide",
                "description": "d",
                "parameters": None,
                "strict": True,
                "defer_loading": True,
            },
            "defer_loading": True,
        },
    ]


def test_responses_tools_render_their_functions_alone():
    """A flat function as the Chat form; a namespace's functions named NAMESPACE__NAME (its
    custom tools and the server's own tools render nothing)."""
    namespace = {
        "type": "namespace",
        "name": "crm",
        "description": "the CRM",
        "tools": [{"type": "function", "name": "find"}, {"type": "custom", "name": "raw"}],
    }
    extra = {**FLAT, "output_schema": {"type": "string"}, "allowed_callers": ["direct"]}
    request = parse(
        responses(extra, {"type": "web_search"}, namespace, {"type": "mcp", "server_label": "s"})
    )
    find = {"name": "crm__find", "description": None, "parameters": None}
    assert request.tools == [SERVED, {"type": "function", "function": find}]


def test_a_responses_request_of_built_in_tools_alone_renders_none():
    assert parse(responses({"type": "web_search_preview"})).tools is None


@pytest.mark.parametrize(
    "tool",
    [
        NESTED,  # the Chat Completions form: no flat name
        {"type": "browser"},
        {"name": "tide"},  # no type
        {"type": "mcp"},  # a built-in tool without its required field
        {"type": "namespace", "name": "crm", "tools": []},
        {"type": "namespace", "name": "crm", "description": "d", "tools": [{"type": "x"}]},
        {**FLAT, "parameters": [1]},
    ],
)
def test_a_responses_tool_outside_its_union_is_a_letter(tool):
    error = refused(responses(FLAT, tool))
    assert error.reason in ("invalid_request", "wrong_type")


def test_an_anthropic_tool_keeps_its_flags_and_drops_the_rest():
    tool = {"name": "tide", "input_schema": {"properties": {}}, "strict": True, "cache_control": {}}
    served = parse({**TS, "system": "s", "messages": USER, "tools": [tool]}).tools
    parameters = {"properties": {}, "type": "object"}
    function = {"name": "tide", "description": None, "parameters": parameters, "strict": True}
    assert served == [{"type": "function", "function": function}]


def test_a_chat_request_of_no_tools_renders_none():
    assert parse(chat()).tools is None
