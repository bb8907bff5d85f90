"""Records held to the shapes the serving engine accepts (read/shapes.py): valid records of every
supported form are generated, then any one field anywhere is replaced by a value of another JSON
type. The record must be a dead letter whose message names the field, or (where the engine
truly takes both types, or ignores the field) parse as the engine would read it."""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtrace.transforms.errors import Rejected
from kvtrace.transforms.read.records import ParseOptions, Request, parse_record
from kvtrace.transforms.read.shapes import declared_fields

TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12)
NAME = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)
ARGUMENTS = st.dictionaries(NAME, st.integers(0, 9) | TEXT, max_size=2).map(json.dumps)
TIMESTAMP = st.integers(1_700_000_000_000, 1_800_000_000_000)
# Fields no reader looks at and the engine takes any value of (sampling parameters, metadata).
IGNORED = st.fixed_dictionaries(
    {},
    optional={
        "model": NAME,
        "temperature": st.floats(0, 2),
        "metadata": st.dictionaries(NAME, TEXT, max_size=2),
    },
)


def _tool_call(draw) -> dict:
    return {
        "id": draw(NAME),
        "type": "function",
        "function": {"name": draw(NAME), "arguments": draw(ARGUMENTS)},
    }


@st.composite
def openai_records(draw) -> dict:
    content = draw(
        TEXT
        | st.lists(st.builds(lambda t: {"type": "text", "text": t}, TEXT), min_size=1, max_size=2)
    )
    messages = [{"role": "system", "content": draw(TEXT)}, {"role": "user", "content": content}]
    if draw(st.booleans()):
        call = _tool_call(draw)
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": draw(TEXT)},
        ]
    message = {"role": "assistant", "content": draw(TEXT), "tool_calls": [_tool_call(draw)]}
    response = draw(st.sampled_from(["message", "chunks", "usage"]))
    if response == "message":
        response = {"choices": [{"index": 0, "message": message, "finish_reason": "stop"}]}
    elif response == "chunks":
        response = [
            {"choices": [{"index": 0, "delta": {"content": draw(TEXT)}}]},
            {"choices": [{"index": 0, "delta": {"reasoning_content": draw(TEXT)}}]},
        ]
    else:
        response = {
            "choices": [],
            "usage": {"prompt_tokens": 3, "completion_tokens": draw(st.integers(0, 99))},
        }
    tools = [
        {
            "type": "function",
            "function": {
                "name": draw(NAME),
                "description": draw(TEXT),
                "parameters": {"type": "object"},
            },
        }
    ]
    return {
        "timestamp": draw(TIMESTAMP),
        "session_id": draw(NAME),
        "request": {"messages": messages, "tools": tools, **draw(IGNORED)},
        "response": response,
    }


@st.composite
def responses_records(draw) -> dict:
    return {
        "timestamp": draw(TIMESTAMP),
        "instructions": draw(TEXT),
        "input": [
            {"role": "user", "content": [{"type": "input_text", "text": draw(TEXT)}]},
            {
                "type": "function_call",
                "call_id": "c",
                "name": draw(NAME),
                "arguments": draw(ARGUMENTS),
            },
            {"type": "function_call_output", "call_id": "c", "output": draw(TEXT)},
        ],
        "tools": [{"type": "function", "name": draw(NAME), "parameters": {"type": "object"}}],
        "response": {
            "output": [
                {"type": "message", "content": [{"type": "output_text", "text": draw(TEXT)}]},
                {"type": "function_call", "name": draw(NAME), "arguments": draw(ARGUMENTS)},
                {"type": "reasoning", "summary": [{"type": "summary_text", "text": draw(TEXT)}]},
            ]
        },
        **draw(IGNORED),
    }


@st.composite
def anthropic_records(draw) -> dict:
    return {
        "timestamp": draw(TIMESTAMP),
        "conversation_id": draw(st.integers(0, 99)),
        "request": {
            "system": [{"type": "text", "text": draw(TEXT)}],
            "messages": [
                {"role": "user", "content": [{"type": "text", "text": draw(TEXT)}]},
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": draw(TEXT)},
                        {"type": "tool_use", "id": "t", "name": draw(NAME), "input": {}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t",
                            "content": [{"type": "text", "text": draw(TEXT)}],
                        }
                    ],
                },
            ],
            "tools": [{"name": draw(NAME), "input_schema": {}}],
            **draw(IGNORED),
        },
        "response": {"type": "message", "content": [{"type": "text", "text": draw(TEXT)}]},
    }


@st.composite
def prompt_and_token_records(draw) -> dict:
    body = draw(
        st.sampled_from(
            [{"prompt": draw(TEXT)}, {"input_ids": draw(st.lists(st.integers(0, 99), min_size=1))}]
        )
    )
    output = draw(
        st.sampled_from([{"output": draw(TEXT)}, {"output_length": draw(st.integers(0, 99))}])
    )
    return {
        "timestamp": draw(TIMESTAMP | st.just("2025-01-01T00:00:00Z")),
        **body,
        **output,
        **draw(IGNORED),
    }


RECORDS = openai_records() | responses_records() | anthropic_records() | prompt_and_token_records()

# One value of each JSON type.
VALUES = {
    "null": None,
    "boolean": True,
    "number": 7,
    "string": "x",
    "array": ["x"],
    "object": {"x": 1},
}
# Where the engine truly takes more than one JSON type (vLLM's request models: Optional fields
# take null; content is a string or a list of parts, a part a string or an object; a streamed
# delta may leave out any field), by field name, a response's prefixed. Any other accepted
# replacement must leave the parse exactly as before (a field nobody reads).
ACCEPTED = {
    "content": {"string", "array", "null"},
    "content[]": {"string", "object"},
    "system": {"string", "array", "null"},
    "input": {"string", "array"},
    "prompt": {"string", "array"},  # a Completions prompt: strings or token ids
    "output": {"string", "array"},
    "timestamp": {"number", "string"},
    "session_id": {"string", "number", "null"},
    "conversation_id": {"string", "number", "null"},
    **dict.fromkeys(
        [
            "tools",
            "tool_calls",
            "name",
            "description",
            "parameters",
            "instructions",
            "reasoning",
            "reasoning_content",
            "tool_call_id",
        ],
        {"null"},
    ),
    "response": {"object", "array", "null"},
    **dict.fromkeys(
        [
            f"response.{name}"
            for name in (
                "content",
                "tool_calls",
                "function",
                "name",
                "arguments",
                "id",
                "type",
                "index",
                "role",
                "reasoning",
                "reasoning_content",
                "text",
                "finish_reason",
                "usage",
                "choices",
                "message",
                "delta",
                "completion_tokens",
                "prompt_tokens",
                "output",
                "summary",
            )
        ],
        {"null"},
    ),
}
# Objects the engine takes whole, as free-form JSON (a tool's JSON schema).
FREE_FORM = {"parameters", "input_schema", "metadata"}


def json_type(value: object) -> str:
    return next(
        name
        for name, sample in VALUES.items()
        if type(sample) is type(value) or (name == "number" and type(value) is float)
    )


def paths(value: object, path: tuple = ()) -> Iterator[tuple]:
    if path:
        yield path
    children = (
        value.items()
        if isinstance(value, dict)
        else (enumerate(value) if isinstance(value, list) else ())
    )
    for key, child in children:
        yield from paths(child, path + (key,))


def replaced(record: dict, path: tuple, value: object) -> dict:
    record = copy.deepcopy(record)
    holder = record
    for key in path[:-1]:
        holder = holder[key]
    holder[path[-1]] = value
    return record


def removed(record: dict, path: tuple) -> dict:
    record = copy.deepcopy(record)
    holder = record
    for key in path[:-1]:
        holder = holder[key]
    del holder[path[-1]]
    return record


def outcome(record: dict) -> Request | tuple[str, str]:
    try:
        return parse(record)
    except Rejected as err:
        return err.reason, err.message


def dotted(path: tuple) -> str:
    text = ""
    for key in path:
        text += f"[{key}]" if isinstance(key, int) else (f".{key}" if text else key)
    return text


def field_name(path: tuple) -> str:
    """The name of the field at path: its key, or its list's key and [] for an element;
    "response." before it in a response."""
    if isinstance(path[-1], str):
        name = path[-1]
    else:
        name = f"{field_name(path[:-1]).removeprefix('response.')}[]" if len(path) > 1 else "[]"
    return f"response.{name}" if path[0] == "response" and len(path) > 1 else name


def parse(record: dict) -> Request:
    request = parse_record(json.dumps(record).encode(), "t.jsonl", ParseOptions())
    return dataclasses.replace(request, line=b"")


@settings(max_examples=25, deadline=None)  # each example: every field x every other type
@given(record=RECORDS)
def test_a_field_of_another_type_anywhere_is_a_dead_letter_naming_it(record):
    before = parse(record)
    for path in paths(record):
        if FREE_FORM & set(path[:-1]):
            continue
        original = record
        for key in path:
            original = original[key]
        for kind in sorted(VALUES.keys() - {json_type(original)}):
            if kind == "null" and isinstance(path[-1], str):  # a null field is an absent one
                assert outcome(replaced(record, path, None)) == outcome(removed(record, path))
                continue
            try:
                after = parse(replaced(record, path, VALUES[kind]))
            except Rejected as err:
                named = path[-1] if isinstance(path[-1], str) else dotted(path)
                assert dotted(path) in err.message or (
                    err.reason != "wrong_type" and named in err.message
                ), (path, err.message)
                continue
            if after != before:
                assert kind in ACCEPTED.get(field_name(path), ()), (path, kind)


@pytest.mark.parametrize(
    "record, where",
    [
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "timestamp": 1,
                "response": {"choices": [{"message": {"content": 5}}]},
            },
            "response.choices[0].message.content",
        ),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "timestamp": 1,
                "response": {"choices": [{"message": {"tool_calls": 3}}]},
            },
            "response.choices[0].message.tool_calls",
        ),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "timestamp": 1,
                "tools": [{"type": "function", "function": {"name": {"a": 1}}}],
            },
            "tools[0].function.name",
        ),
        (
            {
                "request": {
                    "messages": [
                        {
                            "role": "assistant",
                            "content": None,
                            "tool_calls": [
                                {
                                    "id": "c",
                                    "type": "function",
                                    "function": {"name": "f", "arguments": {"a": 1}},
                                }
                            ],
                        }
                    ]
                },
                "timestamp": 1,
            },
            "request.messages[0].tool_calls[0].function.arguments",
        ),
        (
            {
                "input": [{"type": "function_call", "name": 5, "arguments": "{}", "call_id": "c"}],
                "timestamp": 1,
            },
            "input[0].name",
        ),
        (
            {
                "messages": [{"role": "user", "content": "hi"}],
                "timestamp": 1,
                "response": [
                    {"choices": [{"delta": {"content": "a"}}]},
                    {"choices": [{"delta": {"tool_calls": [{"function": {"arguments": 5}}]}}]},
                ],
            },
            "response[1].choices[0].delta.tool_calls[0].function.arguments",
        ),
    ],
)
def test_values_the_engine_refuses_are_dead_letters_naming_the_field(record, where):
    with pytest.raises(Rejected) as caught:
        parse(record)
    assert caught.value.reason == "wrong_type" and caught.value.message.startswith(where + " is ")


def test_content_as_a_string_or_as_its_text_part_parses_alike():
    as_string = {"timestamp": 1, "messages": [{"role": "user", "content": "hi"}]}
    as_part = {
        "timestamp": 1,
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }
    assert parse(as_string) == parse(as_part)


def test_declared_fields_hold_only_what_the_envelope_declares():
    record = {"custom_id": "r", "completion_tokens": 1, "output": "o", "extra": 2, "body": {}}
    assert declared_fields(record, "batch") == {k: v for k, v in record.items() if k != "extra"}
    assert "custom_id" not in declared_fields(record, "log")


CALL = {"id": "c1", "type": "function", "function": {"name": "get", "arguments": "{}"}}


@pytest.mark.parametrize(
    ("odd", "named"),
    [
        ({"call": {k: v for k, v in CALL.items() if k != "id"}}, "tool_calls[0].id"),
        ({"call": {**CALL, "type": None}}, "tool_calls[0].type"),
        ({"call": {**CALL, "function": {"name": "get"}}}, "function.arguments"),
        ({"tools": [{"type": "function", "function": {"name": None}}]}, "function.name"),
        ({"role": None}, "messages[1].role"),
    ],
    ids=["call.id", "call.type", "call.function.arguments", "tool.function.name", "role"],
)
def test_a_field_the_engine_requires_absent_or_null_is_an_invalid_request(odd, named):
    """vLLM's request models require these (a 400 without them): absent and null alike."""
    message = {"role": "assistant", "content": None, "tool_calls": [odd.get("call", CALL)]}
    if "role" in odd:
        message["role"] = odd["role"]
    record = {
        "timestamp": 1_700_000_000_000,
        "messages": [{"role": "user", "content": "hi"}, message],
        "tools": odd.get("tools", [{"type": "function", "function": {"name": "get"}}]),
    }
    with pytest.raises(Rejected) as caught:
        parse(record)
    assert caught.value.reason == "invalid_request"
    assert named in caught.value.message and "absent" in caught.value.message


def test_an_optional_field_sent_as_null_reads_as_absent():
    record = {"timestamp": 1_700_000_000_000, "messages": [{"role": "user", "content": "hi"}]}
    nulls = {**record, "tools": None, "output": None, "output_length": None, "session_id": None}
    assert parse(nulls) == parse(record)
